"""OpenTelemetry instruments built from the catalog, reading the sample cache.

The agent samples on its own timer and puts the result in a :class:`SampleCache`. Every
observable instrument's callback reads that cache and never touches NVML: every reader runs every
callback on each collection, so sampling inside callbacks would multiply the NVML load by the
number of readers (OTLP push plus each Prometheus scrape).

This is the one module of the agent that talks to the OpenTelemetry SDK.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader
from opentelemetry.sdk.resources import Resource

from gpuwarden.agent.catalog import (
    CATALOG,
    CLOCK_EVENT_REASONS,
    GPU_STATES,
    Instrument,
    MetricDef,
    Scope,
    Shape,
    rows_by_name,
)
from gpuwarden.agent.model import GpuSample, ProcessSample, Snapshot

Attributes = Mapping[str, str | int]
Point = tuple[float, Attributes]


class SampleCache:
    """Holds the latest snapshot; replaced whole, so readers never see a half-written round."""

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._lock = threading.Lock()

    def put(self, snapshot: Snapshot) -> None:
        """Publish a new sample round."""
        with self._lock:
            self._snapshot = snapshot

    def get(self) -> Snapshot | None:
        """The latest sample round, or ``None`` before the first one."""
        with self._lock:
            return self._snapshot


def gpu_attributes(gpu: GpuSample) -> dict[str, str | int]:
    """The one attribute every GPU point carries: its identity (the rest is on the info metric)."""
    return {"hw.id": gpu.uuid}


def info_attributes(gpu: GpuSample) -> dict[str, str | int]:
    """The descriptive attributes of ``gpuwarden.gpu.info``: join on ``hw.id`` to use them."""
    attrs: dict[str, str | int] = {
        "hw.id": gpu.uuid,
        "hw.model": gpu.name,
        "hw.vendor": "NVIDIA",
        "gpuwarden.gpu.index": gpu.index,
    }
    if gpu.pci_bus_id is not None:
        attrs["gpuwarden.gpu.pci_bus_id"] = gpu.pci_bus_id
    if gpu.parent_uuid is not None:
        attrs["hw.parent"] = gpu.parent_uuid
    if gpu.mig_profile is not None:
        attrs["gpuwarden.gpu.mig_profile"] = gpu.mig_profile
    return attrs


def process_attributes(gpu: GpuSample, proc: ProcessSample) -> dict[str, str | int]:
    """Per-process points carry the GPU, the pid and the job: never the GPU metrics themselves."""
    attrs: dict[str, str | int] = {"hw.id": gpu.uuid, "process.pid": proc.pid}
    job = proc.job
    if job is not None:
        attrs["gpuwarden.job.scheduler"] = job.scheduler
        if job.job_id is not None:
            attrs["gpuwarden.job.id"] = job.job_id
        if job.pod_uid is not None:
            attrs["k8s.pod.uid"] = job.pod_uid
        if job.container_id is not None:
            attrs["container.id"] = job.container_id
    return attrs


def _expand(row: MetricDef, value: Any, base: Mapping[str, str | int]) -> Iterator[Point]:
    """Turn one field value into data points according to the row's shape."""
    if value is None:
        return
    fixed = {**base, **row.attributes}
    if row.shape is Shape.INFO:
        yield 1.0, fixed
    elif row.shape is Shape.SCALAR:
        yield float(value), fixed
    elif row.shape is Shape.MAPPING:
        for key, item in value.items():
            parts = key if isinstance(key, tuple) else (key,)
            attrs = dict(fixed)
            for attr_name, part in zip(row.keys, parts, strict=True):
                attrs[attr_name] = part if isinstance(part, str) else str(part)
            yield float(item), attrs
    elif row.shape is Shape.ONE_HOT:
        current = str(value)
        for state in GPU_STATES:
            yield (1.0 if state == current else 0.0), {**fixed, row.keys[0]: state}
    else:  # Shape.BITMASK
        for reason, bit in CLOCK_EVENT_REASONS.items():
            yield (1.0 if value & bit else 0.0), {**fixed, row.keys[0]: reason}


