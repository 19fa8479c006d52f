"""Backtest: replay a recorded GPU trace through the real detection engine on a simulated clock.

The trace (our CSV format or the Alibaba GenTD26 duty-cycle file, read by the agent's
``ReplaySource``) is sampled every ``step_seconds`` of trace time and fed, as the points an
agent would send, into a real ``CollectorService`` (WindowStore, SQLite in a temporary
folder); the ``DetectionEngine`` runs every ``cycle_seconds`` with the same rules the collector
would load, and incidents fold exactly as they would live. Memory stays bounded: the store's
rings hold only their windows.

A trace knows GPUs, not jobs. Every GPU is held, for the whole trace, by one job of its own
(``backtest:<gpu>``, team ``backtest``, on-demand), so the waste rules have an owner to judge;
all GPUs sit on one node, ``replay``.

Labels (optional, CSV ``subject,start,end``): ``subject`` is a GPU uuid (or any text an
incident's subject contains), ``start``/``end`` are trace seconds from the trace's first row.
An incident matches a label when its subject contains the label's subject and it opened within
``[start, end + match_slack]``; precision is matched incidents / incidents, recall matched
labels / labels, delay the opening time minus ``start``.
"""

from __future__ import annotations

import csv
import math
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tqdm import tqdm

from gpuwarden.agent.model import GpuSample
from gpuwarden.agent.sources.replay import ReplaySource
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.model import GpuAllocation, Job, JobState
from gpuwarden.collector.otlp import NumberPoint
from gpuwarden.collector.records import Incident, IncidentState
from gpuwarden.collector.rules import RuleSet

EPOCH = 1_700_000_000.0
"""Simulated Unix time of the trace's first row (any whole minute works)."""
NODE = "replay"


class BacktestError(ValueError):
    """Bad input: the message names the file and line or key."""


@dataclass(frozen=True, slots=True)
class Label:
    """A truth window: ``subject`` had a problem from ``start`` to ``end`` (trace seconds)."""

    subject: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class FoundIncident:
    """An incident the replay opened, in trace seconds."""

    rule: str
    subject: str
    opened: float
    resolved: float | None
    idle_gpu_hours: float
    wasted_usd: float


@dataclass(frozen=True, slots=True)
class Quality:
    """Precision, recall and detection delays against labels."""

    labels: int
    incidents: int
    matched_labels: int
    matched_incidents: int
    delays_seconds: tuple[float, ...] = ()

    @property
    def precision(self) -> float | None:
        """Matched incidents over incidents (None without incidents)."""
        return self.matched_incidents / self.incidents if self.incidents else None

    @property
    def recall(self) -> float | None:
        """Matched labels over labels (None without labels)."""
        return self.matched_labels / self.labels if self.labels else None


@dataclass(frozen=True, slots=True)
class BacktestResult:
    """What the replay found."""

    gpus: int
    trace_seconds: float
    cycles: int
    incidents: tuple[FoundIncident, ...]
    not_implemented: tuple[str, ...]
    quality: Quality | None = None
    rules: tuple[str, ...] = field(default=())

    @property
    def idle_gpu_hours(self) -> float:
        """Idle GPU-hours the idle and forgotten-GPU incidents cover."""
        return sum(i.idle_gpu_hours for i in self.incidents)

    @property
    def wasted_usd(self) -> float:
        """What those idle GPU-hours cost at the on-demand price."""
        return sum(i.wasted_usd for i in self.incidents)


class SimClock:
    """A clock the replay moves by hand."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def read_labels(path: Path) -> list[Label]:
    """Labels from a CSV ``subject,start,end`` (header required)."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
    except OSError as exc:
        raise BacktestError(f"{path}: cannot read: {exc.strerror}") from None
    if not rows or [c.strip() for c in rows[0]] != ["subject", "start", "end"]:
        raise BacktestError(f"{path}:1: expected the header 'subject,start,end'")
    labels = []
    for line, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 3 or not row[0].strip():
            raise BacktestError(f"{path}:{line}: expected 'subject,start,end'")
        try:
            start, end = float(row[1]), float(row[2])
        except ValueError:
            raise BacktestError(f"{path}:{line}: start and end are seconds") from None
        if not (math.isfinite(start) and math.isfinite(end)) or end < start:
            raise BacktestError(f"{path}:{line}: need finite start <= end")
        labels.append(Label(row[0].strip(), start, end))
    return labels


def _points(samples: Sequence[GpuSample], now: float) -> list[NumberPoint]:
    resource: dict[str, str | int | float | bool] = {"host.name": NODE}
    t = int(now * 1e9)
    points = []
    for s in samples:
        gpu: dict[str, str | int | float | bool] = {"hw.id": s.uuid}
        info = {**gpu, "hw.model": s.name, "gpuwarden.gpu.index": s.index}
        points.append(
            NumberPoint(resource, "gpuwarden.gpu.info", "1", "gauge", False, info, t, 1.0)
        )
        readings: tuple[tuple[str, str, float | int | None, dict[str, str]], ...] = (
            ("hw.gpu.utilization", "1", s.utilization_ratio, {"hw.gpu.task": "general"}),
            ("hw.gpu.memory.usage", "By", s.memory_used_bytes, {}),
            ("hw.power", "W", s.power_watts, {"hw.type": "gpu"}),
        )
        for metric, unit, value, extra in readings:
            if value is not None and math.isfinite(float(value)):
                attrs = {**gpu, **extra}
                points.append(
                    NumberPoint(resource, metric, unit, "gauge", False, attrs, t, float(value))
                )
    return points


