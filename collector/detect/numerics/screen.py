"""Screen primitives: NaN-aware, vectorised over a series × time matrix (rows = series).

Stage one of the detector cycle runs these on every series at once; stage two
(:mod:`gpuwarden.collector.detect.numerics.confirm`) looks only at the rows they flag. Conventions:

* Input is a float matrix, one row per series, one column per time slot; a 1-D array is one row.
* NaN is a missing sample. Missing never counts as "normal" nor as "anomalous": outputs are NaN
  (floats) or False (masks) at missing slots, running statistics carry over a gap unchanged, and
  a row with too few known samples gets NaN rather than a guess.
* Robust scale is the MAD times 1.4826 (the normal-consistent factor). When more than half of a
  row is one value the MAD is 0; the mean absolute deviation times 1.2533 stands in, and an
  absolute floor ``min_scale`` keeps a truly flat row from dividing by zero.

``held_for`` is whole-array numpy; ``ewma`` and ``cusum`` (whose state
is non-linear or restarts) step over columns, each step a numpy operation over all rows on a
time-major copy so that a column is contiguous in memory. ``ar1_tests`` runs the confirm stage's
two tests without its fits. The whole bench screen (10,000 series × 360 slots against a 1 h
baseline, ``bench/detect_bench.py``) takes about 0.6 s on two cores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatMatrix = npt.NDArray[np.float64]
FloatVector = npt.NDArray[np.float64]
BoolMatrix = npt.NDArray[np.bool_]
BoolVector = npt.NDArray[np.bool_]

MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): MAD of a normal sample times this estimates sigma
MEAN_AD_TO_SIGMA = 1.2533  # sqrt(pi / 2): same for the mean absolute deviation
DEFAULT_MIN_SCALE = 1e-9
PHI_LIMIT = 0.99  # keep the AR(1) filter stable
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_SORT_MIN = 16  # on shorter lanes the float32 copy costs more than the sort saves


def as_matrix(x: npt.ArrayLike) -> FloatMatrix:
    """``x`` as a float64 matrix (a 1-D array becomes one row); rejects other shapes."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[np.newaxis, :]
    if arr.ndim != 2:
        raise ValueError(f"expected series × time (2-D), got shape {arr.shape}")
    return arr


