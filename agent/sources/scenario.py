"""Scenarios for :class:`~agent.sources.simulated.SimulatedSource`: a node, its GPUs, their work.

A :class:`Scenario` is frozen data: the node name, the GPU model, which workload runs on which GPU
(and on behalf of which job), and faults that fire at a time counted from the source's start.
Unassigned GPUs are idle. :func:`scenario_from_mapping` builds one from parsed YAML or JSON::

    node_name: gpu-node-07
    gpu_count: 4
    model: h100              # a GPU_MODELS key, or a mapping of GpuModel fields
    assignments:
      - {gpus: [0, 1], kind: training, job: {scheduler: slurm, job_id: "4242"}}
      - {gpus: [2], kind: inference, peak_hour_utc: 15}
    faults:
      - {kind: xid, gpu: 1, xid: 79, at_seconds: 120}
      - {kind: ecc, gpu: 2, uncorrected: 1, at_seconds: 60}
      - {kind: lost, gpu: 1, at_seconds: 300}
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

from gpuwarden.agent.model import JobRef

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_D = TypeVar("_D", bound="DataclassInstance")
_V = TypeVar("_V")

#: XID codes that mark a GPU DEGRADED (ECC, row remapping, NVLink, fell off the bus, contained
#: and uncontained memory errors).
XIDS_OF_CONCERN = frozenset({48, 63, 64, 74, 79, 92, 94, 95})

_MIB = 1 << 20
_GIB = 1 << 30
MAX_GPUS = 64


class WorkloadKind(enum.StrEnum):
    """What keeps a simulated GPU busy (or not)."""

    IDLE = "idle"
    TRAINING = "training"
    INFERENCE = "inference"
    INPUT_BOUND = "input_bound"
    IDLE_ALLOCATED = "idle_allocated"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuModel:
    """Static properties of a GPU model; ``nvlink_bytes_per_second`` is None without NVLink."""

    name: str
    memory_total_bytes: int
    memory_reserved_bytes: int
    tdp_watts: float
    idle_power_watts: float
    max_sm_clock_hertz: float
    idle_sm_clock_hertz: float
    memory_clock_hertz: float
    pcie_link_generation: int
    pcie_link_width: int
    nvlink_bytes_per_second: float | None = None


H100_SXM = GpuModel(
    name="NVIDIA H100 80GB HBM3",
    memory_total_bytes=80 * _GIB,
    memory_reserved_bytes=529 * _MIB,
    tdp_watts=700.0,
    idle_power_watts=65.0,
    max_sm_clock_hertz=1.98e9,
    idle_sm_clock_hertz=3.45e8,
    memory_clock_hertz=2.619e9,
    pcie_link_generation=5,
    pcie_link_width=16,
    nvlink_bytes_per_second=450e9,
)
L4 = GpuModel(
    name="NVIDIA L4",
    memory_total_bytes=24 * _GIB,
    memory_reserved_bytes=420 * _MIB,
    tdp_watts=72.0,
    idle_power_watts=16.0,
    max_sm_clock_hertz=2.04e9,
    idle_sm_clock_hertz=2.1e8,
    memory_clock_hertz=6.251e9,
    pcie_link_generation=4,
    pcie_link_width=16,
)
GPU_MODELS: Mapping[str, GpuModel] = {"h100": H100_SXM, "l4": L4}


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """Common to every workload; ``noise_ratio`` is the amplitude of per-second noise."""

    kind: ClassVar[WorkloadKind]
    job: JobRef | None = None
    noise_ratio: float = 0.03
    memory_used_ratio: float = 0.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name.endswith("_ratio") and not 0.0 <= value <= 1.0:
                raise ValueError(f"{field.name}: must be in 0..1, got {value}")
            if field.name.endswith("_seconds") and not value > 0.0:
                raise ValueError(f"{field.name}: must be positive, got {value}")
        if self.noise_ratio > 0.5:
            raise ValueError(f"noise_ratio: must be in 0..0.5, got {self.noise_ratio}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Idle(Workload):
    """No process: utilisation 0, memory 0, idle power."""

    kind: ClassVar[WorkloadKind] = WorkloadKind.IDLE


@dataclass(frozen=True, slots=True, kw_only=True)
class Training(Workload):
    """Steady data-parallel training: SMs busy, high power, NVLink all-reduce traffic."""

    kind: ClassVar[WorkloadKind] = WorkloadKind.TRAINING
    utilization_ratio: float = 0.95
    memory_used_ratio: float = 0.92


@dataclass(frozen=True, slots=True, kw_only=True)
class Inference(Workload):
    """Serving with a daily load curve: a 24 h sinusoid peaking at ``peak_hour_utc``."""

    kind: ClassVar[WorkloadKind] = WorkloadKind.INFERENCE
    peak_hour_utc: float = 14.0
    peak_utilization_ratio: float = 0.85
    trough_utilization_ratio: float = 0.1
    memory_used_ratio: float = 0.6
    noise_ratio: float = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class InputBound(Workload):
    """Starved by its data loader: compute bursts for ``duty_ratio`` of every period, then waits."""

    kind: ClassVar[WorkloadKind] = WorkloadKind.INPUT_BOUND
    duty_ratio: float = 0.3
    period_seconds: float = 40.0
    memory_used_ratio: float = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleAllocated(Workload):
    """A job holds the GPU and its memory but runs nothing on it."""

    kind: ClassVar[WorkloadKind] = WorkloadKind.IDLE_ALLOCATED
    memory_used_ratio: float = 0.7


WORKLOADS: Mapping[str, type[Workload]] = {
    cls.kind.value: cls for cls in (Idle, Training, Inference, InputBound, IdleAllocated)
}


@dataclass(frozen=True, slots=True, kw_only=True)
class XidFault:
    """The driver reports XID ``xid`` on GPU ``gpu`` at ``at_seconds`` after the start."""

    gpu: int
    xid: int
    at_seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class LostFault:
    """GPU ``gpu`` stops answering (FAILED, no readings) from ``at_seconds`` after the start."""

    gpu: int
    at_seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class EccFault:
    """GPU ``gpu`` counts ECC errors from ``at_seconds`` after the start."""

    gpu: int
    at_seconds: float
    uncorrected: int = 0
    corrected: int = 0


Fault = XidFault | LostFault | EccFault
FAULTS: Mapping[str, type[Fault]] = {"xid": XidFault, "lost": LostFault, "ecc": EccFault}


def xid(gpu: int, xid: int, at_seconds: float) -> XidFault:
    """An XID fault."""
    return XidFault(gpu=gpu, xid=xid, at_seconds=at_seconds)


def lost(gpu: int, at_seconds: float) -> LostFault:
    """A GPU lost (fallen off the bus)."""
    return LostFault(gpu=gpu, at_seconds=at_seconds)


def ecc(gpu: int, *, uncorrected: int = 0, corrected: int = 0, at_seconds: float) -> EccFault:
    """ECC errors."""
    return EccFault(gpu=gpu, at_seconds=at_seconds, uncorrected=uncorrected, corrected=corrected)


@dataclass(frozen=True, slots=True)
class Assignment:
    """One workload on one or more GPUs (by index)."""

    gpus: tuple[int, ...]
    workload: Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A simulated node. GPUs without an assignment are idle."""

    node_name: str
    gpu_count: int
    model: GpuModel = H100_SXM
    assignments: tuple[Assignment, ...] = ()
    faults: tuple[Fault, ...] = ()

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("node_name: must not be empty")
        if not 1 <= self.gpu_count <= MAX_GPUS:
            raise ValueError(f"gpu_count: must be in 1..{MAX_GPUS}, got {self.gpu_count}")
        assigned = [gpu for assignment in self.assignments for gpu in assignment.gpus]
        for what, gpus in (("assignments", assigned), ("faults", [f.gpu for f in self.faults])):
            bad = sorted({gpu for gpu in gpus if not 0 <= gpu < self.gpu_count})
            if bad:
                raise ValueError(f"{what}: GPU index {bad[0]} not in 0..{self.gpu_count - 1}")
        if len(assigned) != len(set(assigned)):
            raise ValueError("assignments: a GPU is assigned more than one workload")
        if any(fault.at_seconds < 0 for fault in self.faults):
            raise ValueError("faults: at_seconds must not be negative")

    def workload(self, gpu: int) -> Workload:
        """The workload running on GPU ``gpu``."""
        for assignment in self.assignments:
            if gpu in assignment.gpus:
                return assignment.workload
        return Idle()


