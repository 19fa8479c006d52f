"""A simulated GPU node: the fake behind the GpuSource protocol for tests and the demo.

Every reading is a pure function of the scenario, the seed, the source's start time and the time
asked about, so two sources built alike report the same samples whatever their sampling history.
Time is cut into whole-second buckets of the clock (Unix seconds): within a bucket every gauge is
constant, noise is a hash of ``(seed, node, GPU, bucket)``, and counters (energy, NVLink bytes)
are exact integrals of those piecewise-constant rates, so an energy delta is ``power_watts * dt``.

The inference daily curve follows the clock's UTC hour of day; fault times count from the source's
start (the clock reading at construction). A lost GPU keeps its identity, status FAILED and the
XID counts the agent had seen; every reading is None.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.agent.model import GpuEvent, GpuSample, GpuStatus, JobRef, ProcessSample
from gpuwarden.agent.sources.scenario import (
    XIDS_OF_CONCERN,
    Assignment,
    EccFault,
    Fault,
    Idle,
    IdleAllocated,
    Inference,
    InputBound,
    LostFault,
    Scenario,
    Training,
    Workload,
    XidFault,
    ecc,
    lost,
    scenario_from_mapping,
    xid,
)

__all__ = ["PRESETS", "Scenario", "SimulatedSource", "scenario_from_mapping"]

_MASK64 = (1 << 64) - 1
_SECONDS_PER_DAY = 86400
_PCIE_IDLE_BYTES_PER_SECOND = 2.0e4
_CLOCK_EVENT_GPU_IDLE = 0x1  # nvmlClocksEventReasonGpuIdle
_CLOCK_EVENT_SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap


@dataclass(frozen=True, slots=True)
class _Profile:
    """How a workload kind turns utilisation into power and traffic (values at full load)."""

    idle_power_ratio: float  # of the model's idle power; a CUDA context keeps clocks up
    power_ratio: float  # of TDP
    memory_bandwidth_ratio: float
    pcie_rx_bytes_per_second: float
    pcie_tx_bytes_per_second: float
    nvlink_ratio: float  # of the model's NVLink bandwidth (all-reduce traffic)


_PROFILES: Mapping[type[Workload], _Profile] = {
    Idle: _Profile(1.0, 0.0, 0.0, 0.0, 0.0, 0.0),
    IdleAllocated: _Profile(1.12, 0.0, 0.0, 0.0, 0.0, 0.0),
    Training: _Profile(1.0, 0.9, 0.55, 1.2e9, 0.4e9, 0.35),
    Inference: _Profile(1.0, 0.75, 0.35, 0.5e9, 0.2e9, 0.0),
    InputBound: _Profile(1.0, 0.85, 0.45, 3.0e9, 0.1e9, 0.0),
}


def _mix(value: int) -> int:
    """SplitMix64 finaliser: a cheap, well-spread, platform-independent integer hash."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _unit(key: int, channel: int, bucket: int) -> float:
    """A uniform number in [0, 1) for one GPU (``key``), noise channel and second."""
    return (_mix(_mix(key ^ channel) ^ (bucket & _MASK64)) >> 11) / float(1 << 53)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class _Level:
    """The gauges of one GPU during one second."""

    utilization_ratio: float
    memory_utilization_ratio: float
    power_watts: float
    pcie_rx_bytes_per_second: float
    pcie_tx_bytes_per_second: float
    nvlink_bytes_per_second: float


@dataclass(slots=True)
class _Gpu:
    index: int
    uuid: str
    pci_bus_id: str
    pid: int
    key: int
    workload: Workload
    profile: _Profile
    phase_seconds: int
    xids: tuple[XidFault, ...]
    eccs: tuple[EccFault, ...]
    lost_at_seconds: float | None
    # Integrals up to ``boundary_seconds`` (the start or a whole second).
    boundary_seconds: float
    energy_joules: float = 0.0
    nvlink_bytes: float = 0.0


