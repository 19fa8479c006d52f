"""OpenTelemetry names as Prometheus names, as the agent's own ``/metrics`` shows them.

The agent's Prometheus endpoint is ``opentelemetry-exporter-prometheus``; its mapping (the
OpenTelemetry ↔ Prometheus compatibility rules) is used here too, so a series reads the same in
the TSDB as when Prometheus scrapes an agent: the name sanitised, the unit as a suffix
(``hw.power`` in ``W`` → ``hw_power_watts``), ``_total`` on monotonic sums
(``hw.energy`` → ``hw_energy_joules_total``), attribute keys sanitised (``host.name`` →
``host_name``). This module is the one place that imports that mapping.

Every series a collector writes also carries its ``cluster`` label (the collector's
``cluster:``), so that one TSDB holds the series of several clusters apart even when their node
names collide. The collector's cluster wins over an attribute that sanitises to ``cluster``,
as Prometheus' ``external_labels`` name the writer rather than the workload.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from opentelemetry.exporter.prometheus._mapping import (
    map_unit,
    sanitize_attribute,
    sanitize_full_name,
)

from gpuwarden.collector.remote_write.wire import Labels

_TOTAL = "_total"
CLUSTER_LABEL = "cluster"


@lru_cache(maxsize=4096)
def metric_name(metric: str, unit: str, *, counter: bool) -> str:
    """The Prometheus name of an OpenTelemetry metric with this unit (``counter``: monotonic)."""
    name = sanitize_full_name(metric)
    suffix = map_unit(unit or "")
    if counter and name.endswith(_TOTAL):
        name = name[: -len(_TOTAL)]
    if suffix and not name.endswith("_" + suffix):
        name = f"{name}_{suffix}"
    return name + _TOTAL if counter else name


@lru_cache(maxsize=4096)
def label_name(key: str) -> str:
    """The Prometheus label name of an attribute key."""
    return sanitize_attribute(key)


def label_value(value: object) -> str:
    """An attribute value as label text (booleans as ``true``/``false``, as OpenTelemetry)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def labels(
    name: str, attributes: Iterable[tuple[str, object]], *, cluster: str | None = None
) -> Labels:
    """The sorted labels of a series: ``__name__``, its attributes (``None`` and empty values
    dropped, a repeated key keeps its last value as the store does; keys that sanitise to one
    label name join their values with ``;``, as OpenTelemetry does) and, when given, the
    writer's ``cluster``."""
    raw = {key: value for key, value in attributes if value is not None}  # a repeat: last wins
    out: dict[str, str] = {}
    for key, value in sorted(raw.items()):
        label = label_name(key)
        text = label_value(value)
        if not text:
            continue  # the protocol has no empty label values (empty is absent)
        out[label] = f"{out[label]};{text}" if label in out and out[label] != text else text
    out["__name__"] = name
    if cluster is not None:
        out[CLUSTER_LABEL] = cluster
    return tuple(sorted(out.items()))


def with_cluster(series: Labels, cluster: str | None) -> Labels:
    """``series`` with the writer's ``cluster`` label (replacing one it had); unchanged for
    ``None``."""
    if cluster is None:
        return series
    rest = [(k, v) for k, v in series if k != CLUSTER_LABEL]
    return tuple(sorted([*rest, (CLUSTER_LABEL, cluster)]))