# --- parsing ---------------------------------------------------------------------------------


def _mapping(value: object, path: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"{path}: expected a mapping with string keys, got {value!r}")
    return value


def _list(value: object, path: str) -> list[object]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"{path}: expected a list, got {value!r}")
    return list(value)


def _int(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{path}: expected an integer, got {value!r}")
    return value


def _float(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{path}: expected a number, got {value!r}")
    return float(value)


def _str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{path}: expected a string, got {value!r}")
    return value


def _choice(value: object, choices: Mapping[str, _V], path: str) -> _V:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{path}: expected one of {', '.join(choices)}, got {value!r}")
    return choices[value]


def _model(value: object, path: str) -> GpuModel:
    if isinstance(value, str):
        return _choice(value, GPU_MODELS, path)
    return _build(GpuModel, _mapping(value, path), path)


def _assignments(value: object, path: str) -> tuple[Assignment, ...]:
    assignments = []
    for i, item in enumerate(_list(value, path)):
        data, where = _mapping(item, f"{path}[{i}]"), f"{path}[{i}]"
        cls = _choice(data.get("kind"), WORKLOADS, f"{where}.kind")
        workload = _build(cls, data, where, skip=("kind", "gpus"))
        gpus = data.get("gpus")
        gpu_list = [gpus] if isinstance(gpus, int) else _list(gpus, f"{where}.gpus")
        indices = tuple(_int(gpu, f"{where}.gpus[{j}]") for j, gpu in enumerate(gpu_list))
        assignments.append(Assignment(indices, workload))
    return tuple(assignments)


def _faults(value: object, path: str) -> tuple[Fault, ...]:
    faults = []
    for i, item in enumerate(_list(value, path)):
        data, where = _mapping(item, f"{path}[{i}]"), f"{path}[{i}]"
        cls = _choice(data.get("kind"), FAULTS, f"{where}.kind")
        faults.append(_build(cls, data, where, skip=("kind",)))
    return tuple(faults)


def _optional(parse: Callable[[object, str], object]) -> Callable[[object, str], object]:
    return lambda value, path: None if value is None else parse(value, path)


# Annotations are strings (PEP 563): this table maps each one the dataclasses above use to a parser.
_PARSERS: Mapping[str, Callable[[object, str], object]] = {
    "int": _int,
    "float": _float,
    "str": _str,
    "str | None": _optional(_str),
    "float | None": _optional(_float),
    "JobRef | None": _optional(lambda value, path: _build(JobRef, _mapping(value, path), path)),
    "GpuModel": _model,
    "tuple[Assignment, ...]": _assignments,
    "tuple[Fault, ...]": _faults,
}


def _build(cls: type[_D], data: Mapping[str, object], path: str, skip: tuple[str, ...] = ()) -> _D:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, object] = {}
    for key, value in data.items():
        if key in skip:  # keys that chose the class or the GPUs
            continue
        if key not in fields:
            raise ValueError(f"{path}: unknown key {key!r}; expected one of {', '.join(fields)}")
        kwargs[key] = _PARSERS[str(fields[key].type)](value, f"{path}.{key}")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in kwargs:
            raise ValueError(f"{path}: missing key {name!r}")
    try:
        return cls(**kwargs)
    except ValueError as error:  # __post_init__ messages start with the field name
        raise ValueError(f"{path}.{error}") from error


def scenario_from_mapping(data: Mapping[str, object]) -> Scenario:
    """Build a scenario from parsed YAML or JSON (see the module docstring for the shape).

    Raises:
        ValueError: naming the offending key, e.g. ``scenario.assignments[1].kind: ...``.

    """
    return _build(Scenario, _mapping(data, "scenario"), "scenario")
