"""Fuzzing the OTLP decoding path: any body gives a result or an OtlpError (a 4xx), nothing else.

The handler turns OtlpError into its status and lets anything else become a 500, so "decode never
raises anything but OtlpError" is exactly "hostile bodies never get a 5xx". Bounded in examples.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gpuwarden.collector.ingest.otlp import number_points
from gpuwarden.collector.ingest.otlp_transport import (
    JSON,
    PROTOBUF,
    OtlpError,
    decompress,
    parse_request,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode(body: bytes, encoding: str | None, kind: str) -> int:
    """The handler's decode path; returns the accepted point count or raises OtlpError."""
    payload = decompress(body, encoding, 1 << 20)
    points, rejected = number_points(parse_request(payload, kind))
    assert rejected >= 0
    for p in points:
        assert math.isfinite(p.value)
    return len(points)


def outcome(call: Callable[[], int]) -> str | int:
    """``"ok"``, or the HTTP status of the OtlpError; any other exception propagates."""
    try:
        call()
    except OtlpError as exc:
        return exc.status
    return "ok"


def valid_request(values: list[float], names: list[str], attrs: dict[str, str]) -> bytes:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value="n")))
    for i, name in enumerate(names):
        metric = rm.scope_metrics.add().metrics.add()
        metric.name = name
        data = metric.sum if i % 2 else metric.gauge
        for v in values:
            dp = data.data_points.add()
            dp.as_double = v
            for k, val in attrs.items():
                dp.attributes.append(KeyValue(key=k, value=AnyValue(string_value=val)))
    return req.SerializeToString()


@FUZZ
@given(
    st.binary(max_size=4096),
    st.sampled_from([None, "gzip", "identity"]),
    st.sampled_from([PROTOBUF, JSON]),
)
def test_random_bodies_never_raise_anything_but_otlp_errors(body, encoding, kind):
    assert outcome(lambda: decode(body, encoding, kind)) in ("ok", 400, 413, 415)


@FUZZ
@given(
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=8),
    st.lists(st.text(max_size=20), min_size=1, max_size=4),
    st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=4),
    st.data(),
)
def test_mutated_valid_requests_never_raise_anything_but_otlp_errors(values, names, attrs, data):
    body = bytearray(valid_request(values, names, attrs))
    for _ in range(data.draw(st.integers(0, 8))):
        if not body:
            break
        pos = data.draw(st.integers(0, len(body) - 1))
        op = data.draw(st.sampled_from(["flip", "cut", "dup"]))
        if op == "flip":
            body[pos] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del body[pos:]
        else:
            body[pos:pos] = body[pos : pos + data.draw(st.integers(1, 16))]
    compressed = data.draw(st.booleans())
    payload = gzip.compress(bytes(body)) if compressed else bytes(body)
    encoding = "gzip" if compressed else None
    assert outcome(lambda: decode(payload, encoding, PROTOBUF)) in ("ok", 400, 413, 415)


@FUZZ
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=16))
def test_non_finite_values_are_counted_never_stored(values):
    payload = valid_request(values, ["m"], {})
    points, rejected = number_points(parse_request(payload, PROTOBUF))
    assert len(points) + rejected == len(values)
    assert rejected == sum(1 for v in values if not math.isfinite(v))