class SimulatedSource:
    """A :class:`~agent.model.GpuSource` that plays a :class:`Scenario`.

    Args:
        scenario: the node to simulate.
        clock: returns Unix seconds; read once at construction (the scenario's time 0).
        seed: selects the noise; the same seed and times give the same samples.

    """

    def __init__(self, scenario: Scenario, *, clock: Callable[[], float], seed: int = 0) -> None:
        self._scenario = scenario
        self._clock = clock
        self._start_seconds = clock()
        self._xid_faults = sorted(
            (fault for fault in scenario.faults if isinstance(fault, XidFault)),
            key=lambda fault: fault.at_seconds,
        )
        self._reported_xids = 0
        node_hash = int(_digest(scenario.node_name)[:15], 16)
        self._gpus = [self._gpu(index, node_hash, seed) for index in range(scenario.gpu_count)]

    def _gpu(self, index: int, node_hash: int, seed: int) -> _Gpu:
        scenario = self._scenario
        digest = _digest(f"{scenario.node_name}/{index}")
        workload = scenario.workload(index)
        key = _mix(_mix((seed ^ node_hash) & _MASK64) + index)
        period = workload.period_seconds if isinstance(workload, InputBound) else 1.0
        lost = [
            f.at_seconds for f in scenario.faults if isinstance(f, LostFault) and f.gpu == index
        ]
        return _Gpu(
            index=index,
            uuid=f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}",
            pci_bus_id=f"{index // 8:08X}:{0x18 + 0x10 * (index % 8):02X}:00.0",
            pid=2000 + (node_hash % 50_000) * 64 + index,  # unique per node: index < 64
            key=key,
            workload=workload,
            profile=_PROFILES[type(workload)],
            phase_seconds=math.floor(_unit(key, 9, 0) * period),
            xids=tuple(fault for fault in self._xid_faults if fault.gpu == index),
            eccs=tuple(f for f in scenario.faults if isinstance(f, EccFault) and f.gpu == index),
            lost_at_seconds=min(lost, default=None),
            boundary_seconds=self._start_seconds,
        )

    def sample(self) -> list[GpuSample]:
        """One sample of every GPU at the clock's current time."""
        now = self._clock()
        return [self._sample(gpu, now) for gpu in self._gpus]

    def events(self) -> list[GpuEvent]:
        """XID events that fired since the previous call, oldest first."""
        elapsed = self._clock() - self._start_seconds
        events = []
        while self._reported_xids < len(self._xid_faults):
            fault = self._xid_faults[self._reported_xids]
            if fault.at_seconds > elapsed:
                break
            time_unix_nano = round((self._start_seconds + fault.at_seconds) * 1e9)
            events.append(GpuEvent(self._gpus[fault.gpu].uuid, fault.xid, time_unix_nano))
            self._reported_xids += 1
        return events

    def jobs(self) -> Mapping[int, JobRef]:
        """The job of each simulated process, by pid (idle GPUs have no process)."""
        return {
            gpu.pid: gpu.workload.job
            for gpu in self._gpus
            if gpu.workload.job is not None and not isinstance(gpu.workload, Idle)
        }

    def reassign(self, index: int, workload: Workload) -> None:
        """Run ``workload`` on GPU ``index`` from now on (the demo's scheduler frees GPUs).

        Counters stay exact integrals: the whole seconds before the switch are summed with the
        old workload first. After a reassignment, samples depend on when it happened, so the
        "pure function of the time" property holds only between reassignments.
        """
        gpu = self._gpus[index]
        self._integrate(gpu, self._clock())
        gpu.workload = workload
        gpu.profile = _PROFILES[type(workload)]

    def close(self) -> None:
        """Nothing to release."""

    def _level(self, gpu: _Gpu, bucket: int) -> _Level:
        workload, profile, model = gpu.workload, gpu.profile, self._scenario.model
        jitter = workload.noise_ratio * (2.0 * _unit(gpu.key, 0, bucket) - 1.0)
        match workload:
            case Training():
                utilization = workload.utilization_ratio + jitter
            case Inference():
                hour = (bucket % _SECONDS_PER_DAY) / 3600.0
                wave = 0.5 + 0.5 * math.cos(2.0 * math.pi * (hour - workload.peak_hour_utc) / 24.0)
                low, high = workload.trough_utilization_ratio, workload.peak_utilization_ratio
                utilization = low + (high - low) * wave + jitter
            case InputBound():
                phase = (bucket + gpu.phase_seconds) % workload.period_seconds
                busy = phase < workload.duty_ratio * workload.period_seconds
                utilization = 1.0 - abs(jitter) if busy else 0.0
            case _:
                utilization = 0.0
        utilization = min(1.0, max(0.0, utilization))
        idle_noise = 1.0 + workload.noise_ratio * (2.0 * _unit(gpu.key, 1, bucket) - 1.0)
        idle_watts = model.idle_power_watts * profile.idle_power_ratio * idle_noise
        busy_watts = max(0.0, model.tdp_watts * profile.power_ratio - idle_watts)
        nvlink = (model.nvlink_bytes_per_second or 0.0) * profile.nvlink_ratio * utilization
        return _Level(
            utilization_ratio=utilization,
            memory_utilization_ratio=profile.memory_bandwidth_ratio * utilization,
            # NVML reports milliwatts; the integral below uses the same rounded value.
            power_watts=round(min(model.tdp_watts, idle_watts + busy_watts * utilization), 3),
            pcie_rx_bytes_per_second=_PCIE_IDLE_BYTES_PER_SECOND
            + profile.pcie_rx_bytes_per_second * utilization,
            pcie_tx_bytes_per_second=_PCIE_IDLE_BYTES_PER_SECOND
            + profile.pcie_tx_bytes_per_second * utilization,
            nvlink_bytes_per_second=nvlink,
        )

    def _integrate(self, gpu: _Gpu, now: float) -> tuple[_Level, float, float]:
        """The level at ``now`` and the energy and NVLink integrals from the start to ``now``.

        Whole seconds are summed once and kept, in the same order whatever the query history;
        the part of the current second is added on top and not kept.
        """
        if now < gpu.boundary_seconds:  # the clock went back: start over
            gpu.boundary_seconds, gpu.energy_joules, gpu.nvlink_bytes = self._start_seconds, 0, 0
        bucket = math.floor(gpu.boundary_seconds)
        while bucket + 1 <= now:
            level = self._level(gpu, bucket)
            seconds = bucket + 1 - gpu.boundary_seconds
            gpu.energy_joules += level.power_watts * seconds
            gpu.nvlink_bytes += level.nvlink_bytes_per_second * seconds
            bucket += 1
            gpu.boundary_seconds = float(bucket)
        level = self._level(gpu, bucket)
        partial = max(0.0, now - gpu.boundary_seconds)
        return (
            level,
            gpu.energy_joules + level.power_watts * partial,
            gpu.nvlink_bytes + level.nvlink_bytes_per_second * partial,
        )

    def _sample(self, gpu: _Gpu, now: float) -> GpuSample:
        model, workload = self._scenario.model, gpu.workload
        elapsed = now - self._start_seconds
        fired = [fault.xid for fault in gpu.xids if fault.at_seconds <= elapsed]
        xid_counts, last_xid = dict(Counter(fired)), (fired[-1] if fired else None)
        if gpu.lost_at_seconds is not None and elapsed >= gpu.lost_at_seconds:
            return GpuSample(
                uuid=gpu.uuid,
                index=gpu.index,
                name=model.name,
                status=GpuStatus.FAILED,
                pci_bus_id=gpu.pci_bus_id,
                xid_counts=xid_counts,
                last_xid=last_xid,
            )
        level, energy_joules, nvlink_bytes = self._integrate(gpu, now)
        utilization = level.utilization_ratio
        memory_used = int(model.memory_total_bytes * workload.memory_used_ratio)
        eccs = [fault for fault in gpu.eccs if fault.at_seconds <= elapsed]
        uncorrected = sum(fault.uncorrected for fault in eccs)
        load = level.power_watts / model.tdp_watts
        has_nvlink = model.nvlink_bytes_per_second is not None
        processes: tuple[ProcessSample, ...] = ()
        if not isinstance(workload, Idle):
            processes = (
                ProcessSample(
                    pid=gpu.pid,
                    gpu_memory_bytes=memory_used,
                    sm_utilization_ratio=utilization,
                    memory_utilization_ratio=level.memory_utilization_ratio,
                ),
            )
        clock_events = _CLOCK_EVENT_GPU_IDLE if utilization == 0.0 else 0
        if load >= 0.95:
            clock_events |= _CLOCK_EVENT_SW_POWER_CAP
        return GpuSample(
            uuid=gpu.uuid,
            index=gpu.index,
            name=model.name,
            status=GpuStatus.DEGRADED if XIDS_OF_CONCERN.intersection(fired) else GpuStatus.OK,
            pci_bus_id=gpu.pci_bus_id,
            utilization_ratio=utilization,
            memory_utilization_ratio=level.memory_utilization_ratio,
            memory_used_bytes=memory_used,
            memory_total_bytes=model.memory_total_bytes,
            memory_reserved_bytes=model.memory_reserved_bytes,
            power_watts=level.power_watts,
            power_instant_watts=level.power_watts,
            energy_joules=energy_joules,
            temperature_celsius=float(round(30.0 + 50.0 * load)),
            memory_temperature_celsius=float(round(34.0 + 44.0 * load)),
            sm_clock_hertz=(
                model.idle_sm_clock_hertz if utilization == 0.0 else model.max_sm_clock_hertz
            ),
            memory_clock_hertz=model.memory_clock_hertz,
            clock_event_reasons=clock_events,
            pcie_tx_bytes_per_second=level.pcie_tx_bytes_per_second,
            pcie_rx_bytes_per_second=level.pcie_rx_bytes_per_second,
            pcie_link_generation=model.pcie_link_generation,
            pcie_link_width=model.pcie_link_width,
            nvlink_tx_bytes=int(nvlink_bytes) if has_nvlink else None,
            nvlink_rx_bytes=int(nvlink_bytes) if has_nvlink else None,
            ecc_corrected_errors=sum(fault.corrected for fault in eccs),
            ecc_uncorrected_errors=uncorrected,
            remapped_rows_corrected=0,
            remapped_rows_uncorrected=uncorrected,
            remapped_rows_pending=1 if uncorrected else 0,
            remapped_rows_failure=0,
            xid_counts=xid_counts,
            last_xid=last_xid,
            processes=processes,
        )


