"""Replay a recorded trace through the real collector and detection engine on a simulated clock.

The readings go in as the agent's points (``NumberPoint``: ``hw.gpu.utilization`` with ``hw.id``,
resource ``host.name``, plus ``gpuwarden.gpu.info``) through ``CollectorService.accept`` into a
``WindowStore`` whose rings bound the memory; the trace's jobs go into the job registry; the
``DetectionEngine`` runs every ``cycle_seconds`` of simulated time and folds findings into
incidents in a temporary SQLite file, exactly as the running collector does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from tqdm import tqdm

from gpuwarden.collector.backtest.data import FIELD_METRICS, Dataset, Label, Reading
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.detect.incidents import IncidentTracker
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.rules.model import RuleSet
from gpuwarden.collector.store.types import AttrValue

DEFAULT_CYCLE_SECONDS = 60.0
SOURCE = "backtest"
_STEPS = (1, 2, 5, 10, 15, 20, 30, 60)
"""Store steps that divide the long ring's 60 s step."""
_HOURS_KEYS = ("idle_gpu_hours", "wasted_gpu_hours", "starved_gpu_hours")


@contextlib.contextmanager
def _quiet_incident_log() -> Iterator[None]:
    """The replay prints every incident itself: one log line per opening would drown the bar."""
    logger = logging.getLogger(IncidentTracker.__module__)
    level = logger.level
    logger.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        logger.setLevel(level)


class SimClock:
    """The simulated time every part of the replay reads."""

    def __init__(self, start_seconds: float) -> None:
        self.now_seconds = start_seconds

    def __call__(self) -> float:
        return self.now_seconds


@dataclass(frozen=True, slots=True)
class FoundIncident:
    """An incident the replay opened, in the data's time (the dataset's offset removed)."""

    rule_id: str
    subject: str
    opened_seconds: float
    last_seen_seconds: float
    resolved_seconds: float | None
    summary: str
    waste_gpu_hours: float | None
    waste_usd: float | None
    covers: tuple[str, ...] = ()
    """The GPUs (``node/uuid``) an incident about a job names (evidence ``gpu_ids``): a truth
    window labelled on one of them is the incident's too."""
    evidence: Mapping[str, object] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    """The incident's evidence as stored (``policies test`` asks the policies about it)."""


@dataclass(frozen=True, slots=True)
class Backtest:
    """What a replay found."""

    data: str
    gpus: int
    jobs: int
    start_seconds: float
    end_seconds: float
    cycles: int
    cycle_seconds: float
    step_seconds: int
    rules: tuple[str, ...]
    not_implemented: tuple[str, ...]
    failed_rules: tuple[str, ...]
    incidents: tuple[FoundIncident, ...]


def store_step(cadence_seconds: float) -> int:
    """The finest store step at or above the trace's cadence (60 s at most)."""
    return next((s for s in _STEPS if s >= cadence_seconds - 1e-9), _STEPS[-1])


def points_for(reading: Reading) -> list[NumberPoint]:
    """The points the agent would have sent for one reading (info first)."""
    resource: dict[str, AttrValue] = {"host.name": reading.node}
    ns = round(reading.time_seconds * 1e9)
    info: dict[str, AttrValue] = {
        "hw.id": reading.gpu_uuid,
        "hw.model": reading.model,
        "hw.vendor": "NVIDIA",
        "gpuwarden.gpu.index": reading.index,
    }
    out = [NumberPoint(resource, "gpuwarden.gpu.info", "1", "gauge", False, info, ns, 1.0)]
    for field, value in reading.values.items():
        m = FIELD_METRICS[field]
        attrs: dict[str, AttrValue] = {"hw.id": reading.gpu_uuid, **m.attributes}
        out.append(NumberPoint(resource, m.name, m.unit, m.kind, m.monotonic, attrs, ns, value))
    return out


def _batches(readings: Iterable[Reading]) -> Iterator[tuple[float, list[Reading]]]:
    """Readings grouped by time (one request per timestamp, as a fleet of agents would send)."""
    batch: list[Reading] = []
    for reading in readings:
        if batch and reading.time_seconds != batch[0].time_seconds:
            yield batch[0].time_seconds, batch
            batch = []
        batch.append(reading)
    if batch:
        yield batch[0].time_seconds, batch


