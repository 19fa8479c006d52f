"""The window store's reads: series x time matrices, increases, latest values, quantiles."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.store.histograms import binned_totals, histogram_quantile
from gpuwarden.collector.store.types import (
    HOST_NAME,
    BucketCounts,
    LatestOnlyError,
    LatestValues,
    NoLongRingError,
    Resolution,
    SeriesInfo,
    SeriesKey,
    SeriesMatrix,
    label_text,
)
from gpuwarden.collector.store.window_state import NS, WindowState


class WindowReads(WindowState):
    """The queries of ``WindowStore``: each one takes the lock once."""

    def matrix(
        self,
        metric: str,
        *,
        selector: Mapping[str, str] | None = None,
        start: float,
        end: float,
        resolution: Resolution = "recent",
    ) -> SeriesMatrix:
        """Every matching series over ``[start, end)`` (Unix seconds) in one array.

        Slot ``k`` is included when ``start <= k*step < end``, so consecutive ranges partition the
        slots. At most one ring length is returned (the most recent part of the range); slots
        outside the window, gaps, and counters' first points are NaN. Counters read as rates:
        a slot's increase over the time it covers (one point: its delta over the time since the
        previous point; NaN across a gap over ~55 min). Long slots are means of recent slots.

        Raises:
            NoLongRingError: ``resolution="long"`` for a metric the store keeps no long ring of.
            LatestOnlyError: a metric the store keeps the latest value of only.
        """
        if resolution not in ("recent", "long"):
            raise ValueError(f"resolution must be 'recent' or 'long', not {resolution!r}")
        with self._lock:
            table = self._table
            if not table.keeps_recent(metric):
                raise LatestOnlyError(metric)
            ring = table.recent if resolution == "recent" else table.long
            step = self.step_seconds if resolution == "recent" else self.long_step_seconds
            rows, infos = table.select(metric, selector)
            first, count = _slots(start, end, step, ring.n_slots)
            if resolution == "recent":
                values = table.read_rates(rows, first, count)
            else:
                if not table.keeps_long(metric):
                    raise NoLongRingError(metric)
                table.flush_long(self._ratio)
                values = ring.read(table.long_row[rows], first, count)
            return SeriesMatrix(
                times=(np.arange(first, first + count, dtype=np.float64) * step),
                values=values,
                series=infos,
                step_seconds=step,
                resolution=resolution,
            )

    def increase_matrix(
        self, metric: str, *, selector: Mapping[str, str] | None = None, start: float, end: float
    ) -> SeriesMatrix:
        """Per-slot increases (float64) of the matching counter series, recent window.

        Each slot is within ~1e-6 of its exact increase (float32 storage, rounding carried to
        the next slot); a row's sum is exact when the range covers the series' first and newest
        slots, and otherwise off by at most one slot's rounding (see ``store_rows``).

        Raises:
            LatestOnlyError: a metric the store keeps the latest value of only.
        """
        with self._lock:
            table = self._table
            if not table.keeps_recent(metric):
                raise LatestOnlyError(metric)
            rows, infos = table.select(metric, selector)
            mine = table.counter_row[rows] >= 0
            first, count = _slots(start, end, self.step_seconds, table.recent.n_slots)
            return SeriesMatrix(
                times=(np.arange(first, first + count, dtype=np.float64) * self.step_seconds),
                values=table.read_increases(rows[mine], first, count, self._step_ns),
                series=tuple(info for info, ok in zip(infos, mine, strict=True) if ok),
                step_seconds=self.step_seconds,
                resolution="recent",
            )

    def increase(self, key: SeriesKey, start: float, end: float) -> float | None:
        """The increase of a counter over the slots in ``[start, end)``; None without data.

        The sum of each raw point's delta (its value after a reset) over the points whose slot
        starts in the range: exact (float64) from the series' first slot to its newest, else
        within one slot's float32 rounding whatever the range's length, so consecutive ranges
        add up exactly. Raises KeyError for an unknown series, ValueError for a non-counter
        or a range starting before the recent window (that part is gone: accumulate as you go),
        ``LatestOnlyError`` for a metric the store keeps the latest value of only.
        """
        with self._lock:
            table = self._table
            if not table.keeps_recent(key[0]):
                raise LatestOnlyError(key[0])
            row = table.rows_by_key.get(key)
            if row is None:
                raise KeyError(key)
            if table.counter_row[row] < 0:
                raise ValueError(f"{key[0]} is not a counter")
            ring = table.recent
            first, stop = math.ceil(start / self.step_seconds), math.ceil(end / self.step_seconds)
            if ring.head is None or first >= stop:
                return None
            if first <= ring.head - ring.n_slots:
                raise ValueError("range starts before the recent window")
            lo, hi = ring.span(first, stop)
            rows = np.array([row], dtype=np.int64)
            window = table.read_increases(rows, lo, max(0, hi - lo), self._step_ns)
            if np.isnan(window).all():
                return None
            return float(np.nansum(window))

    def latest(
        self,
        metric: str,
        selector: Mapping[str, str] | None = None,
        *,
        max_age_seconds: float | None = None,
    ) -> LatestValues:
        """Each matching series' newest point (for counters, the rate of its newest slot; for a
        latest-only metric, its newest point's value, a counter's rate over its newest step).

        A point older than ``max_age_seconds`` before the store's clock (default: the store's
        ``staleness_seconds``) is stale and reads as NaN: a silent agent's last value is not
        its value now. ``times`` still says when the series was last seen. Pass ``math.inf``
        for the newest point whatever its age.
        """
        bound = self.staleness_seconds if max_age_seconds is None else max_age_seconds
        cutoff = self._clock() - bound
        with self._lock:
            table = self._table
            rows, infos = table.select(metric, selector)
            seen_ns = table.last_seen_ns[rows]
            slots = seen_ns // self._step_ns
            held = table.recent.held(slots)
            values = table.rates(rows, slots)
            times = np.where(held, seen_ns / NS, np.nan)
            fresh = held & (times >= cutoff)
            return LatestValues(
                series=infos,
                times=times,
                values=np.where(fresh, values, np.nan).astype(np.float32),
            )

    def last_seen_by_host(self) -> dict[str, float]:
        """Node (``host.name``) → Unix time of the newest point of any of its series.

        Nodes whose every series was evicted are absent. Histograms count too.
        """
        with self._lock:
            newest = self._table.last_seen_by_host()
            for key, series in self._histograms.items():
                host = dict(key[1]).get(HOST_NAME)
                if isinstance(host, str) and series.last_seen_ns >= 0:
                    newest[host] = max(newest.get(host, series.last_seen_ns), series.last_seen_ns)
        return {host: ns / NS for host, ns in newest.items()}

    def last_seen_of(self, keys: Sequence[SeriesKey]) -> npt.NDArray[np.float64]:
        """Unix time of each series' newest point (NaN for a series not held)."""
        out = np.full(len(keys), np.nan)
        with self._lock:
            rows_by_key = self._table.rows_by_key
            last_seen = self._table.last_seen_ns
            for i, key in enumerate(keys):
                row = rows_by_key.get(key)
                if row is not None:
                    out[i] = last_seen[row] / NS
                elif (hist := self._histograms.get(key)) is not None and hist.last_seen_ns >= 0:
                    out[i] = hist.last_seen_ns / NS
        return out

    def histogram_keys(
        self, metric: str, selector: Mapping[str, str] | None = None
    ) -> list[SeriesKey]:
        """Keys of ``metric``'s histogram series whose attributes match ``selector``, sorted."""
        with self._lock:
            keys = [key for key in self._histograms if key[0] == metric]
        if selector:
            keys = [
                key
                for key in keys
                if all(
                    (value := dict(key[1]).get(name)) is not None and label_text(value) == wanted
                    for name, wanted in selector.items()
                )
            ]
        return sorted(keys, key=repr)

    def histogram_series(
        self, metric: str, selector: Mapping[str, str] | None = None
    ) -> tuple[SeriesInfo, ...]:
        """Infos of ``metric``'s histogram series matching ``selector``, sorted by key."""
        with self._lock:
            found = [(k, h.info) for k, h in self._histograms.items() if k[0] == metric]
        found.sort(key=lambda item: repr(item[0]))
        return tuple(info for _, info in found if info.matches(selector))

    def bucket_counts(self, key: SeriesKey, start: float, end: float) -> BucketCounts | None:
        """Observations per bucket of a histogram over the slots in ``[start, end)``."""
        with self._lock:
            series = self._histograms[key]
            first, stop = math.ceil(start / self.step_seconds), math.ceil(end / self.step_seconds)
            head = self._table.recent.head
            if head is not None:
                series.ring.advance(head)
            totals = series.totals(first, stop)
            if totals is None:
                return None
            return BucketCounts(bounds=series.bounds, counts=totals[0], sum_value=totals[1])

    def bucket_bins(
        self, key: SeriesKey, start: float, bin_seconds: float, bins: int
    ) -> npt.NDArray[np.float64]:
        """:meth:`bucket_counts` of ``bins`` consecutive bins ``[start + i·bin, start +
        (i+1)·bin)`` as one ``bins × (buckets + 2)`` array (bucket counts, then the sum of
        observations), a NaN row for a bin without data.

        Bins aligned on slots are read at once; others fall back to one call per bin, which
        gives the same answer slower.
        """
        step = self.step_seconds
        per_bin = bin_seconds / step
        if bins > 0 and per_bin >= 1 and per_bin == int(per_bin) and start % step == 0:
            with self._lock:
                series = self._histograms[key]
                head = self._table.recent.head
                if head is not None:
                    series.ring.advance(head)
                return binned_totals(series, round(start / step), int(per_bin), bins)
        with self._lock:
            width = len(self._histograms[key].bounds) + 2
        out = np.full((max(bins, 0), width), np.nan)
        for i in range(max(bins, 0)):
            t0 = start + i * bin_seconds
            got = self.bucket_counts(key, t0, t0 + bin_seconds)
            if got is not None:
                out[i, :-1], out[i, -1] = got.counts, got.sum_value
        return out

    def quantile(self, key: SeriesKey, q: float, start: float, end: float) -> float:
        """The ``q``-quantile (0..1) of a histogram over ``[start, end)``; NaN without data."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} is outside [0, 1]")
        counts = self.bucket_counts(key, start, end)
        if counts is None:
            return math.nan
        return histogram_quantile(q, counts.bounds, counts.counts)


def _slots(start: float, end: float, step: int, n_slots: int) -> tuple[int, int]:
    """First absolute slot and count of ``[start, end)``, at most ``n_slots`` (the latest)."""
    first, stop = math.ceil(start / step), math.ceil(end / step)
    count = max(0, stop - first)
    if count > n_slots:
        first, count = stop - n_slots, n_slots
    return (first, count)
