"""The idle-GPU rule on the collector's data: allocation × utilisation → findings with evidence."""

from __future__ import annotations

import math

import numpy as np

from gpuwarden.collector.accounting.gpu_time import UNALLOCATED, ownership
from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.detect.idle import idle_verdicts
from gpuwarden.collector.service import CollectorService


def detect_idle_gpus(
    service: CollectorService,
    *,
    rule_id: str,
    severity: str,
    window_seconds: float,
    threshold_ratio: float,
    min_coverage: float = 0.8,
    now: float | None = None,
) -> list[Finding]:
    """One finding per physical GPU: FIRING when its job left it idle for the whole window.

    Evidence: job, team, node, GPU, window, mean utilisation, coverage, idle GPU-hours and what
    the window cost at the job's price tier.
    """
    step = service.store.step_seconds
    end = math.floor((service.clock() if now is None else now) / step) * step
    start = end - window_seconds
    times, gpus = service.timelines(start, end)
    if not gpus or len(times) == 0:
        return []
    jobs = service.registry.known()
    util = np.vstack([g.utilization_ratio for g in gpus])
    held = np.zeros(util.shape, dtype=bool)
    owner: list[str] = []
    for i, gpu in enumerate(gpus):
        shares = ownership(gpu, jobs, times, step, end)
        main = max(
            (k for k in shares if k != UNALLOCATED), key=lambda k: shares[k].sum(), default=""
        )
        owner.append(main)
        if main:
            held[i] = shares[main] > 0.999
    verdicts = idle_verdicts(util, held, threshold_ratio=threshold_ratio, min_coverage=min_coverage)
    hours = window_seconds / 3600
    findings = []
    for i, gpu in enumerate(gpus):
        job = service.registry.get(owner[i]) if owner[i] else None
        known = ~np.isnan(util[i])
        mean = float(util[i][known].mean()) if known.any() else None
        tier = (job.price_tier if job and job.price_tier else gpu.price_tier) or "on-demand"
        price = service.accounting.prices.price(gpu.model, tier)
        verdict = Verdict(int(verdicts[i]))
        findings.append(
            Finding(
                rule_id=rule_id,
                detector="idle_gpu",
                subject=f"{gpu.node}/{gpu.uuid}",
                verdict=verdict,
                severity=severity,
                window_start=start,
                window_end=end,
                summary=(
                    f"GPU {gpu.uuid} on {gpu.node} held by {owner[i] or 'no job'} "
                    f"idle for {window_seconds / 60:.0f} min"
                ),
                evidence={
                    "job": owner[i] or None,
                    "team": job.team if job else None,
                    "node": gpu.node,
                    "gpu": gpu.uuid,
                    "window_minutes": window_seconds / 60,
                    "threshold_ratio": threshold_ratio,
                    "mean_utilization_ratio": mean,
                    "coverage_ratio": float(known.mean()),
                    "idle_gpu_hours": hours if verdict is Verdict.FIRING else 0.0,
                    "wasted_usd": hours * price if verdict is Verdict.FIRING else 0.0,
                    "price_tier": tier,
                },
                points=tuple(
                    (float(t), float(v))
                    for t, v in zip(times, util[i], strict=True)
                    if not math.isnan(v)
                ),
            )
        )
    return findings
