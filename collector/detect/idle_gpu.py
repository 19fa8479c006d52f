"""``idle_gpu``: GPUs allocated to a job stayed idle for a whole window (one finding per job).

Screened for every GPU at once on the store's series × time matrix. A GPU is idle when a job holds
it for the whole window and its samples stay below the threshold, but for at most
``busy_fraction_tolerated`` of the window's slots (heartbeat blips), with at least
``min_coverage`` of the window's slots sampled. A window with too few samples is UNKNOWN: missing
data never counts as idle, and never as healthy; nor as the job letting the GPU go: a slot where
the GPU sent nothing and no scheduler allocation speaks (``gpu_time.holders``) is unknown, not
"not held" (issue 17: a sender whose newest sample reached the collector just after each
detection cycle, as vmagent's exactly periodic scrapes can, left that slot unheld every cycle,
so a job known only from its processes, a pod dcgm-exporter names, never fired). Jobs holding
fewer than ``min_gpus`` GPUs in the window are not judged (no finding).

GPUs are judged one by one, and reported per job: one finding (so one incident, one requeue
approval) for all the idle GPUs of a job, listing them and their nodes.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.accounting.gpu_time import holders
from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict, new_finding
from gpuwarden.collector.rules.durations import format_duration
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import coverage, duration, integer, number

FloatMatrix = npt.NDArray[np.floating[Any]]
BoolMatrix = npt.NDArray[np.bool_]

#: 2 %: a 30-minute window at 10 s (180 slots) tolerates 3 busy samples (a health check, a
#: heartbeat kernel, ``nvidia-smi`` polling); an intermittent job busy one slot in ten, or a
#: minute of real work in the half hour (6 slots), stays busy. Chosen on those two shapes
#: (tests/test_detect_idle.py), not fitted to any data set.
BUSY_FRACTION_TOLERATED = 0.02


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleGpuParams:
    """Parameters of ``idle_gpu``."""

    window_seconds: float = duration("30m", "1m", "1w", "How long the GPU must stay idle.")
    utilization_below: float = number(
        0.05, 0.0, 1.0, "A sample is idle when GPU utilisation is below this ratio."
    )
    min_coverage: float = coverage()
    min_gpus: int = integer(1, 1, 100_000, "Only jobs holding at least this many GPUs.")
    busy_fraction_tolerated: float = number(
        BUSY_FRACTION_TOLERATED,
        0.0,
        0.5,
        "Share of the window's slots that may be busy (heartbeats, monitoring probes) in an "
        "idle window.",
    )


def idle_verdicts(
    utilization: FloatMatrix,
    held: BoolMatrix,
    *,
    threshold_ratio: float,
    min_coverage: float = 0.8,
    busy_fraction_tolerated: float = BUSY_FRACTION_TOLERATED,
    unknown_holder: BoolMatrix | None = None,
) -> npt.NDArray[np.int8]:
    """Per GPU (row): FIRING, CLEAR or UNKNOWN over the window the columns span.

    A window is busy (CLEAR) when more than ``busy_fraction_tolerated`` of its slots hold a
    sample at or above the threshold, whatever the coverage: busy samples are evidence of
    activity. Otherwise it is idle (FIRING) with enough coverage, else UNKNOWN.

    Args:
        utilization: GPUs × slots, NaN where no sample arrived.
        held: GPUs × slots, True where a job held the GPU.
        threshold_ratio: utilisation below this is idle.
        min_coverage: fraction of slots that must have a sample for any verdict.
        busy_fraction_tolerated: share of the window's slots that may be busy in an idle
            window (brief blips: issue 14, one heartbeat sample cleared 30 minutes).
        unknown_holder: GPUs × slots, True where nothing tells whether the job held the GPU
            (no sample, no allocation): such a slot without a utilisation sample is not "not
            held"; it counts against coverage only. None: every slot's ``held`` is known.
    """
    if utilization.shape != held.shape:
        raise ValueError(f"shapes differ: {utilization.shape} vs {held.shape}")
    if unknown_holder is not None:
        if unknown_holder.shape != held.shape:
            raise ValueError(f"shapes differ: {unknown_holder.shape} vs {held.shape}")
        held = held | (unknown_holder & np.isnan(utilization))  # a sample speaks for itself
    if not 0 < min_coverage <= 1:
        raise ValueError("min_coverage must be in (0, 1]")
    known = ~np.isnan(utilization)
    n_slots = utilization.shape[1]
    coverage = known.sum(axis=1) / n_slots if n_slots else np.zeros(utilization.shape[0])
    busy_count = (known & (np.nan_to_num(utilization, nan=0.0) >= threshold_ratio)).sum(axis=1)
    busy_seen = busy_count > math.floor(busy_fraction_tolerated * n_slots + 1e-9)
    held_all = held.all(axis=1) if n_slots else np.zeros(utilization.shape[0], dtype=bool)
    verdict = np.full(utilization.shape[0], Verdict.UNKNOWN, dtype=np.int8)
    enough = coverage >= min_coverage
    verdict[~held_all] = Verdict.CLEAR  # not allocated for the whole window: not this rule's case
    verdict[held_all & busy_seen] = Verdict.CLEAR  # busy beyond the tolerated blips
    verdict[held_all & enough & ~busy_seen] = Verdict.FIRING
    return verdict


def job_verdict(verdicts: npt.NDArray[np.int8]) -> Verdict:
    """A job's verdict from its GPUs': FIRING when any is idle, CLEAR when all are known busy
    (or not held throughout), else UNKNOWN (a GPU without data is never counted healthy)."""
    if (verdicts == Verdict.FIRING).any():
        return Verdict.FIRING
    if (verdicts == Verdict.CLEAR).all():
        return Verdict.CLEAR
    return Verdict.UNKNOWN


def run_idle_gpu(ctx: DetectionContext, rule: Rule, p: IdleGpuParams, now: float) -> list[Finding]:
    """One finding per job holding GPUs in the window: FIRING when it left any of them idle
    for the whole window.

    The subject is the job, not the GPU (issue 14: a job with 8 idle GPUs was 8 incidents and
    8 requeue approvals): the remedy, a requeue, acts on the job, so one incident and one
    approval. Evidence: the idle GPUs (``gpu_ids``: ``node/uuid,...``; ``gpu``: their UUIDs),
    their nodes, the job's width, mean utilisation and coverage of the idle GPUs (of all the
    job's GPUs when none is idle), idle GPU-hours and what the window cost at the job's price
    tier. GPUs no job held in the window are not this rule's case (no finding); a job that
    ends or moves off its GPUs is judged CLEAR while it still holds them for part of the window,
    so its incident resolves.
    """
    step = ctx.store.step_seconds
    end = math.floor(now / step) * step
    start = end - p.window_seconds
    times, gpus = ctx.timelines(start, end)
    if not gpus or len(times) == 0:
        return []
    util = np.vstack([g.utilization_ratio for g in gpus])
    found = holders(gpus, ctx.jobs(), times, step, end)
    owner = found.owners
    verdicts = idle_verdicts(
        util, found.held, threshold_ratio=p.utilization_below, min_coverage=p.min_coverage,
        busy_fraction_tolerated=p.busy_fraction_tolerated, unknown_holder=found.unknown,
    )  # fmt: skip
    rows_of: dict[str, list[int]] = {}
    for i, key in enumerate(owner):
        if key:
            rows_of.setdefault(key, []).append(i)
    hours = p.window_seconds / 3600
    findings = []
    for key in sorted(rows_of):
        rows = rows_of[key]
        if len(rows) < p.min_gpus:
            continue  # the job is narrower than the rule looks at
        job = ctx.job(key)
        verdict = job_verdict(verdicts[rows])
        idle = [i for i in rows if verdicts[i] == Verdict.FIRING]
        shown = idle or rows
        block = util[shown]
        known = ~np.isnan(block)
        tier = (job.price_tier if job and job.price_tier else gpus[rows[0]].price_tier) or (
            ctx.default_price_tier
        )
        usd = sum(ctx.price(gpus[i].model, tier, gpus[i].cluster) for i in idle) * hours
        idle_nodes = sorted({gpus[i].node for i in idle})
        nodes = idle_nodes or sorted({gpus[i].node for i in rows})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slots stay NaN
            per_slot = np.nanmean(block, axis=0)
        findings.append(
            new_finding(
                rule,
                subject=key,
                verdict=verdict,
                window=(start, end),
                facts=Facts.of_job(key, job, (gpus[i].node for i in rows)),
                summary=(
                    f"job {key} left {len(idle)} of its {len(rows)} GPU(s) idle for "
                    f"{format_duration(p.window_seconds)} on {', '.join(idle_nodes)}"
                    if verdict is Verdict.FIRING
                    else ""
                ),
                evidence={
                    "job": key,
                    "team": job.team if job else None,
                    "node": nodes[0] if len(nodes) == 1 else None,
                    "nodes": ",".join(nodes),
                    "gpu": ",".join(gpus[i].uuid for i in idle) or None,
                    "gpu_ids": ",".join(f"{gpus[i].node}/{gpus[i].uuid}" for i in idle) or None,
                    "idle_gpus": len(idle),
                    "job_gpus": len(rows),
                    "window_minutes": p.window_seconds / 60,
                    "threshold_ratio": p.utilization_below,
                    "mean_utilization_ratio": float(block[known].mean()) if known.any() else None,
                    "coverage_ratio": float(known.mean()),
                    "idle_gpu_hours": len(idle) * hours,
                    "wasted_usd": usd,
                    "price_tier": tier,
                },
                points=(
                    (float(t), float(v))
                    for t, v in zip(times, per_slot, strict=True)
                    if not math.isnan(v)
                ),
            )
        )
    return findings


DETECTOR = Detector(
    spec=spec_of(
        "idle_gpu",
        "GPUs allocated to a job stayed idle for a whole window (one finding per job).",
        subjects=(Subject.JOB,),
        signals=("hw.gpu.utilization", "gpuwarden.gpu.process.utilization"),
        params=IdleGpuParams,
        selector=("teams", "jobs", "models", "nodes"),
    ),
    params=IdleGpuParams,
    run=run_idle_gpu,
)
