"""``forgotten_gpu``: a job has held GPUs it barely used for a very long time (days, read at
the store's long resolution when the recent ring is shorter)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict
from gpuwarden.collector.detect.waste import (
    finite,
    gpu_price,
    held_by_job,
    low_mean_verdicts,
    read_window,
    waste_finding,
)
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import coverage, duration, number


@dataclass(frozen=True, slots=True, kw_only=True)
class ForgottenGpuParams:
    """Parameters of ``forgotten_gpu``."""

    window_seconds: float = duration(
        "1d", "1h", "30d", "How long the allocation must have been (nearly) unused."
    )
    utilization_below: float = number(0.05, 0.0, 1.0, "Mean GPU utilisation below this.")
    min_coverage: float = coverage()


def run_forgotten_gpu(
    ctx: DetectionContext, rule: Rule, p: ForgottenGpuParams, now: float
) -> list[Finding]:
    """One finding per job that held GPUs for the whole window: FIRING when their mean
    utilisation (all GPUs, all samples) stayed below the threshold."""
    window_seconds, threshold_ratio = p.window_seconds, p.utilization_below
    min_coverage = p.min_coverage
    win = read_window(ctx, now, window_seconds)
    if win is None:
        return []
    groups = held_by_job(win)
    util = np.vstack([g.utilization_ratio for g in win.gpus])
    hours = window_seconds / 3600
    findings = []
    for key in sorted(groups):
        job = ctx.job(key)
        rows = groups[key]
        # the job's own GPUs only, as one row: coverage and mean over its cells (issue 14:
        # padding every job to the widest one made a narrow job UNKNOWN beside a wide one)
        cells = util[rows].reshape(1, -1)
        verdicts, means = low_mean_verdicts(
            cells, np.ones(cells.shape, dtype=bool), threshold_ratio=threshold_ratio,
            min_coverage=min_coverage,
        )  # fmt: skip
        verdict = Verdict(int(verdicts[0]))
        usd = sum(gpu_price(ctx, win.gpus[i], job)[0] for i in rows) * hours
        nodes = sorted({win.gpus[i].node for i in rows})
        fire = verdict is Verdict.FIRING
        findings.append(
            waste_finding(
                rule, key, verdict, win,
                f"job {key} held {len(rows)} GPU(s) for {hours:.0f} h at "
                f"{100 * float(means[0]):.1f} % mean utilisation",
                {
                    "job": key,
                    "team": job.team if job else None,
                    "node": nodes[0] if len(nodes) == 1 else None,
                    "nodes": ",".join(nodes),
                    "gpu": win.gpus[rows[0]].uuid if len(rows) == 1 else None,
                    "gpus": len(rows),
                    "window_hours": hours,
                    "threshold_ratio": threshold_ratio,
                    "mean_utilization_ratio": finite(float(means[0])),
                    "coverage_ratio": float((~np.isnan(cells)).mean()),
                    "wasted_gpu_hours": len(rows) * hours if fire else 0.0,
                    "wasted_usd": usd if fire else 0.0,
                    "price_tier": gpu_price(ctx, win.gpus[rows[0]], job)[1],
                },
                Facts.of_job(key, job, nodes),
            )
        )  # fmt: skip
    return findings


DETECTOR = Detector(
    spec=spec_of(
        "forgotten_gpu",
        "A job has held GPUs it barely used for a very long time.",
        subjects=(Subject.JOB,),
        signals=("hw.gpu.utilization", "gpuwarden.gpu.process.utilization"),
        params=ForgottenGpuParams,
        selector=("teams", "jobs", "models", "nodes"),
    ),
    params=ForgottenGpuParams,
    run=run_forgotten_gpu,
)
