"""``node_silent``: a node's agent stopped reporting while jobs run on its GPUs.

Freshness is the store's: a node is silent when its newest point, from any series, is older than
the store's ``staleness_seconds`` (the collector config's key, one definition for ``/metrics``,
``/status`` and every detector) plus the rule's ``grace_seconds``. While it is silent its series
are stale and every other detector reads them as unknown, so without this rule a dead agent
would look like nothing at all.

A job runs on the node when the scheduler lists it running (or suspended) with an allocation
there, or when the agent saw its processes on the node's GPUs in its last reports and no
scheduler says it has ended. Those last process series are stale by definition; this rule reads
who they belonged to (identity), never their values as a state of now.

Verdicts, one per node with GPUs the store still holds: FIRING while it is silent with jobs on
it; CLEAR when it reports again, or when it is silent with no job at stake (an idle node that
was switched off is not an incident; ``with_jobs_only: false`` makes it one). A node the store
has evicted (silent for the whole recent window) gets no finding, so its incident stays open
until someone looks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict, new_finding
from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, flag

PROCESS_METRIC = "gpuwarden.gpu.process.memory.usage"
RUNNING = (JobState.RUNNING, JobState.SUSPENDED)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSilentParams:
    """Parameters of ``node_silent``."""

    grace_seconds: float = duration(
        "0s",
        "0s",
        "1d",
        "Silence beyond the collector's staleness_seconds before the rule fires "
        "(0: as soon as the node's series are stale).",
    )
    with_jobs_only: bool = flag(
        True, "Fire only while jobs run on the node's GPUs (false: any silent GPU node)."
    )


def _scheduled(jobs: list[Job]) -> dict[str, set[str]]:
    """Node → keys of the jobs a scheduler lists running with an allocation there."""
    out: dict[str, set[str]] = {}
    for job in jobs:
        if job.state in RUNNING:
            for alloc in job.allocations:
                out.setdefault(alloc.node, set()).add(job.key)
    return out


def _last_processes(
    ctx: DetectionContext, last_seen: Mapping[str, float], step: float
) -> dict[str, set[str]]:
    """Node → keys of the jobs whose processes the agent reported in its last rounds, unless
    a scheduler says the job has ended."""
    latest = ctx.store.latest(PROCESS_METRIC, max_age_seconds=math.inf)
    out: dict[str, set[str]] = {}
    for info, t in zip(latest.series, latest.times.tolist(), strict=True):
        attrs = info.attributes
        node = str(attrs.get("host.name", ""))
        scheduler = attrs.get("gpuwarden.job.scheduler")
        ident = attrs.get("gpuwarden.job.id") or attrs.get("k8s.pod.uid")
        seen = last_seen.get(node)
        if scheduler is None or ident is None or seen is None or not t >= seen - 2 * step:
            continue  # not attributed, or a process that had ended before the node went quiet
        key = ctx.resolve_job(str(scheduler), str(ident), node)
        job = ctx.job(key)
        if job is not None and job.state not in RUNNING and job.end_time is not None:
            continue
        out.setdefault(node, set()).add(key)
    return out


def run_node_silent(
    ctx: DetectionContext, rule: Rule, p: NodeSilentParams, now: float
) -> list[Finding]:
    """One finding per GPU node the store holds: FIRING while it is silent with jobs on it."""
    store = ctx.store
    bound = store.staleness_seconds
    last_seen = store.last_seen_by_host()
    gpus: dict[str, int] = {}
    for ref in ctx.gpus():
        if ref.parent_uuid is None:
            gpus[ref.node] = gpus.get(ref.node, 0) + 1
    jobs = _scheduled(ctx.jobs())
    for node, keys in _last_processes(ctx, last_seen, store.step_seconds).items():
        jobs.setdefault(node, set()).update(keys)
    findings = []
    for node in sorted(set(gpus) & set(last_seen)):
        silent_seconds = max(0.0, now - last_seen[node])
        silent = silent_seconds > bound + p.grace_seconds
        on_it = sorted(jobs.get(node, ()))
        firing = silent and (bool(on_it) or not p.with_jobs_only)
        first = ctx.job(on_it[0]) if on_it else None
        if firing:
            running = f"{len(on_it)} job(s) on its GPUs: {', '.join(on_it)}" if on_it else "no job"
            summary = f"node {node} silent for {silent_seconds:.0f} s; {running}"
        elif silent:
            summary = f"node {node} silent for {silent_seconds:.0f} s; no job on its GPUs"
        else:
            summary = f"node {node} reporting"
        findings.append(
            new_finding(
                rule,
                subject=node,
                verdict=Verdict.FIRING if firing else Verdict.CLEAR,
                window=(last_seen[node], now),
                facts=Facts(
                    team=first.team if first and len(on_it) == 1 else None,
                    job=on_it[0] if len(on_it) == 1 else None,
                    nodes=(node,),
                ),
                summary=summary,
                evidence={
                    "node": node,
                    "last_seen_unix": last_seen[node],
                    "silent_seconds": silent_seconds,
                    "staleness_seconds": bound,
                    "grace_seconds": p.grace_seconds,
                    "gpus": gpus[node],
                    "jobs": ", ".join(on_it) or None,
                    "job": on_it[0] if on_it else None,
                },
            )
        )
    return findings


DETECTOR = Detector(
    spec=spec_of(
        "node_silent",
        "A node's agent stopped reporting while jobs run on its GPUs.",
        subjects=(Subject.NODE,),
        signals=("gpuwarden.gpu.info", PROCESS_METRIC),
        params=NodeSilentParams,
        selector=("nodes",),
    ),
    params=NodeSilentParams,
    run=run_node_silent,
)
