"""``level_shift`` on GPUs that jobs hold: the holder's tenure, its traffic, one finding per job.

Three facts about who holds a GPU change what a level shift of its series means:

- **Tenure.** A job ending or starting on a GPU moves its utilisation, and that is not a drop:
  the series is judged from the GPU's newest holder change on (:func:`tenures`; "nobody" is a
  holder too), so a baseline never straddles two jobs. A tenure younger than half the baseline
  is UNKNOWN.
- **Traffic.** A serving job's utilisation follows the requests it serves: the daily curve,
  the end of a burst. For a job that serves a model (``Job.model``), a candidate is compared
  with its traffic (:func:`traffic_explains`): the model's request rate now against the
  baseline's scales the level the GPU is expected at, and only a change beyond that by at
  least ``min_change`` is judged further. Without the model's request rate the change cannot
  be told from its traffic: UNKNOWN, not a guess.
- **One finding per job.** The GPUs of one job shift together (one job slowed down), so their
  rows fold into one finding whose subject is the job (:func:`fold_by_job`), listing its GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.accounting.gpu_time import (
    UNALLOCATED,
    GpuTimeline,
    ended_at,
    jobs_by_node,
    ownership,
)
from gpuwarden.collector.detect.contract import DetectionContext
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict, new_finding
from gpuwarden.collector.detect.model_series import model_of
from gpuwarden.collector.detect.numerics import screen
from gpuwarden.collector.jobs.model import Job
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.store.types import SeriesInfo

FloatVector = npt.NDArray[np.float64]
BoolVector = npt.NDArray[np.bool_]
REQUESTS_METRIC = "gpuwarden.model.requests"


@dataclass(frozen=True, slots=True)
class Tenure:
    """Who holds a series' GPU at the end of the span, and since when."""

    holder: str
    """The job key ("" = nobody, or the GPU is not known)."""
    mask: BoolVector
    """Slots in the current holder's tenure (all True when the holder never changed)."""
    previous: str | None = None
    """The holder before the newest change (None: no change in the span)."""
    since: float | None = None
    """Start of the first slot of the current tenure, when it changed in the span."""


def _holders(
    gpu: GpuTimeline,
    jobs: Sequence[Job],
    times: FloatVector,
    step: float,
    now: float,
    ended: Mapping[str, float],
) -> tuple[list[str], npt.NDArray[np.int64]]:
    """Per slot, the job holding the largest share of the GPU ("" for nobody), as the distinct
    holders and each slot's index into them; ``jobs``: those on the GPU's node, ``ended``:
    :func:`ended_at` of every job."""
    shares = ownership(gpu, jobs, times, step, now, ended=ended)
    if not shares:
        return [""], np.zeros(len(times), dtype=np.int64)
    names: list[str] = []
    code_of: dict[str, int] = {}
    codes = []
    for key in shares:
        name = "" if key == UNALLOCATED else key
        if name not in code_of:
            code_of[name] = len(names)
            names.append(name)
        codes.append(code_of[name])
    main = np.argmax(np.vstack(list(shares.values())), axis=0)
    return names, np.asarray(codes, dtype=np.int64)[main]


