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

Skewed bins (:func:`skew_threshold`): when the statistic is a window mean of per-bin values (a
counter's rate), the bins' skewness on the history moves the threshold by the Cornish-Fisher
term, so a worker whose batches are sometimes 4x slower (PAI job 4, workers 5 and 6) needs a
bigger dip than one whose batch times are symmetric: an A/A calibration on the series' own bins.

Sampling noise (:mod:`.drift_noise`): a window with too few requests for its statistic (a p99
needs 200) does not count, and the standard error of a window's quantile, read off its own
histogram, is a floor under both stages' scale (a noisy p99 needs a bigger move).

Missing data is never healthy: a subject whose current window is under-covered or has too few
requests, or whose history is too short to judge, is UNKNOWN.
"""

from __future__ import annotations

import fnmatch
import math
import warnings
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

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
from gpuwarden.collector.detect.numerics.drift_noise import (
    min_requests,
    quantile_noise,
    window_requests,
)
from gpuwarden.collector.detect.numerics.screen import held_for, nanmedian, robust_scale
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, number, text
from gpuwarden.collector.store.types import Kind

FloatArray = npt.NDArray[np.float64]

HOLD_BINS = 3
"""Bins in a row the screen must flag (persistence against one-bin blips)."""
MIN_COVERAGE = 0.5
"""Share of a window's bins that must hold data for its statistic to count."""
MIN_HISTORY_WINDOWS = 3
"""History must hold at least this many windows' worth of known bins (and 30 bins)."""
LOCAL_WINDOWS = 12
"""Windows before the judged one whose median is the local level."""
MIN_CONFIRM_POINTS = 8
CONFIRM_ALPHA = 1e-3
WINSOR_SIGMAS = 5.0
"""History residuals are clipped this many robust sigmas from their median before the fit."""
MAX_POINTS = 240
MIN_SKEW_BINS = 60
"""Per-bin history values needed before their skewness counts (see :func:`skew_threshold`)."""
MAX_WINDOW_SKEW = 1.0
RELATIVE_SCALE_FLOOR = 1e-3
"""The robust scale is at least this share of the baseline (a flat history is not infinitely
sure of itself)."""


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


@dataclass(frozen=True, slots=True)
class DriftParams:
    """A ``model_drift`` rule's parameters, plus the knobs it does not expose."""

    statistic: str = "p95"
    direction: str = "increase"
    window_seconds: float = 3600.0
    history_seconds: float = 14 * 86400.0
    season_seconds: float = 86400.0
    threshold: float = 4.0
    min_relative_change: float = 0.2
    hold_bins: int = HOLD_BINS
    min_coverage: float = MIN_COVERAGE
    confirm_alpha: float = CONFIRM_ALPHA
    bin_seconds: float | None = None
    """Resolution of ``y``; default the store's step."""

    @classmethod
    def of(cls, p: ModelDriftParams) -> DriftParams:
        """The parameters of a validated rule."""
        return cls(
            statistic=p.statistic,
            direction=p.direction,
            window_seconds=p.window_seconds,
            history_seconds=p.history_seconds,
            season_seconds=p.season_seconds,
            threshold=p.threshold,
            min_relative_change=p.min_relative_change,
        )


@dataclass(frozen=True, slots=True)
class Screen:
    """The screen's numbers for every subject (rows), at the newest bin."""

    value: FloatArray
    baseline: FloatArray
    z: FloatArray
    relative_change: FloatArray
    candidate: npt.NDArray[np.bool_]
    judged: npt.NDArray[np.bool_]
    seasonal: npt.NDArray[np.bool_]
    residuals: FloatArray
    """Subjects × bins: the residual each z was computed from."""
    y: FloatArray
    history_end: int
    """Bins before this index are the history (the current window and hold excluded)."""
    noise: FloatArray
    """The newest window's sampling standard error (NaN: not known)."""
    threshold: FloatArray
    """The z threshold each subject was judged with (see :func:`skew_threshold`)."""


def run_model_drift(
    ctx: DetectionContext, rule: Rule, p: ModelDriftParams, now: float
) -> list[Finding]:
    """Engine runner: one finding per selected model × metric."""
    params = DriftParams.of(p)
    bin_seconds = params.bin_seconds or float(ctx.store.step_seconds)
    end = math.floor(now / bin_seconds) * bin_seconds
    start = end - params.history_seconds
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


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Both stages for every row: the screen's numbers, then verdicts and confirm p-values."""

    screen: Screen
    verdicts: npt.NDArray[np.int8]
    p_values: FloatArray
    """NaN where not confirmed by a model (not a candidate, or history too short to fit)."""


def evaluate(
    y: FloatArray,
    params: DriftParams,
    *,
    window_bins: int,
    bin_seconds: float,
    noise: FloatArray | None = None,
    bin_values: FloatArray | None = None,
    fits: DriftFits | None = None,
    keys: Sequence[Hashable] | None = None,
) -> Evaluation:
    """Screen all rows of ``y`` (window statistics, subjects × bins), confirm the candidates.

    ``noise`` (same shape, NaN = none) is each window's sampling standard error
    (:func:`.drift_noise.quantile_noise`), a floor under both stages' scale. ``bin_values``
    (same shape, NaN = none) are the per-bin values whose window mean ``y`` is (see
    :func:`bin_values`): the skewness of their deviations from ``y`` over the history calibrates
    the threshold (:func:`skew_threshold`).
    """
    screen = screen_drift(
        y,
        params,
        window_bins=window_bins,
        bin_seconds=bin_seconds,
        noise=noise,
        bin_values=bin_values,
    )
    verdicts = np.where(screen.judged, int(Verdict.CLEAR), int(Verdict.UNKNOWN)).astype(np.int8)
    p_values = np.full(y.shape[0], np.nan)
    last = y.shape[1] - 1
    idx = np.arange(screen.history_end - 1, -1, -window_bins)[::-1]
    steps = max(1, math.ceil((last - int(idx[-1])) / window_bins)) if idx.size else 1
    for i in np.flatnonzero(screen.candidate).tolist():
        residuals = screen.residuals[i]
        confirmed, p = confirm_shift(
            residuals[idx],
            float(residuals[last]),
            params.direction,
            params.confirm_alpha,
            steps=steps,
            floor=float(screen.noise[i]),
            fits=fits,
            key=keys[i] if keys is not None else None,
        )
        if p is not None:
            p_values[i] = p
        if confirmed:
            verdicts[i] = int(Verdict.FIRING)
    return Evaluation(screen=screen, verdicts=verdicts, p_values=p_values)


def window_statistic(subject: Binned, params: DriftParams, window_bins: int) -> FloatArray:
    """The statistic over the window ending at each bin.

    NaN where under-covered, or with too few requests for the statistic (see
    :func:`.drift_noise.min_requests`): a p99 of 40 requests is their maximum, not a p99.
    """
    sums, known = window_sums(subject.parts, window_bins)
    y = statistic_of(subject, sums, params.statistic, window_bins * subject.bin_seconds)
    y[known < params.min_coverage * window_bins] = np.nan
    if subject.kind is Kind.HISTOGRAM:
        with np.errstate(invalid="ignore"):
            y[sums[:, :-1].sum(axis=1) < min_requests(params.statistic)] = np.nan
    return y


def screen_drift(
    y: FloatArray,
    params: DriftParams,
    *,
    window_bins: int,
    bin_seconds: float,
    noise: FloatArray | None = None,
    bin_values: FloatArray | None = None,
) -> Screen:
    """Stage one over ``subjects × bins`` window statistics (NaN = not enough data).

    The residual is ``y`` minus its seasonal baseline (when there is one) minus its local level:
    the median of the ``LOCAL_WINDOWS`` non-overlapping windows before the one judged. The
    local level takes out what a season cannot (a slow drift through a day without a previous
    day to compare with), and makes a change "new" for ``LOCAL_WINDOWS`` windows, after which it
    is the new normal.
    """
    n, bins = y.shape
    hold = params.hold_bins
    seasonal_base = seasonal_baseline(y, params.season_seconds, bin_seconds)
    seasonal: npt.NDArray[np.bool_] = np.asarray(
        ~np.isnan(seasonal_base[:, -hold:]).any(axis=1), dtype=bool
    )
    deseasonal = np.where(seasonal[:, None], y - seasonal_base, y)
    local = local_level(deseasonal, window_bins)
    residuals = deseasonal - local
    history_end = max(0, bins - window_bins - hold)
    hist = residuals[:, :history_end]
    known_hist = np.sum(~np.isnan(hist), axis=1)
    min_known = max(MIN_HISTORY_WINDOWS * window_bins, 30)
    center = nanmedian(hist, axis=1) if history_end else np.full(n, np.nan)
    base_now = local[:, -hold:] + center[:, None]
    base_now = np.where(seasonal[:, None], seasonal_base[:, -hold:] + base_now, base_now)
    scale = robust_scale(hist, center, axis=1) if history_end else np.full(n, np.nan)
    with np.errstate(invalid="ignore"):
        scale = np.maximum(scale, RELATIVE_SCALE_FLOOR * np.abs(base_now[:, -1]))
    # per bin: the history's scale, or the window's own sampling noise when that is larger
    noise_now = np.full((n, hold), np.nan) if noise is None else noise[:, -hold:]
    scale_now = np.fmax(scale[:, None], noise_now)
    current = residuals[:, -hold:]
    with np.errstate(invalid="ignore", divide="ignore"):
        z = (current - center[:, None]) / scale_now
        rel = (y[:, -hold:] - base_now) / np.abs(base_now)
    bad_z, bad_rel = _bad(z, params.direction), _bad(rel, params.direction)
    threshold = np.full(n, params.threshold)
    if bin_values is not None and history_end:
        # each bin around its own window's value: the noise, not the traffic's daily swing
        spread = bin_values[:, :history_end] - y[:, :history_end]
        threshold = skew_threshold(spread, params.threshold, params.direction, window_bins)
    with np.errstate(invalid="ignore"):
        flags = (bad_z >= threshold[:, None]) & (bad_rel >= params.min_relative_change)
    known_now = ~np.isnan(current)
    held = held_for(flags, hold, known=known_now)[:, -1] & known_now.all(axis=1)
    judged = (known_hist >= min_known) & ~np.isnan(current[:, -1])
    return Screen(
        value=y[:, -1],
        baseline=base_now[:, -1],
        z=z[:, -1],
        relative_change=rel[:, -1],
        candidate=held & judged,
        judged=judged,
        seasonal=seasonal,
        residuals=residuals,
        y=y,
        history_end=history_end,
        noise=noise_now[:, -1],
        threshold=threshold,
    )


def bin_values(subject: Binned, statistic: str) -> FloatArray:
    """Per bin, the value whose window mean the statistic is, in its unit (a counter's rate
    over the bin for ``rate``); all NaN for statistics that are not window means (quantiles,
    ratios)."""
    if subject.kind is Kind.COUNTER and statistic == "rate":
        return np.asarray(subject.parts[:, 0] / subject.bin_seconds, dtype=np.float64)
    return np.full(subject.times.size, np.nan)


def skew_threshold(
    history: FloatArray, threshold: float, direction: str, window_bins: int
) -> FloatArray:
    """Per row, ``threshold`` moved to where a window mean of ``history``'s bins puts it.

    The robust z assumes a Gaussian window statistic. A window mean of ``window_bins`` skewed
    bins has skewness ``g / sqrt(window_bins)`` (``g``: the skewness of ``history``, the bins'
    deviations from their local level), and the Cornish-Fisher expansion moves the quantile
    that sits ``threshold`` sigmas out by ``(threshold**2 - 1) * skew / 6`` on the heavy
    side. Only a heavy *bad* tail raises the threshold (a worker whose batches are sometimes
    4x slower dips that far without any change); the skewness counted is capped at
    ``MAX_WINDOW_SKEW`` (the expansion is only good for moderate skew). Rows without per-bin
    values keep ``threshold``.
    """
    known = np.sum(~np.isnan(history), axis=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows without values
        mean = np.nanmean(history, axis=1, keepdims=True)
        dev = history - mean
        m2 = np.nanmean(dev**2, axis=1)
        m3 = np.nanmean(dev**3, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            g = np.where((known >= MIN_SKEW_BINS) & (m2 > 0), m3 / m2**1.5, 0.0)
    bad = np.clip(_bad(g, direction) / math.sqrt(max(window_bins, 1)), 0.0, MAX_WINDOW_SKEW)
    return np.asarray(threshold + (threshold**2 - 1.0) * bad / 6.0, dtype=np.float64)


def local_level(x: FloatArray, window_bins: int, windows: int = LOCAL_WINDOWS) -> FloatArray:
    """Per bin, the median of ``x`` one, two, ... ``windows`` windows earlier.

    NaN where fewer than half of them are known.
    """
    stack = np.full((windows, *x.shape), np.nan)
    for j in range(1, windows + 1):
        lag = j * window_bins
        if lag < x.shape[1]:
            stack[j - 1, :, lag:] = x[:, : x.shape[1] - lag]
    enough = np.sum(~np.isnan(stack), axis=0) * 2 >= windows
    return np.where(enough, nanmedian(np.moveaxis(stack, 0, -1), axis=-1), np.nan)


def seasonal_baseline(y: FloatArray, season_seconds: float, bin_seconds: float) -> FloatArray:
    """Median of the same phase of the previous seasons (NaN with fewer than two of them)."""
    out = np.full_like(y, np.nan)
    lag = round(season_seconds / bin_seconds) if season_seconds > 0 else 0
    if lag < 1 or y.shape[1] <= 2 * lag:
        return out
    seasons = (y.shape[1] - 1) // lag
    stack = np.full((seasons, *y.shape), np.nan)
    for k in range(1, seasons + 1):
        stack[k - 1, :, k * lag :] = y[:, : y.shape[1] - k * lag]
    enough = np.sum(~np.isnan(stack), axis=0) >= 2
    return np.where(enough, nanmedian(np.moveaxis(stack, 0, -1), axis=-1), np.nan)


@dataclass
class _Fit:
    """The AR(1) parameters fitted for one subject, and how many cycles reused them."""

    params: FloatArray
    uses: int = 0


class DriftFits:
    """AR(1) fits of the confirm stage, per subject, reused for ``refit_every`` cycles: each
    cycle filters the new history with the kept parameters (statsmodels ``filter``, no
    optimisation) instead of fitting again. Bounded (least recently used out)."""

    def __init__(self, *, refit_every: int = 20, capacity: int = 4096) -> None:
        self.refit_every = refit_every
        self._capacity = capacity
        self._fits: OrderedDict[Hashable, _Fit] = OrderedDict()
        self.fitted = 0
        self.reused = 0

    def get(self, key: Hashable) -> _Fit | None:
        """A fit still young enough to reuse (it is counted as used)."""
        fit = self._fits.get(key)
        if fit is None or fit.uses >= self.refit_every:
            return None
        self._fits.move_to_end(key)
        fit.uses += 1
        self.reused += 1
        return fit

    def put(self, key: Hashable, params: FloatArray) -> None:
        """Keep fresh parameters for ``key``."""
        self._fits[key] = _Fit(params)
        self._fits.move_to_end(key)
        self.fitted += 1
        while len(self._fits) > self._capacity:
            self._fits.popitem(last=False)


def confirm_shift(
    history: FloatArray,
    current: float,
    direction: str,
    alpha: float,
    *,
    steps: int = 1,
    floor: float = math.nan,
    fits: DriftFits | None = None,
    key: Hashable | None = None,
) -> tuple[bool, float | None]:
    """Stage two: is ``current`` outside an AR(1) prediction interval ``steps`` after ``history``.

    ``history`` is the residual of non-overlapping windows, oldest first (NaN allowed: the state
    space model skips them). ``floor`` (NaN: none) is the current window's sampling standard
    error; the interval is never narrower. Returns ``(confirmed, p_value)``; ``p_value`` is None
    when the history is too short to fit (then the screen's word stands).
    """
    known = history[~np.isnan(history)]
    if known.size < MIN_CONFIRM_POINTS:
        return True, None
    if np.ptp(known) == 0:
        return bool(current != known[0]), None
    # Winsorise: one past outlier must not widen the interval of every later window.
    center = float(np.median(known))
    spread = WINSOR_SIGMAS * float(
        robust_scale(known[np.newaxis, :], np.array([center]), axis=1)[0]
    )
    history = np.clip(history, center - spread, center + spread)
    from statsmodels.tsa.statespace.sarimax import SARIMAX

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on short, flat histories
        model = SARIMAX(history, order=(1, 0, 0), trend="c")
        kept = fits.get(key) if fits is not None and key is not None else None
        if kept is not None:
            # the kept parameters on the new history; their covariance is never used
            fitted = model.filter(kept.params, cov_type="none")
        else:
            fitted = model.fit(disp=False, cov_type="none")
            if fits is not None and key is not None:
                fits.put(key, np.asarray(fitted.params, dtype=np.float64))
        forecast = fitted.get_forecast(steps=steps)
        mean = float(np.asarray(forecast.predicted_mean)[-1])
        se = float(np.asarray(forecast.se_mean)[-1])
    if not (math.isfinite(se) and se > 0):
        return True, None
    if math.isfinite(floor):
        se = max(se, floor)
    z = (current - mean) / se
    if direction == "increase":
        p = float(stats.norm.sf(z))
    elif direction == "decrease":
        p = float(stats.norm.cdf(z))
    else:
        p = float(2 * stats.norm.sf(abs(z)))
    return p < alpha, p


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


def _bad(x: FloatArray, direction: str) -> FloatArray:
    """The part of a signed change that is bad: positive = worse."""
    if direction == "increase":
        return x
    if direction == "decrease":
        return -x
    return np.abs(x)


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
