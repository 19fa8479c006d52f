"""Preemptions: notices, jobs preempted or requeued, jobs whose node went away.

Per job active in the window (watched price tiers only), the preemptions seen in the window:

- a ``preemption_notice`` event whose subject is the job key, or a node the job runs on (a spot
  reclaim notice names the instance);
- the job's state is ``preempted`` (end time in the window) or ``requeued`` (its end time, else
  its submit time, in the window);
- the node gone, for spot jobs only: a node the running spot job is allocated on sent GPU
  telemetry in the window but nothing in the last ``NODE_SILENT_SECONDS`` (a reclaimed spot
  instance vanishes; an on-demand or reserved node that goes quiet is the ``node_silent``
  rule's finding, most often its agent alone).

Work lost since the last checkpoint, when known: a job label (``LAST_CHECKPOINT_LABELS``, Unix
seconds, set by the workload or its launcher, e.g. the pod label ``gpuwarden.io/last-checkpoint``)
gives the last checkpoint; lost GPU-hours are ``GPUs × (preemption − max(checkpoint, start))``,
priced at the job's tier. Without the label the loss is ``None`` (unknown), never 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict, new_finding
from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.rules.durations import format_duration
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, integer, texts
from gpuwarden.collector.storage.records import Event, EventKind

#: job labels holding the Unix time of the job's last checkpoint (first present wins)
LAST_CHECKPOINT_LABELS = ("gpuwarden.io/last-checkpoint", "gpuwarden.last_checkpoint")
#: a node silent this long while its job runs is gone
NODE_SILENT_SECONDS = 180.0
#: a notice and the preemption that follows it this soon are one preemption
NOTICE_MERGE_SECONDS = 1800.0


@dataclass(frozen=True, slots=True)
class Preemption:
    """One preemption of one job: when, and how it was seen."""

    time: float
    cause: str


def last_checkpoint(job: Job) -> float | None:
    """The job's last checkpoint time from its labels, or None when not known or not a number."""
    for label in LAST_CHECKPOINT_LABELS:
        text = job.labels.get(label)
        if text is None:
            continue
        try:
            value = float(text)
        except ValueError:
            continue
        if math.isfinite(value):
            return value
    return None


def work_lost_seconds(job: Job, at: float) -> float | None:
    """Seconds of work since the last checkpoint (or the job's start) lost at ``at``."""
    checkpoint = last_checkpoint(job)
    if checkpoint is None:
        return None
    since = max(checkpoint, job.start_time) if job.start_time is not None else checkpoint
    return max(0.0, at - since)


def job_preemptions(
    job: Job,
    events: Sequence[Event],
    gone_nodes: dict[str, float],
    *,
    start: float,
    end: float,
    spot: bool = True,
) -> list[Preemption]:
    """Preemptions of ``job`` in ``[start, end)`` (see the module docstring), one per time."""
    nodes = {a.node for a in job.allocations}
    found: dict[float, Preemption] = {}
    for event in events:
        if event.kind is not EventKind.PREEMPTION_NOTICE or not start <= event.time < end:
            continue
        if event.subject == job.key or event.subject in nodes:
            found.setdefault(event.time, Preemption(event.time, "notice"))
    if job.state is JobState.PREEMPTED:
        at = job.end_time
        if at is not None and start <= at < end:
            found.setdefault(at, Preemption(at, "preempted"))
    if job.state is JobState.REQUEUED:
        at = job.end_time if job.end_time is not None else job.submit_time
        if at is not None and start <= at < end:
            found.setdefault(at, Preemption(at, "requeued"))
    if spot and job.state in (JobState.RUNNING, JobState.SUSPENDED):
        for node in sorted(nodes):
            if node in gone_nodes and start <= gone_nodes[node] < end:
                found.setdefault(gone_nodes[node], Preemption(gone_nodes[node], "node gone"))
    # a notice followed by the preemption it announced is one preemption
    times = sorted(found)
    merged: list[Preemption] = []
    for t in times:
        if merged and merged[-1].cause == "notice" and t - merged[-1].time <= NOTICE_MERGE_SECONDS:
            merged[-1] = Preemption(t, f"notice, then {found[t].cause}")
            continue
        merged.append(found[t])
    return merged


