"""Stragglers: one worker of a distributed training job slower than its peers (peer-group MAD
band, and a minimum relative gap).

At every slot the peers' median is the centre; a worker is outside the band when it is more than
``tolerance`` scaled MADs from it in the bad direction, and a straggler when it spends at least
``outside_fraction`` of its sampled slots outside. Shared seasonality and load changes move all
peers together and cancel out, so no history is needed.

The band's width: the peers' usual spread. With a baseline (the window before), the scale is the
median of the baseline's per-slot MADs relative to the median, so when several workers slow down
at once (PAI job 3: 4 of 10) they do not widen the band that should catch them; without one it is
the window's own per-slot MAD. Spreads below ``MIN_RELATIVE_SPREAD`` of the median are raised to
it: identical workers would otherwise make any wobble an outlier.

The band alone is not enough: on a fleet whose workers are nearly identical (a simulator, a
quiet cluster) its width falls to the 1 % floor, and a worker 3 % off its peers is "outside" while
nobody would call it a straggler. A worker is outside only when it is also at least
``min_relative_gap`` away from the peers' median, in the bad direction.

The rule judges the GPUs of one multi-GPU **training** job (:mod:`.job_kind`): in synchronous
training every step waits for the slowest worker. Serving replicas follow their own traffic and
are not peers in that sense. On GPU utilisation the bad direction is *lower*: a worker that falls
behind (throttled clocks, a degraded link, a starving loader) leaves its GPU waiting more than its
peers'; a GPU busier than its peers is not slower (issue 14: one at 1.03× its peers fired).

``bench/peer_outliers.py`` is the same band with the window's own scale, two-sided;
stragglers need a direction and the baseline's spread, so the band is computed here.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.accounting.gpu_time import (
    UNALLOCATED,
    GpuTimeline,
    ended_at,
    jobs_by_node,
    ownership,
)
from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict, new_finding
from gpuwarden.collector.detect.job_kind import JobKind, job_kind
from gpuwarden.collector.jobs.model import Job
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, integer, number

FloatMatrix = npt.NDArray[np.floating[Any]]
Direction = Literal["high", "low", "both"]
MAD_TO_SIGMA = 1.4826
MIN_RELATIVE_SPREAD = 0.01


@dataclass(frozen=True, slots=True)
class PeerVerdicts:
    """Per worker: verdict, share of sampled slots outside the band, median robust z."""

    verdict: npt.NDArray[np.int8]
    outside_ratio: npt.NDArray[np.float64]
    median_z: npt.NDArray[np.float64]
    relative_to_peers: npt.NDArray[np.float64]


def _nanmedian(x: FloatMatrix, axis: int) -> npt.NDArray[np.float64]:
    """``np.nanmedian`` that returns NaN for all-NaN slices without warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(np.nanmedian(x, axis=axis), dtype=np.float64)


def _relative_spread(values: FloatMatrix) -> float:
    """Median over slots of the peers' scaled MAD divided by their median (NaN if none)."""
    with np.errstate(all="ignore"):
        center = _nanmedian(values, 0)
        mad = MAD_TO_SIGMA * _nanmedian(np.abs(values - center), 0)
        rel = mad / np.abs(center)
    rel = rel[np.isfinite(rel)]
    return float(np.median(rel)) if rel.size else math.nan