class _Prepared:
    """A snapshot with its GPU and process attribute sets built once, shared by all callbacks."""

    __slots__ = ("gpus", "infos", "procs", "snapshot")

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.gpus = [(gpu, gpu_attributes(gpu)) for gpu in snapshot.gpus]
        self.infos = [(gpu, info_attributes(gpu)) for gpu in snapshot.gpus]
        self.procs = [
            (proc, process_attributes(gpu, proc)) for gpu in snapshot.gpus for proc in gpu.processes
        ]


def _points(row: MetricDef, prepared: _Prepared) -> Iterator[Point]:
    if row.scope is Scope.GPU:
        for gpu, attrs in prepared.infos if row.shape is Shape.INFO else prepared.gpus:
            yield from _expand(row, getattr(gpu, row.field), attrs)
    elif row.scope is Scope.PROCESS:
        for proc, attrs in prepared.procs:
            yield from _expand(row, getattr(proc, row.field), attrs)
    elif row.scope is Scope.HOST:
        if prepared.snapshot.host is not None:
            yield from _expand(row, getattr(prepared.snapshot.host, row.field), {})
    elif prepared.snapshot.agent is not None:
        yield from _expand(row, getattr(prepared.snapshot.agent, row.field), {})


def points(row: MetricDef, snapshot: Snapshot) -> Iterator[Point]:
    """Every data point one catalog row yields for one snapshot."""
    return _points(row, _Prepared(snapshot))


class _PreparedCache:
    """Prepares each new snapshot once, however many instruments and readers read it."""

    def __init__(self, cache: SampleCache) -> None:
        self._cache = cache
        self._prepared: _Prepared | None = None
        self._lock = threading.Lock()

    def get(self) -> _Prepared | None:
        snapshot = self._cache.get()
        if snapshot is None:
            return None
        with self._lock:
            if self._prepared is None or self._prepared.snapshot is not snapshot:
                self._prepared = _Prepared(snapshot)
            return self._prepared


def _callback(
    rows: tuple[MetricDef, ...], prepared: _PreparedCache
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        current = prepared.get()
        if current is None:
            return []
        return [Observation(value, attrs) for row in rows for value, attrs in _points(row, current)]

    return observe


def register_instruments(meter: Meter, cache: SampleCache) -> list[str]:
    """Create one observable instrument per catalog metric name; return the names."""
    created = []
    prepared = _PreparedCache(cache)
    for name, rows in rows_by_name().items():
        first = rows[0]
        factory = {
            Instrument.GAUGE: meter.create_observable_gauge,
            Instrument.COUNTER: meter.create_observable_counter,
            Instrument.UPDOWNCOUNTER: meter.create_observable_up_down_counter,
        }[first.instrument]
        factory(
            name,
            callbacks=[_callback(rows, prepared)],
            unit=first.unit,
            description=first.description,
        )
        created.append(name)
    return created


class Telemetry:
    """A meter provider whose instruments read ``cache``, plus an on-demand OTLP encoder.

    ``collect_otlp()`` is called by the agent right after each sample round; extra readers (the
    Prometheus pull reader) collect on their own schedule from the same cache.
    """

    def __init__(
        self,
        cache: SampleCache,
        resource_attributes: Mapping[str, str],
        *,
        version: str,
        extra_readers: Iterable[MetricReader] = (),
    ) -> None:
        self._reader = InMemoryMetricReader()
        self._provider = MeterProvider(
            metric_readers=[self._reader, *extra_readers],
            resource=Resource.create(dict(resource_attributes)),
            # observations of a cache carry no trace context: exemplars would be pure cost
            exemplar_filter=AlwaysOffExemplarFilter(),
        )
        meter = self._provider.get_meter("gpuwarden.agent", version)
        self.instrument_names = register_instruments(meter, cache)

    def collect_otlp(self) -> bytes | None:
        """Collect every instrument now and encode an OTLP ``ExportMetricsServiceRequest``."""
        data = self._reader.get_metrics_data()
        if data is None:
            return None
        return encode_metrics(data).SerializeToString()

    def shutdown(self) -> None:
        """Shut the provider down (its readers included)."""
        self._provider.shutdown()


__all__ = ["CATALOG", "SampleCache", "Telemetry", "points", "register_instruments"]
