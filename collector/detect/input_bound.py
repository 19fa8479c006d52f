"""``input_bound``: GPUs starve while the host's CPU, disk or network is saturated, or, for a
training job, their utilisation cycles between busy and stalled the way a data loader that cannot
keep up makes it (stalls of a few seconds to minutes); a job that fires on cycling alone is
confirmed by a two-regime Markov switching model (:mod:`.numerics.regimes`). A job serving a model
(:mod:`.job_kind`) fires only on the host's evidence, and only when its requests waited (its
model's waiting queue, ``gpuwarden.model.queue.size{state="waiting"}``): its utilisation follows
its traffic, and a busy host beside a GPU that has no work queued is no bottleneck.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, JsonScalar, Verdict
from gpuwarden.collector.detect.job_kind import JobKind, job_kind
from gpuwarden.collector.detect.numerics.regimes import busy_stall_regimes
from gpuwarden.collector.detect.slo import model_of
from gpuwarden.collector.detect.waste import (
    IOWAIT_ABOVE,
    QUEUED_SHARE_ABOVE,
    FloatMatrix,
    InputBound,
    finite,
    gpu_price,
    held_by_job,
    input_bound_verdicts,
    read_window,
    resolution_of,
    waste_finding,
)
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import coverage, duration, number
from gpuwarden.collector.store.types import Resolution

QUEUE = "gpuwarden.model.queue.size"


@dataclass(frozen=True, slots=True, kw_only=True)
class InputBoundParams:
    """Parameters of ``input_bound``."""

    window_seconds: float = duration("15m", "1m", "1d", "Evaluation window.")
    gpu_utilization_below: float = number(0.5, 0.0, 1.0, "GPU utilisation below this ...")
    cpu_utilization_above: float = number(
        0.85, 0.0, 1.0, "... while host CPU utilisation is above this."
    )
    min_coverage: float = coverage()


def host_cpu(
    ctx: DetectionContext, start: float, end: float, resolution: Resolution
) -> dict[str, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]:
    """Node → (CPU utilisation, iowait share) per slot, from ``system.cpu.time`` rates by mode."""
    m = ctx.store.matrix(
        "system.cpu.time",
        start=start,
        end=end,
        resolution=resolution,
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


def waiting_share(
    ctx: DetectionContext, start: float, end: float, resolution: Resolution, min_coverage: float
) -> dict[str, float]:
    """Model → share of the window's slots in which its waiting queue (summed over its
    replicas) held at least one request; a model with less than ``min_coverage`` of the slots
    known is left out (unknown)."""
    m = ctx.store.matrix(
        QUEUE, selector={"state": "waiting"}, start=start, end=end, resolution=resolution
    )
    rows: dict[str, list[npt.NDArray[np.float64]]] = {}
    for info, values in zip(m.series, m.values, strict=True):
        name = model_of(info)
        if name is not None:
            rows.setdefault(name, []).append(values.astype(np.float64))
    out = {}
    for name, parts in rows.items():
        block = np.vstack(parts)
        known = ~np.isnan(block).all(axis=0)
        if not known.size or known.mean() < min_coverage:
            continue
        total = np.nansum(block, axis=0)[known]
        out[name] = float(np.mean(total >= 1.0))
    return out


def run_input_bound(
    ctx: DetectionContext, rule: Rule, p: InputBoundParams, now: float
) -> list[Finding]:
    """One finding per job that held GPUs for the window: FIRING when they starved while the
    host's CPU or I/O was saturated, or (training jobs) their utilisation cycled.

    Cost: the starved share of the held GPU-hours, ``gpus × hours × (1 − mean utilisation)``,
    priced at the job's tier.
    """
    window_seconds, min_coverage = p.window_seconds, p.min_coverage
    gpu_below, cpu_above = p.gpu_utilization_below, p.cpu_utilization_above
    win = read_window(ctx, now, window_seconds)
    if win is None:
        return []
    resolution = resolution_of(ctx, win)
    hosts = host_cpu(ctx, win.start, win.end, resolution)
    groups = held_by_job(win)
    if not groups:
        return []
    keys = sorted(groups)
    served = {m.name for m in ctx.deployments()}
    missing = np.full(len(win.times), np.nan)
    blocks_g, blocks_c, blocks_w = [], [], []
    for key in keys:
        rows = [win.gpus[i] for i in groups[key]]
        blocks_g.append(np.vstack([gpu.utilization_ratio for gpu in rows]))
        blocks_c.append(np.vstack([hosts.get(gpu.node, (missing, missing))[0] for gpu in rows]))
        blocks_w.append(np.vstack([hosts.get(gpu.node, (missing, missing))[1] for gpu in rows]))
    kinds = [job_kind(ctx.job(key), served) for key in keys]
    waiting = waiting_share(ctx, win.start, win.end, resolution, min_coverage)
    models = [(job.model if (job := ctx.job(key)) else None) for key in keys]
    result = input_bound_verdicts(
        blocks_g, blocks_c, blocks_w,
        gpu_below=gpu_below, cpu_above=cpu_above, min_coverage=min_coverage,
        training=[kind is JobKind.TRAINING for kind in kinds],
        queued=[waiting.get(model, np.nan) if model else np.nan for model in models],
    )  # fmt: skip
    hours = window_seconds / 3600
    findings = []
    for j, key in enumerate(keys):
        job = ctx.job(key)
        gpus = [win.gpus[i] for i in groups[key]]
        mean = float(result.gpu_mean[j])
        verdict, reasons, regime = _explain(
            result,
            j,
            Verdict(int(result.verdict[j])),
            cpu_above,
            blocks_g[j],
            win.step,
            training=kinds[j] is JobKind.TRAINING,
        )
        starved = len(gpus) * hours * (1 - mean) if verdict is Verdict.FIRING else 0.0
        price = sum(gpu_price(ctx, gpu, job)[0] for gpu in gpus) / len(gpus)
        nodes = sorted({gpu.node for gpu in gpus})
        findings.append(
            waste_finding(
                rule, key, verdict, win,
                f"job {key}: GPUs at {100 * mean:.0f} % while {', '.join(reasons)}",
                {
                    "job": key,
                    "job_kind": str(kinds[j]),
                    "team": job.team if job else None,
                    "node": nodes[0] if len(nodes) == 1 else None,
                    "nodes": ",".join(nodes),
                    "gpus": len(gpus),
                    "window_minutes": window_seconds / 60,
                    "mean_gpu_utilization_ratio": finite(mean),
                    "mean_cpu_utilization_ratio": finite(float(result.cpu_mean[j])),
                    "mean_iowait_ratio": finite(float(result.iowait_mean[j])),
                    "utilization_oscillation": finite(float(result.oscillation[j])),
                    "stall_episodes": int(result.stall_episodes[j]),
                    "stalled_share": finite(float(result.stalled_share[j])),
                    "requests_waiting_share": finite(float(result.queued_share[j])),
                    "reasons": "; ".join(reasons) or None,
                    "starved_gpu_hours": starved,
                    "wasted_usd": starved * price,
                    **regime,
                },
                Facts.of_job(key, job, nodes),
            )
        )  # fmt: skip
    return findings


def _explain(
    result: InputBound,
    j: int,
    verdict: Verdict,
    cpu_above: float,
    util: FloatMatrix,
    step: float,
    *,
    training: bool,
) -> tuple[Verdict, list[str], dict[str, JsonScalar]]:
    """Job ``j``'s reasons; a training job that fires on cycling alone is confirmed (or cleared)
    by the regime model, whose figures join the evidence."""
    reasons = []
    if result.queued_share[j] >= QUEUED_SHARE_ABOVE:
        reasons.append(f"requests waiting {100 * result.queued_share[j]:.0f} % of the time")
    if result.cpu_mean[j] > cpu_above:
        reasons.append(f"host CPU {100 * result.cpu_mean[j]:.0f} %")
    if result.iowait_mean[j] > IOWAIT_ABOVE:
        reasons.append(f"iowait {100 * result.iowait_mean[j]:.0f} %")
    regime: dict[str, JsonScalar] = {}
    if result.cycling[j] and training:
        reasons.append("utilisation cycles between busy and stalled")
        if verdict is Verdict.FIRING and not reasons[:-1]:
            # fired on oscillation alone: confirm a stalled regime apart from the busy one
            verdict, regime = _confirm_stalls(util, step)
            if verdict is Verdict.CLEAR:
                reasons[-1] = "utilisation varies, with no distinct stalled state"
    return verdict, reasons, regime


def _confirm_stalls(util: FloatMatrix, step: float) -> tuple[Verdict, dict[str, JsonScalar]]:
    """The stage-two check of an oscillating job (:mod:`.regimes`): FIRING with the regimes'
    evidence when its mean utilisation per slot has a stalled regime distinct from the busy
    one, CLEAR when it has not; FIRING without evidence when the model cannot be fitted."""
    with warnings.catch_warnings():  # a slot no GPU reported is NaN: "mean of empty slice"
        warnings.simplefilter("ignore", RuntimeWarning)
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


DETECTOR = Detector(
    spec=spec_of(
        "input_bound",
        "GPUs starve while the host's CPU, disk or network is saturated.",
        subjects=(Subject.JOB,),
        signals=(
            "hw.gpu.utilization",
            "system.cpu.time",
            "system.disk.io",
            "system.network.io",
            QUEUE,
        ),
        params=InputBoundParams,
        selector=("teams", "jobs", "models", "nodes"),
    ),
    params=InputBoundParams,
    run=run_input_bound,
)
