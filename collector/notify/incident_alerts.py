"""The alerts the dispatcher sends about incidents: one incident's, a group's (many incidents of
one rule in one pass), and the resolve of a group's alert."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuwarden.collector.alerts.model import Alert, AlertStatus, ProposedAction
from gpuwarden.collector.alerts.redact import redact
from gpuwarden.collector.alerts.runbooks import UNKNOWN, Links
from gpuwarden.collector.notify.notices import RESOLVED
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import Incident

_LABEL_KEYS = ("node", "gpu", "job", "model", "deployment", "team")
_GROUP_LINES = 9  # and a "more" line: Slack shows at most 10 fields


def _fact(value: object) -> str | None:
    if value is None or isinstance(value, list | dict | tuple):
        return None  # plot points and nested structures are for the incident page
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class IncidentAlerts:
    """Builds alerts from incidents, their rule and their actions.

    Args:
        storage: the incidents' actions.
        rules: the loaded rules (owner).
        links: runbook, incident and dashboard URLs.
    """

    def __init__(self, storage: Storage, rules: Iterable[Rule], links: Links) -> None:
        self._storage = storage
        self._rules = {rule.id: rule for rule in rules}
        self._links = links

    def incident(self, incident: Incident, status: str, now: float) -> Alert:
        """``incident`` as a ``status`` (a notice status: firing or resolved) alert."""
        rule = self._rules.get(incident.rule_id)
        incident_id = incident.incident_id or 0
        ev = incident.evidence
        labels = {k: str(ev[k]) for k in _LABEL_KEYS if ev.get(k) not in (None, "")}
        facts = {
            k: text
            for k, v in redact(ev).items()
            if k not in ("summary", "subject") and (text := _fact(v)) is not None
        }
        dashboard = self._links.dashboard_url(
            "gpuwarden-fleet", {"job": labels.get("job", ""), "node": labels.get("node", "")}
        )
        resolved = status == RESOLVED
        return Alert(
            fingerprint=incident.fingerprint,
            rule_id=incident.rule_id,
            status=AlertStatus.RESOLVED if resolved else AlertStatus.FIRING,
            severity=incident.severity,
            summary=str(ev.get("summary") or ev.get("subject") or incident.rule_id),
            starts_at=incident.first_seen,
            ends_at=(incident.resolved_time or now) if resolved else None,
            runbook_url=self._links.incident_runbook_url(incident_id),
            team=rule.owner if rule else None,
            incident_url=self._links.incident_url(incident_id),
            dashboard_url=None if dashboard == UNKNOWN else dashboard,
            labels=labels,
            facts=facts,
            actions=self._actions(incident_id),
        )

    def _actions(self, incident_id: int) -> tuple[ProposedAction, ...]:
        return tuple(
            ProposedAction(row.action, row.target, row.mode, str(row.state))
            for row in self._storage.actions(incident_id=incident_id)
        )

    def group(self, rule_id: str, status: str, incidents: Sequence[Incident], now: float) -> Alert:
        """One alert listing ``incidents`` (of ``rule_id``, all new or all resolved)."""
        rule = self._rules.get(rule_id)
        resolved = status == RESOLVED
        first = incidents[0]
        lines: dict[str, str] = {}
        for incident in incidents[:_GROUP_LINES]:
            ev: Mapping[str, Any] = incident.evidence
            subject = str(ev.get("subject") or incident.fingerprint)
            lines[f"#{incident.incident_id} {subject}"] = str(ev.get("summary") or "")[:200]
        if len(incidents) > _GROUP_LINES:
            lines["…"] = f"and {len(incidents) - _GROUP_LINES} more"
        verb = "resolved" if resolved else "open"
        return Alert(
            fingerprint=f"group-{rule_id}-{status}-{int(now)}",
            rule_id=rule_id,
            status=AlertStatus.RESOLVED if resolved else AlertStatus.FIRING,
            severity=first.severity,
            summary=f"{len(incidents)} incidents {verb}",
            starts_at=min(i.first_seen for i in incidents),
            ends_at=now if resolved else None,
            runbook_url=self._links.runbook_url(rule_id),
            team=rule.owner if rule else None,
            incident_url=f"{self._links.base_url}/status",
            facts=lines,
        )

    def group_resolved(self, last: Incident, group_key: str, now: float) -> Alert:
        """The resolve of the group alert ``group_key``, whose last member ``last`` resolved."""
        rule = self._rules.get(last.rule_id)
        return Alert(
            fingerprint=group_key,
            rule_id=last.rule_id,
            status=AlertStatus.RESOLVED,
            severity=last.severity,
            summary="every incident of the group resolved",
            starts_at=last.first_seen,
            ends_at=now,
            runbook_url=self._links.runbook_url(last.rule_id),
            team=rule.owner if rule else None,
        )