def nanmedian(x: npt.NDArray[np.float64], axis: int = -1) -> npt.NDArray[np.float64]:
    """Median along ``axis`` ignoring NaN; NaN where a lane has no known value.

    Sorts once (NaN sorts last) and picks the middle of the known values: much faster than
    ``np.nanmedian`` on short rows, which falls back to masked arrays.
    """
    ordered = np.sort(x, axis=axis)
    known = np.sum(~np.isnan(x), axis=axis, keepdims=True)
    lo = np.maximum((known - 1) // 2, 0)
    hi = np.maximum(known // 2, 0)
    hi = np.minimum(hi, np.maximum(known - 1, 0))
    median = 0.5 * (
        np.take_along_axis(ordered, lo, axis=axis) + np.take_along_axis(ordered, hi, axis=axis)
    )
    median = np.where(known > 0, median, np.nan)
    return np.squeeze(median, axis=axis)


def _scale_median(deviation: npt.NDArray[np.float64], axis: int) -> npt.NDArray[np.float64]:
    """:func:`nanmedian` of absolute deviations, sorted in float32 along long rows.

    The deviations are already centred, so float32's 7 digits are relative to the spread, not
    to the level: ample for a scale estimate, and numpy's SIMD sort along the last axis is about
    4x faster than in float64 on rows of a few hundred samples (across a short middle axis, as
    for peer groups, it is not faster). Deviations beyond float32's range (not telemetry, but
    possible) keep float64; ones below 1e-38 lose precision, far under any ``min_scale``.
    """
    if axis not in (-1, deviation.ndim - 1) or deviation.shape[-1] < _FLOAT32_SORT_MIN:
        return nanmedian(deviation, axis=axis)
    with np.errstate(invalid="ignore"):
        fits = bool(np.all(~(deviation > _FLOAT32_MAX)))
    if fits:
        return nanmedian(deviation.astype(np.float32), axis=axis).astype(np.float64)
    return nanmedian(deviation, axis=axis)


def robust_scale(
    x: npt.NDArray[np.float64],
    center: npt.NDArray[np.float64],
    axis: int = -1,
    min_scale: float = DEFAULT_MIN_SCALE,
) -> npt.NDArray[np.float64]:
    """Sigma estimate along ``axis`` around ``center``: 1.4826·MAD, else 1.2533·mean |dev|.

    ``center`` has the shape of ``x`` reduced along ``axis``. NaN where a lane has no data.
    """
    deviation = np.abs(x - np.expand_dims(center, axis))
    with np.errstate(invalid="ignore"):
        mad = MAD_TO_SIGMA * _scale_median(deviation, axis)
        known = np.sum(~np.isnan(deviation), axis=axis)
        total = np.nansum(deviation, axis=axis)
        mean_ad = MEAN_AD_TO_SIGMA * np.where(known > 0, total / np.maximum(known, 1), np.nan)
        scale = np.where(mad > 0, mad, mean_ad)
        return np.where(np.isnan(scale), np.nan, np.maximum(scale, min_scale))


def robust_z(
    x: npt.ArrayLike,
    baseline: npt.ArrayLike | None = None,
    *,
    min_scale: float = DEFAULT_MIN_SCALE,
) -> FloatMatrix:
    """Per-row robust z-score ``(x - median) / scale`` (see :func:`robust_scale`).

    Args:
        x: series × time; NaN = missing (stays NaN in the output).
        baseline: series × any, the reference samples each row's median and scale come from
            (e.g. the previous hour); ``None`` uses ``x`` itself.
        min_scale: absolute floor on the scale, in the series' unit.
    """
    values = as_matrix(x)
    reference = values if baseline is None else as_matrix(baseline)
    if reference.shape[0] != values.shape[0]:
        raise ValueError(f"baseline has {reference.shape[0]} rows, x has {values.shape[0]}")
    center = nanmedian(reference, axis=1)
    scale = robust_scale(reference, center, axis=1, min_scale=min_scale)
    return (values - center[:, np.newaxis]) / scale[:, np.newaxis]


def ar1_phi(x: npt.ArrayLike) -> FloatVector:
    """Per-row lag-1 autoregression coefficient of the demeaned row, over pairs both known.

    Clipped to ``[-0.99, 0.99]``; 0 for a row with no known pair or no variance.
    """
    values = as_matrix(x)
    centered = values - _row_nanmean(values)[:, np.newaxis]
    prev, curr = centered[:, :-1], centered[:, 1:]
    pair = ~(np.isnan(prev) | np.isnan(curr))
    num = np.sum(np.where(pair, prev * curr, 0.0), axis=1)
    den = np.sum(np.where(pair, prev * prev, 0.0), axis=1)
    phi = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    clipped: FloatVector = np.clip(phi, -PHI_LIMIT, PHI_LIMIT)
    return clipped


def ar1_prewhiten(
    x: npt.ArrayLike, phi: npt.ArrayLike | None = None
) -> tuple[FloatMatrix, FloatVector]:
    """Per-row AR(1) residuals ``e[t] = c[t] - phi·c[t-1]`` of the demeaned row ``c``.

    Returns ``(residuals, phi)``. A residual is NaN at the first column and wherever ``x[t]`` or
    ``x[t-1]`` is missing (a gap is not bridged: the one-step prediction needs its predecessor).

    Args:
        x: series × time.
        phi: per-row coefficients to use (e.g. fitted on a baseline); ``None`` estimates them
            with :func:`ar1_phi` on ``x``.
    """
    values = as_matrix(x)
    coeff = (
        ar1_phi(values)
        if phi is None
        else np.broadcast_to(np.asarray(phi, dtype=np.float64), (values.shape[0],))
    )
    centered = values - _row_nanmean(values)[:, np.newaxis]
    residuals = np.full_like(values, np.nan)
    residuals[:, 1:] = centered[:, 1:] - coeff[:, np.newaxis] * centered[:, :-1]
    return residuals, np.asarray(coeff, dtype=np.float64)


@dataclass(frozen=True)
class Ar1Tests:
    """Per row, the confirm stage's two tests on AR(1) one-step residuals, without fits."""

    shift_z: FloatVector
    """z of the window's mean residual against the baseline: standard normal under no change
    (NaN where the window has no known residual)."""
    break_sup: FloatVector
    """``sup |cumsum|`` of the demeaned residuals of baseline + window over ``sigma·sqrt(n)``:
    the CUSUM-of-OLS-residuals statistic (p < 0.01 above 1.63). NaN with under two residuals."""


def ar1_tests(
    baseline: npt.ArrayLike, window: npt.ArrayLike, *, min_scale: float = DEFAULT_MIN_SCALE
) -> Ar1Tests:
    """The confirm stage's tests (:mod:`.confirm`) on every row at once, without its fits.

    The AR(1) coefficient, the mean and the residual scale come from ``baseline`` (series ×
    time). The one-step residuals ``e[t] = (x[t] - mean) - phi·(x[t-1] - mean)`` of ``window``
    (the slots that follow it; the first one's predecessor is the baseline's last slot) are
    white under no change, so their mean has variance ``sigma**2 / n``, plus ``sigma**2 / m`` for
    the baseline level it is measured from (``m`` known baseline residuals): ``shift_z`` is
    standard normal. It is the confirm's prediction-interval test; that interval leaves out the
    level's own error, so it cuts at ``q`` where ``shift_z`` cuts at ``q / sqrt(1 + n / m)``.
    ``break_sup`` is the statistic of the confirm's break test (``breaks_cusumolsresid``) on the
    residuals of baseline + window, missing slots skipped. Neither removes seasonality, which
    the confirm does with STL first.
    """
    base, win = as_matrix(baseline), as_matrix(window)
    if base.shape[0] != win.shape[0]:
        raise ValueError(f"baseline has {base.shape[0]} rows, window has {win.shape[0]}")
    phi = ar1_phi(base)[:, np.newaxis]
    centred = np.concatenate([base, win], axis=1) - _row_nanmean(base)[:, np.newaxis]
    resid = centred[:, 1:] - phi * centred[:, :-1]
    split = base.shape[1] - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        head = resid[:, :split]
        sigma = np.maximum(_row_nanstd(head), min_scale)
        m = np.maximum(np.sum(~np.isnan(head), axis=1), 1)
        tail = resid[:, split:]
        n = np.sum(~np.isnan(tail), axis=1)
        mean = np.nansum(tail, axis=1) / np.maximum(n, 1)
        z = np.where(n > 0, mean / (sigma * np.sqrt(1.0 / np.maximum(n, 1) + 1.0 / m)), np.nan)
        known = ~np.isnan(resid)
        total = np.sum(known, axis=1)
        demeaned = np.where(known, resid - _row_nanmean(resid)[:, np.newaxis], 0.0)
        spread = np.sqrt(np.sum(demeaned**2, axis=1) / np.maximum(total - 1, 1))
        sup = np.max(np.abs(np.cumsum(demeaned, axis=1)), axis=1) / (
            np.maximum(spread, min_scale) * np.sqrt(total)
        )
        sup = np.where(total > 1, sup, np.nan)
    return Ar1Tests(np.asarray(z, dtype=np.float64), np.asarray(sup, dtype=np.float64))


def ewma(x: npt.ArrayLike, alpha: float) -> FloatMatrix:
    """Per-row exponentially weighted moving average ``s = alpha·x + (1 - alpha)·s``.

    Starts at each row's first known value; a missing slot leaves the state unchanged and is
    NaN in the output (a gap neither pulls the average down nor counts as a value).
    """
    if not 0 < alpha <= 1:
        raise ValueError("alpha must be in (0, 1]")
    values = as_matrix(x)
    by_time = np.ascontiguousarray(values.T)
    out = np.empty_like(by_time)
    # Seeding the state with the first known value makes that slot's update a no-op
    # (alpha·x + (1 - alpha)·x = x), so the loop needs no "not started yet" branch. A missing
    # sample makes the update NaN: that is the output there, and the state keeps its value.
    state = _first_known(values)
    for t in range(by_time.shape[0]):
        step = out[t]
        np.multiply(by_time[t], alpha, out=step)
        step += (1 - alpha) * state
        np.copyto(state, step, where=~np.isnan(step))
    return np.ascontiguousarray(out.T)


@dataclass(frozen=True)
class Cusum:
    """Two-sided CUSUM: statistics per slot (NaN where missing) and where it alarmed."""

    upper: FloatMatrix
    lower: FloatMatrix
    alarm: BoolMatrix


def cusum(z: npt.ArrayLike, drift: float, threshold: float) -> Cusum:
    """Two-sided tabular CUSUM per row on standardised input, restarting after each alarm.

    ``upper = max(0, upper + z - drift)``, ``lower = max(0, lower - z - drift)``; an alarm where
    either exceeds ``threshold``, after which both restart at 0. A missing ``z`` leaves both
    unchanged (the output is NaN there and never an alarm).
    """
    if drift < 0 or threshold <= 0:
        raise ValueError("drift must be >= 0 and threshold > 0")
    by_time = np.ascontiguousarray(as_matrix(z).T)
    cols, rows = by_time.shape
    upper_out = np.empty_like(by_time)
    lower_out = np.empty_like(by_time)
    alarm = np.empty((cols, rows), dtype=np.bool_)
    upper = np.zeros(rows)
    lower = np.zeros(rows)
    fired = np.empty(rows, dtype=np.bool_)
    for t in range(cols):
        col, up, down = by_time[t], upper_out[t], lower_out[t]
        # A missing z makes both candidates NaN (np.maximum propagates it): that is the output
        # at the slot, it compares False with the threshold, and the state is not overwritten.
        np.add(upper, col, out=up)
        up -= drift
        np.maximum(up, 0.0, out=up)
        np.subtract(lower, col, out=down)
        down -= drift
        np.maximum(down, 0.0, out=down)
        np.greater(up, threshold, out=fired)
        fired |= down > threshold
        alarm[t] = fired
        known = ~np.isnan(col)
        np.copyto(upper, up, where=known)
        np.copyto(lower, down, where=known)
        upper[fired] = 0.0
        lower[fired] = 0.0
    upper_out, lower_out, alarm = (
        np.ascontiguousarray(upper_out.T),
        np.ascontiguousarray(lower_out.T),
        np.ascontiguousarray(alarm.T),
    )
    return Cusum(upper=upper_out, lower=lower_out, alarm=alarm)


@dataclass(frozen=True)
class Excursions:
    """Per row: how long the newest excursion has lasted, and the longest one before it."""

    current: npt.NDArray[np.int64]
    """Known slots in the excursion the row is in at its end (0 when it is not in one)."""
    longest_before: npt.NDArray[np.int64]
    """Known slots of the longest excursion that ended before: a phase the row came back from."""


def excursions(x: npt.ArrayLike, enter: npt.ArrayLike, leave: npt.ArrayLike) -> Excursions:
    """Excursions below a per-row level, with hysteresis, on each row of ``x``.

    A row enters an excursion at a known slot below ``enter`` and leaves it at a known slot above
    ``leave`` (``leave >= enter``: noise around ``enter`` neither ends one nor starts a new one).
    Missing slots neither count nor end one. For excursions above a level, pass ``-x``,
    ``-enter`` and ``-leave``.
    """
    values = as_matrix(x)
    rows = values.shape[0]
    low = np.broadcast_to(np.asarray(enter, dtype=np.float64), (rows,))
    high = np.broadcast_to(np.asarray(leave, dtype=np.float64), (rows,))
    by_time = np.ascontiguousarray(values.T)
    inside = np.zeros(rows, dtype=np.bool_)
    run = np.zeros(rows, dtype=np.int64)
    longest = np.zeros(rows, dtype=np.int64)
    with np.errstate(invalid="ignore"):
        for col in by_time:
            known = ~np.isnan(col)
            ended = inside & known & (col > high)
            np.maximum(longest, np.where(ended, run, 0), out=longest)
            inside &= ~ended
            run[ended] = 0
            inside |= known & (col < low)
            run += inside & known
    return Excursions(current=np.where(inside, run, 0), longest_before=longest)


def held_for(mask: npt.ArrayLike, slots: int, *, known: npt.ArrayLike | None = None) -> BoolMatrix:
    """True where ``mask`` has held for the last ``slots`` known slots in a row (per row).

    A known False restarts the count; a missing slot (``known`` False) neither counts nor
    restarts it, and is False in the output. ``known`` defaults to all True.
    """
    if slots < 1:
        raise ValueError("slots must be >= 1")
    flags = np.atleast_2d(np.asarray(mask, dtype=np.bool_))
    seen = np.ones_like(flags) if known is None else np.atleast_2d(np.asarray(known, dtype=bool))
    if seen.shape != flags.shape:
        raise ValueError(f"known has shape {seen.shape}, mask {flags.shape}")
    # Rank the known slots 1, 2, ... per row; the run at a slot is its rank minus the rank of
    # the latest known False up to it (every known slot in between is True). No time loop.
    rank = np.cumsum(seen, axis=1, dtype=np.int32)
    reset_rank = np.maximum.accumulate(rank * (seen & ~flags), axis=1)
    out: BoolMatrix = seen & flags & (rank - reset_rank >= slots)
    return out


def row_mean(x: npt.ArrayLike) -> FloatVector:
    """Per-row mean of the known values; NaN for a row with none (no warning)."""
    values = as_matrix(x)
    count = np.sum(~np.isnan(values), axis=1)
    total = np.nansum(values, axis=1)
    mean: FloatVector = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return mean


def _row_nanmean(values: FloatMatrix) -> FloatVector:
    known = ~np.isnan(values)
    count = known.sum(axis=1)
    total = np.where(known, values, 0.0).sum(axis=1)
    mean: FloatVector = np.divide(total, count, out=np.zeros(values.shape[0]), where=count > 0)
    return mean


def _row_nanstd(values: FloatMatrix) -> FloatVector:
    """Per-row standard deviation over known values (NaN for a row with fewer than two)."""
    known = np.sum(~np.isnan(values), axis=1)
    mean = _row_nanmean(values)[:, np.newaxis]
    sq = np.nansum((values - mean) ** 2, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(known > 1, np.sqrt(sq / (known - 1)), np.nan), np.float64)


def _first_known(values: FloatMatrix) -> FloatVector:
    """Each row's first known value (NaN for a row with none)."""
    known = ~np.isnan(values)
    first = np.argmax(known, axis=1)
    picked: FloatVector = values[np.arange(values.shape[0]), first]
    return picked
