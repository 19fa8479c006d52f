"""Deploy regression: a model's metric got worse right after one of its deploy events.

For each ``EventKind.DEPLOY`` event of a selected model whose after-window has just completed,
the statistic is computed per sample bin in the ``before`` window and in the ``after`` window
(which starts ``settle`` after the deploy, to skip warm-up); the chosen two-sample test
(Mann-Whitney U, Kolmogorov-Smirnov or Welch's t) compares them in the bad direction, and the
change of the statistic over the whole windows (merged histograms, summed counters) must reach
``min_relative_change``. A deploy whose windows are not covered by data is UNKNOWN.

Samples are bins of ``max(step, before/SAMPLES_PER_WINDOW)``: about 30 per side, so one bin's
statistic is estimated from many requests, and the test is not fed thousands of strongly
autocorrelated 10 s values (its p-value assumes independent samples; the relative-change gate
stands guard against what remains of that).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import stats

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.drift import DIRECTIONS, STATISTICS
from gpuwarden.collector.detect.findings import Facts, Finding, JsonScalar, Verdict, new_finding
from gpuwarden.collector.detect.model_series import (
    Binned,
    read_model_metric,
    statistic_of,
    supports,
)
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, number, text
from gpuwarden.collector.storage.records import Event, EventKind

FloatArray = npt.NDArray[np.float64]

SAMPLES_PER_WINDOW = 30
MIN_SAMPLES = 5
"""Fewest known sample bins per side for a test."""
TESTS = ("mann_whitney", "ks", "welch")


Alternative = Literal["two-sided", "less", "greater"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeployParams:
    """Parameters of ``deploy_regression``."""

    statistic: str = text("p95", "What is compared.", choices=STATISTICS)
    direction: str = text("increase", "Which change is bad.", choices=DIRECTIONS)
    before_seconds: float = duration("30m", "5m", "1d", "Window before the deploy.")
    after_seconds: float = duration("30m", "5m", "1d", "Window after the deploy (after settling).")
    settle_seconds: float = duration(
        "5m", "0s", "1h", "Warm-up right after the deploy that is ignored."
    )
    test: str = text("mann_whitney", "Two-sample test.", choices=TESTS)
    p_value_below: float = number(0.01, 1e-9, 0.2, "Significance level.")
    min_relative_change: float = number(
        0.1, 0.0, 10.0, "And the change must be at least this share of before."
    )

    @property
    def span_seconds(self) -> float:
        """From the start of the before-window to the end of the after-window."""
        return self.before_seconds + self.settle_seconds + self.after_seconds


def run_deploy_regression(
    ctx: DetectionContext, rule: Rule, params: DeployParams, now: float
) -> list[Finding]:
    """Engine runner: one finding per (recent deploy of a selected model) × metric.

    A deploy is judged from the moment its after-window is complete until one after-window
    later (so its finding lives for a while and then lets its incident resolve).
    """
    step = float(ctx.store.step_seconds)
    sample_seconds = max(step, step * round(params.before_seconds / SAMPLES_PER_WINDOW / step))
    since = now - params.span_seconds - params.after_seconds
    deploys = [
        e
        for e in ctx.events(since=since, kinds=(EventKind.DEPLOY,))
        if e.time + params.settle_seconds + params.after_seconds <= now
        and (
            not rule.selector.models
            or any(fnmatch.fnmatchcase(e.subject, m) for m in rule.selector.models)
        )
    ]
    if not deploys:
        return []
    labels = dict(rule.selector.labels) or None
    findings = []
    for metric in rule.selector.metrics:
        subjects = read_model_metric(
            ctx.store,
            metric,
            selector=labels,
            start=min(e.time for e in deploys) - params.before_seconds - sample_seconds,
            end=now,
            bin_seconds=sample_seconds,
        )
        by_model = {s.model: s for s in subjects}
        for event in deploys:
            subject = by_model.get(event.subject)
            if subject is not None:
                findings.append(judge_deploy(subject, event, params, rule))
    return findings


def judge_deploy(subject: Binned, event: Event, params: DeployParams, rule: Rule) -> Finding:
    """Compare the before and after windows of one deploy of ``subject``'s model."""
    times = subject.times
    ends = times + subject.bin_seconds
    before = (times >= event.time - params.before_seconds) & (ends <= event.time)
    after_start = event.time + params.settle_seconds
    after = (times >= after_start) & (ends <= after_start + params.after_seconds)
    evidence: dict[str, JsonScalar] = {
        "model": subject.model,
        "metric": subject.metric,
        "statistic": params.statistic,
        "direction": params.direction,
        "deploy_time": event.time,
        "version": str(event.attributes.get("version", "")) or None,
        "before_seconds": params.before_seconds,
        "after_seconds": params.after_seconds,
        "settle_seconds": params.settle_seconds,
        "test": params.test,
        "threshold": params.p_value_below,
        "min_relative_change": params.min_relative_change,
        "sample_seconds": subject.bin_seconds,
    }
    verdict, summary = Verdict.UNKNOWN, "not enough data around the deploy"
    points: tuple[tuple[float, float], ...] = ()
    if supports(subject.kind, params.statistic):
        per_bin = statistic_of(
            subject, np.nan_to_num(subject.parts), params.statistic, subject.bin_seconds
        )
        per_bin[np.isnan(subject.parts).all(axis=1)] = np.nan
        x, y = per_bin[before], per_bin[after]
        x, y = x[~np.isnan(x)], y[~np.isnan(y)]
        base = _whole(subject, before, params.statistic)
        new = _whole(subject, after, params.statistic)
        keep = before | after
        points = tuple(
            (float(t), float(v))
            for t, v in zip(ends[keep], per_bin[keep], strict=True)
            if math.isfinite(v)
        )
        evidence.update(
            baseline=_f(base), value=_f(new), before_samples=int(x.size), after_samples=int(y.size)
        )
        if min(x.size, y.size) >= MIN_SAMPLES and math.isfinite(base) and math.isfinite(new):
            rel = (new - base) / abs(base) if base != 0 else math.copysign(math.inf, new)
            p = two_sample_p(x, y, params.test, params.direction)
            bad = _bad(rel, params.direction)
            firing = p < params.p_value_below and bad >= params.min_relative_change
            verdict = Verdict.FIRING if firing else Verdict.CLEAR
            evidence.update(p_value=p, score=p, relative_change=_f(rel))
            summary = (
                f"{subject.model} {params.statistic} of {subject.metric} after the deploy: "
                f"{new:.4g} vs {base:.4g} before ({100 * rel:+.1f} %, {params.test} p={p:.2g})"
            )
    return new_finding(
        rule,
        subject=f"{subject.model}/{subject.metric}/{params.statistic}@deploy:{event.time:.0f}",
        verdict=verdict,
        window=(event.time - params.before_seconds, after_start + params.after_seconds),
        facts=Facts(model=subject.model),
        summary=summary,
        evidence=evidence,
        points=points,
    )


