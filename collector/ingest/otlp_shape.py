"""The protobuf fast path for a sender's steady state: :class:`RequestShape` records where a
request keeps each gauge and sum point's time and value bytes (read off the protobuf wire
format), so the next request with identical bytes everywhere else is read with a few numpy
operations, without parsing it; :func:`shape_key` says which shape to try.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)


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
