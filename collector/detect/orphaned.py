"""``orphaned_memory``: GPU memory held by processes of no running job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.accounting.gpu_time import UNALLOCATED, ended_at, jobs_by_node, ownership
from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict
from gpuwarden.collector.detect.waste import (
    LIVE_STATES,
    Window,
    orphan_processes,
    slot_end,
    waste_finding,
)
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, integer


@dataclass(frozen=True, slots=True, kw_only=True)
class OrphanedMemoryParams:
    """Parameters of ``orphaned_memory``."""

    memory_above_bytes: int = integer(
        1 << 30, 0, None, "Ignore orphans holding less GPU memory than this."
    )
    grace_seconds: float = duration(
        "10m", "0s", "1d", "Time after the owning job ended before memory counts as orphaned."
    )


#: samples this many store steps old or newer count as "the process holds memory now"
FRESH_STEPS = 3


def run_orphaned_memory(
    ctx: DetectionContext, rule: Rule, p: OrphanedMemoryParams, now: float
) -> list[Finding]:
    """One finding per GPU with fresh telemetry: FIRING when processes whose job is not running
    (or that belong to no job) have held more than ``memory_above_bytes`` past the grace.

    A process without job attribution on a GPU that a running job holds counts as that job's
    (the agent could not read its cgroup). A GPU with no fresh sample at all is UNKNOWN.
    """
    memory_above_bytes, grace_seconds = float(p.memory_above_bytes), p.grace_seconds
    step = float(ctx.store.step_seconds)
    end = slot_end(ctx, now, step) + step
    fresh = FRESH_STEPS * step
    start = end - grace_seconds - fresh
    procs = ctx.store.matrix("gpuwarden.gpu.process.memory.usage", start=start, end=end)
    times = procs.times
    recent = times >= end - fresh
    live_jobs = {j.key: j for j in ctx.jobs() if j.state in LIVE_STATES}
    _, timelines = ctx.timelines(end - step, end)
    held_now: dict[tuple[str, str], bool] = {}
    on_node, ended = jobs_by_node(list(live_jobs.values())), ended_at(list(live_jobs.values()))
    for gpu in timelines:
        node_jobs = on_node.get(gpu.node, ())
        shares = ownership(gpu, node_jobs, np.array([end - step]), step, now, ended=ended)
        held_now[gpu.node, gpu.uuid] = any(
            k != UNALLOCATED and v[-1] > 0 for k, v in shares.items()
        )
    table = _process_table(ctx, procs, recent, held_now)
    memory, since, gone = table.memory, table.since, table.gone
    where, owners, pids = table.where, table.owners, table.pids
    n = len(where)
    orphan = orphan_processes(memory, since, gone, now=now, grace_seconds=grace_seconds)
    fresh_gpus = _fresh_gpus(ctx, end - fresh, end) | {
        where[i] for i in range(n) if not np.isnan(memory[i])
    }
    empty = np.zeros((0, 0), dtype=bool)
    win = Window(start, end, times, step, [], [], empty, empty)
    orphans_on: dict[tuple[str, str], list[int]] = {}  # GPU → its orphan processes, in order
    for i in np.flatnonzero(orphan).tolist():
        orphans_on.setdefault(where[i], []).append(i)
    findings = []
    for ref in ctx.gpus():
        key2 = (ref.node, ref.uuid)
        mine = orphans_on.get(key2, [])
        total = float(sum(memory[i] for i in mine))
        if total > memory_above_bytes:
            verdict = Verdict.FIRING
        else:
            verdict = Verdict.CLEAR if key2 in fresh_gpus else Verdict.UNKNOWN
        job_keys = sorted({owners[i] or "" for i in mine} - {""})
        job = ctx.job(job_keys[0]) if len(job_keys) == 1 else None
        findings.append(
            waste_finding(
                rule, f"{ref.node}/{ref.uuid}", verdict, win,
                f"{total / 2**30:.1f} GiB on GPU {ref.uuid} of {ref.node} held by "
                f"{len(mine)} process(es) of {', '.join(job_keys) or 'no job'}",
                {
                    "job": job_keys[0] if len(job_keys) == 1 else None,
                    "jobs": ",".join(job_keys) or None,
                    "team": job.team if job else None,
                    "job_state": str(job.state) if job else None,
                    "job_end_time": job.end_time if job else None,
                    "node": ref.node,
                    "gpu": ref.uuid,
                    "pids": ",".join(pids[i] for i in mine) or None,
                    "orphaned_memory_bytes": total,
                    "memory_above_bytes": memory_above_bytes,
                    "grace_seconds": grace_seconds,
                },
                Facts(
                    team=job.team if job else None,
                    job=job_keys[0] if len(job_keys) == 1 else None,
                    nodes=(ref.node,),
                ),
            )
        )  # fmt: skip
    return findings


@dataclass(frozen=True, slots=True)
class _Processes:
    memory: npt.NDArray[np.float64]
    since: npt.NDArray[np.float64]
    gone: npt.NDArray[np.float64]
    where: list[tuple[str, str]]
    owners: list[str | None]
    pids: list[str]


def _process_table(
    ctx: DetectionContext,
    procs: Any,
    recent: npt.NDArray[np.bool_],
    held_now: dict[tuple[str, str], bool],
) -> _Processes:
    """Per process series: memory now, first seen, when its owner stopped running (see
    :func:`orphan_processes`), GPU, owner job key and pid."""
    n = len(procs.series)
    table = _Processes(np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan), [], [], [])
    for i, info in enumerate(procs.series):
        attrs = info.attributes
        node, uuid = str(attrs.get("host.name", "")), str(attrs.get("hw.id", ""))
        row = procs.values[i]
        known = ~np.isnan(row)
        table.where.append((node, uuid))
        table.pids.append(str(attrs.get("process.pid", "?")))
        if known[recent].any():
            table.memory[i] = float(row[recent][known[recent]][-1])
        if known.any():
            table.since[i] = float(procs.times[np.flatnonzero(known)[0]])
        scheduler = attrs.get("gpuwarden.job.scheduler")
        ident = attrs.get("gpuwarden.job.id") or attrs.get("k8s.pod.uid")
        key = (
            ctx.resolve_job(str(scheduler), str(ident), node)
            if scheduler is not None and ident is not None
            else None
        )
        table.owners.append(key)
        job = ctx.job(key) if key else None
        if job is not None and job.state in LIVE_STATES:
            continue  # NaN: the owner runs
        if key is None and held_now.get((node, uuid), False):
            continue  # unattributed, on a GPU a running job holds: assume it is that job's
        ended = job.end_time if job is not None else None
        table.gone[i] = ended if ended is not None else -np.inf
    return table


def _fresh_gpus(ctx: DetectionContext, start: float, end: float) -> set[tuple[str, str]]:
    """GPUs with any memory or utilisation sample in ``[start, end)``."""
    seen = set()
    for metric in ("hw.gpu.memory.usage", "hw.gpu.utilization"):
        m = ctx.store.matrix(metric, start=start, end=end)
        for info, row in zip(m.series, m.values, strict=True):
            if not np.isnan(row).all():
                a = info.attributes
                seen.add((str(a.get("host.name", "")), str(a.get("hw.id", ""))))
    return seen


DETECTOR = Detector(
    spec=spec_of(
        "orphaned_memory",
        "GPU memory held by processes of no running job.",
        subjects=(Subject.NODE,),
        signals=("gpuwarden.gpu.process.memory.usage", "hw.gpu.memory.usage"),
        params=OrphanedMemoryParams,
        selector=("teams", "jobs", "nodes"),
    ),
    params=OrphanedMemoryParams,
    run=run_orphaned_memory,
)