def straggler_verdicts(
    values: FloatMatrix,
    *,
    tolerance: float,
    outside_fraction: float,
    min_peers: int,
    direction: Direction = "both",
    baseline: FloatMatrix | None = None,
    min_coverage: float = 0.5,
    min_relative_gap: float = 0.0,
    idle_below: float | None = None,
) -> PeerVerdicts:
    """Judge every worker (row) of one job against its peers over the window (columns).

    Args:
        values: workers × slots of a per-worker signal (NaN = no sample).
        tolerance: band half-width in scaled MADs.
        outside_fraction: share of a worker's sampled slots outside the band that fires.
        min_peers: fewer workers with data: every worker is UNKNOWN.
        direction: ``high`` (e.g. step time: slower is higher), ``low`` or ``both``.
        baseline: the same workers over an earlier window, for the band's width.
        min_coverage: share of slots a worker needs samples in, else UNKNOWN; a slot counts
            only when at least ``min_peers`` workers have a sample in it.
        min_relative_gap: a slot is outside only when the worker is also at least this share
            of the peers' median away from it, in the bad direction (0: the band alone).
        idle_below: a slot where the worker or its peers' median is below this (idle) is
            never outside: an idle GPU is stopped, not slow (``idle_gpu``'s finding), and
            ratios between idle peers are noise (None: no such floor).
    """
    if direction not in ("high", "low", "both"):
        raise ValueError(f"direction must be high, low or both, not {direction!r}")
    n, slots = values.shape
    known = ~np.isnan(values)
    enough_peers = known.sum(axis=0) >= min_peers
    usable = known & enough_peers
    with np.errstate(all="ignore"):
        center = _nanmedian(np.where(enough_peers, values, np.nan), 0)
        spread = math.nan if baseline is None else _relative_spread(baseline)
        if math.isnan(spread):
            scale = MAD_TO_SIGMA * _nanmedian(np.abs(values - center), 0)
        else:
            scale = spread * np.abs(center)
        scale = np.maximum(scale, MIN_RELATIVE_SPREAD * np.abs(center))
        z = (values - center) / scale
        gap = values / center - 1
    if direction == "high":
        out = (z > tolerance) & (gap >= min_relative_gap)
    elif direction == "low":
        out = (z < -tolerance) & (-gap >= min_relative_gap)
    else:
        out = (np.abs(z) > tolerance) & (np.abs(gap) >= min_relative_gap)
    if idle_below is not None:
        with np.errstate(invalid="ignore"):
            out &= (values >= idle_below) & (center >= idle_below)
    count = usable.sum(axis=1)
    outside = np.where(count > 0, (out & usable).sum(axis=1) / np.maximum(count, 1), np.nan)
    with np.errstate(all="ignore"):
        median_z = np.array([np.median(z[i][usable[i]]) if count[i] else np.nan for i in range(n)])
        rel = np.array(
            [np.median((values / center)[i][usable[i]]) if count[i] else np.nan for i in range(n)]
        )
    verdict = np.full(n, Verdict.UNKNOWN, dtype=np.int8)
    judged = (count >= min_coverage * slots) & (slots > 0)
    if (known.any(axis=1)).sum() >= min_peers:
        verdict[judged] = Verdict.CLEAR
        verdict[judged & (np.nan_to_num(outside) >= outside_fraction)] = Verdict.FIRING
    return PeerVerdicts(verdict, outside.astype(np.float64), median_z, rel)


def detect_stragglers(
    ctx: DetectionContext,
    rule: Rule,
    *,
    window_seconds: float,
    tolerance: float,
    outside_fraction: float,
    min_peers: int,
    now: float,
    min_relative_gap: float,
    min_coverage: float = 0.8,
    idle_below: float | None = None,
) -> list[Finding]:
    """One finding per GPU of every training job that held at least ``min_peers`` GPUs for the
    window (serving jobs are not judged: no finding).

    The signal is GPU utilisation, judged downwards only (a worker behind its peers is a GPU
    busy less than theirs); the window before is the baseline for the band's width.
    """
    step = float(ctx.store.step_seconds)
    end = math.floor(now / step) * step
    start = end - window_seconds
    times, gpus = ctx.timelines(start - window_seconds, end)
    if not gpus or len(times) == 0:
        return []
    current = times >= start
    groups = _held_throughout(gpus, ctx.jobs(), times, current, step, end)
    served = {m.name for m in ctx.deployments()}
    findings = []
    for key in sorted(groups):
        rows = groups[key]
        job = ctx.job(key)
        if len(rows) < min_peers or job_kind(job, served) is not JobKind.TRAINING:
            continue
        util = np.vstack([gpus[i].utilization_ratio for i in rows])
        result = straggler_verdicts(
            util[:, current],
            tolerance=tolerance,
            outside_fraction=outside_fraction,
            min_peers=min_peers,
            direction="low",
            baseline=util[:, ~current] if (~current).any() else None,
            min_coverage=min_coverage,
            min_relative_gap=min_relative_gap,
            idle_below=idle_below,
        )
        for j, i in enumerate(rows):
            gpu = gpus[i]
            verdict = Verdict(int(result.verdict[j]))
            rel = float(result.relative_to_peers[j])
            findings.append(
                new_finding(
                    rule,
                    subject=f"{key}/{gpu.node}/{gpu.uuid}",
                    verdict=verdict,
                    window=(start, end),
                    summary=(
                        f"job {key}: GPU {gpu.uuid} on {gpu.node} runs at {rel:.2f}× its "
                        f"{len(rows) - 1} peers' median utilisation"
                        if verdict is Verdict.FIRING
                        else ""
                    ),
                    evidence={
                        "job": key,
                        "team": job.team if job else None,
                        "node": gpu.node,
                        "gpu": gpu.uuid,
                        "peers": len(rows) - 1,
                        "window_minutes": window_seconds / 60,
                        "tolerance_mads": tolerance,
                        "min_relative_gap": min_relative_gap,
                        "outside_ratio": _num(float(result.outside_ratio[j])),
                        "median_robust_z": _num(float(result.median_z[j])),
                        "relative_to_peers": _num(rel),
                    },
                    facts=Facts.of_job(key, job, (gpu.node,)),
                )
            )
    return findings