def tenures(
    ctx: DetectionContext,
    infos: Sequence[SeriesInfo],
    values: npt.NDArray[np.float64],
    times: FloatVector,
    step: float,
    span: tuple[float, float],
) -> list[Tenure]:
    """Each row's tenure over ``times`` (the slots of ``store.matrix(start=span[0],
    end=span[1])``); a series whose GPU (``host.name``, ``hw.id``) has no timeline has one
    tenure. A slot without a sample keeps the holder of the sample before it: a gap in the data
    is not a change of holder."""
    start, end = span
    slot_times, gpus = ctx.timelines(start, end)
    by_gpu = {(g.node, g.uuid): g for g in gpus}
    index = {round(float(t) / step): i for i, t in enumerate(slot_times)}
    jobs = ctx.jobs()
    on_node, ended = jobs_by_node(jobs), ended_at(jobs)
    grid = np.asarray(slot_times, dtype=np.float64)
    # each column of the series' grid as a slot of the timelines' grid (-1: none)
    slot_of = np.array([index.get(round(float(t) / step), -1) for t in times], dtype=np.int64)
    out = []
    for row, info in enumerate(infos):
        attrs = info.attributes
        gpu = by_gpu.get((str(attrs.get("host.name", "")), str(attrs.get("hw.id", ""))))
        if gpu is None or not len(times):
            out.append(Tenure("", np.ones(len(times), dtype=np.bool_)))
            continue
        names, per_slot = _holders(gpu, on_node.get(gpu.node, []), grid, step, end, ended)
        if "" not in names:
            names.append("")
        nobody = names.index("")
        # holders as codes into ``names`` (one per distinct holder), vectorised per series
        holder = np.where(slot_of >= 0, per_slot[np.maximum(slot_of, 0)], nobody)
        known = ~np.isnan(values[row])
        last = np.maximum.accumulate(np.where(known, np.arange(len(times)), -1))
        first = int(np.argmax(known)) if known.any() else 0
        filled = np.where(last >= 0, holder[np.maximum(last, 0)], holder[first])
        current = int(filled[-1])
        changed = np.flatnonzero(filled != current)
        if not changed.size:
            out.append(Tenure(names[current], np.ones(len(times), dtype=np.bool_)))
            continue
        cut = int(changed[-1])
        mask = np.arange(len(times)) > cut
        out.append(
            Tenure(
                names[current],
                mask,
                previous=names[int(filled[cut])],
                since=float(times[cut + 1]),
            )
        )
    return out


def model_rates(
    ctx: DetectionContext, models: set[str], start: float, end: float, width: int
) -> dict[str, FloatVector]:
    """Requests per second served of each model (all outcomes and replicas), per slot; a
    series' model is read as the model detectors read it (``model_series.model_of``)."""
    if not models:
        return {}
    matrix = ctx.store.matrix(REQUESTS_METRIC, start=start, end=end)
    if matrix.values.shape[1] != width:
        return {}
    rows: dict[str, list[int]] = {}
    for i, info in enumerate(matrix.series):
        model = model_of(info)
        if model in models:
            rows.setdefault(model, []).append(i)
    rates = {}
    for model, picked in rows.items():
        block = np.asarray(matrix.values[picked], dtype=np.float64)
        known = ~np.isnan(block)
        rates[model] = np.where(known.any(axis=0), np.nansum(block, axis=0), np.nan)
    return rates


def traffic_ratio(rate: FloatVector | None, baseline: BoolVector, hold_slots: int) -> float:
    """The request rate over the newest ``hold_slots`` against the baseline's (median over the
    slots of ``baseline``); NaN when either is unknown or the baseline served nothing."""
    if rate is None:
        return math.nan
    before = screen.nanmedian(np.where(baseline, rate, np.nan)[np.newaxis, :], axis=1)[0]
    recent = rate[-hold_slots:]
    if not np.isfinite(before) or before <= 0 or np.isnan(recent).all():
        return math.nan
    return float(np.nanmean(recent) / before)


def traffic_explains(
    level: float, before: float, ratio: float, direction: str, min_change: float
) -> bool:
    """Whether the traffic explains the level: the GPU is expected at ``before × ratio`` (its
    utilisation in proportion to the requests it serves); the change beyond that must reach
    ``min_change`` on the rule's side to count. Proportionality overstates how far a GPU with a
    fixed load falls with its traffic, so a fall that follows the traffic is always explained."""
    unexplained = level - before * ratio
    if direction == "decrease":
        return unexplained > -min_change
    if direction == "increase":
        return unexplained < min_change
    return abs(unexplained) < min_change


