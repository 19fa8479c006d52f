"""The collector's domain objects: jobs and model deployments, and the adapter protocol."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol


class JobState(enum.StrEnum):
    """Scheduler-neutral job states."""

    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class GpuAllocation:
    """GPUs a job holds on one node: NVML/GRES indices, and UUIDs where the scheduler names them."""

    node: str
    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Job:
    """One job (Slurm job, Kubernetes pod with GPU requests, or a job announced over the API).

    ``key`` is scheduler-qualified and unique across schedulers: ``slurm:<cluster>:<id>``,
    ``k8s:<pod uid>``, ``api:<id>``. Times are Unix seconds; ``None`` when not known yet.
    """

    key: str
    scheduler: str
    job_id: str
    state: JobState
    name: str | None = None
    owner: str | None = None
    team: str | None = None
    gpus: int = 0
    allocations: tuple[GpuAllocation, ...] = ()
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    priority: int | None = None
    model: str | None = None
    price_tier: str | None = None
    restarts: int = 0
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: when the scheduler could first start it (Slurm: after its begin time, dependencies and
    #: holds; a requeued job's is in the future until its requeue delay passes); queue waits
    #: count from it, from ``submit_time`` where the scheduler does not say
    eligible_time: float | None = None


class JobSource(Protocol):
    """A scheduler adapter: what jobs exist now."""

    def jobs(self, now: float) -> list[Job]:
        """Every job the scheduler reports (pending, running and recently finished)."""
        ...
