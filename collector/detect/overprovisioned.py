"""``overprovisioned_inference``: an inference deployment has far more GPU capacity than its
peak needs; the finding suggests the replica count that would run the peak at a target."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict
from gpuwarden.collector.detect.waste import (
    finite,
    gpu_price,
    read_window,
    rightsize,
    waste_finding,
)
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, integer, number


@dataclass(frozen=True, slots=True, kw_only=True)
class OverprovisionedInferenceParams:
    """Parameters of ``overprovisioned_inference``."""

    window_seconds: float = duration(
        "1d", "1h", "30d", "Window whose peak is judged (a day covers the daily peak)."
    )
    quantile: float = number(0.95, 0.5, 1.0, "The peak is this quantile of utilisation.")
    peak_utilization_below: float = number(
        0.3, 0.0, 1.0, "Over-provisioned when the peak stays below this."
    )
    target_utilization: float = number(
        0.6, 0.05, 1.0, "Utilisation the suggested replica count aims for."
    )
    min_replicas: int = integer(2, 1, 10000, "Never suggest fewer replicas than this.")


#: share of the window's slots that need a sample before a deployment's peak is judged
PEAK_MIN_COVERAGE = 0.8


def run_overprovisioned_inference(
    ctx: DetectionContext, rule: Rule, p: OverprovisionedInferenceParams, now: float
) -> list[Finding]:
    """One finding per model deployment with GPUs in the window.

    The deployment's utilisation per slot is the mean over the GPUs its jobs held; its peak is
    the ``quantile`` of that over the window. FIRING when the peak stays below ``peak_below``;
    the recommendation is the replica count that would run that peak at ``target_ratio``, and
    the saving is the GPUs it frees, priced per window and per 30 days. A deployment whose
    peak is low but that already runs ``min_replicas`` (or fewer) is CLEAR: no replica can go,
    so the finding would have no saving and no action.
    """
    window_seconds, quantile, min_replicas = p.window_seconds, p.quantile, p.min_replicas
    peak_below, target_ratio = p.peak_utilization_below, p.target_utilization
    win = read_window(ctx, now, window_seconds)
    if win is None:
        return []
    deployments = {m.name: m for m in ctx.deployments()}
    model_of: dict[str, list[int]] = {}
    jobs_of: dict[str, set[str]] = {}
    for i, key in enumerate(win.owner):
        job = ctx.job(key) if key else None
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
        if verdict is Verdict.FIRING and suggested >= replicas:
            # already at min_replicas (issue 14): nothing to save, so nothing to act on
            verdict = Verdict.CLEAR
        freed = (replicas - suggested) * gpus_per_replica
        some_job = ctx.job(sorted(jobs_of[name])[0])
        price = sum(gpu_price(ctx, win.gpus[i], some_job)[0] for i in rows) / len(rows)
        findings.append(
            waste_finding(
                rule, f"model:{name}", verdict, win,
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
                    "peak_utilization_ratio": finite(peak),
                    "target_utilization_ratio": target_ratio,
                    "coverage_ratio": coverage,
                    "replicas": replicas,
                    "suggested_replicas": suggested,
                    "freed_gpus": freed,
                    "saving_usd_per_window": freed * price * hours,
                    "saving_usd_per_30_days": freed * price * 24 * 30,
                },
                Facts(
                    team=some_job.team if some_job else None, model=name,
                    nodes=tuple(sorted({win.gpus[i].node for i in rows})),
                ),
            )
        )  # fmt: skip
    return findings


DETECTOR = Detector(
    spec=spec_of(
        "overprovisioned_inference",
        "An inference deployment has far more GPU capacity than its peak needs.",
        subjects=(Subject.DEPLOYMENT,),
        signals=("hw.gpu.utilization", "hw.gpu.memory.usage", "gpuwarden.model.requests"),
        params=OverprovisionedInferenceParams,
        selector=("teams", "models", "nodes"),
    ),
    params=OverprovisionedInferenceParams,
    run=run_overprovisioned_inference,
)
