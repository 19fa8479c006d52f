"""The data points of a snapshot, row by row of the catalog: what every exporter sends.

One source of truth for the OTLP push encoder (``agent.otlp``) and the OpenTelemetry SDK's
instruments (``agent.telemetry``, for the Prometheus pull): both read their points here, so
they cannot disagree on a value or an attribute. No OpenTelemetry import: the push path runs
without the SDK's metrics machinery.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from gpuwarden.agent.catalog import (
    CLOCK_EVENT_REASONS,
    GPU_STATES,
    MetricDef,
    Scope,
    Shape,
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


class Prepared:
    """A snapshot with its GPU and process attribute sets built once, shared by all callbacks."""

    __slots__ = ("gpus", "infos", "procs", "snapshot")

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.gpus = [(gpu, gpu_attributes(gpu)) for gpu in snapshot.gpus]
        self.infos = [(gpu, info_attributes(gpu)) for gpu in snapshot.gpus]
        self.procs = [
            (proc, process_attributes(gpu, proc)) for gpu in snapshot.gpus for proc in gpu.processes
        ]


def prepared_points(row: MetricDef, prepared: Prepared) -> Iterator[Point]:
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
    return prepared_points(row, Prepared(snapshot))
