"""WindowStore: every series' recent history in numpy ring buffers, read as series x time matrices.

Layout (see ``store_ring``): one float32 array per resolution, ``capacity x n_slots``, rows are
series and columns a ring over time with one time axis shared by all series. The recent ring holds
``recent_seconds`` at ``step_seconds`` (default 6 h at 10 s, 2160 slots); the long ring holds
``long_seconds`` at ``long_step_seconds`` (default 14 d at 1 min, 20160 slots), each long slot the
mean of its recent slots, recomputed (lazily, before the head moves or the long ring is read)
whenever one of them is written, so late points and duplicates leave it right. Missing data is
NaN, never 0; the rings are stored so that untouched (calloc'd) memory reads as NaN, so a large
pre-sized store costs nothing until written. Rows are series ids: a dict maps the series key to
its row, rows of stale series go to a free list, the arrays double when full.

Gauges (and non-monotonic sums) are stored as sent; the last write to a slot wins. Monotonic
cumulative sums are counters (``store_counters``): a counter's row of the recent ring holds each
slot's increase (the sum of the deltas of the raw points in it, a reset counting its new value)
as float32, its rounding carried forward so sums stay exact (``store_rows``), plus a small
``uint16`` ring of the time each slot's increase covers. Counters read as per-second rates
(increase / covered time) in ``matrix`` and ``latest``, and the long ring keeps their per-minute
mean rate; ``increase()`` and ``increase_matrix()`` give the increases, for energy accounting.
Histograms live in ``store_histograms``.

Points older than the recent window, too far in the future (a wrong agent clock would otherwise
roll the whole window over), non-finite, or beyond ``max_series`` are counted and dropped.
Everything runs under one lock: the receiver ingests on the event loop, detectors read from a
worker thread.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.otlp_columns import NumberColumns, number_columns
from gpuwarden.collector.ingest.otlp_shape import RequestShape, shape_key
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF, parse_request
from gpuwarden.collector.store.histograms import HistogramSeries, histogram_quantile
from gpuwarden.collector.store.rows import SeriesTable
from gpuwarden.collector.store.types import (
    HOST_NAME,
    AttrValue,
    BucketCounts,
    IngestCounts,
    Kind,
    LatestValues,
    Resolution,
    SeriesInfo,
    SeriesKey,
    SeriesMatrix,
    label_text,
    series_key,
)

NS = 1_000_000_000
SHAPE_BYTES = 64 << 20
"""Request shapes kept beyond ``SHAPE_BYTES_PER_SERIES`` per series held (least recent go)."""
SHAPE_BYTES_PER_SERIES = 512
SHAPE_SENDERS = 100_000
"""Senders (hashes of their resource) whose shape history is remembered (cleared beyond)."""
_SEEN, _BUILT, _USED = 0, 1, 2
"""A sender's shape history: seen without a shape, shape built but not matched yet, matched."""


@dataclass(frozen=True, slots=True)
class RequestIngest:
    """What became of one OTLP request's gauges and sums.

    ``points`` and ``rejected`` are what ``number_points`` gives for the request (its list's
    length, and its count of points without a value, non-finite, or of a type not stored here,
    histograms included); ``counts`` is what the store did with those points. ``resources`` are
    the resources with at least one such point, in request order; ``newest_ns`` the newest point
    time. ``histogram_request`` is the parsed request when it holds histograms (for
    ``otlp.histogram_points``).
    """

    counts: IngestCounts
    points: int
    rejected: int
    resources: tuple[Mapping[str, AttrValue], ...]
    newest_ns: int | None
    histogram_request: ExportMetricsServiceRequest | None = None


@dataclass(slots=True, eq=False)
class _Shaped:
    """A sender's request shape and the rows its points resolved to."""

    shape: RequestShape
    rows: npt.NDArray[np.int64]
    unique: bool
    generation: int
    resources: tuple[Mapping[str, AttrValue], ...]
    point_resources: tuple[Mapping[str, AttrValue], ...]
    nbytes: int