def two_sample_p(
    x: Sequence[float] | FloatArray, y: Sequence[float] | FloatArray, test: str, direction: str
) -> float:
    """p-value that ``y`` (after) is worse than ``x`` (before) in ``direction``."""
    alt: Alternative = "two-sided"
    if direction == "increase":
        alt = "less"
    elif direction == "decrease":
        alt = "greater"
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    # scipy's alternative is about the first sample: "less" = x tends to be smaller than y
    if test == "mann_whitney":
        return float(stats.mannwhitneyu(x, y, alternative=alt).pvalue)
    if test == "welch":
        welch = stats.ttest_ind(x, y, equal_var=False, alternative=alt)
        return float(welch.pvalue)
    if test == "ks":
        # for KS, "greater" means the CDF of x lies above that of y: y is larger
        ks_alt: Alternative = "two-sided"
        if alt == "less":
            ks_alt = "greater"
        elif alt == "greater":
            ks_alt = "less"
        return float(stats.ks_2samp(x, y, alternative=ks_alt).pvalue)
    raise ValueError(f"unknown test {test!r}; expected one of {', '.join(TESTS)}")


def _whole(subject: Binned, mask: npt.NDArray[np.bool_], statistic: str) -> float:
    rows = subject.parts[mask]
    if rows.size == 0 or np.isnan(rows).all():
        return math.nan
    sums = np.nansum(rows, axis=0)[np.newaxis, :]
    seconds = float(np.count_nonzero(mask)) * subject.bin_seconds
    return float(statistic_of(subject, sums, statistic, seconds)[0])


def _bad(x: float, direction: str) -> float:
    if direction == "increase":
        return x
    if direction == "decrease":
        return -x
    return abs(x)


def _f(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


DETECTOR = Detector(
    spec=spec_of(
        "deploy_regression",
        "A metric got worse right after a deploy event.",
        subjects=(Subject.DEPLOYMENT,),
        signals=("gpuwarden.model.request.latency", "gpuwarden.model.requests"),
        params=DeployParams,
        selector=("metrics", "models", "labels"),
        requires=("metrics",),
    ),
    params=DeployParams,
    run=run_deploy_regression,
)
