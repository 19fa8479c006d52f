"""The OTLP push request, encoded straight from the catalog and the snapshot.

Why not the SDK's collect path: per round it builds an ``Observation``, a ``Measurement``, a
hashed attribute set and an aggregation per point, then a protobuf object tree, then serialises
it; that was two thirds of the agent's CPU per round. Here each point is a few bytes appended to
a buffer: the resource, the scope and every metric's header are encoded once, each series'
attributes once per life of the series, and a point adds only its times and value.

The bytes are what the SDK path (``InMemoryMetricReader`` + ``encode_metrics``) sends for the
same observations: the same resource (the SDK ``Resource``'s attributes), scope, metrics in
catalog order, names, descriptions, units, gauges and cumulative sums (monotonic for counters),
``as_double`` values and attributes in the same order, serialised canonically (each field once,
by field number, as upb does: the collector's fast path reads such requests without parsing);
``tests/test_otlp_encode.py`` checks it point for point. Points carry the round's sample time;
a sum's start time is the sample time of the round its series first appeared in, kept while the
series lasts. Two points of one metric with equal attributes merge as the SDK merges them (sums
add, gauges keep the last), and a non-finite value (NaN, ±inf) is dropped, as the SDK drops it
(logged once per metric here, not every round).

The SDK stays for the optional Prometheus pull reader (``agent.telemetry``).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping
from math import isfinite

from gpuwarden.agent.catalog import Instrument, MetricDef, rows_by_name
from gpuwarden.agent.model import Snapshot
from gpuwarden.agent.points import Prepared, prepared_points

log = logging.getLogger(__name__)

AttrKey = tuple[tuple[str, str | int], ...]

_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
AGGREGATION_TEMPORALITY_CUMULATIVE = 2

# Wire tags: (field number << 3) | wire type (0 varint, 1 fixed64, 2 length-delimited).
_POINT_START = b"\x11"  # NumberDataPoint.start_time_unix_nano = 2, fixed64
_POINT_TIME = b"\x19"  # NumberDataPoint.time_unix_nano = 3, fixed64
_POINT_DOUBLE = b"\x21"  # NumberDataPoint.as_double = 4, double
_POINT_ATTRIBUTE = 7  # NumberDataPoint.attributes, KeyValue
_DATA_POINTS = b"\x0a"  # Gauge/Sum.data_points = 1


def _varint(value: int) -> bytes:
    """A protobuf varint; negative numbers as 64-bit two's complement (int64)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _string(number: int, value: str) -> bytes:
    """A proto3 string field: absent when empty, as protobuf leaves it."""
    return _field(number, value.encode()) if value else b""


def _any_value(value: object) -> bytes:
    """An ``AnyValue`` for the attribute types the agent uses, as the SDK's encoder picks them."""
    if isinstance(value, bool):
        return b"\x10" + _varint(int(value))  # bool_value = 2
    if isinstance(value, str):
        return _field(1, value.encode())  # string_value = 1 (a oneof: present even if "")
    if isinstance(value, int):
        return b"\x18" + _varint(value)  # int_value = 3
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)  # double_value = 4
    msg = f"attribute value {value!r} of type {type(value).__name__} is not encodable"
    raise TypeError(msg)


def encode_attributes(number: int, attributes: Mapping[str, object]) -> bytes:
    """Every attribute as a repeated ``KeyValue`` field ``number``, in the mapping's order."""
    return b"".join(
        _field(number, _string(1, key) + _field(2, _any_value(value)))
        for key, value in attributes.items()
    )


# A point's fixed-size fields after its attributes' head: time (9 bytes) and value (9 bytes).
_TIME_AND_VALUE_BYTES = 18
_START_BYTES = 9