class WindowStore:
    """Recent and downsampled long windows of every series, in fixed-step numpy rings."""

    def __init__(
        self,
        *,
        step_seconds: int = 10,
        recent_seconds: int = 6 * 3600,
        long_step_seconds: int = 60,
        long_seconds: int = 14 * 86400,
        max_series: int = 1_000_000,
        stale_after_seconds: float | None = None,
        max_future_seconds: float = 300.0,
        initial_capacity: int = 1024,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Create an empty store.

        Args:
            step_seconds: recent resolution.
            recent_seconds: recent window, a multiple of ``long_step_seconds``.
            long_step_seconds: long resolution, a multiple of ``step_seconds``.
            long_seconds: long window, a multiple of ``long_step_seconds``, >= ``recent_seconds``.
            max_series: cap on number and histogram series together.
            stale_after_seconds: ``evict_stale`` drops series without a point this long
                (default: the recent window; their long history goes with them).
            max_future_seconds: points further ahead of ``clock()`` are rejected.
            initial_capacity: rows allocated up front (doubled as needed).
            clock: Unix time in seconds.
        """
        if min(step_seconds, recent_seconds, long_step_seconds, long_seconds, max_series) <= 0:
            raise ValueError("steps, windows and max_series must be positive")
        if long_step_seconds % step_seconds or recent_seconds % long_step_seconds:
            raise ValueError(
                "long_step_seconds must be a multiple of step_seconds, and "
                "recent_seconds a multiple of long_step_seconds"
            )
        if long_seconds % long_step_seconds or long_seconds < recent_seconds:
            raise ValueError(
                "long_seconds must be a multiple of long_step_seconds and at least recent_seconds"
            )
        self.step_seconds = step_seconds
        self.long_step_seconds = long_step_seconds
        self.recent_seconds = recent_seconds
        """How far back the recent ring (full resolution, and the histograms) reaches."""
        self.long_seconds = long_seconds
        """How far back the long ring (``long_step_seconds`` means) reaches."""
        self._step_ns = step_seconds * NS
        self._ratio = long_step_seconds // step_seconds
        self._max_series = max_series
        self._stale_after_seconds = (
            float(recent_seconds) if stale_after_seconds is None else stale_after_seconds
        )
        self._max_future_seconds = max_future_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._table = SeriesTable(
            n_slots=recent_seconds // step_seconds,
            n_long_slots=long_seconds // long_step_seconds,
            capacity=max(1, min(initial_capacity, max_series)),
            max_rows=max_series,
        )
        self._histograms: dict[SeriesKey, HistogramSeries] = {}
        self._shapes: dict[bytes, _Shaped] = {}
        self._shape_bytes = 0
        self._shape_senders: dict[int, int] = {}  # a heuristic: hash collisions are harmless
        self.shape_hits = 0
        """Requests read through a shape, without parsing (``ingest_payload``)."""

    # --- ingest -------------------------------------------------------------------------------

    def ingest(
        self, points: Iterable[NumberPoint], *, new_series_budget: int | None = None
    ) -> IngestCounts:
        """Store gauge and sum points; return what became of them.

        ``new_series_budget`` caps the series this call may create (a per-sender limit kept by
        the caller); points of further new series count as ``rejected_limit``.
        """
        with self._lock:
            return self._ingest(points, new_series_budget)

    def _ingest(self, points: Iterable[NumberPoint], budget: int | None = None) -> IngestCounts:
        table = self._table
        aliases = table.aliases
        resolve = table.resolve
        isfinite = math.isfinite
        future_ns = int((self._clock() + self._max_future_seconds) * NS)
        created_before = table.created
        rows: list[int] = []
        times: list[int] = []
        values: list[float] = []
        nonfinite = future = limit = 0
        # The per-point loop is the hot path: plain Python, no numpy scalars, one dict lookup.
        for p in points:
            value = p.value
            t = p.time_unix_nano
            if not isfinite(value):
                nonfinite += 1
                continue
            if t > future_ns:
                future += 1
                continue
            alias = (p.metric, p.resource.get(HOST_NAME), tuple(p.attributes.items()))
            row = aliases.get(alias)
            if row is None:
                create = budget is None or table.created - created_before < budget
                row = resolve(
                    alias,
                    unit=p.unit,
                    counter=p.kind == "sum" and p.monotonic,
                    time_ns=t,
                    total=len(self._histograms),
                    create=create,
                )
                if row < 0:
                    limit += 1
                    continue
            rows.append(row)
            times.append(t)
            values.append(value)
        counts = IngestCounts(
            rejected_nonfinite=nonfinite,
            rejected_future=future,
            rejected_limit=limit,
            new_series=table.created - created_before,
        )
        if not rows:
            return counts
        return table.write(
            np.array(rows, dtype=np.int64),
            np.array(times, dtype=np.int64),
            np.array(values, dtype=np.float64),
            self._step_ns,
            self._ratio,
            counts,
        )

    def ingest_payload(
        self, payload: bytes, kind: str, *, new_series_budget: int | None = None
    ) -> RequestIngest:
        """Parse and store an OTLP/HTTP body's gauges and sums (histograms are the caller's).

        The same points, series, counts and budget as ``ingest(number_points(request)[0])``,
        without a ``NumberPoint`` per point: attribute items are looked up as sent.

        A protobuf sender's (first resource's) second request makes the store keep its shape
        (``otlp_shape.RequestShape``) with the rows its points resolved to; a later request that
        matches it byte for byte but for point times and values is read without parsing. When
        a sender whose shape matched sends another shape (a new series), that one is kept at
        once; a sender whose shapes never match gets one built every other request at most.
        Raises ``OtlpError`` (400) for a body that does not parse.
        """
        key = shape_key(payload) if kind == PROTOBUF else None
        if key is not None:
            with self._lock:
                done = self._ingest_shaped(key, payload)
            if done is not None:
                return done
        request = parse_request(payload, kind)
        columns = number_columns(request)
        shape = None
        if key is not None and not columns.histograms and self._shape_wanted(key):
            shape = RequestShape.of(payload, request)
        with self._lock:
            counts, rows = self._ingest_columns(
                columns, new_series_budget, want_rows=shape is not None
            )
            if key is not None and shape is not None and rows is not None:
                self._remember(key, shape, rows, columns)
        return _request_ingest(columns, counts, request)

    def _ingest_columns(
        self, columns: NumberColumns, budget: int | None, *, want_rows: bool
    ) -> tuple[IngestCounts, list[int] | None]:
        """Store decoded columns; with ``want_rows`` also each point's row (-1: not stored)."""
        table = self._table
        aliases = table.aliases
        resolve = table.resolve
        future_ns = int((self._clock() + self._max_future_seconds) * NS)
        created_before = table.created
        histograms = len(self._histograms)
        rows: list[int] = []
        times: list[int] = []
        values: list[float] = []
        point_rows: list[int] | None = [] if want_rows else None
        future = limit = 0
        hosts = [resource.get(HOST_NAME) for resource in columns.resources]
        for metric in columns.metrics:
            name, host = metric.name, hosts[metric.resource]
            for items, t, value in zip(metric.items, metric.times, metric.values, strict=True):
                if t > future_ns:
                    future += 1
                    if point_rows is not None:
                        point_rows.append(-1)
                    continue
                alias = (name, host, items)
                row = aliases.get(alias)
                if row is None:
                    create = budget is None or table.created - created_before < budget
                    row = resolve(
                        alias,
                        unit=metric.unit,
                        counter=metric.counter,
                        time_ns=t,
                        total=histograms,
                        create=create,
                    )
                    if row < 0:
                        limit += 1
                        if point_rows is not None:
                            point_rows.append(-1)
                        continue
                rows.append(row)
                times.append(t)
                values.append(value)
                if point_rows is not None:
                    point_rows.append(row)
        counts = IngestCounts(
            rejected_future=future,
            rejected_limit=limit,
            new_series=table.created - created_before,
        )
        if rows:
            counts = table.write(
                np.array(rows, dtype=np.int64),
                np.array(times, dtype=np.int64),
                np.array(values, dtype=np.float64),
                self._step_ns,
                self._ratio,
                counts,
            )
        return counts, point_rows

    def _shape_wanted(self, key: bytes) -> bool:
        """Whether to build the shape of a request that has none (see ``ingest_payload``)."""
        sender = hash(key[8:])
        with self._lock:
            state = self._shape_senders.get(sender)
            if state is None and len(self._shape_senders) >= SHAPE_SENDERS:
                self._shape_senders.clear()
            self._shape_senders[sender] = _SEEN if state in (None, _BUILT) else _BUILT
            return state in (_SEEN, _USED)

    def _remember(
        self, key: bytes, shape: RequestShape, rows: list[int], columns: NumberColumns
    ) -> None:
        """Keep ``shape`` with its points' rows (when every point has one)."""
        if shape.points != len(rows) or shape.points != columns.points or min(rows, default=0) < 0:
            return
        table = self._table
        resolved = np.array(rows, dtype=np.int64)
        with_points = sorted({m.resource for m in columns.metrics})
        entry = _Shaped(
            shape=shape,
            rows=resolved,
            unique=int(np.unique(resolved).size) == resolved.size,
            generation=table.evictions,
            resources=columns.resources,
            point_resources=tuple(columns.resources[i] for i in with_points),
            nbytes=shape.nbytes + resolved.nbytes + sys.getsizeof(key),
        )
        self._forget(key)
        self._shapes[key] = entry
        self._shape_bytes += entry.nbytes
        limit = SHAPE_BYTES + SHAPE_BYTES_PER_SERIES * self._series_count()
        while self._shape_bytes > limit and self._shapes:
            self._forget(next(iter(self._shapes)))  # the least recently used

    def _forget(self, key: bytes) -> None:
        entry = self._shapes.pop(key, None)
        if entry is not None:
            self._shape_bytes -= entry.nbytes

    def _ingest_shaped(self, key: bytes, payload: bytes) -> RequestIngest | None:
        """Store ``payload`` through its sender's shape; None when it has none or differs."""
        entry = self._shapes.get(key)
        if entry is None:
            return None
        if entry.generation != self._table.evictions:  # some of its rows may be freed
            self._forget(key)
            return None
        got = entry.shape.extract(payload)
        if got is None:
            return None
        del self._shapes[key]
        self._shapes[key] = entry  # most recently used last
        self._shape_senders[hash(key[8:])] = _USED
        self.shape_hits += 1
        times_u, values = got
        rows = entry.rows
        resources = entry.point_resources
        finite = np.isfinite(values)
        nonfinite = 0
        if not finite.all():
            nonfinite = int(np.count_nonzero(~finite))
            rows, times_u, values = rows[finite], times_u[finite], values[finite]
            present = np.unique(entry.shape.resource_of_point[finite])
            resources = tuple(entry.resources[i] for i in present.tolist())
        newest = int(times_u.max()) if times_u.size else None
        future_ns = int((self._clock() + self._max_future_seconds) * NS)
        counts = IngestCounts()
        future = times_u > np.uint64(max(future_ns, 0))
        if future.any():
            counts = IngestCounts(rejected_future=int(np.count_nonzero(future)))
            keep = ~future
            rows, times_u, values = rows[keep], times_u[keep], values[keep]
        if rows.size:
            counts = self._table.write(
                rows,
                times_u.astype(np.int64),
                values,
                self._step_ns,
                self._ratio,
                counts,
                unique_rows=entry.unique,
            )
        return RequestIngest(
            counts=counts,
            points=entry.shape.points - nonfinite,
            rejected=entry.shape.no_value + nonfinite,
            resources=resources,
            newest_ns=newest,
        )

    def ingest_histogram(
        self,
        metric: str,
        attributes: Mapping[str, AttrValue],
        *,
        time_unix_nano: int,
        bounds: Sequence[float],
        bucket_counts: Sequence[float],
        sum_value: float,
        unit: str = "",
    ) -> IngestCounts:
        """Store one cumulative explicit-bucket histogram point.

        Args:
            metric: metric name.
            attributes: point attributes plus the resource's ``host.name``.
            time_unix_nano: point time.
            bounds: explicit bucket bounds, increasing.
            bucket_counts: observations per bucket since the series started,
                ``len(bounds) + 1`` of them (the last is the +Inf bucket).
            sum_value: sum of the observations since the series started.
            unit: metric unit.
        """
        if len(bucket_counts) != len(bounds) + 1:
            raise ValueError(
                f"{metric}: {len(bucket_counts)} bucket counts for {len(bounds)} bounds"
            )
        counts = np.asarray(bucket_counts, dtype=np.float64)
        with self._lock:
            if not (np.isfinite(counts).all() and math.isfinite(sum_value)):
                return IngestCounts(rejected_nonfinite=1)
            if time_unix_nano > int((self._clock() + self._max_future_seconds) * NS):
                return IngestCounts(rejected_future=1)
            key = series_key(metric, attributes)
            series = self._histograms.get(key)
            new = 0
            if series is None or series.bounds != tuple(bounds):
                if series is None and self._series_count() >= self._max_series:
                    return IngestCounts(rejected_limit=1)
                series = HistogramSeries(
                    self._table.info(key, unit, Kind.HISTOGRAM),
                    tuple(float(b) for b in bounds),
                    self._table.recent.n_slots,
                )
                new = int(key not in self._histograms)
                self._histograms[key] = series
            slot = time_unix_nano // self._step_ns
            head = self._table.advance(slot, self._ratio)
            return series.observe(slot, head, time_unix_nano, counts, sum_value, new_series=new)

    # --- queries ------------------------------------------------------------------------------

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
        """
        if resolution not in ("recent", "long"):
            raise ValueError(f"resolution must be 'recent' or 'long', not {resolution!r}")
        with self._lock:
            table = self._table
            ring = table.recent if resolution == "recent" else table.long
            step = self.step_seconds if resolution == "recent" else self.long_step_seconds
            rows, infos = table.select(metric, selector)
            first, count = _slots(start, end, step, ring.n_slots)
            if resolution == "recent":
                values = table.read_rates(rows, first, count)
            else:
                table.flush_long(self._ratio)
                values = ring.read(rows, first, count)
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
        """
        with self._lock:
            table = self._table
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
        or a range starting before the recent window (that part is gone: accumulate as you go).
        """
        with self._lock:
            table = self._table
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

    def latest(self, metric: str, selector: Mapping[str, str] | None = None) -> LatestValues:
        """Each matching series' newest point (for counters, the rate of its newest slot)."""
        with self._lock:
            table = self._table
            rows, infos = table.select(metric, selector)
            seen_ns = table.last_seen_ns[rows]
            slots = seen_ns // self._step_ns
            held = table.recent.held(slots)
            values = table.rates(rows, slots)
            return LatestValues(
                series=infos,
                times=np.where(held, seen_ns / NS, np.nan),
                values=np.where(held, values, np.nan).astype(np.float32),
            )

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

    def quantile(self, key: SeriesKey, q: float, start: float, end: float) -> float:
        """The ``q``-quantile (0..1) of a histogram over ``[start, end)``; NaN without data."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} is outside [0, 1]")
        counts = self.bucket_counts(key, start, end)
        if counts is None:
            return math.nan
        return histogram_quantile(q, counts.bounds, counts.counts)

    # --- housekeeping -------------------------------------------------------------------------

    def evict_stale(self, now: float | None = None) -> int:
        """Drop series without a point for ``stale_after_seconds``; return how many."""
        with self._lock:
            cutoff_ns = int(
                ((self._clock() if now is None else now) - self._stale_after_seconds) * NS
            )
            stale = [k for k, h in self._histograms.items() if h.last_seen_ns < cutoff_ns]
            for key in stale:
                del self._histograms[key]
            evicted = self._table.evict_before(cutoff_ns, self._ratio)
            if evicted:  # shapes hold rows, some now free
                self._shapes.clear()
                self._shape_bytes = 0
            return evicted + len(stale)

    def series_count(self) -> int:
        """Series held (number and histogram)."""
        with self._lock:
            return self._series_count()

    def metric_names(self) -> set[str]:
        """Every metric name with at least one series held."""
        with self._lock:
            return {key[0] for key in self._table.rows_by_key} | {
                key[0] for key in self._histograms
            }

    def _series_count(self) -> int:
        return len(self._table.rows_by_key) + len(self._histograms)

    def memory_bytes(self) -> int:
        """Bytes held: every array's ``nbytes`` plus an estimate of per-series Python objects."""
        with self._lock:
            hist = sum(h.ring.nbytes + sys.getsizeof(h) for h in self._histograms.values())
            return self._table.memory_bytes() + hist + self._shape_bytes


def _request_ingest(
    columns: NumberColumns, counts: IngestCounts, request: ExportMetricsServiceRequest
) -> RequestIngest:
    with_points = sorted({m.resource for m in columns.metrics})
    newest = max((max(m.times) for m in columns.metrics), default=None)
    return RequestIngest(
        counts=counts,
        points=columns.points,
        rejected=columns.rejected,
        resources=tuple(columns.resources[i] for i in with_points),
        newest_ns=newest,
        histogram_request=request if columns.histograms else None,
    )


def _slots(start: float, end: float, step: int, n_slots: int) -> tuple[int, int]:
    """First absolute slot and count of ``[start, end)``, at most ``n_slots`` (the latest)."""
    first, stop = math.ceil(start / step), math.ceil(end / step)
    count = max(0, stop - first)
    if count > n_slots:
        first, count = stop - n_slots, n_slots
    return (first, count)
