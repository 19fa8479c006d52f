"""Waste beyond one idle window: orphaned GPU memory, forgotten GPUs, input-bound jobs and
over-provisioned inference deployments.

Each detector is a pure, vectorised verdict function over aligned matrices (NaN = no sample) and a
rule function that reads the collector's data and builds findings with evidence (job, team, node,
GPU, window, the figures, GPU-hours and $ at the job's price tier). Missing data never counts as
waste and never as healthy: too little coverage gives ``Verdict.UNKNOWN``.

Windows longer than the store's recent ring (days, for forgotten GPUs and daily peaks) are read at
the long (1-minute mean) resolution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.accounting.gpu_time import UNALLOCATED, GpuTimeline, ownership
from gpuwarden.collector.detect.findings import Finding, JsonScalar, Verdict
from gpuwarden.collector.detect.numerics.regimes import busy_stall_regimes
from gpuwarden.collector.detect.numerics.screen import row_mean
from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.service import CollectorService

FloatMatrix = npt.NDArray[np.floating[Any]]
BoolMatrix = npt.NDArray[np.bool_]
Verdicts = npt.NDArray[np.int8]

#: host CPU share in iowait above which a starving GPU counts as waiting on I/O
IOWAIT_ABOVE = 0.2
#: mean |slot-to-slot change| of utilisation above which a starving GPU oscillates (loader stalls)
OSCILLATION_ABOVE = 0.25
_LIVE = (JobState.RUNNING, JobState.SUSPENDED)


# --- pure verdicts ---------------------------------------------------------------------------


def low_mean_verdicts(
    utilization: FloatMatrix, held: BoolMatrix, *, threshold_ratio: float, min_coverage: float
) -> tuple[Verdicts, npt.NDArray[np.float64]]:
    """Per row: FIRING when held throughout and the mean of its samples is below the threshold.

    Returns the verdicts and each row's mean (NaN without samples). Rows not held for the whole
    window are CLEAR (not this rule's case); rows with coverage below ``min_coverage`` UNKNOWN.
    """
    if utilization.shape != held.shape:
        raise ValueError(f"shapes differ: {utilization.shape} vs {held.shape}")
    if not 0 < min_coverage <= 1:
        raise ValueError("min_coverage must be in (0, 1]")
    known = ~np.isnan(utilization)
    n = np.maximum(known.sum(axis=1), 1)
    mean = np.where(known.any(axis=1), np.nansum(utilization, axis=1) / n, np.nan)
    coverage = known.mean(axis=1) if utilization.shape[1] else np.zeros(len(utilization))
    held_all = held.all(axis=1) if utilization.shape[1] else np.zeros(len(utilization), bool)
    verdict = np.full(len(utilization), Verdict.UNKNOWN, dtype=np.int8)
    enough = held_all & (coverage >= min_coverage)
    verdict[~held_all] = Verdict.CLEAR
    verdict[enough & (mean >= threshold_ratio)] = Verdict.CLEAR
    verdict[enough & (mean < threshold_ratio)] = Verdict.FIRING
    return verdict, mean.astype(np.float64)


@dataclass(frozen=True, slots=True)
class InputBound:
    """Per job (row) verdicts of :func:`input_bound_verdicts` and the figures behind them."""

    verdict: Verdicts
    gpu_mean: npt.NDArray[np.float64]
    cpu_mean: npt.NDArray[np.float64]
    iowait_mean: npt.NDArray[np.float64]
    oscillation: npt.NDArray[np.float64]


def input_bound_verdicts(
    gpu: FloatMatrix,
    cpu: FloatMatrix,
    iowait: FloatMatrix,
    *,
    gpu_below: float,
    cpu_above: float,
    min_coverage: float,
    iowait_above: float = IOWAIT_ABOVE,
    oscillation_above: float = OSCILLATION_ABOVE,
) -> InputBound:
    """Rows are jobs' GPUs (util), their hosts' CPU utilisation and iowait share, per slot.

    FIRING: GPU coverage enough, mean GPU utilisation below ``gpu_below``, and either the host
    was saturated (mean CPU above ``cpu_above`` or iowait above ``iowait_above``, with enough
    host coverage) or utilisation oscillates (mean absolute slot-to-slot change above
    ``oscillation_above``: the sawtooth of a data loader that cannot keep up). CLEAR: the GPU
    was busy, or it starved with a known, unsaturated host and no oscillation. Else UNKNOWN.
    """
    if not gpu.shape == cpu.shape == iowait.shape:
        raise ValueError(f"shapes differ: {gpu.shape}, {cpu.shape}, {iowait.shape}")
    slots = max(gpu.shape[1], 1)
    g_cov = (~np.isnan(gpu)).sum(axis=1) / slots
    h_cov = (~np.isnan(cpu)).sum(axis=1) / slots
    g_mean, c_mean, w_mean = row_mean(gpu), row_mean(cpu), row_mean(iowait)
    steps = np.abs(np.diff(gpu, axis=1))
    osc = row_mean(steps) if gpu.shape[1] > 1 else np.full(len(gpu), np.nan)
    g_ok = g_cov >= min_coverage
    h_ok = h_cov >= min_coverage
    starving = g_ok & (g_mean < gpu_below)
    saturated = h_ok & ((c_mean > cpu_above) | (np.nan_to_num(w_mean) > iowait_above))
    oscillating = np.nan_to_num(osc) > oscillation_above
    verdict = np.full(len(gpu), Verdict.UNKNOWN, dtype=np.int8)
    verdict[g_ok & (g_mean >= gpu_below)] = Verdict.CLEAR
    verdict[starving & h_ok & ~saturated & ~oscillating] = Verdict.CLEAR
    verdict[starving & (saturated | oscillating)] = Verdict.FIRING
    return InputBound(verdict, g_mean, c_mean, w_mean, osc)


def orphan_processes(
    memory_bytes: npt.NDArray[np.float64],
    held_since: npt.NDArray[np.float64],
    owner_gone_since: npt.NDArray[np.float64],
    *,
    now: float,
    grace_seconds: float,
) -> npt.NDArray[np.bool_]:
    """Per process: orphaned when it still holds memory and its owner is gone for the grace.

    Args:
        memory_bytes: memory each process holds now (NaN: the process was not seen lately).
        held_since: when each process was first seen in the window.
        owner_gone_since: when its job stopped running; NaN while the job runs; ``-inf`` when the
            process belongs to no known job (then the grace runs from ``held_since``).
        now: the evaluation time.
        grace_seconds: how long the owner must have been gone.
    """
    alive = ~np.isnan(memory_bytes) & (np.nan_to_num(memory_bytes) > 0)
    no_owner = np.isneginf(owner_gone_since)
    since = np.where(no_owner, held_since, owner_gone_since)
    gone = ~np.isnan(owner_gone_since)
    return np.asarray(alive & gone & (now - np.nan_to_num(since, nan=now) >= grace_seconds))


def rightsize(replicas: int, peak_ratio: float, *, target_ratio: float, min_replicas: int) -> int:
    """Replicas that would run the observed peak at the target utilisation (never fewer than
    ``min_replicas``, never more than now)."""
    need = math.ceil(replicas * peak_ratio / target_ratio - 1e-9) if replicas else 0
    return min(replicas, max(min_replicas, need))


# --- reading the service ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Window:
    start: float
    end: float
    times: npt.NDArray[np.float64]
    step: float
    gpus: list[GpuTimeline]
    owner: list[str]  # the job that held each GPU longest in the window ("" = none)
    held: BoolMatrix  # GPU × slot: that job held it


def _end(service: CollectorService, now: float, step: float) -> float:
    return math.floor(now / step) * step


def read_window(service: CollectorService, now: float, window_seconds: float) -> _Window | None:
    """GPUs' utilisation and ownership over the window ending at ``now`` (slot-aligned).

    Uses the recent ring when it covers the window, else the long (1-minute) resolution.
    """
    step = float(service.store.step_seconds)
    end = _end(service, now, step)
    start = end - window_seconds
    times, gpus = service.timelines(start, end)
    if len(times) * step < window_seconds:  # the recent ring is shorter: read long slots
        step = float(service.store.long_step_seconds)
        end = _end(service, now, step)
        start = end - window_seconds
        util = service.store.matrix("hw.gpu.utilization", start=start, end=end, resolution="long")
        times = util.times
        rows = {
            (
                str(s.attributes.get("host.name", "")),
                str(s.attributes.get("hw.id", "")),
            ): util.values[i]
            for i, s in enumerate(util.series)
        }
        gpus = [
            GpuTimeline(
                node=g.node,
                uuid=g.uuid,
                index=g.index,
                model=g.model,
                price_tier=g.price_tier,
                utilization_ratio=rows.get((g.node, g.uuid), np.full(len(times), np.nan)).astype(
                    np.float64
                ),
                energy_joules=np.full(len(times), np.nan),
            )
            for g in gpus
        ]
    if not gpus or len(times) == 0:
        return None
    jobs = service.registry.known()
    held = np.zeros((len(gpus), len(times)), dtype=bool)
    owner = []
    for i, gpu in enumerate(gpus):
        shares = ownership(gpu, jobs, times, step, end)
        main = max(
            (k for k in shares if k != UNALLOCATED), key=lambda k: shares[k].sum(), default=""
        )
        owner.append(main)
        if main:
            held[i] = shares[main] > 0.999
    return _Window(start, end, times, step, gpus, owner, held)


def _price(service: CollectorService, gpu: GpuTimeline, job: Job | None) -> tuple[float, str]:
    tier = (job.price_tier if job and job.price_tier else gpu.price_tier) or "on-demand"
    return service.accounting.prices.price(gpu.model, tier), tier


def _by_job(win: _Window) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(win.owner):
        if key and win.held[i].all():
            groups.setdefault(key, []).append(i)
    return groups


def _pooled(rows: Sequence[FloatMatrix]) -> FloatMatrix:
    """Rows of several jobs, each job's GPUs concatenated into one row (NaN padded)."""
    width = max((r.size for r in rows), default=0)
    out = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        out[i, : r.size] = r.ravel()
    return out


def _finding(
    rule: Rule, detector: str, subject: str, verdict: Verdict, win: _Window, summary: str,
    evidence: dict[str, JsonScalar],
) -> Finding:  # fmt: skip
    return Finding(
        rule_id=rule.id,
        detector=detector,
        subject=subject,
        verdict=verdict,
        severity=str(rule.severity),
        window_start=win.start,
        window_end=win.end,
        summary=summary if verdict is Verdict.FIRING else "",
        evidence=evidence,
    )


def _num(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def _resolution(service: CollectorService, win: _Window) -> str:
    return "recent" if win.step == service.store.step_seconds else "long"


# --- forgotten GPU ---------------------------------------------------------------------------


def detect_forgotten_gpus(
    service: CollectorService,
    rule: Rule,
    *,
    window_seconds: float,
    threshold_ratio: float,
    min_coverage: float,
    now: float,
) -> list[Finding]:
    """One finding per job that held GPUs for the whole window: FIRING when their mean
    utilisation (all GPUs, all samples) stayed below the threshold."""
    win = read_window(service, now, window_seconds)
    if win is None:
        return []
    groups = _by_job(win)
    keys = sorted(groups)
    util = np.vstack([g.utilization_ratio for g in win.gpus])
    pooled = _pooled([util[groups[k]] for k in keys])
    verdicts, means = low_mean_verdicts(
        pooled, np.ones(pooled.shape, dtype=bool), threshold_ratio=threshold_ratio,
        min_coverage=min_coverage,
    )  # fmt: skip
    hours = window_seconds / 3600
    findings = []
    for j, key in enumerate(keys):
        job = service.registry.get(key)
        rows = groups[key]
        verdict = Verdict(int(verdicts[j]))
        usd = sum(_price(service, win.gpus[i], job)[0] for i in rows) * hours
        nodes = sorted({win.gpus[i].node for i in rows})
        fire = verdict is Verdict.FIRING
        findings.append(
            _finding(
                rule, "forgotten_gpu", key, verdict, win,
                f"job {key} held {len(rows)} GPU(s) for {hours:.0f} h at "
                f"{100 * float(means[j]):.1f} % mean utilisation",
                {
                    "job": key,
                    "team": job.team if job else None,
                    "node": nodes[0] if len(nodes) == 1 else None,
                    "nodes": ",".join(nodes),
                    "gpu": win.gpus[rows[0]].uuid if len(rows) == 1 else None,
                    "gpus": len(rows),
                    "window_hours": hours,
                    "threshold_ratio": threshold_ratio,
                    "mean_utilization_ratio": _num(float(means[j])),
                    "coverage_ratio": float((~np.isnan(pooled[j])).mean()),
                    "wasted_gpu_hours": len(rows) * hours if fire else 0.0,
                    "wasted_usd": usd if fire else 0.0,
                    "price_tier": _price(service, win.gpus[rows[0]], job)[1],
                },
            )
        )  # fmt: skip
    return findings


def run_forgotten_gpu(service: CollectorService, rule: Rule, now: float) -> list[Finding]:
    """Engine runner for ``forgotten_gpu``."""
    p = rule.parameters
    return detect_forgotten_gpus(
        service,
        rule,
        window_seconds=float(p["window_seconds"]),  # type: ignore[arg-type]
        threshold_ratio=float(p["utilization_below"]),  # type: ignore[arg-type]
        min_coverage=float(p["min_coverage"]),  # type: ignore[arg-type]
        now=now,
    )


# --- input-bound training --------------------------------------------------------------------


def host_cpu(
    service: CollectorService, start: float, end: float, resolution: str
) -> dict[str, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]:
    """Node → (CPU utilisation, iowait share) per slot, from ``system.cpu.time`` rates by mode."""
    m = service.store.matrix(
        "system.cpu.time",
        start=start,
        end=end,
        resolution=resolution,  # type: ignore[arg-type]
    )
    total: dict[str, npt.NDArray[np.float64]] = {}
    idle: dict[str, npt.NDArray[np.float64]] = {}
    wait: dict[str, npt.NDArray[np.float64]] = {}
    for info, values in zip(m.series, m.values, strict=True):
        node = str(info.attributes.get("host.name", ""))
        mode = str(info.attributes.get("cpu.mode", ""))
        row = values.astype(np.float64)
        total[node] = total.get(node, 0.0) + row
        if mode == "idle":
            idle[node] = idle.get(node, 0.0) + row
        if mode == "iowait":
            wait[node] = wait.get(node, 0.0) + row
    out = {}
    for node, tot in total.items():
        safe = np.where(tot > 0, tot, np.nan)
        w = wait.get(node, np.zeros_like(tot))
        busy = tot - idle.get(node, np.zeros_like(tot)) - w
        out[node] = (np.clip(busy / safe, 0, 1), np.clip(w / safe, 0, 1))
    return out


def detect_input_bound(
    service: CollectorService,
    rule: Rule,
    *,
    window_seconds: float,
    gpu_below: float,
    cpu_above: float,
    min_coverage: float,
    now: float,
) -> list[Finding]:
    """One finding per job that held GPUs for the window: FIRING when they starved while the
    host's CPU or I/O was saturated, or their utilisation oscillated.

    Cost: the starved share of the held GPU-hours, ``gpus × hours × (1 − mean utilisation)``,
    priced at the job's tier.
    """
    win = read_window(service, now, window_seconds)
    if win is None:
        return []
    hosts = host_cpu(service, win.start, win.end, _resolution(service, win))
    groups = _by_job(win)
    n = len(win.times)
    missing = np.full(n, np.nan)
    rows_g, rows_c, rows_w, job_of = [], [], [], []
    for key in sorted(groups):
        for i in groups[key]:
            gpu = win.gpus[i]
            cpu, wait = hosts.get(gpu.node, (missing, missing))
            rows_g.append(gpu.utilization_ratio)
            rows_c.append(cpu)
            rows_w.append(wait)
            job_of.append(key)
    if not job_of:
        return []
    keys = sorted(groups)
    index = {k: [j for j, owner in enumerate(job_of) if owner == k] for k in keys}
    g, c, w = (np.vstack(r) for r in (rows_g, rows_c, rows_w))
    result = input_bound_verdicts(
        _pooled([g[index[k]] for k in keys]),
        _pooled([c[index[k]] for k in keys]),
        _pooled([w[index[k]] for k in keys]),
        gpu_below=gpu_below, cpu_above=cpu_above, min_coverage=min_coverage,
    )  # fmt: skip
    hours = window_seconds / 3600
    findings = []
    for j, key in enumerate(keys):
        job = service.registry.get(key)
        gpus = [win.gpus[i] for i in groups[key]]
        verdict = Verdict(int(result.verdict[j]))
        mean = float(result.gpu_mean[j])
        reasons = []
        if result.cpu_mean[j] > cpu_above:
            reasons.append(f"host CPU {100 * result.cpu_mean[j]:.0f} %")
        if result.iowait_mean[j] > IOWAIT_ABOVE:
            reasons.append(f"iowait {100 * result.iowait_mean[j]:.0f} %")
        regime: dict[str, JsonScalar] = {}
        if result.oscillation[j] > OSCILLATION_ABOVE:
            reasons.append("oscillating utilisation")
            if verdict is Verdict.FIRING and not reasons[:-1]:
                # fired on oscillation alone: confirm a stalled regime apart from the busy one
                verdict, regime = _confirm_stalls(g[index[key]], win.step)
                if verdict is Verdict.CLEAR:
                    reasons[-1] = "utilisation varies, with no distinct stalled state"
        starved = len(gpus) * hours * (1 - mean) if verdict is Verdict.FIRING else 0.0
        price = sum(_price(service, gpu, job)[0] for gpu in gpus) / len(gpus)
        nodes = sorted({gpu.node for gpu in gpus})
        findings.append(
            _finding(
                rule, "input_bound", key, verdict, win,
                f"job {key}: GPUs at {100 * mean:.0f} % while {', '.join(reasons)}",
                {
                    "job": key,
                    "team": job.team if job else None,
                    "node": nodes[0] if len(nodes) == 1 else None,
                    "nodes": ",".join(nodes),
                    "gpus": len(gpus),
                    "window_minutes": window_seconds / 60,
                    "mean_gpu_utilization_ratio": _num(mean),
                    "mean_cpu_utilization_ratio": _num(float(result.cpu_mean[j])),
                    "mean_iowait_ratio": _num(float(result.iowait_mean[j])),
                    "utilization_oscillation": _num(float(result.oscillation[j])),
                    "reasons": "; ".join(reasons) or None,
                    "starved_gpu_hours": starved,
                    "wasted_usd": starved * price,
                    **regime,
                },
            )
        )  # fmt: skip
    return findings


def _confirm_stalls(util: FloatMatrix, step: float) -> tuple[Verdict, dict[str, JsonScalar]]:
    """The stage-two check of an oscillating job (:mod:`.regimes`): FIRING with the regimes'
    evidence when its mean utilisation per slot has a stalled regime distinct from the busy
    one, CLEAR when it has not; FIRING without evidence when the model cannot be fitted."""
    with np.errstate(all="ignore"):
        per_slot = np.nanmean(util, axis=0) if util.size else np.zeros(0)
    found = busy_stall_regimes(per_slot)
    if found is None:
        return Verdict.FIRING, {"regimes": "not fitted (too few samples, or a strict alternation)"}
    evidence: dict[str, JsonScalar] = {
        "stall_share": round(found.stall_share, 4),
        "stall_level": round(found.stall_level, 4),
        "busy_level": round(found.busy_level, 4),
        "mean_stall_seconds": round(found.stall_slots * step, 1),
        "regime_separation": round(found.separation, 2),
    }
    return (Verdict.FIRING if found.distinct else Verdict.CLEAR), evidence


def run_input_bound(service: CollectorService, rule: Rule, now: float) -> list[Finding]:
    """Engine runner for ``input_bound``."""
    p = rule.parameters
    return detect_input_bound(
        service,
        rule,
        window_seconds=float(p["window_seconds"]),  # type: ignore[arg-type]
        gpu_below=float(p["gpu_utilization_below"]),  # type: ignore[arg-type]
        cpu_above=float(p["cpu_utilization_above"]),  # type: ignore[arg-type]
        min_coverage=float(p["min_coverage"]),  # type: ignore[arg-type]
        now=now,
    )


# --- over-provisioned inference --------------------------------------------------------------

#: share of the window's slots that need a sample before a deployment's peak is judged
PEAK_MIN_COVERAGE = 0.8


def detect_overprovisioned(
    service: CollectorService,
    rule: Rule,
    *,
    window_seconds: float,
    quantile: float,
    peak_below: float,
    target_ratio: float,
    min_replicas: int,
    now: float,
) -> list[Finding]:
    """One finding per model deployment with GPUs in the window.

    The deployment's utilisation per slot is the mean over the GPUs its jobs held; its peak is
    the ``quantile`` of that over the window. FIRING when the peak stays below ``peak_below``;
    the recommendation is the replica count that would run that peak at ``target_ratio``, and
    the saving is the GPUs it frees, priced per window and per 30 days.
    """
    win = read_window(service, now, window_seconds)
    if win is None:
        return []
    deployments = {m.name: m for m in service.storage.models()}
    model_of: dict[str, list[int]] = {}
    jobs_of: dict[str, set[str]] = {}
    for i, key in enumerate(win.owner):
        job = service.registry.get(key) if key else None
        if job is not None and job.model:
            model_of.setdefault(job.model, []).append(i)
            jobs_of.setdefault(job.model, set()).add(key)
    util = np.vstack([g.utilization_ratio for g in win.gpus])
    masked = np.where(win.held, util, np.nan)
    hours = window_seconds / 3600
    findings = []
    for name in sorted(model_of):
        rows = model_of[name]
        block = masked[rows]
        known = ~np.isnan(block)
        per_slot = np.where(
            known.any(axis=0), np.nansum(block, axis=0) / np.maximum(known.sum(axis=0), 1), np.nan
        )
        coverage = float((~np.isnan(per_slot)).mean())
        peak = float(np.nanquantile(per_slot, quantile)) if coverage > 0 else math.nan
        deployment = deployments.get(name)
        replicas = deployment.replicas if deployment and deployment.replicas > 0 else 0
        replicas = replicas or len(jobs_of[name])
        gpus_per_replica = len(rows) / replicas
        if coverage < PEAK_MIN_COVERAGE:
            verdict = Verdict.UNKNOWN
        else:
            verdict = Verdict.FIRING if peak < peak_below else Verdict.CLEAR
        suggested = (
            rightsize(replicas, peak, target_ratio=target_ratio, min_replicas=min_replicas)
            if verdict is Verdict.FIRING
            else replicas
        )
        freed = (replicas - suggested) * gpus_per_replica
        some_job = service.registry.get(sorted(jobs_of[name])[0])
        price = sum(_price(service, win.gpus[i], some_job)[0] for i in rows) / len(rows)
        findings.append(
            _finding(
                rule, "overprovisioned_inference", f"model:{name}", verdict, win,
                f"model {name}: p{100 * quantile:.0f} GPU utilisation {100 * peak:.0f} % on "
                f"{replicas} replicas; {suggested} would run it at {100 * target_ratio:.0f} %",
                {
                    "job": None,
                    "team": some_job.team if some_job else None,
                    "node": None,
                    "model": name,
                    "gpus": len(rows),
                    "window_hours": hours,
                    "quantile": quantile,
                    "peak_utilization_ratio": _num(peak),
                    "target_utilization_ratio": target_ratio,
                    "coverage_ratio": coverage,
                    "replicas": replicas,
                    "suggested_replicas": suggested,
                    "freed_gpus": freed,
                    "saving_usd_per_window": freed * price * hours,
                    "saving_usd_per_30_days": freed * price * 24 * 30,
                },
            )
        )  # fmt: skip
    return findings


def run_overprovisioned_inference(
    service: CollectorService, rule: Rule, now: float
) -> list[Finding]:
    """Engine runner for ``overprovisioned_inference``."""
    p = rule.parameters
    return detect_overprovisioned(
        service,
        rule,
        window_seconds=float(p["window_seconds"]),  # type: ignore[arg-type]
        quantile=float(p["quantile"]),  # type: ignore[arg-type]
        peak_below=float(p["peak_utilization_below"]),  # type: ignore[arg-type]
        target_ratio=float(p["target_utilization"]),  # type: ignore[arg-type]
        min_replicas=int(p["min_replicas"]),  # type: ignore[arg-type]
        now=now,
    )


# --- orphaned GPU memory ---------------------------------------------------------------------

#: samples this many store steps old or newer count as "the process holds memory now"
FRESH_STEPS = 3


def detect_orphaned_memory(
    service: CollectorService,
    rule: Rule,
    *,
    memory_above_bytes: float,
    grace_seconds: float,
    now: float,
) -> list[Finding]:
    """One finding per GPU with fresh telemetry: FIRING when processes whose job is not running
    (or that belong to no job) have held more than ``memory_above_bytes`` past the grace.

    A process without job attribution on a GPU that a running job holds counts as that job's
    (the agent could not read its cgroup). A GPU with no fresh sample at all is UNKNOWN.
    """
    step = float(service.store.step_seconds)
    end = _end(service, now, step) + step
    fresh = FRESH_STEPS * step
    start = end - grace_seconds - fresh
    procs = service.store.matrix("gpuwarden.gpu.process.memory.usage", start=start, end=end)
    times = procs.times
    recent = times >= end - fresh
    live_jobs = {j.key: j for j in service.registry.known() if j.state in _LIVE}
    _, timelines = service.timelines(end - step, end)
    held_now: dict[tuple[str, str], bool] = {}
    for gpu in timelines:
        shares = ownership(gpu, list(live_jobs.values()), np.array([end - step]), step, now)
        held_now[gpu.node, gpu.uuid] = any(
            k != UNALLOCATED and v[-1] > 0 for k, v in shares.items()
        )
    table = _process_table(service, procs, recent, held_now)
    memory, since, gone = table.memory, table.since, table.gone
    where, owners, pids = table.where, table.owners, table.pids
    n = len(where)
    orphan = orphan_processes(memory, since, gone, now=now, grace_seconds=grace_seconds)
    fresh_gpus = _fresh_gpus(service, end - fresh, end) | {
        where[i] for i in range(n) if not np.isnan(memory[i])
    }
    win = _Window(start, end, times, step, [], [], np.zeros((0, 0), dtype=bool))
    findings = []
    for ref in service.gpus():
        key2 = (ref.node, ref.uuid)
        mine = [i for i in range(n) if where[i] == key2 and orphan[i]]
        total = float(sum(memory[i] for i in mine))
        if total > memory_above_bytes:
            verdict = Verdict.FIRING
        else:
            verdict = Verdict.CLEAR if key2 in fresh_gpus else Verdict.UNKNOWN
        job_keys = sorted({owners[i] or "" for i in mine} - {""})
        job = service.registry.get(job_keys[0]) if len(job_keys) == 1 else None
        findings.append(
            _finding(
                rule, "orphaned_memory", f"{ref.node}/{ref.uuid}", verdict, win,
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
    service: CollectorService,
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
            service.registry.resolve(str(scheduler), str(ident), node)
            if scheduler is not None and ident is not None
            else None
        )
        table.owners.append(key)
        job = service.registry.get(key) if key else None
        if job is not None and job.state in _LIVE:
            continue  # NaN: the owner runs
        if key is None and held_now.get((node, uuid), False):
            continue  # unattributed, on a GPU a running job holds: assume it is that job's
        ended = job.end_time if job is not None else None
        table.gone[i] = ended if ended is not None else -np.inf
    return table


def _fresh_gpus(service: CollectorService, start: float, end: float) -> set[tuple[str, str]]:
    """GPUs with any memory or utilisation sample in ``[start, end)``."""
    seen = set()
    for metric in ("hw.gpu.memory.usage", "hw.gpu.utilization"):
        m = service.store.matrix(metric, start=start, end=end)
        for info, row in zip(m.series, m.values, strict=True):
            if not np.isnan(row).all():
                a = info.attributes
                seen.add((str(a.get("host.name", "")), str(a.get("hw.id", ""))))
    return seen


def run_orphaned_memory(service: CollectorService, rule: Rule, now: float) -> list[Finding]:
    """Engine runner for ``orphaned_memory``."""
    p = rule.parameters
    return detect_orphaned_memory(
        service,
        rule,
        memory_above_bytes=float(p["memory_above_bytes"]),  # type: ignore[arg-type]
        grace_seconds=float(p["grace_seconds"]),  # type: ignore[arg-type]
        now=now,
    )
