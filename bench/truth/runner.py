"""Replays one fleet through the collector's real path and records every incident it opens.

Telemetry → ``CollectorService.accept`` (the OTLP intake; histograms through
``accept_histograms``) → WindowStore; jobs → the job
registry as the scheduler would report them at each time; events → SQLite storage; the shipped
``rules/default.yaml``, loaded unmodified, → ``DetectionEngine.run_cycle`` every
``fleet.cycle_seconds`` on a simulated clock, with the real ``IncidentTracker`` over SQLite.
Nothing here judges anything: the runner only observes which incidents opened, when, and what
their finding named (rule, subject, facts, evidence).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

from bench.truth.model import Fleet, PlannedJob
from bench.truth.score import OpenedIncident
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.detect.findings import Finding
from gpuwarden.collector.detect.incidents import FoldResult, IncidentTracker
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import RuleSet
from gpuwarden.collector.service import CollectorService


@cache
def shipped_rules() -> RuleSet:
    """``rules/default.yaml`` as shipped: loaded, never edited."""
    return load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())


@dataclass
class RecordingTracker(IncidentTracker):
    """The real tracker; it also remembers, for each incident it opens, its finding's names."""

    opened_log: list[OpenedIncident] = field(default_factory=list)
    resolved_log: list[tuple[str, str, float]] = field(default_factory=list)
    """(rule, subject, resolved time) of every incident it resolved."""

    def fold(self, findings: Sequence[Finding]) -> FoldResult:
        result = super().fold(findings)
        by_fp = {f.fingerprint: f for f in findings}
        for incident in result.opened:
            finding = by_fp[incident.fingerprint]
            self.opened_log.append(OpenedIncident.of(finding, incident.first_seen))
        for incident in result.resolved:
            finding = by_fp[incident.fingerprint]
            self.resolved_log.append(
                (finding.rule_id, finding.subject, incident.resolved_time or 0.0)
            )
        return result


def job_at(planned: PlannedJob, t: float) -> Job:
    """What the scheduler reports about ``planned`` at ``t`` (it has started)."""
    ended = planned.end is not None and planned.end <= t
    nodes: dict[str, list[int]] = {}
    for gpu in planned.gpus:
        nodes.setdefault(gpu.node, []).append(gpu.index)
    return Job(
        key=planned.key,
        scheduler="slurm",
        job_id=planned.key.rsplit(":", 1)[1],
        state=planned.final_state if ended else JobState.RUNNING,
        team="eval",
        gpus=len(planned.gpus),
        allocations=tuple(GpuAllocation(n, tuple(i)) for n, i in sorted(nodes.items())),
        submit_time=planned.start,
        start_time=planned.start,
        end_time=planned.end if ended else None,
        model=planned.model,
        price_tier=planned.tier,
        labels=planned.labels,
    )


@dataclass(frozen=True, slots=True)
class FleetRun:
    """What detection did on one fleet."""

    fleet: Fleet
    incidents: tuple[OpenedIncident, ...]
    cycles: int
    failed_rules: tuple[str, ...]
    resolved: tuple[tuple[str, str, float], ...] = ()
    """(rule, subject, time) of every incident that resolved during the run."""


def run_fleet(fleet: Fleet, rules: RuleSet | None = None) -> FleetRun:
    """Replay ``fleet`` with detection on; return the incidents opened."""
    rules = shipped_rules() if rules is None else rules
    with tempfile.TemporaryDirectory(prefix="gpuwarden-truth-") as tmp:
        now = [fleet.start]
        config = CollectorConfig(
            database=Path(tmp) / "collector.db",
            step_seconds=fleet.step_seconds,
            recent_hours=fleet.recent_hours,
        )
        svc = build_service(config, clock=lambda: now[0])
        try:
            return _replay(fleet, svc, rules, now)
        finally:
            svc.storage.close()


def _replay(fleet: Fleet, svc: CollectorService, rules: RuleSet, now: list[float]) -> FleetRun:
    for deployment in fleet.deployments:
        svc.storage.upsert_model(deployment)
    tracker = RecordingTracker(svc.storage, clock=lambda: now[0])
    engine = DetectionEngine(
        svc.detection_view, rules, storage=svc.storage, tracker=tracker, clock=lambda: now[0]
    )
    events = sorted(fleet.events, key=lambda e: e.time)
    reported: dict[str, Job] = {}
    cycles, failed = 0, set[str]()
    steps = round((fleet.end - fleet.start) / fleet.cadence_seconds)
    per_cycle = max(1, round(fleet.cycle_seconds / fleet.cadence_seconds))
    first_cycle = fleet.start + fleet.warmup_seconds
    for k in range(steps + 1):
        t = fleet.start + k * fleet.cadence_seconds
        now[0] = t
        while events and events[0].time <= t:
            svc.record_events([events.pop(0)])  # as POST /v1/events records them
        changed = []
        for planned in fleet.jobs:
            if planned.start <= t:
                job = job_at(planned, t)
                if reported.get(job.key) != job:
                    reported[job.key] = job
                    changed.append(job)
        if changed:
            svc.registry.put(changed)
        batch = fleet.points(t)
        rejected = svc.accept(batch, "agents") if batch else 0
        if fleet.histograms is not None:
            histograms = fleet.histograms(t)
            rejected += svc.accept_histograms(histograms, "models") if histograms else 0
        if rejected:
            raise RuntimeError(f"{fleet.name}: the store rejected {rejected} point(s) at {t}")
        if t >= first_cycle and k % per_cycle == 0:
            result = engine.run_cycle(t)
            cycles += 1
            failed.update(result.failed_rules)
    return FleetRun(
        fleet=fleet,
        incidents=tuple(replace(i, fleet=fleet.name) for i in tracker.opened_log),
        cycles=cycles,
        failed_rules=tuple(sorted(failed)),
        resolved=tuple(tracker.resolved_log),
    )
