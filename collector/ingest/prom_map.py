"""Remote-written Prometheus series as the points our own agent sends for the same facts.

:func:`translate` turns the series of one remote-write request (dcgm-exporter's GPU series, the
model servers' series) into :class:`~.otlp.NumberPoint` values that look exactly like an agent's:
resource ``host.name``, ``hw.id`` on every GPU point, a ``gpuwarden.gpu.info`` point per GPU and
time, units converted by the table (:mod:`.prom_catalog`), and the pods or Slurm jobs dcgm-exporter
names as per-process points (``gpuwarden.gpu.process.*`` with the job's attributes), which is
how accounting and detection learn who holds a GPU. Everything downstream (``WindowStore``,
accounting, detection) then works unchanged.

Time-slicing: dcgm-exporter repeats each GPU series once per pod that shares the GPU; values are
kept once per (GPU, metric, time), a device-level series (no pod label) before the pods' copies,
so one shared GPU is never counted twice; the pods become its job attribution. Where
dcgm-exporter (``--kubernetes-virtual-gpus`` with per-process data) prints a device-level
``DCGM_FI_DEV_GPU_UTIL``/``DCGM_FI_DEV_FB_USED`` *and* per-pod ones, the per-pod values become
the pods' per-process points. The translation is per request: a sender that splits one scrape's
series over several requests (Prometheus' remote-write shards) may let a pod's copy stand for
the device value, which is the same number except in that per-process mode.

Model servers: the vLLM, Triton and TGI counters and gauges of ``scrape.MODEL_METRICS`` map as
the scraper maps them (:mod:`.prom_models`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.prom_catalog import (
    BY_SOURCE,
    CONTAINER_LABELS,
    HOST_LABELS,
    HPC_JOB_LABEL,
    MIB,
    MIG_ID_LABEL,
    MIG_PROFILE_LABEL,
    MODEL_LABELS,
    NAMESPACE_LABELS,
    POD_LABELS,
    POD_UID_LABEL,
    UUID_LABELS,
    PromRow,
)
from gpuwarden.collector.ingest.prom_models import (
    HISTOGRAM_SERIES,
    MODEL_BY_SERIES,
    model_points,
    superseded,
)
from gpuwarden.collector.ingest.scrape import INSTANCE, ModelMetric


class Series(Protocol):
    """One remote-written series (``remote_write.wire.Series`` is one; ingest may not import it,
    the layering keeps ``remote_write`` above ``ingest``)."""

    @property
    def labels(self) -> tuple[tuple[str, str], ...]:
        """Its labels, ``__name__`` among them."""
        ...

    @property
    def timestamps_ms(self) -> tuple[int, ...]:
        """Its samples' times, Unix milliseconds."""
        ...

    @property
    def values(self) -> tuple[float, ...]:
        """Its samples' values."""
        ...

    @property
    def name(self) -> str:
        """The ``__name__`` label ('' when absent)."""
        ...


Attrs = dict[str, str | int | float | bool]
JobAttrs = tuple[tuple[str, str], ...]

INFO = "gpuwarden.gpu.info"
PROCESS_MEMORY = "gpuwarden.gpu.process.memory.usage"
LIMIT = "hw.gpu.memory.limit"

#: Reasons a series is skipped (``Translated.skipped_by_reason`` keys).
UNMAPPED, NO_HOST, NO_UUID, HISTOGRAM = "unmapped", "no_hostname", "no_gpu_uuid", "histogram"

#: dcgm-exporter's series, counters also with the ``_total`` an OpenTelemetry Collector's
#: ``prometheusremotewrite`` exporter (or prometheus_client's parser) appends to them.
DCGM_BY_SERIES: Mapping[str, PromRow] = {
    name: row
    for row in BY_SOURCE.values()
    for name in (row.source, row.source + "_total")
    if name == row.source or row.source_type == "counter"
}


