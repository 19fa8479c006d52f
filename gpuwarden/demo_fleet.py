"""The demo's simulated fleet: 4 nodes × 8 GPUs, the jobs on them, and the things that act.

- ``gpu-node-a``: a training job starved by its data loader (input-bound);
- ``gpu-node-b``: a research notebook holding 4 GPUs and running nothing on them, and a spot
  fine-tuning job on the other 4 that gets preempted;
- ``gpu-node-c``: the ``llama-70b`` inference service with a daily load curve (its metrics come
  from a simulated vLLM server the collector scrapes); a deploy makes it slow;
- ``gpu-node-d``: a training job whose GPU 3 raises XID 79 (fallen off the bus).

``DemoScheduler`` is the actuator for these simulated targets: a requeue frees the job's GPUs
for real (the simulated GPUs go idle and the job goes back to the queue); scaling the service
has no room (its node is full). Actions on anything else stay dry runs. ``ConsoleNotifier``
prints what Slack or PagerDuty would have received.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpuwarden.agent.model import HostSample, JobRef
from gpuwarden.agent.sources.scenario import (
    H100_SXM,
    Assignment,
    Idle,
    IdleAllocated,
    Inference,
    InputBound,
    LostFault,
    Scenario,
    Training,
    XidFault,
)
from gpuwarden.agent.sources.simulated import SimulatedSource
from gpuwarden.collector.alerts.model import Alert, AlertStatus, DeliveryResult
from gpuwarden.collector.detect.catalog import SPECS as DETECTORS
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.remediate.actuators.base import ActionRequest, ActionResult, Outcome
from gpuwarden.collector.rules.model import ParamType, Rule, RuleSet
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import Event, EventKind, ModelDeployment

CLUSTER = "demo"
GPUS_PER_NODE = 8
SERVICE_MODEL = "llama-70b"
FALLBACK_MODEL = "llama-8b"


@dataclass(frozen=True, slots=True)
class DemoJob:
    """A job of the demo fleet: where it runs and what it does."""

    job_id: str
    name: str
    team: str
    tier: str
    node: str
    gpus: tuple[int, ...]
    kind: str  # input_bound | idle_allocated | training | inference
    model: str | None = None

    @property
    def key(self) -> str:
        """The scheduler-qualified key the collector uses."""
        return f"slurm:{CLUSTER}:{self.job_id}"


JOBS: tuple[DemoJob, ...] = (
    DemoJob("101", "train-llm-7b", "llm", "on-demand", "gpu-node-a", tuple(range(8)),
            "input_bound"),
    DemoJob("102", "notebook-research", "research", "on-demand", "gpu-node-b", (0, 1, 2, 3),
            "idle_allocated"),
    DemoJob("103", "finetune-spot", "llm", "spot", "gpu-node-b", (4, 5, 6, 7), "training"),
    DemoJob("104", "serve-llama-70b", "serving", "reserved", "gpu-node-c", tuple(range(8)),
            "inference", SERVICE_MODEL),
    DemoJob("105", "pretrain-vision", "vision", "on-demand", "gpu-node-d", tuple(range(8)),
            "training"),
)  # fmt: skip
NODES = ("gpu-node-a", "gpu-node-b", "gpu-node-c", "gpu-node-d")
XID_NODE, XID_GPU, XID_CODE = "gpu-node-d", 3, 79


HOST_CPU_BUSY: Mapping[str, float] = MappingProxyType(
    {"gpu-node-a": 0.95, "gpu-node-b": 0.2, "gpu-node-c": 0.35, "gpu-node-d": 0.3}
)
"""Each node's host CPU load: the starved training job's data loader saturates gpu-node-a."""
HOST_CPUS = 96


class SimulatedHost:
    """The host of a demo node: ``/proc``-like CPU counters at a fixed load, and memory.

    The demo's agents would otherwise read the machine that runs the demo, whose CPU load (a
    busy laptop, a shared CI runner) would decide which jobs look input-bound. The counters
    advance on ``clock``, the clock that stamps the agents' samples (the wall clock), so the
    collector reads ``busy_ratio`` as the utilisation whatever the demo's speed.
    """

    def __init__(self, busy_ratio: float, *, clock: Callable[[], float] = time.time) -> None:
        self._busy_ratio = busy_ratio
        self._clock = clock
        self._start = clock()

    def sample(self) -> HostSample:
        """The counters since the host's start."""
        cpu_seconds = HOST_CPUS * max(0.0, self._clock() - self._start)
        busy = cpu_seconds * self._busy_ratio
        return HostSample(
            cpu_time_seconds={
                "user": busy * 0.9,
                "system": busy * 0.1,
                "idle": cpu_seconds - busy,
                "iowait": 0.0,
            },
            cpu_count=HOST_CPUS,
            memory_bytes={"used": 600 * 2**30, "free": 1400 * 2**30},
            memory_limit_bytes=2048 * 2**30,
        )


