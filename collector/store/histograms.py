"""Explicit-bucket histograms in the store: per-slot bucket-count increases, and quantiles.

OTLP sends cumulative histograms: each point carries, per bucket, the observations since the
series started. Like counters, a series stores the increase between consecutive points (a bucket
count going down is a reset: the increase is then the new counts), in a ring that shares the
store's recent time axis. Rows are buckets (the last, ``(bounds[-1], +Inf)``), plus one row for the
sum of observations; columns are slots. Few series are histograms, so each has its own small ring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.store.counters import NO_TIME
from gpuwarden.collector.store.ring import Ring
from gpuwarden.collector.store.types import IngestCounts, SeriesInfo


class HistogramSeries:
    """One histogram series and its raw state."""

    __slots__ = (
        "bounds",
        "info",
        "last_counts",
        "last_seen_ns",
        "last_sum",
        "last_time_ns",
        "ring",
    )

    def __init__(self, info: SeriesInfo, bounds: tuple[float, ...], n_slots: int) -> None:
        self.info = info
        self.bounds = bounds
        self.ring = Ring(n_slots=n_slots, rows=len(bounds) + 2)
        self.last_counts: npt.NDArray[np.float64] | None = None
        self.last_sum = math.nan
        self.last_time_ns = NO_TIME
        self.last_seen_ns = NO_TIME

    def observe(
        self,
        slot: int,
        head: int,
        time_ns: int,
        counts: npt.NDArray[np.float64],
        sum_value: float,
        *,
        new_series: int,
    ) -> IngestCounts:
        """Take one point after the store moved its head to ``head``; say what became of it."""
        self.ring.advance(head)
        moved, reset = self.record(slot, time_ns, counts, sum_value)
        old = moved and slot <= head - self.ring.n_slots
        return IngestCounts(
            accepted=int(moved and not old),
            rejected_old=int(old),
            counter_out_of_order=int(not moved),
            counter_resets=int(reset),
            new_series=new_series,
        )

    def record(
        self, slot: int, time_ns: int, counts: npt.NDArray[np.float64], sum_value: float
    ) -> tuple[bool, bool]:
        """Take one cumulative point; return (moved the series forward, was a reset).

        The increase lands in ``slot`` when the ring (already advanced to the store's head)
        holds it; the raw state moves forward either way.
        """
        if time_ns <= self.last_time_ns:
            return (False, False)
        previous, previous_sum = self.last_counts, self.last_sum
        self.last_counts, self.last_sum, self.last_time_ns = counts, sum_value, time_ns
        self.last_seen_ns = max(self.last_seen_ns, time_ns)
        if previous is None:
            return (True, False)
        increase = counts - previous
        reset = bool((increase < 0).any())
        if reset:
            increase, previous_sum = counts, 0.0
        held = self.ring.held(np.array([slot], dtype=np.int64))
        if held[0]:
            col = slot % self.ring.n_slots
            column = np.nan_to_num(self.ring.get_column(col), nan=0.0)
            column[:-1] += increase
            column[-1] += sum_value - previous_sum
            self.ring.put_column(col, column)
        return (True, reset)

    def totals(self, first: int, stop: int) -> tuple[npt.NDArray[np.float64], float] | None:
        """Bucket counts and sum over absolute slots ``[first, stop)``; None without data."""
        lo, hi = self.ring.span(first, stop)
        if lo >= hi:
            return None
        rows = np.arange(self.ring.rows, dtype=np.int64)
        window = self.ring.read(rows, lo, hi - lo).astype(np.float64)
        if np.isnan(window[0]).all():
            return None
        sums = np.nansum(window, axis=1)
        return (sums[:-1], float(sums[-1]))


def binned_totals(
    series: HistogramSeries, first: int, per_bin: int, bins: int
) -> npt.NDArray[np.float64]:
    """:meth:`HistogramSeries.totals` of ``bins`` consecutive bins of ``per_bin`` slots from
    absolute slot ``first``, in one read: ``bins × (buckets + 1)`` (bucket counts, then the
    sum), a NaN row for a bin without data. Only the bins the ring holds are read, so a long
    history (a 14-day baseline at 10 s slots is 121k bins) costs what the ring holds, not one
    call per bin."""
    rows = series.ring.rows
    out = np.full((bins, rows), np.nan)
    lo, hi = series.ring.span(first, first + bins * per_bin)
    if lo >= hi or per_bin < 1:
        return out
    b0, b1 = (lo - first) // per_bin, -(-(hi - first) // per_bin)
    window = series.ring.read(
        np.arange(rows, dtype=np.int64), first + b0 * per_bin, (b1 - b0) * per_bin
    ).astype(np.float64)
    window = window.reshape(rows, b1 - b0, per_bin)
    known = ~np.isnan(window[0]).all(axis=1)  # as totals(): the first bucket says
    sums = np.nansum(window, axis=2).T
    held = out[b0:b1]
    held[known] = sums[known]
    return out


def histogram_quantile(q: float, bounds: Sequence[float], counts: npt.NDArray[np.float64]) -> float:
    """The ``q``-quantile of bucketed observations, as Prometheus' ``histogram_quantile``.

    Linear interpolation inside the bucket holding the rank; the first bucket starts at 0 when
    its upper bound is positive; a rank in the +Inf bucket gives the highest finite bound. NaN
    without observations or without a finite bound.
    """
    total = float(counts.sum())
    if not bounds or not total > 0:
        return math.nan
    cumulative = np.cumsum(counts)
    rank = q * total
    b = int(np.searchsorted(cumulative[:-1], rank, side="left"))
    if b == len(bounds):
        return float(bounds[-1])
    if b == 0 and bounds[0] <= 0:
        return float(bounds[0])
    start = 0.0 if b == 0 else float(bounds[b - 1])
    below = 0.0 if b == 0 else float(cumulative[b - 1])
    in_bucket = float(counts[b])
    if in_bucket == 0:
        return start
    return start + (float(bounds[b]) - start) * (rank - below) / in_bucket
