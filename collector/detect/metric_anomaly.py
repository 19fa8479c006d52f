"""``metric_anomaly``: the NAB-scored anomaly scorer (:mod:`.anomaly`) on selected metrics.

Each cycle reads every selected series at one-minute resolution over the rule's history (the
store's long ring: means of the recent slots), scores it with :func:`anomaly.score_series`
(causal: a point is judged only against the points before it), and looks at the newest
``recent_seconds``: a score at or above the threshold there is a finding. The scorer alarms
when an anomaly starts, not while it lasts, so an incident opens at the onset and resolves
after the engine's clear cycles; it is an event notice ("this metric did something it never
did in the last hours"), not a state.

Missing data is neither normal nor anomalous: a series with fewer than the scorer's warm-up of
known minutes, or no known minute in the newest window, is UNKNOWN.

``min_fold_change`` (off at 1) asks more of a rule whose metric swings by itself, like a model's
request rate: a high score is a finding only when the value it scored is at least that many times
above or below the median of the hour before the newest window. A daily curve sinking below its
first hours, or an ordinary burst of a fifth more traffic, is new to the scorer but not to anyone
who runs the service; a collapse or a surge is both. The scorer costs about
40 µs per point, so ``max_series`` bounds a rule's cycle (the rest are reported, not scored).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict, new_finding
from gpuwarden.collector.detect.numerics import anomaly
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, integer, number
from gpuwarden.collector.store.types import AttrValue, SeriesInfo, label_text

log = logging.getLogger(__name__)

POINTS = 120
_SUBJECT_ATTRIBUTES = ("model", "host.name", "hw.id", "gpuwarden.job.key", "service.name")


def series_subject(info: SeriesInfo) -> str:
    """``metric{attr=value,...}``: a series' identity in findings (also other detectors')."""
    attrs = info.attributes
    parts = [f"{k}={attrs[k]}" for k in sorted(attrs) if attrs[k] not in (None, "")]
    return f"{info.metric}{{{','.join(parts)}}}"


def series_identity(info: SeriesInfo) -> dict[str, str]:
    """The evidence keys that name what a series is about: node, model, GPU and job."""
    attrs = info.attributes
    names = (("node", "host.name"), ("model", "model"), ("gpu", "hw.id"),
             ("job", "gpuwarden.job.key"))  # fmt: skip
    return {key: str(attrs[name]) for key, name in names if attrs.get(name) not in (None, "")}


def series_facts(attrs: Mapping[str, object]) -> Facts:
    """Who and where a series is about, from its attributes (team, job, node, model)."""

    def text(*names: str) -> str | None:
        for name in names:
            value = attrs.get(name)
            if value not in (None, ""):
                return str(value)
        return None

    node = text("host.name", "node")
    return Facts(
        team=text("team", "gpuwarden.team"),
        job=text("gpuwarden.job.key", "job_key"),
        model=text("model", "service.name"),
        nodes=(node,) if node else (),
    )


def series_selected(rule: Rule, attrs: Mapping[str, AttrValue]) -> bool:
    """Whether the rule's selector (teams, jobs, nodes, models, labels) takes a series'
    attributes (checked before a series is scored, so ``max_series`` counts selected series only).

    The labels are passed too: ``Selector.matches`` fails a label it is not given, so without
    them a rule with ``selector.labels`` selected nothing (the store already filtered by them).
    """
    facts = series_facts(attrs)
    return rule.selector.matches(
        team=facts.team,
        job=facts.job,
        node=facts.nodes[0] if facts.nodes else None,
        model=facts.model,
        labels={name: label_text(value) for name, value in attrs.items()},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricAnomalyParams:
    """Parameters of ``metric_anomaly``."""

    history_seconds: float = duration(
        "12h", "6h", "1w", "History each minute is judged against (needs 5 h of data)."
    )
    recent_seconds: float = duration(
        "3m", "1m", "1h", "Newest window in which a high score is a finding."
    )
    score_above: float = number(
        0.5328, 0.5, 0.99, "Score threshold (0.5328: fixed on NAB split A, 61.8 standard)."
    )
    max_series: int = integer(
        200, 1, 5000, "Series scored per cycle (about 30 ms each); the rest are reported."
    )
    min_fold_change: float = number(
        1.0, 1.0, 1000.0,
        "A high score counts only at this many times above or below the median of the hour "
        "before the newest window (1: any score counts).",
    )  # fmt: skip


FOLD_BASELINE_SECONDS = 3600.0
"""The hour before the newest window that ``min_fold_change`` compares the scored value with."""


def fold_change(value: float, baseline: float) -> float:
    """How many times ``value`` is above or below ``baseline`` (>= 1; inf when one is 0 and the
    other not; NaN when either is unknown or negative)."""
    if not (math.isfinite(value) and math.isfinite(baseline)) or min(value, baseline) < 0:
        return math.nan
    low, high = sorted((value, baseline))
    if high == 0:
        return 1.0
    return math.inf if low == 0 else high / low


def run_metric_anomaly(
    ctx: DetectionContext, rule: Rule, p: MetricAnomalyParams, now: float
) -> list[Finding]:
    """Engine runner: one finding per selected series (up to ``max_series``)."""
    history, recent = p.history_seconds, p.recent_seconds
    threshold, limit = p.score_above, p.max_series
    fold = p.min_fold_change
    store = ctx.store
    step = float(store.long_step_seconds)
    end = math.floor(now / step) * step  # the current minute is not complete yet
    labels = dict(rule.selector.labels) or None
    findings: list[Finding] = []
    scored = 0
    for metric in rule.selector.metrics:
        matrix = store.matrix(
            metric, selector=labels, start=end - history, end=end, resolution="long"
        )
        for row, info in enumerate(matrix.series):
            if not series_selected(rule, info.attributes):
                continue
            if scored >= limit:
                log.warning(
                    "rule %s: more than max_series=%d series selected; the rest are not scored",
                    rule.id,
                    limit,
                )
                return findings
            scored += 1
            values = np.asarray(matrix.values[row], dtype=np.float64)
            findings.append(
                _judge(rule, info, matrix.times + step, values, end, recent, threshold, fold)
            )
    return findings


def _judge(
    rule: Rule,
    info: SeriesInfo,
    times: np.ndarray,
    values: np.ndarray,
    end: float,
    recent: float,
    threshold: float,
    min_fold: float = 1.0,
) -> Finding:
    subject, facts = series_subject(info), series_facts(info.attributes)
    known = np.isfinite(values)
    newest = times > end - recent
    base: dict[str, object] = {
        "metric": info.metric,
        "threshold": threshold,
        "known_minutes": int(known.sum()),
    }
    base.update(series_identity(info))
    warmup = anomaly.AnomalyParams().warmup_rows
    if known.sum() <= warmup or not known[newest].any():
        why = "no data in the newest window" if known.sum() > warmup else "too little history"
        return _finding(
            rule,
            series_facts(info.attributes),
            subject,
            Verdict.UNKNOWN,
            times,
            values,
            base,
            why,
            end - recent,
            end,
        )
    scores = anomaly.score_series(times, values)
    window = np.where(newest & np.isfinite(scores), scores, -np.inf)
    top = int(np.argmax(window))
    score = float(window[top])
    history = values[known & ~newest]
    median = float(np.median(history)) if history.size else math.nan
    evidence = {
        **base,
        "score": round(score, 4) if math.isfinite(score) else None,
        "value": float(values[top]) if np.isfinite(values[top]) else None,
        "baseline_median": median,
        "at": float(times[top]),
    }
    if min_fold > 1.0:
        before = known & (times > end - recent - FOLD_BASELINE_SECONDS) & ~newest
        hour = float(np.median(values[before])) if before.any() else math.nan
        fold = fold_change(float(values[top]), hour) if score >= threshold else math.nan
        evidence["hour_before_median"] = hour
        evidence["fold_change"] = round(fold, 3) if math.isfinite(fold) else None
        if math.isfinite(fold) and fold < min_fold:
            score = -math.inf  # new to the scorer, ordinary for the service
    if score >= threshold:
        summary = (
            f"{subject}: {values[top]:.4g} at a score of {score:.3f} (threshold {threshold}); "
            f"median of the last {int(known.sum())} minutes {median:.4g}"
        )
        if min_fold > 1.0:
            summary += f", {evidence['fold_change']}x the hour before ({hour:.4g})"
        return _finding(
            rule, facts, subject, Verdict.FIRING, times, values, evidence, summary,
            end - recent, end,
        )  # fmt: skip
    return _finding(
        rule,
        series_facts(info.attributes),
        subject,
        Verdict.CLEAR,
        times,
        values,
        evidence,
        "",
        end - recent,
        end,
    )


def _finding(
    rule: Rule,
    facts: Facts,
    subject: str,
    verdict: Verdict,
    times: np.ndarray,
    values: np.ndarray,
    evidence: Mapping[str, object],
    summary: str,
    start: float,
    end: float,
) -> Finding:
    known = np.isfinite(values)
    points = tuple(
        (float(t), float(v))
        for t, v in zip(times[known][-POINTS:], values[known][-POINTS:], strict=True)
    )
    return new_finding(
        rule,
        subject=subject,
        verdict=verdict,
        window=(start, end),
        facts=facts,
        summary=summary,
        evidence={k: v for k, v in evidence.items() if isinstance(v, str | int | float | bool)},
        points=points,
    )


DETECTOR = Detector(
    spec=spec_of(
        "metric_anomaly",
        "A selected metric did what it never did in its recent history (the NAB-scored "
        "nearest-neighbour/novelty/step scorer, causal, at one-minute resolution).",
        subjects=(Subject.JOB, Subject.NODE, Subject.DEPLOYMENT),
        signals=(),
        params=MetricAnomalyParams,
        selector=("metrics", "teams", "jobs", "models", "nodes", "labels"),
        requires=("metrics",),
    ),
    params=MetricAnomalyParams,
    run=run_metric_anomaly,
)