@dataclass(frozen=True, slots=True)
class Judged:
    """One series' verdict in one cycle, before folding by job."""

    info: SeriesInfo
    holder: str
    previous: str | None
    """The holder before the newest change in the span (None: no change)."""
    verdict: Verdict
    summary: str
    evidence: dict[str, object]
    pending: bool
    """A candidate that could not be judged this cycle (fit budget, no request rate): its job
    is UNKNOWN, not clear."""
    finding: Finding


def fold_by_job(ctx: DetectionContext, rule: Rule, rows: Sequence[Judged]) -> list[Finding]:
    """One finding per job holding any of the rows' GPUs (subject ``job:<key>``), and the rows
    of GPUs nobody holds as they are.

    The job fires when any of its GPUs fires; it is UNKNOWN while a candidate of it waits or
    when none of its GPUs could be judged; otherwise clear. The evidence lists the GPUs that
    shifted (all of them when none did) and carries the numbers of the one that moved most.
    """
    out = [r.finding for r in rows if not r.holder]
    groups: dict[str, list[Judged]] = {}
    for r in rows:
        if r.holder:
            groups.setdefault(r.holder, []).append(r)
    out += _left(ctx, rule, rows, set(groups))
    for key, members in groups.items():
        fired = [r for r in members if r.verdict is Verdict.FIRING]
        if fired:
            verdict = Verdict.FIRING
        elif any(r.pending for r in members) or all(r.verdict is Verdict.UNKNOWN for r in members):
            verdict = Verdict.UNKNOWN
        else:
            verdict = Verdict.CLEAR
        listed = fired or members
        lead = max(listed, key=lambda r: abs(_number(r.evidence.get("change"))))
        gpus = sorted({str(r.info.attributes.get("hw.id", "")) for r in listed} - {""})
        nodes = sorted({str(r.info.attributes.get("host.name", "")) for r in members} - {""})
        evidence = {
            **lead.evidence,
            "job": key,
            "node": ", ".join(nodes),
            "gpu": ", ".join(gpus),
            "gpus": len(members),
            "gpus_judged": sum(r.verdict is not Verdict.UNKNOWN for r in members),
            "gpus_shifted": len(fired),
        }
        summary = lead.summary
        if fired:
            summary = f"job {key}: {len(fired)} of {len(members)} GPUs shifted; {lead.summary}"
        out.append(
            new_finding(
                rule,
                subject=f"job:{key}",
                verdict=verdict,
                window=(lead.finding.window_start, lead.finding.window_end),
                facts=Facts.of_job(key, ctx.job(key), nodes),
                summary=summary,
                evidence={
                    k: v for k, v in evidence.items() if isinstance(v, str | int | float | bool)
                },
                points=lead.finding.points if verdict is Verdict.FIRING else (),
            )
        )
    return out


def _left(
    ctx: DetectionContext, rule: Rule, rows: Sequence[Judged], holding: set[str]
) -> list[Finding]:
    """A CLEAR finding for each job that held some of the rows' GPUs earlier in the span and
    holds none of them now: its incident resolves instead of waiting for a job that is gone."""
    gone: dict[str, list[Judged]] = {}
    for r in rows:
        if r.previous and r.previous not in holding:
            gone.setdefault(r.previous, []).append(r)
    out = []
    for key, members in gone.items():
        nodes = sorted({str(r.info.attributes.get("host.name", "")) for r in members} - {""})
        gpus = sorted({str(r.info.attributes.get("hw.id", "")) for r in members} - {""})
        out.append(
            new_finding(
                rule,
                subject=f"job:{key}",
                verdict=Verdict.CLEAR,
                window=(members[0].finding.window_start, members[0].finding.window_end),
                facts=Facts.of_job(key, ctx.job(key), nodes),
                summary=f"job {key} no longer holds its GPUs",
                evidence={"job": key, "node": ", ".join(nodes), "gpu": ", ".join(gpus),
                          "gpus": len(members), "left": True},
            )
        )  # fmt: skip
    return out


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0