@dataclass(frozen=True, slots=True)
class Translated:
    """What one request's series became."""

    points: list[NumberPoint]
    skipped: int
    """Series with no mapping, or without the labels their mapping needs."""
    skipped_by_reason: Mapping[str, int] = field(default_factory=dict)
    """``skipped`` by reason: ``unmapped``, ``no_hostname``, ``no_gpu_uuid``, ``histogram``."""
    dropped_samples: int = 0
    """Samples of mapped series that were not finite (NaN, the stale marker, +-Inf)."""


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """One GPU (or MIG device) as dcgm-exporter's labels describe it."""

    host: str
    hw_id: str
    info: tuple[tuple[str, str | int], ...]
    parent: GpuIdentity | None = None


@dataclass
class _Batch:
    """The GPU series of one request, gathered before they are deduplicated."""

    gpus: dict[tuple[str, str], GpuIdentity] = field(default_factory=dict)
    times: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    #: (host, hw.id, source, t) -> [(job attributes or (), value)]
    values: dict[tuple[str, str, str, int], list[tuple[JobAttrs, float]]] = field(
        default_factory=dict
    )
    #: (host, hw.id, t) -> the jobs seen on the GPU then, in order: identity -> attributes
    jobs: dict[tuple[str, str, int], dict[JobAttrs, JobAttrs]] = field(default_factory=dict)


def _first(labels: Mapping[str, str], names: Sequence[str]) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def _job_attributes(labels: Mapping[str, str]) -> JobAttrs:
    """The job a series names, as the agent's per-process attributes say it (() for none).

    The first two items (scheduler, then the id the collector resolves) are its identity.
    """
    uid, hpc = labels.get(POD_UID_LABEL), labels.get(HPC_JOB_LABEL)
    pod, namespace = _first(labels, POD_LABELS), _first(labels, NAMESPACE_LABELS)
    if pod:
        namespace = namespace or "default"
        out = [("gpuwarden.job.scheduler", "kubernetes")]
        out.append(("k8s.pod.uid", uid) if uid else ("gpuwarden.job.id", f"{namespace}/{pod}"))
        out += [("k8s.namespace.name", namespace), ("k8s.pod.name", pod)]
        container = _first(labels, CONTAINER_LABELS)
        if container:
            out.append(("k8s.container.name", container))
        return tuple(out)
    if hpc:
        return (("gpuwarden.job.scheduler", "slurm"), ("gpuwarden.job.id", hpc))
    return ()


def _gpu(labels: Mapping[str, str], host: str, uuid: str) -> GpuIdentity:
    info: list[tuple[str, str | int]] = [("hw.vendor", "NVIDIA")]
    model = _first(labels, MODEL_LABELS)
    if model:
        info.insert(0, ("hw.model", model))
    index = labels.get("gpu", "")
    if index.isdigit():
        info.append(("gpuwarden.gpu.index", int(index)))
    bus = labels.get("pci_bus_id")
    if bus:
        info.append(("gpuwarden.gpu.pci_bus_id", bus))
    instance = labels.get(MIG_ID_LABEL)
    if not instance:
        return GpuIdentity(host, uuid, tuple(info))
    parent = GpuIdentity(host, uuid, tuple(info))
    mig = [*info, ("hw.parent", uuid)]
    profile = labels.get(MIG_PROFILE_LABEL)
    if profile:
        mig.append(("gpuwarden.gpu.mig_profile", profile))
    return GpuIdentity(host, f"{uuid}/gi-{instance}", tuple(mig), parent)


def gpu_identity(labels: Mapping[str, str]) -> tuple[GpuIdentity, JobAttrs] | str:
    """The GPU and job a dcgm-exporter series names, or why it cannot be placed."""
    host, uuid = _first(labels, HOST_LABELS), _first(labels, UUID_LABELS)
    if host is None:
        return NO_HOST
    if uuid is None:
        return NO_UUID
    return _gpu(labels, host, uuid), _job_attributes(labels)


