"""What a labelled fleet is: GPUs, jobs over time, telemetry, events and the planted episodes.

A fleet is data, not behaviour: the generators (:mod:`bench.truth.fleets`) build it, the runner
(:mod:`bench.truth.runner`) replays it through the collector, the scorer
(:mod:`bench.truth.score`) compares the incidents with ``episodes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint
from gpuwarden.collector.jobs.model import JobState
from gpuwarden.collector.storage.records import Event, ModelDeployment

T0 = 1_767_225_600.0
"""Every fleet starts here (2026-01-01 00:00 UTC): a fixed, seeded simulated clock."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU: its node and index; the UUID follows from them."""

    node: str
    index: int

    @property
    def uuid(self) -> str:
        return f"GPU-{self.node}-{self.index}"

    @property
    def subject(self) -> str:
        """``node/uuid``: how per-GPU findings name a GPU."""
        return f"{self.node}/{self.uuid}"


@dataclass(frozen=True, slots=True)
class PlannedJob:
    """A job as the scheduler would report it over time.

    Registered once ``start`` has passed; ``end`` (None: still running when the fleet ends) is
    when it stops, after which it is reported with ``final_state``.
    """

    key: str
    gpus: tuple[Gpu, ...]
    start: float
    end: float | None = None
    final_state: JobState = JobState.COMPLETED
    model: str | None = None
    tier: str = "on-demand"
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Episode:
    """One planted problem: what the evaluation calls truth.

    ``rule`` is the shipped rule that should open an incident for it. ``job``, ``gpus``,
    ``nodes`` and ``model`` name its subject (any that apply); the episode runs from ``start``
    (its onset) to ``end``. ``kind`` says what was planted (for the report only).
    """

    rule: str
    kind: str
    start: float
    end: float
    job: str | None = None
    gpus: tuple[str, ...] = ()
    """UUIDs of the GPUs concerned (empty: the job's or node's, whichever is named)."""
    nodes: tuple[str, ...] = ()
    model: str | None = None


PointsAt = Callable[[float], list[NumberPoint]]
"""The telemetry every agent (and model server) sends at one time, as OTLP points."""

HistogramsAt = Callable[[float], list[HistogramPoint]]
"""The cumulative histograms (request latency) model servers send at one time."""


@dataclass(frozen=True, slots=True)
class Fleet:
    """One generated (or replayed) fleet and its truth.

    Attributes:
        name: unique within a run, e.g. ``idle/s101``.
        family: what it exercises (``idle``, ``straggler``, ``busy-diurnal``...).
        seed: what drew it.
        gpus: every GPU that reports.
        start, end: the telemetry span (Unix seconds, simulated).
        cadence_seconds: how often agents send (the agent's default is 10 s).
        cycle_seconds: how often detection runs.
        warmup_seconds: detection starts this long after ``start`` (the rules' windows fill).
        points: the telemetry at a time (called on the cadence grid).
        jobs: the scheduler's view, replayed as time passes.
        events: point events recorded in storage when their time passes.
        deployments: model deployments in storage from the start.
        episodes: the planted truth; empty for a busy fleet.
        recent_hours: the store's full-resolution ring (the collector's ``recent_hours``).
        histograms: cumulative histogram points at a time (None: the fleet sends none).
    """

    name: str
    family: str
    seed: int
    gpus: tuple[Gpu, ...]
    start: float
    end: float
    points: PointsAt
    jobs: tuple[PlannedJob, ...] = ()
    events: tuple[Event, ...] = ()
    deployments: tuple[ModelDeployment, ...] = ()
    episodes: tuple[Episode, ...] = ()
    cadence_seconds: float = 10.0
    cycle_seconds: float = 60.0
    warmup_seconds: float = 0.0
    recent_hours: int = 6
    histograms: HistogramsAt | None = None

    @property
    def busy(self) -> bool:
        """A fleet with no planted episode: every incident on it is false."""
        return not self.episodes

    @property
    def gpu_days(self) -> float:
        """GPUs × the span detection ran over, in days (the false-incident rate's exposure)."""
        return len(self.gpus) * (self.end - self.start - self.warmup_seconds) / 86400
