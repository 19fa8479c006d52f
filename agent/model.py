"""Typed, frozen samples that every source produces and every exporter reads.

Units are in the field names and follow OpenTelemetry (bytes, watts, joules, hertz, celsius,
ratios in 0..1). ``None`` means "not available on this device or not supported": never 0.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


class GpuStatus(enum.StrEnum):
    """OpenTelemetry ``hw.state`` values used for GPUs."""

    OK = "ok"
    DEGRADED = "degraded"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class JobRef:
    """The job that owns a process, as far as the node can tell.

    ``scheduler`` is ``"slurm"`` or ``"kubernetes"``. For Slurm ``job_id`` is the job id (the
    array or het-job id as Slurm prints it in the cgroup path); for Kubernetes ``pod_uid`` is set
    and ``container_id`` when the cgroup names one. ``source`` says how we learned it
    (``"cgroup"`` or ``"environ"``).
    """

    scheduler: str
    job_id: str | None = None
    pod_uid: str | None = None
    container_id: str | None = None
    source: str = "cgroup"


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process that holds a GPU context."""

    pid: int
    gpu_memory_bytes: int | None = None
    sm_utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    job: JobRef | None = None


class GpuEventKind(enum.StrEnum):
    """What happened to a GPU."""

    XID = "xid"  # the driver reported an XID error (``xid`` holds its code)
    GPU_LOST = "gpu_lost"  # the GPU stopped answering NVML (no XID code of its own)


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """One event on one GPU: a driver-reported XID, or the agent noticing a lost GPU."""

    gpu_uuid: str
    xid: int | None
    time_unix_nano: int
    kind: GpuEventKind = GpuEventKind.XID


@dataclass(frozen=True, slots=True)
class GpuSample:
    """Everything one sample round learned about one GPU or MIG device.

    Counters (``energy_joules``, ``nvlink_*_bytes``, ``ecc_*``, ``xid_counts``) are cumulative as
    the device reports them; the exporter passes them on as OpenTelemetry cumulative sums.
    """

    uuid: str
    index: int
    name: str
    status: GpuStatus = GpuStatus.OK
    pci_bus_id: str | None = None
    parent_uuid: str | None = None
    mig_profile: str | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    power_watts: float | None = None
    power_instant_watts: float | None = None
    energy_joules: float | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    clock_event_reasons: int | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_link_generation: int | None = None
    pcie_link_width: int | None = None
    nvlink_tx_bytes: int | None = None
    nvlink_rx_bytes: int | None = None
    ecc_corrected_errors: int | None = None
    ecc_uncorrected_errors: int | None = None
    remapped_rows_corrected: int | None = None
    remapped_rows_uncorrected: int | None = None
    remapped_rows_pending: int | None = None
    remapped_rows_failure: int | None = None
    xid_counts: Mapping[int, int] = field(default_factory=dict)
    last_xid: int | None = None
    processes: tuple[ProcessSample, ...] = ()


@dataclass(frozen=True, slots=True)
class HostSample:
    """Host-level counters and gauges read from ``/proc`` and powercap (RAPL).

    Mapping keys are the attribute values: ``cpu_time_seconds`` by CPU mode (``user``,
    ``system``, ``idle``, ``iowait``, ...), ``memory_bytes`` by state (``used``, ``free``,
    ``cached``, ``buffers``), ``disk_io_bytes`` by ``(device, direction)``, ``network_io_bytes``
    by ``(interface, direction)``, ``cpu_energy_joules`` by RAPL zone name (``package-0``).
    """

    cpu_time_seconds: Mapping[str, float] = field(default_factory=dict)
    cpu_count: int | None = None
    memory_bytes: Mapping[str, int] = field(default_factory=dict)
    memory_limit_bytes: int | None = None
    disk_io_bytes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    network_io_bytes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    cpu_energy_joules: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AgentStats:
    """The agent's own health, exported beside the telemetry."""

    sample_rounds: int = 0
    last_sample_seconds: float | None = None
    spool_bytes: int = 0
    spool_evicted: int = 0
    export_rejected: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The result of one sample round: what the cache holds and the exporter reads."""

    time_unix_nano: int
    gpus: tuple[GpuSample, ...]
    host: HostSample | None = None
    events: tuple[GpuEvent, ...] = ()
    agent: AgentStats | None = None


class GpuSource(Protocol):
    """Anything that can report the GPUs of one node."""

    def sample(self) -> list[GpuSample]:
        """Return one sample of every GPU (and MIG device) on the node."""
        ...

    def close(self) -> None:
        """Release the underlying library or file handles."""
        ...
