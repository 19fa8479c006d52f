"""The numbers of ``model_drift`` (:mod:`gpuwarden.collector.detect.drift`): screen, confirm.

Arrays in, verdicts out: :func:`evaluate` takes the window statistic of every subject
(subjects x bins) and gives the screen's numbers (:func:`screen_drift`: residual against the
seasonal baseline and the local level, robust z, threshold raised for skewed bins by
:func:`skew_threshold`) and, for the candidates only, the AR(1) interval of :func:`confirm_shift`
(fits kept by :class:`DriftFits`). The detector module reads the store and words the findings.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.numerics.screen import held_for, nanmedian, robust_scale

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
MIN_SKEW_BINS = 60
"""Per-bin history values needed before their skewness counts (see :func:`skew_threshold`)."""
MAX_WINDOW_SKEW = 1.0
RELATIVE_SCALE_FLOOR = 1e-3
"""The robust scale is at least this share of the baseline (a flat history is not infinitely
sure of itself)."""


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
    :func:`..drift.bin_values`): the skewness of their deviations from ``y`` over the history
    calibrates the threshold (:func:`skew_threshold`).
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


def _bad(x: FloatArray, direction: str) -> FloatArray:
    """The part of a signed change that is bad: positive = worse."""
    if direction == "increase":
        return x
    if direction == "decrease":
        return -x
    return np.abs(x)
