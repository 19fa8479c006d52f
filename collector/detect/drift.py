"""Model drift: a model's latency, throughput or errors moved away from its (seasonal) baseline.

Two stages, as everywhere in detection:

1. **Screen** every selected subject at once. Per bin ``t``, ``y[t]`` is the statistic over the
   window ending there (merged histogram buckets, summed counters). The residual is ``y`` minus
   the median of the same phase of the previous seasons (when the store holds at least two of
   them) minus the local level (median of the ``LOCAL_WINDOWS`` windows before the judged one).
   A subject is a candidate when the robust z of its residual against the history (median/MAD,
   the current window excluded) passes ``threshold`` in the bad direction *and* the change is at
   least ``min_relative_change`` of the baseline, for each of the last ``hold_bins`` bins.
2. **Confirm** only the candidates with statsmodels: an AR(1)+constant SARIMAX fitted on the
   (winsorised) residuals of non-overlapping history windows gives a prediction interval for the
   current window (the autocorrelation of telemetry is in the model, not ignored); the candidate
   fires when the current residual is outside it (``confirm_alpha``). With fewer than
   ``MIN_CONFIRM_POINTS`` history windows the screen decides alone, and the evidence says so.

Skewed bins (:func:`.numerics.drift.skew_threshold`): when the statistic is a window mean of
per-bin values (a counter's rate), the bins' skewness on the history moves the threshold by the
Cornish-Fisher term, so a worker whose batches are sometimes 4x slower (PAI job 4, workers 5 and
6) needs a bigger dip than one whose batch times are symmetric: an A/A calibration on the
series' own bins.

Sampling noise (:mod:`.numerics.drift_noise`): a window with too few requests for its statistic
(a p99 needs 200) does not count, and the standard error of a window's quantile, read off its
own histogram, is a floor under both stages' scale (a noisy p99 needs a bigger move).

Missing data is never healthy: a subject whose current window is under-covered or has too few
requests, or whose history is too short to judge, is UNKNOWN.

The numbers of both stages are :mod:`.numerics.drift` (arrays in, verdicts out); this module
reads the store, turns each subject into its window statistic, and words the findings.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, JsonScalar, Verdict, new_finding
from gpuwarden.collector.detect.forecast import check_seasonal
from gpuwarden.collector.detect.model_series import (
    Binned,
    read_model_metric,
    statistic_of,
    supports,
    window_sums,
)
from gpuwarden.collector.detect.numerics.drift import DriftFits, DriftParams, Evaluation, evaluate
from gpuwarden.collector.detect.numerics.drift_noise import (
    min_requests,
    quantile_noise,
    window_requests,
)
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, number, text
from gpuwarden.collector.store.types import Kind
from gpuwarden.collector.store.window import WindowStore

FloatArray = npt.NDArray[np.float64]

MAX_POINTS = 240
"""Points of the window statistic a finding carries (thinned evenly beyond)."""

STATISTICS = ("mean", "p50", "p95", "p99", "rate", "error_ratio")
DIRECTIONS = ("increase", "decrease", "both")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelDriftParams:
    """Parameters of ``model_drift``."""

    statistic: str = text("p95", "What is compared.", choices=STATISTICS)
    direction: str = text("increase", "Which change is bad.", choices=DIRECTIONS)
    window_seconds: float = duration("1h", "5m", "1d", "Window judged.")
    history_seconds: float = duration("14d", "1h", "90d", "Baseline history.")
    season_seconds: float = duration(
        "1d", "0s", "30d", "Seasonal period removed before comparing (0: none)."
    )
    threshold: float = number(
        4.0,
        1.0,
        50.0,
        "Robust z-score of the deseasonalised residual that counts (raised for a counter's "
        "rate whose bins have a heavy bad tail).",
    )
    min_relative_change: float = number(
        0.2, 0.0, 10.0, "And the change must be at least this share of the baseline."
    )


def _check(p: ModelDriftParams) -> tuple[str, str] | None:
    return check_seasonal(
        p.history_seconds, p.season_seconds, (("window_seconds", p.window_seconds),)
    )


def _params_of(p: ModelDriftParams) -> DriftParams:
    """The numerics' parameters of a validated rule."""
    return DriftParams(
        statistic=p.statistic,
        direction=p.direction,
        window_seconds=p.window_seconds,
        history_seconds=p.history_seconds,
        season_seconds=p.season_seconds,
        threshold=p.threshold,
        min_relative_change=p.min_relative_change,
    )


