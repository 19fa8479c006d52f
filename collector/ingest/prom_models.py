"""Remote-written model-server series (vLLM, Triton, TGI) as the scraper's model points.

The one table is ``scrape.MODEL_METRICS`` (``docs/model-metrics.md``); this module reads its
counters and gauges under the names remote-write carries: the exposed name, and for counters the
same with ``_total`` (vLLM's prometheus_client prints it; an OpenTelemetry Collector's
``prometheusremotewrite`` exporter appends it to any counter). Attributes are the scraper's
(``scrape._attributes``): the server's label renames, ``reason``/``outcome`` and the row's fixed
attributes, Prometheus' ``instance`` as ``service.instance.id``. Histograms arrive as separate
``_bucket``/``_sum``/``_count`` series; they are recognised (to be counted as skipped) but not
mapped yet.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.scrape import (
    INSTANCE,
    LABEL_RENAMES,
    MODEL_METRICS,
    OUTCOME,
    REASON,
    ModelMetric,
)

Attrs = dict[str, str | int | float | bool]

#: Series name -> its row, for the rows' counters and gauges.
MODEL_BY_SERIES: Mapping[str, ModelMetric] = {
    name: m
    for m in MODEL_METRICS
    if m.source_type != "histogram"
    for name in ((m.source, m.source + "_total") if m.source_type == "counter" else (m.source,))
}
#: The series a histogram row's family is written as.
HISTOGRAM_SERIES = frozenset(
    m.source + suffix
    for m in MODEL_METRICS
    if m.source_type == "histogram"
    for suffix in ("_bucket", "_sum", "_count")
)
#: Labels that are not the server's: the series name and Prometheus' target labels.
DROPPED_LABELS = frozenset({"__name__", "instance", "job"})


def superseded(spec: ModelMetric, names: Collection[str]) -> bool:
    """Whether the request also carries the newer series that replaces ``spec``'s."""
    newer = spec.superseded_by
    return newer is not None and (newer in names or newer + "_total" in names)


def model_attributes(spec: ModelMetric, labels: Mapping[str, str]) -> Attrs:
    """The scraper's attributes from a remote-written series' labels."""
    renames = LABEL_RENAMES[spec.server]
    attrs: Attrs = {
        renames.get(k, k): v
        for k, v in labels.items()
        if k not in DROPPED_LABELS and k != spec.reason_label
    }
    outcome = spec.outcome
    reason = labels.get(spec.reason_label) if spec.reason_label is not None else None
    if reason is not None:
        attrs[REASON] = reason
        outcome = dict(spec.outcomes).get(reason, outcome)
    if outcome is not None:
        attrs[OUTCOME] = outcome
    attrs.update(spec.attributes)
    attrs[INSTANCE] = labels.get("instance", "")
    return attrs


def model_points(
    spec: ModelMetric,
    labels: Mapping[str, str],
    samples: Iterable[tuple[int, float]],
    resource: Attrs,
) -> list[NumberPoint]:
    """One point per (time in ns, finite value) sample of a series of ``spec``'s family."""
    attrs = model_attributes(spec, labels)
    counter = spec.source_type == "counter"
    kind = "sum" if counter else "gauge"
    return [
        NumberPoint(resource, spec.name, spec.unit, kind, counter, dict(attrs), t, v / spec.divisor)
        for t, v in samples
    ]