class _MetricEncoder:
    """One metric name: its header bytes, and the series it had in the last round.

    A live series keeps two byte strings: its point's head (the ``data_points`` tag, the
    point's length, which never changes for a series, and a sum's start time) and its encoded
    attributes. A point of a known series is then its head, the round's time, its value and its
    attributes, joined.
    """

    __slots__ = ("header", "is_sum", "logged", "rows", "series", "tail")

    def __init__(self, rows: tuple[MetricDef, ...]) -> None:
        first = rows[0]
        self.rows = rows
        self.is_sum = first.instrument is not Instrument.GAUGE
        self.header = (
            _string(1, first.name) + _string(2, first.description) + _string(3, first.unit)
        )
        if self.is_sum:
            monotonic = b"\x18\x01" if first.instrument is Instrument.COUNTER else b""
            self.tail = b"\x10" + _varint(AGGREGATION_TEMPORALITY_CUMULATIVE) + monotonic
        else:
            self.tail = b""
        self.series: dict[AttrKey, tuple[bytes, bytes]] = {}  # live series: (head, attributes)
        self.logged = False

    def _log_non_finite(self, value: float) -> None:
        if not self.logged:  # once per metric: a broken sensor must not flood the log
            self.logged = True
            log.warning(
                "dropping the non-finite value %s of %s (logged once)", value, self.rows[0].name
            )

    def _new_series(self, key: AttrKey, time_nano: int) -> tuple[bytes, bytes]:
        attributes = encode_attributes(_POINT_ATTRIBUTE, dict(key))
        length = _TIME_AND_VALUE_BYTES + len(attributes)
        if self.is_sum:  # the start time: this round's, kept while the series lasts
            start = _POINT_START + _FIXED64.pack(time_nano)
            return _DATA_POINTS + _varint(length + _START_BYTES) + start, attributes
        return _DATA_POINTS + _varint(length), attributes

    def encode(self, prepared: Prepared, time_field: bytes, time_nano: int) -> bytes:
        """The whole ``Metric`` field of this round, or b"" when it has no point."""
        values: dict[AttrKey, float] = {}
        for row in self.rows:
            for value, attrs in prepared_points(row, prepared):
                if not isfinite(value):  # NaN, ±inf: dropped, as the SDK drops them
                    self._log_non_finite(value)
                    continue
                key = tuple(attrs.items())
                if self.is_sum:  # as the SDK's sum aggregation: from 0, adding (0 + -0.0 is 0.0)
                    values[key] = values.get(key, 0) + value
                else:
                    values[key] = value  # a gauge keeps the last, as the SDK does
        known = self.series
        live: dict[AttrKey, tuple[bytes, bytes]] = {}
        parts: list[bytes] = []
        pack = _DOUBLE.pack
        for key, value in values.items():
            series = known.get(key)
            if series is None:
                series = self._new_series(key, time_nano)
            live[key] = series
            # points are floats (as_double), as the SDK encodes the agent's observations
            parts += (series[0], time_field, _POINT_DOUBLE, pack(value), series[1])
        self.series = live
        if not parts:
            return b""
        data = b"".join(parts) + self.tail
        return _field(2, self.header + _field(7 if self.is_sum else 5, data))


class OtlpEncoder:
    """Encodes one ``ExportMetricsServiceRequest`` per snapshot, from the catalog.

    Args:
        resource_attributes: the resource's attributes as the SDK ``Resource`` holds them
            (service, host, ``telemetry.sdk.*``), in its order.
        scope_name: the instrumentation scope (the meter's name).
        scope_version: the meter's version.

    Not thread-safe: the sampling loop is its only caller.

    """

    def __init__(
        self, resource_attributes: Mapping[str, object], scope_name: str, scope_version: str
    ) -> None:
        self._resource = _field(1, encode_attributes(1, resource_attributes))
        self._scope = _field(1, _string(1, scope_name) + _string(2, scope_version))
        self._metrics = [_MetricEncoder(rows) for rows in rows_by_name().values()]

    def encode(self, snapshot: Snapshot) -> bytes | None:
        """The request for ``snapshot``, or None when it has no point at all (as the SDK)."""
        prepared = Prepared(snapshot)
        time_nano = snapshot.time_unix_nano
        time_field = _POINT_TIME + _FIXED64.pack(time_nano)
        metrics = b"".join(m.encode(prepared, time_field, time_nano) for m in self._metrics)
        if not metrics:
            return None
        scope_metrics = _field(2, self._scope + metrics)
        return _field(1, self._resource + scope_metrics)