def run_model_drift(
    ctx: DetectionContext, rule: Rule, p: ModelDriftParams, now: float
) -> list[Finding]:
    """Engine runner: one finding per selected model × metric."""
    params = _params_of(p)
    bin_seconds = params.bin_seconds or float(ctx.store.step_seconds)
    end = math.floor(now / bin_seconds) * bin_seconds
    window_bins = max(1, round(params.window_seconds / bin_seconds))
    start = held_start(ctx.store, end - params.history_seconds, end, bin_seconds, window_bins)
    labels = dict(rule.selector.labels) or None
    subjects: list[Binned] = []
    for metric in rule.selector.metrics:
        found = read_model_metric(
            ctx.store, metric, selector=labels, start=start, end=end, bin_seconds=bin_seconds
        )
        subjects.extend(
            b
            for b in found
            if not rule.selector.models
            or any(fnmatch.fnmatchcase(b.model, m) for m in rule.selector.models)
        )
    return detect_drift(subjects, params, rule=rule, fits=ctx.cache(DriftFits))


def held_start(store: WindowStore, start: float, end: float, bin_seconds: float,
               window_bins: int) -> float:  # fmt: skip
    """``start`` moved up to where the store's reads can return data, less one window.

    Model series are read from the recent window (histograms are kept for it only, numbers are
    read at full resolution), and nothing before ``held_since``: the 14 days of 10 s bins the
    default rule asks for are mostly empty (121k bins read, merged and screened per subject).
    Every stage treats a bin without data as unknown, and a window that ends before the data
    starts has none, so verdicts, scores and evidence are those of the whole history; the bins
    stay on the same grid (``end`` minus whole bins), one start for every metric of the rule.
    """
    held = end - store.recent_seconds
    since = store.held_since()
    if since is not None:
        held = max(held, since)
    bins_back = math.ceil((end - held) / bin_seconds) + window_bins
    return max(start, end - bins_back * bin_seconds)


def detect_drift(
    subjects: Sequence[Binned],
    params: DriftParams,
    *,
    rule: Rule,
    fits: DriftFits | None = None,
) -> list[Finding]:
    """Judge each subject's newest window; all subjects must share one bin grid."""
    ok = [supports(s.kind, params.statistic) and s.times.size > 0 for s in subjects]
    usable = [s for s, good in zip(subjects, ok, strict=True) if good]
    findings = [
        _finding(s, params, rule, Verdict.UNKNOWN, {}, "statistic not available")
        for s, good in zip(subjects, ok, strict=True)
        if not good
    ]
    if not usable:
        return findings
    bin_seconds = usable[0].bin_seconds
    window_bins = max(1, round(params.window_seconds / bin_seconds))
    y = np.vstack([window_statistic(s, params, window_bins) for s in usable])
    noise = np.vstack([quantile_noise(s, params.statistic, window_bins) for s in usable])
    per_bin = np.vstack([bin_values(s, params.statistic) for s in usable])
    keys = [(rule.id, s.model, s.metric, params.window_seconds) for s in usable]
    judged = evaluate(
        y,
        params,
        window_bins=window_bins,
        bin_seconds=bin_seconds,
        noise=noise,
        bin_values=per_bin,
        fits=fits,
        keys=keys,
    )
    for i, subject in enumerate(usable):
        requests = float(window_requests(subject, window_bins)[-1])
        findings.append(_judge(subject, i, judged, params, window_bins, rule, requests))
    return findings


def window_statistic(subject: Binned, params: DriftParams, window_bins: int) -> FloatArray:
    """The statistic over the window ending at each bin.

    NaN where under-covered, or with too few requests for the statistic (see
    :func:`.numerics.drift_noise.min_requests`): a p99 of 40 requests is their maximum, not a p99.
    """
    sums, known = window_sums(subject.parts, window_bins)
    y = statistic_of(subject, sums, params.statistic, window_bins * subject.bin_seconds)
    y[known < params.min_coverage * window_bins] = np.nan
    if subject.kind is Kind.HISTOGRAM:
        with np.errstate(invalid="ignore"):
            y[sums[:, :-1].sum(axis=1) < min_requests(params.statistic)] = np.nan
    return y


