"""Findings fold into incidents by fingerprint: open, update, resolve with hysteresis.

A subject opens an incident after ``open_after`` firing cycles in a row and resolves after
``resolve_after`` clear cycles in a row; UNKNOWN cycles (not enough data) change nothing, so a
gap neither resolves an incident nor opens one, and an incident does not flap on one good sample.
Incidents live in the collector's storage; only the not-yet-open streaks are kept in memory.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import Incident, IncidentState

log = logging.getLogger(__name__)


MAX_PLOT_POINTS = 120
"""Points of a finding kept with its incident (evenly thinned), for the status page's chart."""


def incident_evidence(finding: Finding) -> dict[str, object]:
    """What an incident keeps of its latest finding: subject, summary, evidence and the points
    to plot (``[[unix_seconds, value], ...]``, at most ``MAX_PLOT_POINTS``)."""
    points = plot_points(finding.points)
    return {
        "subject": finding.subject,
        "summary": finding.summary,
        **{key: _finite(value) for key, value in finding.evidence.items()},
        "points": [[round(t, 3), round(v, 6)] for t, v in points if math.isfinite(v)],
    }


def plot_points(points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """The points an incident keeps: at most ``MAX_PLOT_POINTS``, evenly thinned (the same
    selection again on points already thinned)."""
    if len(points) <= MAX_PLOT_POINTS:
        return points
    stride = (len(points) - 1) / (MAX_PLOT_POINTS - 1)
    return tuple(points[round(i * stride)] for i in range(MAX_PLOT_POINTS))


def _finite(value: object) -> object:
    """NaN and infinities are not JSON: a number a detector could not compute is unknown."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


@dataclass(frozen=True, slots=True)
class FoldResult:
    """What one detection cycle changed."""

    opened: tuple[Incident, ...] = ()
    updated: tuple[Incident, ...] = ()
    resolved: tuple[Incident, ...] = ()


@dataclass
class IncidentTracker:
    """Turns each cycle's findings into incident transitions in ``storage``."""

    storage: Storage
    open_after: int = 1
    resolve_after: int = 3
    clock: Callable[[], float] = time.time
    _pending: dict[str, int] = field(default_factory=dict)

    def fold(self, findings: Sequence[Finding]) -> FoldResult:
        """Apply one cycle's findings; return the incidents opened, updated and resolved.

        The open incidents are read once per cycle, not once per finding (a large fleet's
        cycle has thousands of findings, nearly all about subjects with no incident), and kept
        up to date as this fold changes them.
        """
        now = self.clock()
        opened, updated, resolved = [], [], []
        open_now = {i.fingerprint: i for i in self.storage.incidents(state=IncidentState.OPEN)}
        for finding in findings:
            fp = finding.fingerprint
            current = open_now.get(fp)
            if finding.verdict is Verdict.FIRING:
                if current is None:
                    streak = self._pending.get(fp, 0) + 1
                    self._pending[fp] = streak
                    if streak >= self.open_after:
                        incident = self._open(finding, now, streak)
                        if incident is not None:
                            opened.append(incident)
                            open_now[fp] = incident
                        self._pending.pop(fp, None)
                else:
                    incident = replace(
                        current,
                        last_seen=now,
                        severity=finding.severity,
                        evidence=incident_evidence(finding),
                        consecutive_breaches=current.consecutive_breaches + 1,
                        consecutive_clears=0,
                    )
                    self.storage.update_incident(incident)
                    updated.append(incident)
                    open_now[fp] = incident
            elif finding.verdict is Verdict.CLEAR:
                self._pending.pop(fp, None)
                if current is None:
                    continue
                clears = current.consecutive_clears + 1
                if clears >= self.resolve_after:
                    incident = replace(
                        current,
                        state=IncidentState.RESOLVED,
                        resolved_time=now,
                        consecutive_clears=clears,
                        consecutive_breaches=0,
                    )
                    resolved.append(incident)
                    open_now.pop(fp, None)
                    log.info("incident %s (%s) resolved", fp, finding.subject)
                else:
                    incident = replace(current, consecutive_clears=clears)
                    updated.append(incident)
                    open_now[fp] = incident
                self.storage.update_incident(incident)
        return FoldResult(tuple(opened), tuple(updated), tuple(resolved))

    def _open(self, finding: Finding, now: float, streak: int) -> Incident | None:
        incident = Incident(
            fingerprint=finding.fingerprint,
            rule_id=finding.rule_id,
            severity=finding.severity,
            first_seen=now,
            last_seen=now,
            evidence=incident_evidence(finding),
            consecutive_breaches=streak,
        )
        incident_id = self.storage.open_incident(incident)
        if incident_id is None:  # another shard opened it first
            return None
        log.warning("incident %s opened: %s", finding.fingerprint, finding.summary)
        return replace(incident, incident_id=incident_id)
