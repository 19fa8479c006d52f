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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint

from gpuwarden.collector.ingest.otlp_limits import DEFAULT_LIMITS, IngestLimits


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


def histogram_points(
    request: ExportMetricsServiceRequest, limits: IngestLimits = DEFAULT_LIMITS
) -> list[HistogramPoint]:
    """Cumulative explicit-bucket histogram points that are well formed and within ``limits``.

    ``number_points`` counts every histogram point as rejected; a sink that stores histograms
    takes these and un-counts the ones it kept. Delta temporality, bucket/bound mismatches and
    points over the label limits are left out (so they stay rejected).
    """
    out = []
    for rm in request.resource_metrics:
        resource = _resource(rm.resource.attributes, limits)
        if resource is None:
            continue
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.WhichOneof("data") != "histogram" or not limits.metric_ok(metric.name):
                    continue
                if metric.histogram.aggregation_temporality != CUMULATIVE:
                    continue
                for dp in metric.histogram.data_points:
                    if not _attributes_ok(dp.attributes, limits):
                        continue
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


def number_points(
    request: ExportMetricsServiceRequest, limits: IngestLimits = DEFAULT_LIMITS
) -> tuple[list[NumberPoint], int]:
    """Flatten gauges and sums; return them and the count of points rejected.

    Rejected: non-finite values, points without a value, points over the label ``limits`` (their
    own, their metric name's or their resource's), and metric types this receiver does not store
    yet (histograms, summaries), which are counted so the agent sees a partial success.
    """
    flat = flatten(request, limits)
    return flat.points, flat.rejected


@dataclass(frozen=True, slots=True)
class Flattened:
    """``number_points``' answer, with how many of the rejected points broke the limits."""

    points: list[NumberPoint]
    rejected: int
    over_limits: int


def flatten(
    request: ExportMetricsServiceRequest, limits: IngestLimits = DEFAULT_LIMITS
) -> Flattened:
    """``number_points`` with the count of points over the label limits (of the rejected)."""
    accepted: list[NumberPoint] = []
    rejected = over = 0
    for rm in request.resource_metrics:
        resource = _resource(rm.resource.attributes, limits)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if resource is None or not limits.metric_ok(metric.name):
                    count = data_points(metric)
                    rejected += count
                    over += count
                    continue
                bad, over_here = _flatten(metric, resource, accepted, limits)
                rejected += bad
                over += over_here
    return Flattened(accepted, rejected, over)


def _resource(
    kvs: Sequence[KeyValue], limits: IngestLimits
) -> dict[str, str | int | float | bool] | None:
    """A resource's attributes, or None when it breaks the label limits."""
    if len(kvs) > limits.max_attributes:
        return None
    resource = attributes(kvs)
    return resource if limits.resource_ok(resource) else None


def _attributes_ok(kvs: Sequence[KeyValue], limits: IngestLimits) -> bool:
    if len(kvs) > limits.max_attributes:
        return False
    return limits.items_ok((kv.key, any_value(kv.value)) for kv in kvs)


def _flatten(
    metric: Metric,
    resource: dict[str, str | int | float | bool],
    out: list[NumberPoint],
    limits: IngestLimits,
) -> tuple[int, int]:
    """Append a metric's good points; return how many were rejected, and of those how many
    broke the label limits."""
    kind = metric.WhichOneof("data")
    if kind == "gauge":
        dps, monotonic = metric.gauge.data_points, False
    elif kind == "sum":
        dps, monotonic = metric.sum.data_points, metric.sum.is_monotonic
    else:
        return other_points(metric), 0
    rejected = over = 0
    for dp in dps:
        if dp.WhichOneof("value") is None:
            rejected += 1
            continue
        value = _number(dp)
        if not math.isfinite(value):
            rejected += 1
            continue
        if not _attributes_ok(dp.attributes, limits):
            rejected += 1
            over += 1
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
    return rejected, over


def request_points(request: ExportMetricsServiceRequest) -> int:
    """Data points of every type in a parsed request (lengths only: nothing is built)."""
    return sum(
        data_points(metric)
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    )


def data_points(metric: Metric) -> int:
    """A metric's data points, of whatever type."""
    kind = metric.WhichOneof("data")
    if kind == "gauge":
        return len(metric.gauge.data_points)
    if kind == "sum":
        return len(metric.sum.data_points)
    return other_points(metric)


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
