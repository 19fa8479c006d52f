"""The detection cycle: run every enabled rule that has a detector here, fold into incidents.

Rules are compiled once (a dict lookup from detector name to runner); a rule whose detector is
not implemented yet is reported, not silently dropped. One failing rule never stops the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuwarden.collector.detect.deploy import run_deploy_regression
from gpuwarden.collector.detect.distribution import run_distribution_drift
from gpuwarden.collector.detect.drift import run_model_drift
from gpuwarden.collector.detect.faults import detect_hardware_faults
from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.detect.forecast import run_demand_forecast
from gpuwarden.collector.detect.idle_rule import detect_idle_gpus
from gpuwarden.collector.detect.incidents import IncidentTracker
from gpuwarden.collector.detect.level_shift import run_level_shift
from gpuwarden.collector.detect.metric_anomaly import run_metric_anomaly
from gpuwarden.collector.detect.preemption import run_preemption
from gpuwarden.collector.detect.slo import run_slo_burn
from gpuwarden.collector.detect.straggler import run_straggler
from gpuwarden.collector.detect.waste import (
    run_forgotten_gpu,
    run_input_bound,
    run_orphaned_memory,
    run_overprovisioned_inference,
)
from gpuwarden.collector.rules.model import Rule, RuleSet
from gpuwarden.collector.service import CollectorService

log = logging.getLogger(__name__)

Runner = Callable[[CollectorService, Rule, float], list[Finding]]
FAULT_WINDOW_SECONDS = 300.0


def _idle(service: CollectorService, rule: Rule, now: float) -> list[Finding]:
    p = rule.parameters
    return detect_idle_gpus(
        service,
        rule_id=rule.id,
        severity=str(rule.severity),
        window_seconds=float(p["window_seconds"]),  # type: ignore[arg-type]
        threshold_ratio=float(p["utilization_below"]),  # type: ignore[arg-type]
        min_coverage=float(p["min_coverage"]),  # type: ignore[arg-type]
        now=now,
    )


def _faults(service: CollectorService, rule: Rule, now: float) -> list[Finding]:
    p = rule.parameters
    codes = p["xid_codes"]
    return detect_hardware_faults(
        service,
        rule_id=rule.id,
        severity=str(rule.severity),
        window_seconds=FAULT_WINDOW_SECONDS,
        xids=tuple(int(c) for c in codes) if isinstance(codes, tuple | list) else (),
        gpu_lost=bool(p["gpu_lost"]),
        uncorrected_ecc=bool(p["uncorrected_ecc"]),
        remap_failure=bool(p["remap_failure"]),
        now=now,
    )


#: Detector name → runner. Detectors of the rule vocabulary not listed here are not built yet.
PUSHED_DETECTORS = frozenset({"alertmanager"})
"""Detectors whose findings are pushed to the collector (Alertmanager's webhook), not computed."""

RUNNERS: Mapping[str, Runner] = {
    "idle_gpu": _idle,
    "hardware_fault": _faults,
    "slo_burn": run_slo_burn,
    "distribution_drift": run_distribution_drift,
    "demand_forecast": run_demand_forecast,
    "orphaned_memory": run_orphaned_memory,
    "forgotten_gpu": run_forgotten_gpu,
    "input_bound": run_input_bound,
    "overprovisioned_inference": run_overprovisioned_inference,
    "straggler": run_straggler,
    "preemption": run_preemption,
    "metric_anomaly": run_metric_anomaly,
    "level_shift": run_level_shift,
    "model_drift": run_model_drift,
    "deploy_regression": run_deploy_regression,
}


def _selected(rule: Rule, finding: Finding) -> bool:
    ev = finding.evidence
    return rule.selector.matches(
        team=str(ev["team"]) if ev.get("team") else None,
        job=str(ev["job"]) if ev.get("job") else None,
        node=str(ev["node"]) if ev.get("node") else None,
    )


@dataclass(frozen=True, slots=True)
class CycleResult:
    """What one detection cycle did."""

    findings: int
    firing: int
    opened: int
    resolved: int
    failed_rules: tuple[str, ...]


class DetectionEngine:
    """Runs the rule set against the service's data and keeps incidents up to date."""

    def __init__(
        self,
        service: CollectorService,
        rules: RuleSet,
        *,
        tracker: IncidentTracker | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._service = service
        self._clock = clock
        self._tracker = tracker or IncidentTracker(service.storage, clock=clock)
        self.rules = [r for r in rules.enabled() if r.detector in RUNNERS]
        self.not_implemented = tuple(
            sorted(
                {
                    r.detector
                    for r in rules.enabled()
                    if r.detector not in RUNNERS and r.detector not in PUSHED_DETECTORS
                }
            )
        )
        if self.not_implemented:
            log.info(
                "detectors not implemented yet (rules skipped): %s", ", ".join(self.not_implemented)
            )

    def run_cycle(self, now: float | None = None) -> CycleResult:
        """Evaluate every runnable rule once and fold the findings into incidents."""
        current = self._clock() if now is None else now
        findings: list[Finding] = []
        failed = []
        for rule in self.rules:
            try:
                found = RUNNERS[rule.detector](self._service, rule, current)
            except Exception:  # one broad except per rule: the others still run
                log.exception("rule %s failed in this cycle", rule.id)
                failed.append(rule.id)
                continue
            findings.extend(f for f in found if _selected(rule, f))
        result = self._tracker.fold(findings)
        return CycleResult(
            findings=len(findings),
            firing=sum(1 for f in findings if f.verdict is Verdict.FIRING),
            opened=len(result.opened),
            resolved=len(result.resolved),
            failed_rules=tuple(failed),
        )