def point_batches(dataset: Dataset) -> Iterator[tuple[float, list[NumberPoint]]]:
    """The dataset's points by time: its own batches, or its readings as the agent sends them."""
    if dataset.batches is not None:
        yield from dataset.batches()
        return
    for t, batch in _batches(dataset.readings()):
        yield t, [p for reading in batch for p in points_for(reading)]


def run_backtest(
    dataset: Dataset,
    rules: RuleSet,
    *,
    cycle_seconds: float = DEFAULT_CYCLE_SECONDS,
    step_seconds: int | None = None,
    progress: bool = False,
    progress_file: TextIO | None = None,
) -> Backtest:
    """Replay ``dataset`` through the collector and ``rules``; return the incidents found."""
    if not cycle_seconds > 0:
        raise ValueError(f"cycle must be positive, got {cycle_seconds}")
    step = step_seconds or store_step(dataset.cadence_seconds)
    first = math.ceil(dataset.start_seconds / cycle_seconds) * cycle_seconds
    clock = SimClock(dataset.start_seconds)
    failed: set[str] = set()
    cycles = 0
    with tempfile.TemporaryDirectory(prefix="gpuwarden-backtest-") as tmp:
        config = CollectorConfig(database=Path(tmp) / "backtest.db", step_seconds=step)
        service = build_service(config, clock=clock, job_sources=[])
        service.registry.put(list(dataset.jobs))
        tracker = IncidentTracker(service.storage, clock=clock)
        engine = DetectionEngine(
            service.detection_view, rules, storage=service.storage, tracker=tracker, clock=clock
        )
        bar = tqdm(
            total=round(dataset.end_seconds - dataset.start_seconds),
            unit="sim-s",
            desc="backtest",
            disable=not progress,
            file=progress_file or sys.stderr,
            leave=False,
        )
        next_cycle = first

        def cycle_until(t: float) -> None:
            nonlocal next_cycle, cycles
            while next_cycle <= t:
                clock.now_seconds = next_cycle
                result = engine.run_cycle(next_cycle)
                failed.update(result.failed_rules)
                cycles += 1
                bar.n = round(min(next_cycle, dataset.end_seconds) - dataset.start_seconds)
                bar.refresh()
                next_cycle += cycle_seconds

        try:
            with bar, _quiet_incident_log():
                for t, points in point_batches(dataset):
                    cycle_until(t)
                    clock.now_seconds = t
                    rejected = service.accept(points, SOURCE)
                    if rejected:
                        when = t - dataset.offset_seconds
                        raise ValueError(
                            f"{dataset.path}: the store refused {rejected} point(s) at {when:g}"
                        )
                cycle_until(dataset.end_seconds)
            incidents = tuple(
                _found(i.rule_id, i.first_seen, i.last_seen, i.resolved_time, i.evidence, dataset)
                for i in service.storage.incidents()
            )
        finally:
            service.storage.close()
    return Backtest(
        data=str(dataset.path),
        gpus=dataset.gpus,
        jobs=len(dataset.jobs),
        start_seconds=dataset.start_seconds - dataset.offset_seconds,
        end_seconds=dataset.end_seconds - dataset.offset_seconds,
        cycles=cycles,
        cycle_seconds=cycle_seconds,
        step_seconds=step,
        rules=tuple(r.id for r in engine.rules),
        not_implemented=tuple(
            r.id for r in rules.enabled() if r.detector in engine.not_implemented
        ),
        failed_rules=tuple(sorted(failed)),
        incidents=tuple(sorted(incidents, key=lambda i: (i.opened_seconds, i.rule_id, i.subject))),
    )


