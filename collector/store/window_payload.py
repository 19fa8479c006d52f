"""The window store's ingest of OTLP/HTTP bodies, and the shaped fast path.

A protobuf sender's request shape (``otlp.RequestShape``) is kept with the rows its points
resolved to, so a later request of the same shape is read without parsing (see
``ingest_payload``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from gpuwarden.collector.ingest.otlp import request_points
from gpuwarden.collector.ingest.otlp_columns import NumberColumns, number_columns
from gpuwarden.collector.ingest.otlp_limits import DEFAULT_LIMITS, IngestLimits
from gpuwarden.collector.ingest.otlp_shape import RequestShape, shape_key
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF, OtlpError, parse_request
from gpuwarden.collector.store.types import AttrValue, IngestCounts
from gpuwarden.collector.store.window_ingest import PointIngest
from gpuwarden.collector.store.window_state import NS, Shaped

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
    over_limits: int = 0


class PayloadIngest(PointIngest):
    """``ingest_payload``: parse (or read through a kept shape) and store an OTLP body."""

    def ingest_payload(
        self,
        payload: bytes,
        kind: str,
        *,
        new_series_budget: int | None = None,
        limits: IngestLimits = DEFAULT_LIMITS,
    ) -> RequestIngest:
        """Parse and store an OTLP/HTTP body's gauges and sums (histograms are the caller's).

        The same points, series, counts and budget as ``ingest(number_points(request)[0])``,
        without a ``NumberPoint`` per point: attribute items are looked up as sent.

        A protobuf sender's (first resource's) first request makes the store keep its shape
        (``otlp.RequestShape``) with the rows its points resolved to; a later request that
        matches it byte for byte but for point times and values is read without parsing. When
        a sender whose shape matched sends another shape (a new series), that one is kept at
        once; a sender whose shapes never match gets one built every other request at most.
        Points over the label ``limits`` are rejected (a shape is only ever built from a request
        without them, and a match has the same attributes byte for byte).
        Raises ``OtlpError``: 400 for a body that does not parse, 413 for one with more than
        ``limits.max_points_per_request`` points (before its columns are built).
        """
        key = shape_key(payload) if kind == PROTOBUF else None
        if key is not None:
            with self._lock:
                done = self._ingest_shaped(key, payload)
            if done is not None:
                return done
        request = parse_request(payload, kind)
        if request_points(request) > limits.max_points_per_request:
            raise OtlpError(
                413, f"request holds more than {limits.max_points_per_request} data points"
            )
        columns = number_columns(request, limits)
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

    def _shape_wanted(self, key: bytes) -> bool:
        """Whether to build the shape of a request that has none (see ``ingest_payload``)."""
        sender = hash(key[8:])
        with self._lock:
            state = self._shape_senders.get(sender)
            if state is None and len(self._shape_senders) >= SHAPE_SENDERS:
                self._shape_senders.clear()
            self._shape_senders[sender] = _SEEN if state in (None, _BUILT) else _BUILT
            return state in (None, _SEEN, _USED)

    def _remember(
        self, key: bytes, shape: RequestShape, rows: list[int], columns: NumberColumns
    ) -> None:
        """Keep ``shape`` with its points' rows (when every point has one)."""
        if shape.points != len(rows) or shape.points != columns.points or min(rows, default=0) < 0:
            return
        table = self._table
        resolved = np.array(rows, dtype=np.int64)
        with_points = sorted({m.resource for m in columns.metrics})
        entry = Shaped(
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
        over_limits=columns.over_limits,
    )