class _Translator:
    """One request's translation (see :func:`translate`)."""

    def __init__(self, series: Sequence[Series]) -> None:
        self.series = series
        self.labels = [dict(s.labels) for s in series]  # once: every step below reads them
        self.names = {labels.get("__name__", "") for labels in self.labels}
        self.points: list[NumberPoint] = []
        self.skipped: Counter[str] = Counter()
        self.dropped = 0
        self.batch = _Batch()
        self.resources: dict[str, Attrs] = {}
        self.instances: dict[str, Attrs] = {}
        self.infos: set[tuple[str, str, int]] = set()
        self.identities: dict[tuple[tuple[str, str], ...], tuple[GpuIdentity, JobAttrs] | str] = {}

    def run(self) -> Translated:
        for one, labels in zip(self.series, self.labels, strict=True):
            name = labels.get("__name__", "")
            row = DCGM_BY_SERIES.get(name)
            if row is not None:
                self._gather(one, labels, row)
            elif name in MODEL_BY_SERIES:
                self._model(one, labels, MODEL_BY_SERIES[name])
            else:
                self.skipped[HISTOGRAM if name in HISTOGRAM_SERIES else UNMAPPED] += 1
        self._emit_gpus()
        return Translated(self.points, sum(self.skipped.values()), dict(self.skipped), self.dropped)

    def _resource(self, host: str) -> Attrs:
        """One resource dict per node, shared by its points (as one agent request's are)."""
        resource = self.resources.get(host)
        if resource is None:
            resource = self.resources[host] = {"host.name": host}
        return resource

    def _finite(self, one: Series) -> list[tuple[int, float]]:
        values = one.values
        if len(values) == 1 and math.isfinite(values[0]):  # the common case: one sample
            return [(one.timestamps_ms[0] * 1_000_000, values[0])]
        out = []
        for t, v in zip(one.timestamps_ms, values, strict=True):
            if math.isfinite(v):
                out.append((t * 1_000_000, v))
            else:
                self.dropped += 1
        return out

    # --- dcgm-exporter -------------------------------------------------------------------------

    def _gather(self, one: Series, labels: Mapping[str, str], row: PromRow) -> None:
        # every field of one GPU (and pod) carries the same labels but the name: read them once
        same = tuple(item for item in one.labels if item[0] != "__name__")
        found = self.identities.get(same)
        if found is None:
            found = self.identities[same] = gpu_identity(labels)
        if isinstance(found, str):
            self.skipped[found] += 1
            return
        gpu, job = found
        key = (gpu.host, gpu.hw_id)
        if key not in self.batch.gpus:
            self.batch.gpus[key] = gpu
            if gpu.parent is not None:
                self.batch.gpus.setdefault((gpu.host, gpu.parent.hw_id), gpu.parent)
        times = self.batch.times.setdefault(key, set())
        for t, v in self._finite(one):
            times.add(t)
            self.batch.values.setdefault((*key, row.source, t), []).append((job, v))
            if job:
                self.batch.jobs.setdefault((*key, t), {}).setdefault(job[:2], job)

    def _emit_gpus(self) -> None:
        batch = self.batch
        gpu_values: dict[tuple[str, str, str, int], float] = {}
        pod_values: dict[tuple[str, str, str, int], list[tuple[JobAttrs, float]]] = {}
        for (host, hw_id, source, t), seen in batch.values.items():
            device = [v for job, v in seen if not job]
            gpu_values[host, hw_id, source, t] = device[0] if device else seen[0][1]
            if device and len(device) < len(seen):
                pod_values[host, hw_id, source, t] = [(job, v) for job, v in seen if job]
        for (host, hw_id), times in batch.times.items():
            gpu = batch.gpus[host, hw_id]
            for t in sorted(times):
                self._info(gpu, t)
                if gpu.parent is not None:
                    self._info(gpu.parent, t)
        for (host, hw_id, source, t), value in gpu_values.items():
            row = BY_SOURCE[source]
            attrs: Attrs = {"hw.id": hw_id, **row.attributes}
            self._point(host, row.name, row.unit, row.kind, row.monotonic, attrs, t,
                        value * row.scale)  # fmt: skip
        self._limits(gpu_values)
        self._attribution(gpu_values, pod_values)

    def _info(self, gpu: GpuIdentity, t: int) -> None:
        """One ``gpuwarden.gpu.info`` point per GPU and time, as the agent sends every round."""
        key = (gpu.host, gpu.hw_id, t)
        if key in self.infos:
            return
        self.infos.add(key)
        attrs: Attrs = {"hw.id": gpu.hw_id, **dict(gpu.info)}
        self._point(gpu.host, INFO, "1", "gauge", False, attrs, t, 1.0)

    def _limits(self, gpu_values: Mapping[tuple[str, str, str, int], float]) -> None:
        """``hw.gpu.memory.limit`` = used + free + reserved where dcgm-exporter sends no total."""
        for (host, hw_id, source, t), used in gpu_values.items():
            if source != "DCGM_FI_DEV_FB_USED":
                continue
            if (host, hw_id, "DCGM_FI_DEV_FB_TOTAL", t) in gpu_values:
                continue
            free = gpu_values.get((host, hw_id, "DCGM_FI_DEV_FB_FREE", t))
            if free is None:
                continue
            reserved = gpu_values.get((host, hw_id, "DCGM_FI_DEV_FB_RESERVED", t), 0.0)
            attrs: Attrs = {"hw.id": hw_id}
            self._point(host, LIMIT, "By", "sum", False, attrs, t, (used + free + reserved) * MIB)

    def _attribution(
        self,
        gpu_values: Mapping[tuple[str, str, str, int], float],
        pod_values: Mapping[tuple[str, str, str, int], list[tuple[JobAttrs, float]]],
    ) -> None:
        """Each job seen on a GPU becomes per-process points on it (see the module)."""
        own_memory: set[tuple[str, str, int, JobAttrs]] = set()
        for (host, hw_id, source, t), values in pod_values.items():
            row = BY_SOURCE[source]
            if row.pod_metric is None:
                continue
            for job, value in values:
                attrs: Attrs = {"hw.id": hw_id, **dict(job)}
                kind = "sum" if row.pod_metric == PROCESS_MEMORY else "gauge"
                self._point(host, row.pod_metric, row.unit, kind, False, attrs, t,
                            value * row.scale)  # fmt: skip
                if row.pod_metric == PROCESS_MEMORY:
                    own_memory.add((host, hw_id, t, job[:2]))
        for (host, hw_id, t), jobs in self.batch.jobs.items():
            used = gpu_values.get((host, hw_id, "DCGM_FI_DEV_FB_USED", t))
            share = 0.0 if used is None else used * MIB / len(jobs)
            for ident, job in jobs.items():
                if (host, hw_id, t, ident) in own_memory:
                    continue
                attrs = {"hw.id": hw_id, **dict(job)}
                self._point(host, PROCESS_MEMORY, "By", "sum", False, attrs, t, share)

    def _point(
        self,
        host: str,
        name: str,
        unit: str,
        kind: str,
        monotonic: bool,
        attrs: Attrs,
        t: int,
        value: float,
    ) -> None:
        self.points.append(
            NumberPoint(self._resource(host), name, unit, kind, monotonic, attrs, t, value)
        )

    # --- model servers -------------------------------------------------------------------------

    def _model(self, one: Series, labels: Mapping[str, str], spec: ModelMetric) -> None:
        if superseded(spec, self.names):
            self.skipped[UNMAPPED] += 1
            return
        instance = labels.get("instance", "")
        resource = self.instances.setdefault(instance, {INSTANCE: instance})
        self.points.extend(model_points(spec, labels, self._finite(one), resource))


def translate(series: Sequence[Series]) -> Translated:
    """The points one remote-write request's ``series`` stand for (see the module)."""
    return _Translator(series).run()
