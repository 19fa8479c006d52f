"""The detection cycle: run every enabled rule through its detector, fold into incidents.

Rules are compiled once: each is bound to its detector and its typed parameters. Rules of pushed
detectors (Alertmanager's webhook) have nothing to run here. One failing rule never stops the
others. The engine also applies the selector fields the engine honours for a detector (teams,
jobs, models, nodes) to every finding's subject facts; detectors apply metrics and labels
themselves when they read series.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.collector.detect.catalog import DETECTORS
from gpuwarden.collector.detect.contract import DetectionContext, Detector
from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.detect.incidents import IncidentTracker
from gpuwarden.collector.rules.model import Rule, RuleSet
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.sql_base import FencedError

log = logging.getLogger(__name__)


def selected(rule: Rule, detector: Detector[Any], finding: Finding) -> bool:
    """Whether the finding's subject passes the rule's teams/jobs/models/nodes patterns.

    Only the fields the detector honours apply (the rule loader refuses the others); a fact
    the finding does not know fails a pattern.
    """
    selector, facts, honoured = rule.selector, finding.facts, detector.spec.selector
    for name, patterns, values in (
        ("teams", selector.teams, (facts.team,)),
        ("jobs", selector.jobs, (facts.job,)),
        ("models", selector.models, (facts.model,)),
        ("nodes", selector.nodes, facts.nodes),
    ):
        if name not in honoured or not patterns:
            continue
        if not any(
            value is not None and fnmatch.fnmatchcase(value, pattern)
            for value in values
            for pattern in patterns
        ):
            return False
    return True


@dataclass(frozen=True, slots=True)
class CycleResult:
    """What one detection cycle did."""

    findings: int
    firing: int
    opened: int
    resolved: int
    failed_rules: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Bound:
    rule: Rule
    detector: Detector[Any]
    params: Any


class DetectionEngine:
    """Runs the rule set against a detection context and keeps incidents up to date.

    Args:
        ctx: what detectors read (``CollectorService.detection_view`` in the collector).
        rules: the loaded rules; rules of detectors not in ``detectors`` are reported, not run.
        storage: where incidents live (used to build the default tracker).
        tracker: folds findings into incidents (default: one over ``storage``).
        clock: Unix seconds.
        detectors: the catalog, by name.
    """

    def __init__(
        self,
        ctx: DetectionContext,
        rules: RuleSet,
        *,
        storage: Storage,
        tracker: IncidentTracker | None = None,
        clock: Callable[[], float] = time.time,
        detectors: Mapping[str, Detector[Any]] = DETECTORS,
    ) -> None:
        self._ctx = ctx
        self._clock = clock
        self._tracker = tracker or IncidentTracker(storage, clock=clock)
        self._detectors = detectors
        self.proceed: Callable[[], bool] = lambda: True
        """Checked before each rule and before incidents are written (active/standby: whether
        this replica still leads); false stops the cycle there (``FencedError``)."""
        self.replace_rules(rules)

    def _check_proceed(self) -> None:
        if not self.proceed():
            raise FencedError("this collector no longer leads: detection cycle stopped")

    def replace_rules(self, rules: RuleSet) -> None:
        """Run ``rules`` from the next cycle on (at start, and on an admin reload); a cycle that
        is running keeps the rules it started with."""
        detectors = self._detectors
        enabled = rules.enabled()
        bound = [
            _Bound(rule, detectors[rule.detector], detectors[rule.detector].bind(rule))
            for rule in enabled
            if rule.detector in detectors and detectors[rule.detector].run is not None
        ]
        self.not_implemented = tuple(sorted({r.detector for r in enabled} - set(detectors)))
        self._bound = bound  # one assignment: a cycle iterates the list it started with
        self.rules = [b.rule for b in bound]
        if self.not_implemented:
            log.warning("rules of unknown detectors skipped: %s", ", ".join(self.not_implemented))

    def run_cycle(self, now: float | None = None) -> CycleResult:
        """Evaluate every runnable rule once and fold the findings into incidents."""
        current = self._clock() if now is None else now
        findings: list[Finding] = []
        failed = []
        for bound in self._bound:
            self._check_proceed()
            run = bound.detector.run
            if run is None:  # pragma: no cover - filtered in __init__
                continue
            try:
                found = run(self._ctx, bound.rule, bound.params, current)
            except Exception:  # one broad except per rule: the others still run
                log.exception("rule %s failed in this cycle", bound.rule.id)
                failed.append(bound.rule.id)
                continue
            findings.extend(f for f in found if selected(bound.rule, bound.detector, f))
        self._check_proceed()
        result = self._tracker.fold(findings)
        return CycleResult(
            findings=len(findings),
            firing=sum(1 for f in findings if f.verdict is Verdict.FIRING),
            opened=len(result.opened),
            resolved=len(result.resolved),
            failed_rules=tuple(failed),
        )