def _workload(job: DemoJob, peak_hour_utc: float) -> Assignment:
    ref = JobRef(scheduler="slurm", job_id=job.job_id)
    workloads = {
        "input_bound": InputBound(job=ref, duty_ratio=0.3, period_seconds=600.0),
        "idle_allocated": IdleAllocated(job=ref),
        "training": Training(job=ref),
        "inference": Inference(job=ref, peak_hour_utc=peak_hour_utc),
    }
    return Assignment(gpus=job.gpus, workload=workloads[job.kind])


def peak_hour(start: float, simulated_seconds: float) -> float:
    """The UTC hour of the serving load's daily peak: the middle of the simulated run.

    The daily curve then looks the same whatever the hour the demo is run at (near its peak,
    where it is flattest), instead of a falling evening or a rising morning by chance.
    """
    return ((start % 86400) + simulated_seconds / 2) / 3600 % 24


def scenario(node: str, xid_at_seconds: float, peak_hour_utc: float = 14.0) -> Scenario:
    """The scenario of one node; the XID fires ``xid_at_seconds`` of simulated time in, and the
    GPU is lost a few simulated seconds later (XID 79: it fell off the bus); the inference
    load peaks at ``peak_hour_utc``."""
    faults = (
        XidFault(gpu=XID_GPU, xid=XID_CODE, at_seconds=xid_at_seconds),
        LostFault(gpu=XID_GPU, at_seconds=xid_at_seconds + 5),
    )
    return Scenario(
        node_name=node,
        gpu_count=GPUS_PER_NODE,
        model=H100_SXM,
        assignments=tuple(_workload(job, peak_hour_utc) for job in JOBS if job.node == node),
        faults=faults if node == XID_NODE else (),
    )


def jobs(now: float) -> list[Job]:
    """The scheduler's view: every demo job running since ``now``."""
    return [
        Job(
            key=job.key,
            scheduler="slurm",
            job_id=job.job_id,
            state=JobState.RUNNING,
            name=job.name,
            owner=f"{job.team}-lead",
            team=job.team,
            gpus=len(job.gpus),
            allocations=(GpuAllocation(job.node, job.gpus),),
            submit_time=now - 600,
            start_time=now,
            price_tier=job.tier,
            model=job.model,
        )
        for job in JOBS
    ]


def deployment(version: str = "v1") -> ModelDeployment:
    """The inference service as the collector knows it."""
    return ModelDeployment(
        name=SERVICE_MODEL,
        version=version,
        replicas=GPUS_PER_NODE,
        slo_latency_p99_seconds=1.5,
        slo_error_ratio=0.001,
        fallback_model=FALLBACK_MODEL,
        labels={"node": "gpu-node-c"},
    )


def scaled_rules(rules: RuleSet, speed: float) -> RuleSet:
    """The rules with every duration divided by ``speed`` (the demo compresses time).

    Rule validation is skipped on purpose: a 30-minute window becomes 30 s at 60×, below the
    1-minute floor a real rule file may use.
    """

    def scale(rule: Rule) -> Rule:
        specs = DETECTORS[rule.detector].parameters
        params = dict(rule.parameters)
        for name, spec in specs.items():
            value = params.get(name)
            if spec.type is ParamType.DURATION and isinstance(value, int | float):
                params[name] = float(value) / speed
            elif spec.type is ParamType.DURATION_LIST and isinstance(value, tuple | list):
                params[name] = tuple(float(v) / speed for v in value)
        return dataclasses.replace(rule, parameters=params)

    return dataclasses.replace(rules, rules=tuple(scale(r) for r in rules.rules))