def _jobs(samples: Sequence[GpuSample], start: float, end: float) -> list[Job]:
    return [
        Job(
            key=f"backtest:{s.uuid}",
            scheduler="backtest",
            job_id=s.uuid,
            state=JobState.RUNNING,
            name=f"gpu {s.index}",
            team="backtest",
            gpus=1,
            allocations=(GpuAllocation(NODE, (s.index,)),),
            start_time=start - 3600,  # held since before the trace: its first window counts
            end_time=end + 3600,
            price_tier="on-demand",
        )
        for s in samples
    ]


def _found(incident: Incident, end: float) -> FoundIncident:
    evidence = incident.evidence
    idle_hours = 0.0
    wasted = 0.0
    window = evidence.get("window_minutes")
    window_hours = evidence.get("idle_gpu_hours")
    window_usd = evidence.get("wasted_usd")
    if isinstance(window, int | float) and isinstance(window_hours, int | float):
        until = incident.resolved_time if incident.resolved_time is not None else end
        idle_hours = (until - incident.first_seen) / 3600 + float(window) / 60
        # the detector priced its window at the GPU model's on-demand rate
        price = (
            window_usd / window_hours if isinstance(window_usd, int | float) and window_hours else 0
        )
        wasted = idle_hours * price
    return FoundIncident(
        rule=incident.rule_id,
        subject=str(evidence.get("subject", incident.fingerprint)),
        opened=incident.first_seen - EPOCH,
        resolved=None if incident.resolved_time is None else incident.resolved_time - EPOCH,
        idle_gpu_hours=idle_hours,
        wasted_usd=wasted,
    )


def score(
    incidents: Sequence[FoundIncident], labels: Sequence[Label], match_slack: float
) -> Quality:
    """Match incidents to labels (see the module docstring)."""
    matched_incidents: set[int] = set()
    delays = []
    matched_labels = 0
    for label in labels:
        hits = [
            (i, inc)
            for i, inc in enumerate(incidents)
            if label.subject in inc.subject and label.start <= inc.opened <= label.end + match_slack
        ]
        if hits:
            matched_labels += 1
            matched_incidents.update(i for i, _ in hits)
            delays.append(min(inc.opened for _, inc in hits) - label.start)
    return Quality(
        labels=len(labels),
        incidents=len(incidents),
        matched_labels=matched_labels,
        matched_incidents=len(matched_incidents),
        delays_seconds=tuple(delays),
    )


def run_backtest(
    rules: RuleSet,
    data: Path,
    *,
    labels: Sequence[Label] = (),
    step_seconds: int = 60,
    cycle_seconds: float = 60.0,
    max_gpus: int | None = None,
    match_slack_seconds: float = 3600.0,
    progress: bool = False,
    workdir: Path | None = None,
    on_cycle: Callable[[float], None] | None = None,
) -> BacktestResult:
    """Replay ``data`` through ``rules``; see the module docstring."""
    if step_seconds <= 0 or cycle_seconds <= 0:
        raise BacktestError("step and cycle must be positive")
    clock = SimClock(EPOCH)
    try:
        source = ReplaySource(
            data, clock=clock, loop=False, max_gpus=max_gpus, stale_after_seconds=3 * step_seconds
        )
        duration = source.duration_seconds
        first = source.sample()
    except (OSError, ValueError) as exc:
        raise BacktestError(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="gpuwarden-backtest-", dir=workdir) as tmp:
        recent_hours = max(6, math.ceil(_longest_window(rules) / 3600) + 1)
        config = CollectorConfig(
            database=Path(tmp) / "backtest.db",
            step_seconds=step_seconds,
            recent_hours=recent_hours,
        )
        service = build_service(config, clock=clock)
        service.registry.put(_jobs(first, EPOCH, EPOCH + duration))
        engine = DetectionEngine(service, rules, clock=clock)
        steps = max(1, math.ceil(duration / step_seconds))
        cycles = 0
        next_cycle = EPOCH + cycle_seconds
        bar = tqdm(total=steps, unit="step", disable=not progress, file=sys.stderr,
                   desc="backtest")  # fmt: skip
        with bar:
            for k in range(steps):
                clock.now = EPOCH + k * step_seconds
                service.accept(_points(source.sample(), clock.now), "backtest")
                if clock.now >= next_cycle:
                    engine.run_cycle(clock.now)
                    cycles += 1
                    next_cycle += cycle_seconds
                    if on_cycle is not None:
                        on_cycle(clock.now)
                bar.update(1)
        end = clock.now
        found = tuple(
            _found(i, end)
            for i in service.storage.incidents()
            if i.state in (IncidentState.OPEN, IncidentState.RESOLVED)
        )
        not_implemented = engine.not_implemented
        service.storage.close()
    return BacktestResult(
        gpus=len(first),
        trace_seconds=duration,
        cycles=cycles,
        incidents=found,
        not_implemented=not_implemented,
        quality=score(found, labels, match_slack_seconds) if labels else None,
        rules=tuple(r.id for r in rules.enabled()),
    )


def _longest_window(rules: RuleSet) -> float:
    """The longest ``window_seconds`` of the rules (the store's recent window must hold it)."""
    windows = [r.parameters.get("window_seconds") for r in rules.rules]
    return max((float(w) for w in windows if isinstance(w, int | float)), default=0.0)


def only_rule(rules: RuleSet, rule_id: str) -> RuleSet:
    """The rule set reduced to one rule; ``BacktestError`` naming the known ids otherwise."""
    rule = rules.get(rule_id)
    if rule is None:
        known = ", ".join(sorted(r.id for r in rules.rules))
        raise BacktestError(f"no rule {rule_id!r} (rules: {known})")
    return replace(rules, rules=(rule,))