def _found(
    rule_id: str,
    first_seen: float,
    last_seen: float,
    resolved: float | None,
    evidence: Mapping[str, object],
    dataset: Dataset,
) -> FoundIncident:
    off = dataset.offset_seconds
    hours, usd = waste_of(evidence, first_seen, last_seen)
    return FoundIncident(
        rule_id=rule_id,
        subject=str(evidence.get("subject", "")),
        opened_seconds=first_seen - off,
        last_seen_seconds=last_seen - off,
        resolved_seconds=None if resolved is None else resolved - off,
        summary=str(evidence.get("summary", "")),
        waste_gpu_hours=hours,
        waste_usd=usd,
        covers=tuple(g for g in str(evidence.get("gpu_ids") or "").split(",") if g),
        evidence=MappingProxyType(dict(evidence)),
    )


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def waste_of(
    evidence: Mapping[str, object], first_seen: float, last_seen: float
) -> tuple[float | None, float | None]:
    """Idle GPU-hours and dollars of an incident, from its (last firing) evidence.

    The evidence prices one window: ``G`` GPU-hours over a window of ``W`` hours, i.e. ``G / W``
    GPUs wasted. The incident wasted them from the start of its first window (``first_seen −
    W``) to its last firing cycle: ``G / W × (last_seen − first_seen + W)`` GPU-hours, at the
    evidence's dollars per GPU-hour. ``(None, None)`` for a rule that does not price waste.
    """
    hours = next((_number(evidence.get(k)) for k in _HOURS_KEYS if k in evidence), None)
    usd = _number(evidence.get("wasted_usd"))
    if hours is None or hours <= 0:
        return None, None
    window_h = _number(evidence.get("window_hours"))
    minutes = _number(evidence.get("window_minutes"))
    if window_h is None and minutes is not None:
        window_h = minutes / 60
    if window_h is None or window_h <= 0:
        return hours, usd
    total = hours / window_h * ((last_seen - first_seen) / 3600 + window_h)
    return total, None if usd is None else usd / hours * total


def with_rules(rules: RuleSet, keep: Sequence[str]) -> RuleSet:
    """Only the rules named in ``keep`` (for ``rules test``)."""
    return replace(rules, rules=tuple(r for r in rules.rules if r.id in keep))


@dataclass(frozen=True, slots=True)
class RuleScore:
    """One rule's incidents against the truth windows that apply to it."""

    rule_id: str
    incidents: int
    true_incidents: int
    labels: int
    labels_found: int
    delays_seconds: tuple[float, ...]
    """Per label found: its earliest true incident's opening minus the label's start (0 when
    that incident was already open)."""

    @property
    def precision(self) -> float | None:
        return self.true_incidents / self.incidents if self.incidents else None

    @property
    def recall(self) -> float | None:
        return self.labels_found / self.labels if self.labels else None


def _overlaps(label: Label, incident: FoundIncident, grace_seconds: float) -> bool:
    closed = incident.resolved_seconds
    if closed is None:
        closed = incident.last_seen_seconds
    return (
        (label.subject == incident.subject or label.subject in incident.covers)
        and incident.opened_seconds <= label.end_seconds + grace_seconds
        and closed >= label.start_seconds
    )


def score(backtest: Backtest, labels: Sequence[Label], *, grace_seconds: float) -> list[RuleScore]:
    """Precision, recall and delay per rule.

    An incident is true when it overlaps a window of its subject, stretched by ``grace_seconds``
    at its end (a window-based rule fires after the window, up to a cycle late). The rules scored
    are those the labels name, or every rule that ran when no label names one.
    """
    named = sorted({lb.rule_id for lb in labels if lb.rule_id})
    out = []
    for rule_id in named or backtest.rules:
        mine = [lb for lb in labels if lb.rule_id in (None, rule_id)]
        found = [i for i in backtest.incidents if i.rule_id == rule_id]
        true = sum(1 for i in found if any(_overlaps(lb, i, grace_seconds) for lb in mine))
        delays = []
        for label in mine:
            hits = [i.opened_seconds for i in found if _overlaps(label, i, grace_seconds)]
            if hits:  # an incident already open when the window began found it at once
                delays.append(max(0.0, min(hits) - label.start_seconds))
        out.append(RuleScore(rule_id, len(found), true, len(mine), len(delays), tuple(delays)))
    return out
