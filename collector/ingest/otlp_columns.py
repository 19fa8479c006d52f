"""The receiver's fast path: a request's gauges and sums as columns (per metric: attribute items
as sent, times, values), the points, order and counts :func:`.otlp.number_points` gives,
without one object per point.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import NumberDataPoint

from gpuwarden.collector.ingest.otlp import any_value, attributes, data_points, other_points
from gpuwarden.collector.ingest.otlp_limits import DEFAULT_LIMITS, IngestLimits

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
    ``histograms`` says whether the request holds explicit-bucket histograms at all;
    ``over_limits`` how many of ``rejected`` broke the label limits (``otlp_limits``).
    """

    resources: tuple[dict[str, AttrScalar], ...]
    metrics: tuple[MetricColumns, ...]
    points: int
    rejected: int
    histograms: bool
    over_limits: int = 0


def number_columns(
    request: ExportMetricsServiceRequest, limits: IngestLimits = DEFAULT_LIMITS
) -> NumberColumns:
    """Gauges and sums as columns: the points, order and counts ``number_points`` gives.

    Points over ``limits`` (their own, their metric name's or their resource's) are rejected
    and counted in ``over_limits`` before anything of them is kept.
    """
    resources: list[dict[str, AttrScalar]] = []
    metrics: list[MetricColumns] = []
    points = rejected = over = 0
    histograms = False
    for rm in request.resource_metrics:
        resource_index = len(resources)
        resource_ok = len(rm.resource.attributes) <= limits.max_attributes
        resources.append(attributes(rm.resource.attributes) if resource_ok else {})
        resource_ok = resource_ok and limits.resource_ok(resources[-1])
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if not resource_ok or not limits.metric_ok(metric.name):
                    count = data_points(metric)
                    rejected += count
                    over += count
                    histograms = histograms or kind == "histogram"  # held, if refused
                    continue
                if kind == "gauge":
                    dps, counter = metric.gauge.data_points, False
                elif kind == "sum":
                    dps, counter = metric.sum.data_points, metric.sum.is_monotonic
                else:
                    rejected += other_points(metric)
                    histograms = histograms or kind == "histogram"
                    continue
                items: list[RawItems] = []
                times: list[int] = []
                values: list[float] = []
                bad, over_here = _point_columns(dps, items, times, values, limits)
                rejected += bad
                over += over_here
                if items:
                    points += len(items)
                    metrics.append(
                        MetricColumns(
                            resource_index, metric.name, metric.unit, counter, items, times, values
                        )
                    )
    return NumberColumns(tuple(resources), tuple(metrics), points, rejected, histograms, over)


def _point_columns(
    dps: Iterable[NumberDataPoint],
    items: list[RawItems],
    times: list[int],
    values: list[float],
    limits: IngestLimits,
) -> tuple[int, int]:
    """Append the well-formed points' columns; return how many were rejected, and of those how
    many broke the label limits."""
    rejected = over = 0
    isfinite = math.isfinite
    max_attributes = limits.max_attributes
    items_ok = limits.items_ok
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
        if len(dp.attributes) > max_attributes:  # before building anything of it
            rejected += 1
            over += 1
            continue
        row = []
        for kv in dp.attributes:
            v = kv.value
            text = v.string_value  # the common case: one field read, not WhichOneof
            row.append((kv.key, text if text else any_value(v)))
        if not items_ok(row):
            rejected += 1
            over += 1
            continue
        items.append(tuple(row))
        times.append(dp.time_unix_nano)
        values.append(value)
    return rejected, over