class DemoScheduler:
    """The actuator of the simulated fleet: requeue a demo job, scale the demo service.

    A requeue moves the job back to the queue and frees its GPUs on the simulated node (they go
    idle and lose the job's processes); scaling has no room (the service's node is full), which
    is what leaves degrading to the smaller model as the way out. Drains are not simulated:
    they are answered as dry runs.
    """

    kinds = frozenset({"requeue", "scale_up", "drain"})

    def __init__(
        self,
        service: CollectorService,
        sources: Mapping[str, SimulatedSource],
        *,
        clock: Callable[[], float] = time.time,
        log: Callable[[str], None] = print,
    ) -> None:
        self._service = service
        self._sources = sources
        self._clock = clock
        self._log = log
        self._lock = threading.Lock()
        self.requeued: list[str] = []

    def accepts(self, target: str) -> bool:
        """Demo jobs, the demo service and demo nodes only."""
        return target.startswith(f"slurm:{CLUSTER}:") or target == SERVICE_MODEL or target in NODES

    def execute(self, request: ActionRequest) -> ActionResult:
        """Requeue for real on the simulation; scale and drain as the demo allows."""
        if request.kind == "scale_up":
            return ActionResult(
                Outcome.REFUSED,
                f"no room to scale {request.target}: gpu-node-c has 8 of 8 GPUs in use",
            )
        if request.kind == "drain":
            return ActionResult(
                Outcome.DRY_RUN, f"would drain {request.target} (nodes are not simulated)"
            )
        job = next((j for j in JOBS if j.key == request.target), None)
        if job is None:
            return ActionResult(Outcome.NOT_FOUND, f"no demo job {request.target}")
        current = self._service.registry.get(job.key)
        if current is not None and current.state is not JobState.RUNNING:
            return ActionResult(Outcome.ALREADY_DONE, f"{job.key} is {current.state}")
        if request.dry_run:
            return ActionResult(Outcome.DRY_RUN, f"would requeue {job.key} ({job.name})")
        with self._lock:
            source = self._sources[job.node]
            for gpu in job.gpus:
                source.reassign(gpu, Idle())
            if current is not None:
                requeued = dataclasses.replace(
                    current,
                    state=JobState.PENDING,
                    allocations=(),
                    end_time=self._clock(),  # this run ended; its processes get a grace period
                    restarts=current.restarts + 1,
                )
                self._service.registry.put([requeued])
            self.requeued.append(job.key)
        self._log(f"scheduler: requeued {job.key} ({job.name}); its {len(job.gpus)} GPUs are free")
        return ActionResult(Outcome.DONE, f"requeued {job.key}; restarts=1")

    def rollback(self, request: ActionRequest, result: ActionResult) -> ActionResult:
        """A requeue has nothing to undo (the job restarts from its checkpoint)."""
        del result
        return ActionResult(Outcome.REFUSED, f"nothing to undo for {request.kind}")


def preempt(service: CollectorService, source: SimulatedSource, now: float) -> str:
    """Reclaim the spot job: a preemption notice, the job preempted, its GPUs idle."""
    job = next(j for j in JOBS if j.tier == "spot")
    service.storage.record_event(
        Event(now, EventKind.PREEMPTION_NOTICE, job.key, {"reason": "spot capacity reclaimed"})
    )
    current = service.registry.get(job.key)
    if current is not None:
        service.registry.put([dataclasses.replace(current, state=JobState.PREEMPTED, end_time=now)])
    for gpu in job.gpus:
        source.reassign(gpu, Idle())
    return job.key


class ConsoleNotifier:
    """Prints what a notifier would send (the demo has no Slack or PagerDuty)."""

    def __init__(self, scheme: str, log: Callable[[str], None] = print) -> None:
        self._scheme = scheme
        self._log = log
        self.sent: list[Alert] = []

    @property
    def name(self) -> str:
        """The route scheme this stands in for."""
        return self._scheme

    def send(self, alert: Alert, route: str) -> DeliveryResult:
        """Print one line (and the approval links) instead of posting."""
        self.sent.append(alert)
        state = "RESOLVED" if alert.status is AlertStatus.RESOLVED else "FIRING"
        self._log(
            f"{self._scheme}:{route}: [{state}] {alert.rule_id} ({alert.severity}): "
            f"{alert.summary} · runbook {alert.runbook_url}"
        )
        for action in alert.actions:
            if action.approval_url:
                self._log(f"    approve {action.kind} {action.target}: {action.approval_url}")
        return DeliveryResult.ok()