def bin_values(subject: Binned, statistic: str) -> FloatArray:
    """Per bin, the value whose window mean the statistic is, in its unit (a counter's rate
    over the bin for ``rate``); all NaN for statistics that are not window means (quantiles,
    ratios)."""
    if subject.kind is Kind.COUNTER and statistic == "rate":
        return np.asarray(subject.parts[:, 0] / subject.bin_seconds, dtype=np.float64)
    return np.full(subject.times.size, np.nan)


def _judge(
    subject: Binned,
    i: int,
    judged: Evaluation,
    params: DriftParams,
    window_bins: int,
    rule: Rule,
    requests: float = math.nan,
) -> Finding:
    screen = judged.screen
    evidence: dict[str, JsonScalar] = {
        "value": _f(screen.value[i]),
        "baseline": _f(screen.baseline[i]),
        "score": _f(screen.z[i]),
        "threshold": _f(screen.threshold[i]),
        "relative_change": _f(screen.relative_change[i]),
        "min_relative_change": params.min_relative_change,
        "baseline_kind": "seasonal" if screen.seasonal[i] else "plain",
        "requests": _f(requests),
        "noise": _f(screen.noise[i]),
    }
    verdict = Verdict(int(judged.verdicts[i]))
    if verdict is Verdict.UNKNOWN:
        why = "short history"
        if math.isnan(screen.value[i]):
            need = min_requests(params.statistic)
            why = (
                f"too few requests in the current window ({requests:.0f} < {need:.0f})"
                if math.isfinite(requests) and 0 < requests < need
                else "no data in the current window"
            )
        return _finding(subject, params, rule, verdict, evidence, why)
    if screen.candidate[i]:
        p = judged.p_values[i]
        evidence["p_value"] = _f(p)
        evidence["confirm"] = "screen_only" if math.isnan(p) else "ar1_interval"
    summary = (
        f"{subject.model} {params.statistic} of {subject.metric}: "
        f"{_fmt(screen.value[i])} vs baseline {_fmt(screen.baseline[i])} "
        f"(z {_fmt(screen.z[i])}, {_fmt(100 * screen.relative_change[i])} %)"
    )
    return _finding(subject, params, rule, verdict, evidence, summary, screen.y[i], window_bins)


def _finding(
    subject: Binned,
    params: DriftParams,
    rule: Rule,
    verdict: Verdict,
    evidence: dict[str, JsonScalar],
    summary: str,
    y: FloatArray | None = None,
    window_bins: int = 1,
) -> Finding:
    end = float(subject.times[-1] + subject.bin_seconds) if subject.times.size else 0.0
    points: tuple[tuple[float, float], ...] = ()
    if y is not None:
        ends = subject.times + subject.bin_seconds
        keep = np.flatnonzero(~np.isnan(y))
        stride = max(1, math.ceil(keep.size / MAX_POINTS))
        keep = keep[::-1][::stride][::-1]
        points = tuple((float(ends[k]), float(y[k])) for k in keep)
    full: dict[str, JsonScalar] = {
        "model": subject.model,
        "metric": subject.metric,
        "statistic": params.statistic,
        "direction": params.direction,
        "window_seconds": window_bins * subject.bin_seconds
        if y is not None
        else params.window_seconds,
        "history_seconds": params.history_seconds,
        "season_seconds": params.season_seconds,
        "bin_seconds": subject.bin_seconds,
        "series": subject.series,
        **evidence,
    }
    return new_finding(
        rule,
        subject=f"{subject.model}/{subject.metric}/{params.statistic}",
        verdict=verdict,
        window=(end - params.window_seconds, end),
        facts=Facts(model=subject.model),
        summary=summary,
        evidence=full,
        points=points,
    )


def _f(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else "n/a"


DETECTOR = Detector(
    spec=spec_of(
        "model_drift",
        "A model's latency, throughput or errors regressed against its seasonal baseline.",
        subjects=(Subject.DEPLOYMENT,),
        signals=("gpuwarden.model.request.latency", "gpuwarden.model.requests"),
        params=ModelDriftParams,
        selector=("metrics", "models", "labels"),
        requires=("metrics",),
        check=_check,
    ),
    params=ModelDriftParams,
    run=run_model_drift,
)
