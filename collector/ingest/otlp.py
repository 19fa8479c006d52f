"""Decoding OTLP/HTTP metric requests: content types, gzip with a size cap, protobuf and JSON.

Pure functions with no web framework in them, so the same code serves the aiohttp receiver, the
tests and the fuzzers. Every failure is an :class:`OtlpError` carrying the HTTP status to answer.

Two ways to flatten gauges and sums: :func:`number_points` builds one :class:`NumberPoint` per
data point (tests, the demo, the scraper); :func:`number_columns` is the receiver's fast path:
per metric, columns of attribute items (as sent, no dicts), times and values, with the same
validation and counts. :class:`RequestShape` goes further for the steady state of an agent that
sends the same series every interval: it records where a protobuf request keeps each point's
time and value bytes, so the next request with identical bytes everywhere else is read with
a few numpy operations, without parsing it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class OtlpError(Exception):
    """A request we refuse, with the HTTP status that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def media_type(content_type: str | None) -> str:
    """The bare media type of a Content-Type header, or raise 415."""
    bare = (content_type or "").split(";", 1)[0].strip().lower()
    if bare not in (PROTOBUF, JSON):
        raise OtlpError(415, f"unsupported content type {bare or '(none)'!r}; use {PROTOBUF}")
    return bare


def decompress(body: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """Undo ``Content-Encoding``; refuse anything that inflates past ``max_bytes`` (gzip bombs)."""
    enc = (encoding or "identity").strip().lower()
    if enc == "identity":
        return body
    if enc != "gzip":
        raise OtlpError(415, f"unsupported content encoding {enc!r}; use gzip or identity")
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise OtlpError(400, f"invalid gzip body: {exc}") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise OtlpError(413, f"decompressed body exceeds {max_bytes} bytes")
    if not inflater.eof:
        raise OtlpError(400, "truncated gzip body")
    return out


def parse_request(payload: bytes, kind: str) -> ExportMetricsServiceRequest:
    """Parse an ``ExportMetricsServiceRequest`` in the given media type, or raise 400."""
    request = ExportMetricsServiceRequest()
    try:
        if kind == PROTOBUF:
            request.ParseFromString(payload)
        else:
            json_format.Parse(payload.decode("utf-8"), request, ignore_unknown_fields=True)
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
        raise OtlpError(400, f"malformed OTLP {kind} body: {exc}") from None
    return request


def encode_response(response: ExportMetricsServiceResponse, kind: str) -> bytes:
    """Serialise the response in the same media type as the request."""
    if kind == PROTOBUF:
        return response.SerializeToString()
    return json_format.MessageToJson(response).encode("utf-8")


def any_value(value: AnyValue) -> str | int | float | bool | None:
    """A scalar attribute value (arrays and maps are rendered as their JSON text)."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        return value.double_value
    if which == "bool_value":
        return value.bool_value
    if which is None:
        return None
    return json_format.MessageToJson(value, indent=None)


def attributes(kvs: Iterable[KeyValue]) -> dict[str, str | int | float | bool]:
    """OTLP key-values as a plain dict (keys with no value are dropped)."""
    out: dict[str, str | int | float | bool] = {}
    for kv in kvs:
        value = any_value(kv.value)
        if value is not None:
            out[kv.key] = value
    return out


@dataclass(frozen=True, slots=True)
class NumberPoint:
    """One gauge or sum data point, flattened with its resource and metric."""

    resource: dict[str, str | int | float | bool]
    metric: str
    unit: str
    kind: str
    monotonic: bool
    attributes: dict[str, str | int | float | bool]
    time_unix_nano: int
    value: float


def _number(point: NumberDataPoint) -> float:
    return point.as_double if point.WhichOneof("value") == "as_double" else float(point.as_int)


@dataclass(frozen=True, slots=True)
class HistogramPoint:
    """One cumulative explicit-bucket histogram point, flattened with its resource and metric."""

    resource: dict[str, str | int | float | bool]
    metric: str
    unit: str
    attributes: dict[str, str | int | float | bool]
    time_unix_nano: int
    bounds: tuple[float, ...]
    bucket_counts: tuple[int, ...]
    sum_value: float


CUMULATIVE = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def histogram_points(request: ExportMetricsServiceRequest) -> list[HistogramPoint]:
    """Cumulative explicit-bucket histogram points that are well formed.

    ``number_points`` counts every histogram point as rejected; a sink that stores histograms
    takes these and un-counts the ones it kept. Delta temporality and bucket/bound mismatches are
    left out (so they stay rejected).
    """
    out = []
    for rm in request.resource_metrics:
        resource = attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.WhichOneof("data") != "histogram":
                    continue
                if metric.histogram.aggregation_temporality != CUMULATIVE:
                    continue
                for dp in metric.histogram.data_points:
                    bounds = tuple(dp.explicit_bounds)
                    counts = tuple(dp.bucket_counts)
                    if len(counts) != len(bounds) + 1 or list(bounds) != sorted(set(bounds)):
                        continue
                    if not all(math.isfinite(b) for b in bounds):
                        continue
                    out.append(
                        HistogramPoint(
                            resource=resource,
                            metric=metric.name,
                            unit=metric.unit,
                            attributes=attributes(dp.attributes),
                            time_unix_nano=dp.time_unix_nano,
                            bounds=bounds,
                            bucket_counts=counts,
                            sum_value=dp.sum if dp.HasField("sum") else 0.0,
                        )
                    )
    return out


def number_points(request: ExportMetricsServiceRequest) -> tuple[list[NumberPoint], int]:
    """Flatten gauges and sums; return them and the count of points rejected.

    Rejected: non-finite values, points without a value, and metric types this receiver does not
    store yet (histograms, summaries), which are counted so the agent sees a partial success.
    """
    accepted: list[NumberPoint] = []
    rejected = 0
    for rm in request.resource_metrics:
        resource = attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                rejected += _flatten(metric, resource, accepted)
    return accepted, rejected


def _flatten(
    metric: Metric, resource: dict[str, str | int | float | bool], out: list[NumberPoint]
) -> int:
    kind = metric.WhichOneof("data")
    if kind == "gauge":
        dps, monotonic = metric.gauge.data_points, False
    elif kind == "sum":
        dps, monotonic = metric.sum.data_points, metric.sum.is_monotonic
    else:
        return _count_points(metric)
    rejected = 0
    for dp in dps:
        if dp.WhichOneof("value") is None:
            rejected += 1
            continue
        value = _number(dp)
        if not math.isfinite(value):
            rejected += 1
            continue
        out.append(
            NumberPoint(
                resource=resource,
                metric=metric.name,
                unit=metric.unit,
                kind=kind,
                monotonic=monotonic,
                attributes=attributes(dp.attributes),
                time_unix_nano=dp.time_unix_nano,
                value=value,
            )
        )
    return rejected


def _count_points(metric: Metric) -> int:
    kind = metric.WhichOneof("data")
    if kind == "histogram":
        return len(metric.histogram.data_points)
    if kind == "exponential_histogram":
        return len(metric.exponential_histogram.data_points)
    if kind == "summary":
        return len(metric.summary.data_points)
    return 0


# --- the receiver's fast path ------------------------------------------------------------------

AttrScalar = str | int | float | bool
RawItems = tuple[tuple[str, AttrScalar | None], ...]
"""A data point's attributes as sent: in order, a key may repeat, None where it has no value."""


@dataclass(frozen=True, slots=True)
class MetricColumns:
    """One gauge or sum metric's well-formed points (finite value), as columns."""

    resource: int
    """Index into :attr:`NumberColumns.resources`."""
    name: str
    unit: str
    counter: bool
    """A monotonic sum."""
    items: list[RawItems]
    times: list[int]
    values: list[float]


@dataclass(frozen=True, slots=True)
class NumberColumns:
    """A request's gauges and sums: what :func:`number_points` gives, without per-point objects.

    ``points`` and ``rejected`` are the length of ``number_points``' list and its rejected count;
    ``histograms`` says whether the request holds explicit-bucket histograms at all.
    """

    resources: tuple[dict[str, AttrScalar], ...]
    metrics: tuple[MetricColumns, ...]
    points: int
    rejected: int
    histograms: bool


def number_columns(request: ExportMetricsServiceRequest) -> NumberColumns:
    """Gauges and sums as columns: the points, order and counts ``number_points`` gives."""
    resources: list[dict[str, AttrScalar]] = []
    metrics: list[MetricColumns] = []
    points = rejected = 0
    histograms = False
    for rm in request.resource_metrics:
        resource_index = len(resources)
        resources.append(attributes(rm.resource.attributes))
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind == "gauge":
                    dps, counter = metric.gauge.data_points, False
                elif kind == "sum":
                    dps, counter = metric.sum.data_points, metric.sum.is_monotonic
                else:
                    rejected += _count_points(metric)
                    histograms = histograms or kind == "histogram"
                    continue
                items: list[RawItems] = []
                times: list[int] = []
                values: list[float] = []
                rejected += _point_columns(dps, items, times, values)
                if items:
                    points += len(items)
                    metrics.append(
                        MetricColumns(
                            resource_index, metric.name, metric.unit, counter, items, times, values
                        )
                    )
    return NumberColumns(tuple(resources), tuple(metrics), points, rejected, histograms)


def _point_columns(
    dps: Iterable[NumberDataPoint], items: list[RawItems], times: list[int], values: list[float]
) -> int:
    """Append the well-formed points' columns; return how many were rejected."""
    rejected = 0
    isfinite = math.isfinite
    for dp in dps:
        which = dp.WhichOneof("value")
        if which == "as_double":
            value = dp.as_double
        elif which == "as_int":
            value = float(dp.as_int)
        else:
            rejected += 1
            continue
        if not isfinite(value):
            rejected += 1
            continue
        row = []
        for kv in dp.attributes:
            v = kv.value
            text = v.string_value  # the common case: one field read, not WhichOneof
            row.append((kv.key, text if text else any_value(v)))
        items.append(tuple(row))
        times.append(dp.time_unix_nano)
        values.append(value)
    return rejected


def shape_key(payload: bytes) -> bytes | None:
    """What identifies a sender's protobuf requests: their size and first resource's bytes.

    None when the payload does not start with a resource (nothing to key on).
    """
    try:
        if payload[0] != 0x0A:
            return None
        _, p = _varint(payload, 1)
        if payload[p] != 0x0A:
            return None
        size, q = _varint(payload, p + 1)
    except IndexError:
        return None
    return len(payload).to_bytes(8, "little") + payload[q : q + size]


class RequestShape:
    """Where a protobuf request keeps its gauge and sum points' times and values.

    Built from a canonical payload (as upb serialises it: each field once, by number, so the
    walk below reads the bytes exactly as the parser did) that holds gauges and sums only. Every
    point's time, value and start time are 8-byte fixed64 fields, whatever their content: a
    payload of the same size that equals the template everywhere but in those bytes parses to
    the same resources, metrics, attributes and point order, so its points are read from those
    offsets (:meth:`extract`), in ``number_points`` order. Any other difference (a new series,
    an exemplar, a changed unit) is a mismatch and the request is parsed as usual.
    """

    __slots__ = (
        "int_values",
        "keep",
        "no_value",
        "resource_of_point",
        "size",
        "time_at",
        "value_at",
        "words",
    )

    def __init__(
        self,
        payload: bytes,
        masked: list[int],
        time_at: list[int],
        value_at: list[int],
        int_values: list[bool],
        resource_of_point: list[int],
        no_value: int,
    ) -> None:
        self.size = len(payload)
        keep = np.ones(_padded(self.size), dtype=bool)
        at = np.asarray(masked, dtype=np.int64)
        keep[(at[:, None] + np.arange(8)).ravel()] = False
        self.keep = np.packbits(keep)  # a bit per byte: 1/64 of the payload
        self.words = _words(payload) & _unpack(self.keep, self.size)
        self.time_at = np.asarray(time_at, dtype=np.int32)
        self.value_at = np.asarray(value_at, dtype=np.int32)
        self.int_values = np.asarray(int_values, dtype=bool)
        self.resource_of_point = np.asarray(resource_of_point, dtype=np.int32)
        self.no_value = no_value

    @property
    def points(self) -> int:
        """Gauge and sum points with a value."""
        return int(self.time_at.size)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays."""
        return sum(
            int(a.nbytes)
            for a in (
                self.keep,
                self.words,
                self.time_at,
                self.value_at,
                self.int_values,
                self.resource_of_point,
            )
        )

    @classmethod
    def of(cls, payload: bytes, request: ExportMetricsServiceRequest) -> RequestShape | None:
        """The shape of ``payload`` (``request`` is it parsed); None when it cannot have one.

        None for a payload that is not upb's canonical encoding of ``request``, holds
        histograms or summaries, or has a point without a time.
        """
        if not 8 <= len(payload) < 1 << 31 or request.SerializeToString() != payload:
            return None  # (offsets are int32)
        try:
            return cls._walk(payload)
        except (IndexError, ValueError):
            return None

    @classmethod
    def _walk(cls, buf: bytes) -> RequestShape | None:
        layout = _Layout()
        for number, wire, start, end in _fields(buf, 0, len(buf)):
            if number != 1 or wire != 2:  # ResourceMetrics
                continue
            layout.resources += 1
            for f2, w2, s2, e2 in _fields(buf, start, end):
                if f2 != 2 or w2 != 2:  # ScopeMetrics
                    continue
                for f3, w3, s3, e3 in _fields(buf, s2, e2):
                    if f3 == 2 and w3 == 2 and not layout.metric(buf, s3, e3):  # Metric
                        return None
        return cls(
            buf,
            layout.masked,
            layout.time_at,
            layout.value_at,
            layout.int_values,
            layout.resource_of_point,
            layout.no_value,
        )

    def extract(
        self, payload: bytes
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float64]] | None:
        """Times (uint64 ns) and values of ``payload``'s points, or None if it does not match."""
        if len(payload) != self.size:
            return None
        words = _words(payload)
        words &= _unpack(self.keep, self.size)
        if not np.array_equal(words, self.words):
            return None
        # Every 8-byte window of the payload as one unaligned number: gather the fields' ones.
        u64 = np.ndarray((self.size - 7,), dtype="<u8", buffer=payload, strides=(1,))
        times = u64[self.time_at]
        values = np.ndarray((self.size - 7,), dtype="<f8", buffer=payload, strides=(1,))[
            self.value_at
        ]
        if self.int_values.any():
            ints = np.ndarray((self.size - 7,), dtype="<i8", buffer=payload, strides=(1,))
            values[self.int_values] = ints[self.value_at[self.int_values]]
        return times, values


@dataclass(slots=True)
class _Layout:
    """What ``RequestShape._walk`` finds, metric by metric."""

    masked: list[int] = field(default_factory=list)
    time_at: list[int] = field(default_factory=list)
    value_at: list[int] = field(default_factory=list)
    int_values: list[bool] = field(default_factory=list)
    resource_of_point: list[int] = field(default_factory=list)
    resources: int = 0
    no_value: int = 0

    def metric(self, buf: bytes, start: int, end: int) -> bool:
        """Take one Metric's points; False if it cannot be shaped (histograms, no time)."""
        for number, wire, s, e in _fields(buf, start, end):
            if wire != 2:
                continue
            if number in (9, 10, 11):  # histogram, exponential histogram, summary
                return False
            if number not in (5, 7):  # gauge, sum
                continue
            for n2, w2, s2, e2 in _fields(buf, s, e):
                if n2 == 1 and w2 == 2 and not self.point(buf, s2, e2):  # NumberDataPoint
                    return False
        return True

    def point(self, buf: bytes, start: int, end: int) -> bool:
        """Take one NumberDataPoint; False if it has a value but no time."""
        # Canonical encoding lists fields by number: start time (2), time (3), as_double (4),
        # then exemplars (5), as_int (6), attributes (7), flags (8), unknown fields. Read the
        # fixed64 ones by their one-byte tags; after them only 5 and 6 need a closer look.
        started = time = value = -1
        as_int = False
        p = start
        if p < end and buf[p] == 0x11:
            started = p + 1
            p += 9
        if p < end and buf[p] == 0x19:
            time = p + 1
            p += 9
        if p < end and buf[p] == 0x21:
            value = p + 1
            p += 9
        elif p < end and buf[p] == 0x31:
            value, as_int = p + 1, True
            p += 9
        if p < end and buf[p] in (0x2A, 0x31):  # exemplars: read every field
            return self.point_fields(buf, start, end)
        return self.taken(started, time, value, as_int)

    def point_fields(self, buf: bytes, start: int, end: int) -> bool:
        """``point`` for any layout, field by field."""
        started = time = value = -1
        as_int = False
        for number, wire, s, _ in _fields(buf, start, end):
            if wire != 1:
                continue
            if number == 2:
                started = s
            elif number == 3:
                time = s
            elif number in (4, 6):  # as_double, as_int
                value, as_int = s, number == 6
        return self.taken(started, time, value, as_int)

    def taken(self, started: int, time: int, value: int, as_int: bool) -> bool:
        """Record one point's offsets (-1: absent)."""
        if started >= 0:  # start_time_unix_nano: not used, may change
            self.masked.append(started)
        if value >= 0 > time:
            return False
        if time >= 0:
            self.masked.append(time)
        if value < 0:
            self.no_value += 1
            return True
        self.masked.append(value)
        self.time_at.append(time)
        self.value_at.append(value)
        self.int_values.append(as_int)
        self.resource_of_point.append(self.resources - 1)
        return True


def _padded(size: int) -> int:
    return (size + 7) // 8 * 8


def _unpack(bits: npt.NDArray[np.uint8], size: int) -> npt.NDArray[np.uint64]:
    """A byte mask (0xFF kept, 0x00 masked) as uint64 words, from one bit per byte."""
    mask = np.unpackbits(bits, count=_padded(size))
    np.negative(mask, out=mask)  # 1 → 0xFF
    return mask.view("<u8")


def _words(payload: bytes) -> npt.NDArray[np.uint64]:
    """The payload as little-endian uint64 words, zero-padded (a new, writable array)."""
    buf = np.zeros(_padded(len(payload)), dtype=np.uint8)
    buf[: len(payload)] = np.frombuffer(payload, dtype=np.uint8)
    return buf.view("<u8")


def _varint(buf: bytes, p: int) -> tuple[int, int]:
    byte = buf[p]
    if byte < 0x80:
        return byte, p + 1
    value, shift = byte & 0x7F, 7
    while True:
        p += 1
        byte = buf[p]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, p + 1
        shift += 7


def _fields(buf: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """``(field number, wire type, value start, value end)`` of a message's fields."""
    out = []
    p = start
    while p < end:
        tag, p = _varint(buf, p)
        wire = tag & 7
        if wire == 0:
            _, q = _varint(buf, p)
        elif wire == 1:
            q = p + 8
        elif wire == 2:
            size, p = _varint(buf, p)
            q = p + size
        elif wire == 5:
            q = p + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.append((tag >> 3, wire, p, q))
        p = q
    if p != end:
        raise ValueError("field overruns its message")
    return out
