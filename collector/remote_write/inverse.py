"""Prometheus series read back from the TSDB as the points the collector took: ``naming`` inverted.

The OpenTelemetry → Prometheus mapping loses information (``hw.gpu.utilization`` and
``hw_gpu_utilization`` sanitise alike, the unit becomes a suffix, an integer attribute becomes
text), so it is inverted through tables of what the collector knows, never by guessing:

- metric names: every row of the agent's telemetry catalog and every number family of the
  model-server scrape table, mapped through :func:`~.naming.metric_name` as the writer maps them
  (the same function, so the two cannot disagree); a name in neither is not read back;
- label names: the attribute keys the agent, the scraper and workloads set (``hw_id`` →
  ``hw.id``); an unknown label keeps its Prometheus name;
- label values: text, except the attributes the agent sends as integers
  (``gpuwarden.gpu.index``, ``process.pid``), so a series read back has the identity of the
  series the agents go on sending.

Histograms are not written out (the writer takes gauges and sums), so they never come back from
the TSDB: :data:`NOT_WRITTEN` names them for the readiness page.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpuwarden.agent.catalog import Instrument, rows_by_name
from gpuwarden.agent.points import info_attributes, process_attributes
from gpuwarden.collector.ingest.scrape import (
    INSTANCE,
    MODEL,
    MODEL_METRICS,
    MODEL_VERSION,
    OUTCOME,
    REASON,
)
from gpuwarden.collector.ingest.workloads import (
    AGENT_VERSION,
    JOB_ID,
    JOB_SCHEDULER,
    MODEL_NAME,
    POD_UID,
    TEAM,
)
from gpuwarden.collector.ingest.workloads import MODEL_VERSION as WORKLOAD_MODEL_VERSION
from gpuwarden.collector.remote_write.naming import CLUSTER_LABEL, label_name, metric_name
from gpuwarden.collector.store.types import HOST_NAME, AttrValue

INTEGER_KEYS = frozenset({"gpuwarden.gpu.index", "process.pid"})
"""Attributes the agent sends as integers (``agent.points``): read back as ``int``."""
_EXTRA_KEYS = (
    HOST_NAME,
    "gpuwarden.job.id",
    "k8s.pod.uid",
    "container.id",
    "gpuwarden.gpu.pci_bus_id",
    "hw.parent",
    "gpuwarden.gpu.mig_profile",
    MODEL,
    MODEL_VERSION,
    INSTANCE,
    OUTCOME,
    REASON,
    "direction",
    "state",
    JOB_ID,
    JOB_SCHEDULER,
    POD_UID,
    MODEL_NAME,
    WORKLOAD_MODEL_VERSION,
    TEAM,
    AGENT_VERSION,
    "service.name",
    "service.version",
)


@dataclass(frozen=True, slots=True)
class MetricOrigin:
    """What a Prometheus name was: the OpenTelemetry metric, its unit, and whether a counter."""

    metric: str
    unit: str
    counter: bool

    @property
    def kind(self) -> str:
        """The OTLP point kind the store takes it as (``sum`` for counters)."""
        return "sum" if self.counter else "gauge"


@dataclass(frozen=True, slots=True)
class Origin:
    """One series read back: the metric, its ``host.name`` and its other attributes."""

    metric: MetricOrigin
    host: str | None
    attributes: Mapping[str, AttrValue]


def _known_keys() -> list[str]:
    keys: list[str] = list(_EXTRA_KEYS)
    for rows in rows_by_name().values():
        for row in rows:
            keys.extend(row.attributes)
            keys.extend(row.keys)
    for metric in MODEL_METRICS:
        keys.extend(k for k, _ in metric.attributes)
    # the agent's own attribute builders, so a key added there is known here too
    keys.extend(_builder_keys())
    return keys


def _builder_keys() -> list[str]:
    from gpuwarden.agent.model import GpuSample, JobRef, ProcessSample

    gpu = GpuSample(uuid="u", index=0, name="n", pci_bus_id="p", parent_uuid="q", mig_profile="m")
    job = JobRef(scheduler="s", job_id="1", pod_uid="p", container_id="c")
    proc = ProcessSample(pid=1, job=job)
    return [*info_attributes(gpu), *process_attributes(gpu, proc)]


class Inverse:
    """The tables that turn a Prometheus series back into the collector's point identity.

    Args:
        names: Prometheus name → its origin (default: the catalog and the scrape table).
        keys: OpenTelemetry attribute keys the label names come from (default: the known ones).
    """

    def __init__(
        self,
        names: Mapping[str, MetricOrigin] | None = None,
        keys: Iterable[str] | None = None,
    ) -> None:
        self.names: Mapping[str, MetricOrigin] = MappingProxyType(
            dict(default_names() if names is None else names)
        )
        self._keys = {label_name(k): k for k in (_known_keys() if keys is None else keys)}

    def origin(self, labels: Iterable[tuple[str, str]]) -> Origin | None:
        """The point identity of a series' labels; None for a name this collector never wrote."""
        attributes: dict[str, AttrValue] = {}
        metric: MetricOrigin | None = None
        for name, text in labels:
            if name == "__name__":
                metric = self.names.get(text)
                continue
            if name == CLUSTER_LABEL:  # the writer's, never an attribute of the point
                continue
            key = self._keys.get(name, name)
            attributes[key] = int(text) if key in INTEGER_KEYS and _integer(text) else text
        if metric is None:
            return None
        host = attributes.pop(HOST_NAME, None)
        return Origin(metric, None if host is None else str(host), attributes)


def _integer(text: str) -> bool:
    return text.lstrip("-").isdigit()


def default_names() -> dict[str, MetricOrigin]:
    """Every gauge and sum the collector takes from its agents and scrapes, by Prometheus name."""
    out: dict[str, MetricOrigin] = {}
    for name, rows in rows_by_name().items():
        row = rows[0]
        counter = row.instrument is Instrument.COUNTER
        out[metric_name(name, row.unit, counter=counter)] = MetricOrigin(name, row.unit, counter)
    for family in MODEL_METRICS:
        if family.source_type == "histogram":
            continue
        counter = family.source_type == "counter"
        prom = metric_name(family.name, family.unit, counter=counter)
        out.setdefault(prom, MetricOrigin(family.name, family.unit, counter))
    return out


NOT_WRITTEN = frozenset(m.name for m in MODEL_METRICS if m.source_type == "histogram")
"""Metrics the TSDB never holds (histograms are not written out): only a snapshot keeps them."""