def _held_throughout(
    gpus: list[GpuTimeline],
    jobs: list[Job],
    times: npt.NDArray[np.float64],
    current: npt.NDArray[np.bool_],
    step: float,
    end: float,
) -> dict[str, list[int]]:
    """Job key → its GPUs (row numbers): those the job held for all of the current window."""
    groups: dict[str, list[int]] = {}
    on_node, ended = jobs_by_node(jobs), ended_at(jobs)
    for i, gpu in enumerate(gpus):
        shares = ownership(gpu, on_node.get(gpu.node, ()), times, step, end, ended=ended)
        main = max(
            (k for k in shares if k != UNALLOCATED),
            key=lambda k: shares[k][current].sum(),
            default="",
        )
        if main and (shares[main][current] > 0.999).all():
            groups.setdefault(main, []).append(i)
    return groups


def _num(value: float) -> float | None:
    return None if math.isnan(value) else value


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerParams:
    """Parameters of ``straggler``."""

    window_seconds: float = duration("10m", "1m", "1d", "Evaluation window.")
    tolerance: float = number(
        3.0, 0.5, 20.0, "Band around the peers' median, in median absolute deviations."
    )
    outside_fraction: float = number(
        0.5, 0.05, 1.0, "Share of the window a worker must spend outside the band."
    )
    min_peers: int = integer(4, 3, 100000, "Jobs with fewer workers are not judged.")
    # 0.1: the smallest slowdown worth a message (synchronous training runs at its slowest
    # worker's pace, so 10 % behind costs the job ~10 %). Checked on the Alibaba PAI mini-batch
    # times (tests/test_detect_straggler.py): jobs 1 and 2 (no stragglers; healthy workers sit up
    # to 11.5 % off the median in a window, held by the MAD band) stay clear with it; in jobs 3
    # and 4, held out, the late stragglers stay flagged (job 3's workers 6, 7 and 9 take 13-18 %
    # longer per mini-batch than the median, job 4's workers 5 and 6 5.0-6.8× as long).
    min_relative_gap: float = number(
        0.1, 0.0, 0.9, "A worker must also be this share below its peers' median."
    )
    # 0.05: idle_gpu's and accounting's idle threshold, not tuned. Issue 14: on the idle fleets
    # of bench/truth a whole job went idle (0-1 %), its GPUs' ratios to each other were noise,
    # and idle GPUs were paged as stragglers; one worker idle among busy peers is stopped, not
    # slow, and is idle_gpu's finding.
    idle_below: float = number(
        0.05, 0.0, 1.0, "Slots where the worker or its peers' median is below this are idle."
    )


def run_straggler(
    ctx: DetectionContext, rule: Rule, p: StragglerParams, now: float
) -> list[Finding]:
    """Engine runner for ``straggler``."""
    return detect_stragglers(
        ctx,
        rule,
        window_seconds=p.window_seconds,
        tolerance=p.tolerance,
        outside_fraction=p.outside_fraction,
        min_peers=p.min_peers,
        now=now,
        min_relative_gap=p.min_relative_gap,
        idle_below=p.idle_below,
    )


DETECTOR = Detector(
    spec=spec_of(
        "straggler",
        "One worker of a distributed training job runs slower than its peers.",
        subjects=(Subject.JOB, Subject.NODE),
        signals=("hw.gpu.utilization", "hw.power"),
        params=StragglerParams,
        selector=("teams", "jobs", "models", "nodes"),
    ),
    params=StragglerParams,
    run=run_straggler,
)
