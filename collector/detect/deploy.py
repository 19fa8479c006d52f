"""Deploy regression: a model's metric got worse right after one of its deploy events.

For each ``EventKind.DEPLOY`` event of a selected model whose after-window has just completed,
the statistic is computed per sample bin in the ``before`` window and in the ``after`` window
(which starts ``settle`` after the deploy, to skip warm-up); the chosen two-sample test
(Mann-Whitney U, Kolmogorov-Smirnov or Welch's t) compares them in the bad direction, and the
change of the statistic over the whole windows (merged histograms, summed counters) must reach
``min_relative_change``. A deploy whose windows are not covered by data is UNKNOWN.

Only the version actually serving is judged. A deploy is superseded by the model's next
``DEPLOY`` or ``ROLLBACK`` event, or when the model's deployment record (``ctx.deployments()``)
names another version than the one it deployed: a superseded deploy is CLEAR ("no longer
serving"), whatever its windows say, so no incident opens for a version that was rolled back and
an open one resolves. A superseded deploy keeps reporting CLEAR for ``after_seconds`` after the
event that ended it (long enough for the incident's hysteresis), even when its own judging
period is over.

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
from gpuwarden.collector.storage.records import Event, EventKind, deployed_version

FloatArray = npt.NDArray[np.float64]

SAMPLES_PER_WINDOW = 30
MIN_SAMPLES = 5
"""Fewest known sample bins per side for a test."""
TESTS = ("mann_whitney", "ks", "welch")
SUPERSEDED_LOOKBACK_SECONDS = 7 * 86400.0
"""How far back a deploy may have been to be cleared by a rollback or newer deploy: an incident
about it may have stayed open that long (past a week, its incident is the operator's to close)."""


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
    changes = ctx.events(
        since=since - SUPERSEDED_LOOKBACK_SECONDS, kinds=(EventKind.DEPLOY, EventKind.ROLLBACK)
    )
    serving = {d.name: d.version for d in ctx.deployments()}
    ended = {
        (e.time, e.subject): end
        for e in changes
        if e.kind is EventKind.DEPLOY
        and (end := superseded_by(e, changes, serving.get(e.subject))) is not None
    }
    deploys = []
    for e in changes:
        if e.kind is not EventKind.DEPLOY or not (
            not rule.selector.models
            or any(fnmatch.fnmatchcase(e.subject, m) for m in rule.selector.models)
        ):
            continue
        end = ended.get((e.time, e.subject))
        if end is None:
            if since <= e.time and e.time + params.settle_seconds + params.after_seconds <= now:
                deploys.append(e)
        # superseded: clear while it would be judged, and for a while after what ended it
        elif e.time >= since or (end[1] is not None and end[1] >= now - params.after_seconds):
            deploys.append(e)
    if not deploys:
        return []
    judged = [e for e in deploys if (e.time, e.subject) not in ended]
    labels = dict(rule.selector.labels) or None
    findings = []
    for metric in rule.selector.metrics:
        subjects = read_model_metric(
            ctx.store,
            metric,
            selector=labels,
            start=min((e.time for e in judged), default=now)
            - params.before_seconds
            - sample_seconds,
            end=now,
            bin_seconds=sample_seconds,
        )
        by_model = {s.model: s for s in subjects}
        for event in deploys:
            end = ended.get((event.time, event.subject))
            if end is not None:
                findings.append(not_serving(event, metric, end, params, rule))
                continue
            subject = by_model.get(event.subject)
            if subject is not None:
                findings.append(judge_deploy(subject, event, params, rule))
    return findings


def superseded_by(
    event: Event, changes: Sequence[Event], serving: str | None
) -> tuple[str, float | None] | None:
    """What ended ``event``'s tenure as the serving version, and when: the model's next deploy
    or rollback (``("deploy" | "rollback", time)``), or its deployment record naming another
    version (``("deployment", None)``: the time is not known); ``None`` while it serves."""
    later = [e for e in changes if e.subject == event.subject and e.time > event.time]
    if later:
        first = min(later, key=lambda e: e.time)
        return str(first.kind), first.time
    version = deployed_version(event)
    if serving is not None and version is not None and serving != version:
        return "deployment", None
    return None


def not_serving(
    event: Event, metric: str, end: tuple[str, float | None], params: DeployParams, rule: Rule
) -> Finding:
    """The CLEAR finding of a deploy whose version no longer serves."""
    kind, when = end
    model, version = event.subject, deployed_version(event)
    how = f"a {kind} at {when:.0f}" if when is not None else "its deployment record"
    return new_finding(
        rule,
        subject=f"{model}/{metric}/{params.statistic}@deploy:{event.time:.0f}",
        verdict=Verdict.CLEAR,
        window=(event.time - params.before_seconds, event.time + params.span_seconds),
        facts=Facts(model=model),
        summary=f"{model} {version or '(version unknown)'} is no longer serving ({how} ended it)",
        evidence={
            "model": model,
            "metric": metric,
            "statistic": params.statistic,
            "deploy_time": event.time,
            "version": version,
            "superseded_by": kind,
            "superseded_time": when,
        },
    )


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
        "version": deployed_version(event),
        "version_after": deployed_version(event),
        "version_before": str(event.attributes.get("from", "")) or None,
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
