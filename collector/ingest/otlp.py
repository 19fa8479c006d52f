"""OTLP metric points: a parsed request's gauges, sums and histograms flattened with their
resource and metric (:class:`NumberPoint`, :class:`HistogramPoint`).

OTLP/HTTP decoding is pure functions with no web framework in them, so the same code serves the
aiohttp receiver, the tests and the fuzzers. It is split by job:

- :mod:`.otlp_transport`: content types, gzip with a size cap, protobuf and JSON parsing, the
  response; every failure an ``OtlpError`` carrying the HTTP status to answer;
- this module: :func:`number_points` builds one :class:`NumberPoint` per data point (tests, the
  demo, the scraper), :func:`histogram_points` the well-formed histogram points;
- :mod:`.otlp_columns`: the receiver's fast path, ``number_columns``: per metric, columns of
  attribute items (as sent, no dicts), times and values, with the same validation and counts;
- :mod:`.otlp_shape`: ``RequestShape`` goes further for the steady state of an agent that sends
  the same series every interval: it records where a protobuf request keeps each point's time
  and value bytes, so the next request with identical bytes everywhere else is read with a few
  numpy operations, without parsing it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint


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
        return other_points(metric)
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


def other_points(metric: Metric) -> int:
    """Data points of the metric types not flattened into numbers (histograms, summaries)."""
    kind = metric.WhichOneof("data")
    if kind == "histogram":
        return len(metric.histogram.data_points)
    if kind == "exponential_histogram":
        return len(metric.exponential_histogram.data_points)
    if kind == "summary":
        return len(metric.summary.data_points)
    return 0
