"""Decoding OTLP/HTTP metric requests: content types, gzip with a size cap, protobuf and JSON.

Pure functions with no web framework in them, so the same code serves the aiohttp receiver, the
tests and the fuzzers. Every failure is an :class:`OtlpError` carrying the HTTP status to answer.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

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