def _slurm(job_id: str) -> JobRef:
    return JobRef(scheduler="slurm", job_id=job_id)


def _pod(gpu: int) -> JobRef:
    return JobRef(scheduler="kubernetes", pod_uid=f"5f0c1e2a-0000-4000-8000-{gpu:012d}")


_ALL = tuple(range(8))
_PRESET_PARTS: tuple[tuple[str, tuple[Assignment, ...], tuple[Fault, ...]], ...] = (
    ("idle", (), ()),
    ("training", (Assignment(_ALL, Training(job=_slurm("1001"))),), ()),
    ("inference", tuple(Assignment((gpu,), Inference(job=_pod(gpu))) for gpu in _ALL), ()),
    ("input-bound", (Assignment(_ALL, InputBound(job=_slurm("1002"))),), ()),
    (
        "faults",
        (Assignment(_ALL, Training(job=_slurm("1003"))),),
        (
            xid(0, 13, 30),  # graphics engine exception: counted, status stays OK
            ecc(2, uncorrected=1, at_seconds=45),
            xid(2, 48, 45),  # the double-bit ECC error that goes with it
            xid(5, 79, 90),  # fallen off the bus ...
            lost(5, 95),  # ... and gone
        ),
    ),
    (
        "mixed",
        (
            Assignment((0, 1), Training(job=_slurm("2001"))),
            Assignment((2, 3), Inference(job=_slurm("2002"))),
            Assignment((4, 5), InputBound(job=_slurm("2003"))),
            Assignment((6,), IdleAllocated(job=_slurm("2004"))),
        ),
        (xid(1, 79, 120), lost(1, 300)),
    ),
)
#: Named 8-GPU H100 scenarios for the demo and tests ("mixed" runs every workload kind).
PRESETS: Mapping[str, Scenario] = {
    name: Scenario(node_name=f"sim-{name}", gpu_count=8, assignments=parts, faults=faults)
    for name, parts, faults in _PRESET_PARTS
}


def load_scenario(name_or_path: str, *, node_name: str) -> Scenario:
    """A preset by name, or a scenario YAML file; either way reported as ``node_name``.

    Raises:
        ValueError: unknown preset and no such file, or an invalid scenario (naming the key).
    """
    if name_or_path in PRESETS:
        return dataclasses.replace(PRESETS[name_or_path], node_name=node_name)
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"scenario {name_or_path!r}: not a preset ({', '.join(sorted(PRESETS))}) "
            "and no such file"
        )
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    data.setdefault("node_name", node_name)
    try:
        return scenario_from_mapping(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
