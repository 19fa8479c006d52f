"""Sampling noise of a window's histogram statistic, from the requests the window holds.

A p99 over 200 requests rests on the two slowest of them; over 20,000 requests on the 200
slowest. The drift screen's robust scale comes from the history, which was mostly busy: at a
quiet hour it would take a noisy p99 at face value. So, per window:

* **enough requests**: a quantile ``q`` is judged only when ``MIN_TAIL_REQUESTS`` requests are
  expected beyond it (``n·min(q, 1 − q)``; p99 needs 200 requests, p50 4); the mean needs
  ``MIN_TAIL_REQUESTS`` requests. Below that the quantile is the window's maximum (or close to
  it), whatever the distribution; above it the noise floor below takes over. A window with
  fewer is *not known* (never healthy, never drift), like a window without data.
* **noise floor**: the standard error of a sample quantile is read off the window's own
  histogram through the order-statistic (binomial) interval of its rank:
  ``(Q(q + d) − Q(q − d)) / 2`` with ``d = sqrt(q(1 − q)/n)``. It is distribution-free, and
  wide exactly where the quantile sits in a sparse stretch of the distribution (a p99 inside a
  thin tail cluster), which is where p99 jumps without anything having changed.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.detect.model_series import QUANTILES, Binned, quantiles, window_sums
from gpuwarden.collector.store.types import Kind

FloatArray = npt.NDArray[np.float64]

LOG_STEP = 0.02
"""Rank offsets are grouped on a log grid this fine (2 %) so quantiles run per group."""
MIN_TAIL_REQUESTS = 2.0
"""Requests expected beyond the judged quantile (in total, for the mean) for a window to count."""


def min_requests(statistic: str) -> float:
    """Requests a window needs for ``statistic`` to be judged (0: no such limit)."""
    if statistic in QUANTILES:
        q = QUANTILES[statistic]
        return math.ceil(MIN_TAIL_REQUESTS / min(q, 1.0 - q))
    if statistic == "mean":
        return MIN_TAIL_REQUESTS
    return 0.0


def window_requests(subject: Binned, window_bins: int) -> FloatArray:
    """Requests in the window ending at each bin (NaN for a non-histogram or no full window)."""
    if subject.kind is not Kind.HISTOGRAM:
        return np.full(subject.times.size, np.nan)
    sums, _ = window_sums(subject.parts, window_bins)
    return np.asarray(sums[:, :-1].sum(axis=1), dtype=np.float64)


def quantile_noise(subject: Binned, statistic: str, window_bins: int) -> FloatArray:
    """Standard error of ``statistic`` in the window ending at each bin; NaN where not defined.

    Only histogram quantiles have one here (the mean would need the sum of squares, which a
    Prometheus histogram does not carry).
    """
    n_bins = subject.times.size
    if subject.kind is not Kind.HISTOGRAM or statistic not in QUANTILES:
        return np.full(n_bins, np.nan)
    sums, _ = window_sums(subject.parts, window_bins)
    counts = sums[:, :-1]
    n = counts.sum(axis=1)
    q = QUANTILES[statistic]
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.sqrt(q * (1.0 - q) / n)
    out = np.full(n_bins, np.nan)
    ok = np.flatnonzero((n > 0) & np.isfinite(d))
    if ok.size == 0:
        return out
    # quantiles() takes one q for all rows: group rows by their rank offset, rounded on a 2 %
    # log grid (a few dozen groups per series instead of one call per window).
    level = np.round(np.log(d[ok]) / LOG_STEP)
    for value in np.unique(level).tolist():
        rows = ok[level == value]
        offset = math.exp(value * LOG_STEP)
        hi = quantiles(min(q + offset, 1.0), subject.bounds, counts[rows])
        lo = quantiles(max(q - offset, 0.0), subject.bounds, counts[rows])
        out[rows] = (hi - lo) / 2.0
    return out
