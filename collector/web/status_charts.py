"""The status page's charts: an incident's evidence plotted with its units and thresholds, and
the fleet's utilisation per node.

Incidents keep no units, so they are read here from the evidence a detector writes: the metric
named in ``metric`` (its unit from the agent's telemetry catalog, or from the name's own suffix),
and what each threshold key means. A threshold is placed against the axis of its own unit, so a
deploy test's p-value or a drift's z-score is never drawn on the latency axis beside it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from gpuwarden.agent.catalog import rows_by_name
from gpuwarden.collector.web.status_svg import RATIO_PERCENT, Axis, Series, Threshold, line_chart

_UNITS = {"1": RATIO_PERCENT, "s": Axis("s"), "W": Axis("W"), "J": Axis("J"), "Cel": Axis("°C")}
_UNIT_SUFFIXES = (  # what a name says of its unit, first match wins
    ("_seconds", Axis("s")),
    ("_ratio", RATIO_PERCENT),
    (".utilization", RATIO_PERCENT),
    ("_watts", Axis("W")),
    ("_bytes", Axis("B")),
    ("latency", Axis("s")),
    (".duration", Axis("s")),
)
UTILIZATION = RATIO_PERCENT
REQUEST_RATE = Axis("req/s")
BURN_RATE = Axis("× budget rate")
P_VALUE = Axis("p-value")
Z_SCORE = Axis("z-score")
ANOMALY_SCORE = Axis("anomaly score")


@functools.cache
def _catalog_units() -> dict[str, str]:
    return {name: rows[0].unit for name, rows in rows_by_name().items() if rows}


def metric_axis(metric: str) -> Axis:
    """The axis of a metric: its catalog unit, else what its name says, else a bare number."""
    unit = _catalog_units().get(metric)
    if unit is not None:
        return _UNITS.get(unit, Axis(unit.strip("{}")))
    lowered = metric.lower()
    for suffix, axis in _UNIT_SUFFIXES:
        if suffix in lowered:
            return axis
    return Axis()


def _number(evidence: Mapping[str, object], key: str) -> float | None:
    value = evidence.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def incident_axes(evidence: Mapping[str, object]) -> tuple[Axis, list[Threshold]]:
    """The unit of an incident's plotted points and its thresholds, each in its own unit."""
    utilization = _number(evidence, "threshold_ratio")
    if utilization is None:
        utilization = _number(evidence, "utilization_below")
    if utilization is not None or "mean_utilization_ratio" in evidence:
        marks = [] if utilization is None else [Threshold(utilization, "idle below", UTILIZATION)]
        return UTILIZATION, marks
    if "slo" in evidence:  # the SLO detector plots burn rates against its pairs' thresholds
        return BURN_RATE, _burn_thresholds(evidence)
    limit = _number(evidence, "limit_rps")
    if limit is not None or "forecast_upper_rps_max" in evidence:
        marks = [] if limit is None else [Threshold(limit, "capacity limit", REQUEST_RATE)]
        return REQUEST_RATE, marks
    return _metric_axes(evidence)


def _burn_thresholds(evidence: Mapping[str, object]) -> list[Threshold]:
    marks = []
    for key in sorted(evidence):
        value = _number(evidence, key)
        if key.startswith("pair_") and key.endswith("_threshold") and value is not None:
            pair = key.removeprefix("pair_").removesuffix("_threshold").replace("_", "/")
            marks.append(Threshold(value, f"burn threshold {pair}", BURN_RATE))
    return marks


def _metric_axes(evidence: Mapping[str, object]) -> tuple[Axis, list[Threshold]]:
    """A metric's values; the ``threshold`` key's meaning depends on the detector that wrote it."""
    metric = evidence.get("metric")
    axis = metric_axis(metric) if isinstance(metric, str) else Axis()
    threshold = _number(evidence, "threshold")
    if "method" in evidence:  # a distribution distance, plotted against its own threshold
        axis = Axis(f"{evidence['method']} distance")
        marks = [] if threshold is None else [Threshold(threshold, "drift threshold", axis)]
        return axis, marks
    if threshold is None:
        return axis, []
    if "test" in evidence:  # a deploy's two-sample test
        return axis, [Threshold(threshold, "p-value below", P_VALUE)]
    if "baseline_kind" in evidence:  # drift: a robust z against the baseline
        return axis, [Threshold(threshold, "z above", Z_SCORE)]
    return axis, [Threshold(threshold, "score above", ANOMALY_SCORE)]


def incident_chart(
    rule_id: str,
    subject: str,
    evidence: Mapping[str, object],
    points: Sequence[tuple[float, float]],
) -> str:
    """The chart of an incident's evidence, with its unit, legend and thresholds."""
    axis, thresholds = incident_axes(evidence)
    metric = evidence.get("metric")
    label = f"{subject} ({metric})" if isinstance(metric, str) else subject
    return line_chart(
        [Series(label, points)],
        title=f"{rule_id}: {subject}",
        axis=axis,
        thresholds=thresholds,
    )


def fleet_chart(series: Sequence[Series]) -> str:
    """Mean GPU utilisation per node (one line per node), in %."""
    return line_chart(
        series,
        title="mean GPU utilisation per node, last hour",
        axis=UTILIZATION,
        y_min=0.0,
        y_max=1.0,
    )