def gone_nodes(ctx: DetectionContext, start: float, end: float) -> dict[str, float]:
    """Node → time of its last GPU sample, for nodes seen in ``[start, end)`` but silent for the
    last ``NODE_SILENT_SECONDS``."""
    info = ctx.store.matrix("gpuwarden.gpu.info", start=start, end=end)
    last: dict[str, float] = {}
    for series, row in zip(info.series, info.values, strict=True):
        seen = np.flatnonzero(~np.isnan(row))
        if seen.size:
            node = str(series.attributes.get("host.name", ""))
            last[node] = max(last.get(node, -math.inf), float(info.times[seen[-1]]))
    cutoff = end - NODE_SILENT_SECONDS
    return {node: t for node, t in last.items() if t < cutoff}


def _active(job: Job, start: float) -> bool:
    if job.state in (JobState.RUNNING, JobState.SUSPENDED, JobState.REQUEUED):
        return True
    return job.end_time is not None and job.end_time >= start


def detect_preemptions(
    ctx: DetectionContext,
    rule: Rule,
    *,
    window_seconds: float,
    min_preemptions: int,
    price_tiers: Sequence[str],
    now: float,
) -> list[Finding]:
    """One finding per watched job active in the window; FIRING at ``min_preemptions``."""
    end = now
    start = end - window_seconds
    events = ctx.events(since=start, kinds=[EventKind.PREEMPTION_NOTICE])
    gone = gone_nodes(ctx, start, end)
    refs = {(g.node, g.index): g for g in ctx.gpus()}
    default_tier = ctx.default_price_tier
    findings = []
    for job in sorted(ctx.jobs(), key=lambda j: j.key):
        tier = job.price_tier or default_tier
        if tier not in price_tiers or not _active(job, start):
            continue
        found = job_preemptions(job, events, gone, start=start, end=end, spot=tier == "spot")
        verdict = Verdict.FIRING if len(found) >= min_preemptions else Verdict.CLEAR
        lost = [work_lost_seconds(job, p.time) for p in found]
        known_lost = [s for s in lost if s is not None]
        gpus = job.gpus or sum(max(len(a.indices), len(a.uuids)) for a in job.allocations)
        ref = next(
            (refs[a.node, i] for a in job.allocations for i in a.indices if (a.node, i) in refs),
            None,
        )
        model = ref.model if ref is not None else "unknown"
        lost_h = (
            gpus * sum(known_lost) / 3600 if known_lost and len(known_lost) == len(lost) else None
        )
        price = ctx.price(model, tier, ref.cluster if ref is not None else None)
        nodes = sorted({a.node for a in job.allocations})
        findings.append(
            new_finding(
                rule,
                subject=job.key,
                verdict=verdict,
                window=(start, end),
                summary=(
                    f"job {job.key} ({tier}) preempted {len(found)}× in "
                    f"{format_duration(window_seconds)}: {'; '.join(p.cause for p in found)}"
                    if verdict is Verdict.FIRING
                    else ""
                ),
                evidence={
                    "job": job.key,
                    "team": job.team,
                    "node": nodes[0] if len(nodes) == 1 else None,
                    "nodes": ",".join(nodes) or None,
                    "price_tier": tier,
                    "state": str(job.state),
                    "preemptions": len(found),
                    "causes": "; ".join(p.cause for p in found) or None,
                    "last_preemption_time": found[-1].time if found else None,
                    "last_checkpoint_time": last_checkpoint(job),
                    "gpus": gpus,
                    "work_lost_gpu_hours": lost_h,
                    "work_lost_usd": lost_h * price if lost_h is not None else None,
                },
                facts=Facts.of_job(job.key, job, nodes),
            )
        )
    return findings


@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptionParams:
    """Parameters of ``preemption``."""

    window_seconds: float = duration("1h", "5m", "1w", "Counting window.")
    min_preemptions: int = integer(1, 1, 1000, "Preemptions of one job in the window.")
    price_tiers: tuple[str, ...] = texts(
        ("on-demand", "spot", "reserved"),
        "Price tiers watched.",
        choices=("on-demand", "spot", "reserved"),
    )


def run_preemption(
    ctx: DetectionContext, rule: Rule, p: PreemptionParams, now: float
) -> list[Finding]:
    """Engine runner for ``preemption``."""
    return detect_preemptions(
        ctx,
        rule,
        window_seconds=p.window_seconds,
        min_preemptions=p.min_preemptions,
        price_tiers=p.price_tiers,
        now=now,
    )


DETECTOR = Detector(
    spec=spec_of(
        "preemption",
        "Jobs are being preempted (spot reclaim, priority).",
        subjects=(Subject.JOB,),
        signals=("gpuwarden.gpu.info",),
        params=PreemptionParams,
        selector=("teams", "jobs", "models", "nodes"),
    ),
    params=PreemptionParams,
    run=run_preemption,
)
