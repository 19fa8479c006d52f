"""What the remediator tells humans: approval requests, escalations and breaker pages.

Every message goes to the alert outbox; the alert dispatcher stores, delivers and retries it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from gpuwarden.collector.alerts.model import Alert, AlertOutbox, AlertStatus, ProposedAction
from gpuwarden.collector.alerts.redact import redact
from gpuwarden.collector.alerts.runbooks import Links
from gpuwarden.collector.remediate.approvals import Approvals
from gpuwarden.collector.remediate.states import ActionState
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.storage.base import ActionRecord, Storage
from gpuwarden.collector.storage.records import Incident

log = logging.getLogger(__name__)


class Pager:
    """Builds the remediator's alerts and hands them to the outbox.

    Args:
        storage: read for approval requests already waiting.
        rules: the loaded rules by id (their routes and owners).
        outbox: where the alerts go; without one they are logged and not sent.
        escalation_routes: where breaker trips and escalations page (``pagerduty:...``).
        approvals: approval links for ``approve`` actions (without: CLI/API approval only).
        links: URLs for runbooks, incidents and approval links in messages.
        clock: wall clock.
    """

    def __init__(
        self,
        storage: Storage,
        rules: Mapping[str, Rule],
        *,
        outbox: AlertOutbox | None,
        escalation_routes: Sequence[str],
        approvals: Approvals | None,
        links: Links,
        clock: Callable[[], float],
    ) -> None:
        self._storage = storage
        self._rules = rules
        self._outbox = outbox
        self._escalation_routes = tuple(escalation_routes)
        self._approvals = approvals
        self._links = links
        self._clock = clock

    def request_approval(self, row: ActionRecord, incident: Incident) -> None:
        """Send an approval link for ``row`` (once per action and target waiting)."""
        if self._approvals is None or row.action_id is None:
            return
        waiting = self._storage.actions(states=[ActionState.AWAITING_APPROVAL])
        if any(
            r.action == row.action and r.target == row.target and r.action_id != row.action_id
            for r in waiting
        ):
            # Another incident already asks a human for this very action (e.g. each idle GPU of
            # one job): one request is enough; this one stays approvable from the CLI and API.
            log.info("approval for %s %s already requested", row.action, row.target)
            return
        token = self._approvals.issue(row.action_id)
        action = ProposedAction(
            kind=row.action,
            target=row.target,
            mode=row.mode,
            state=row.state,
            approval_url=self._links.approval_url(token),
        )
        rule = self._rules.get(incident.rule_id)
        summary = f"approval needed: {row.action} {row.target} ({incident.rule_id})"
        self._send(self._alert(incident, summary, None, (action,)), rule.routes if rule else ())

    def escalate(self, row: ActionRecord, incident: Incident, why: str) -> None:
        """Page the rule's routes and the escalation routes: ``row`` needs a human."""
        rule = self._rules.get(incident.rule_id)
        routes = (*(rule.routes if rule else ()), *self._escalation_routes)
        action = ProposedAction(row.action, row.target, row.mode, str(row.state))
        summary = f"remediation needs a human: {why}"
        self._send(self._alert(incident, summary, "page", (action,)), routes)

    def page_breaker(self, reason: str, incident: Incident) -> None:
        """Page the escalation routes: the breaker tripped on ``incident``."""
        alert = Alert(
            fingerprint="gpuwarden-remediation-breaker",
            rule_id="remediation-breaker",
            status=AlertStatus.FIRING,
            severity="page",
            summary=f"gpuwarden stopped automating: {reason}. Reset with "
            "`gpuwarden actions reset-breaker` once the fleet is understood.",
            starts_at=self._clock(),
            runbook_url=self._links.runbook_url(incident.rule_id),
            facts={"last incident": str(incident.incident_id)},
        )
        self._send(alert, self._escalation_routes)

    def _alert(
        self,
        incident: Incident,
        summary: str,
        severity: str | None,
        actions: Sequence[ProposedAction],
    ) -> Alert:
        rule = self._rules.get(incident.rule_id)
        incident_id = incident.incident_id or 0
        return Alert(
            fingerprint=incident.fingerprint,
            rule_id=incident.rule_id,
            status=AlertStatus.FIRING,
            severity=severity or incident.severity,
            summary=summary,
            starts_at=incident.first_seen,
            runbook_url=self._links.incident_runbook_url(incident_id),
            team=rule.owner if rule else None,
            incident_url=self._links.incident_url(incident_id),
            facts={k: str(v) for k, v in redact(incident.evidence).items() if v is not None},
            actions=tuple(actions),
        )

    def _send(self, alert: Alert, routes: Iterable[str]) -> None:
        """Hand ``alert`` to the outbox for ``routes``: stored now, delivered and retried by the
        alert dispatcher (never sent from here, so a slow or failing service cannot hold up
        remediation, and a page is not lost when the service is down)."""
        routes = tuple(routes)
        if not routes:
            return
        if self._outbox is None:
            log.warning("no alert outbox: %s for %s not sent", alert.summary, alert.rule_id)
            return
        try:
            self._outbox.enqueue(alert, routes)
        except Exception:  # paging must not stop remediation; the state is in the store
            log.exception("could not store the alert for %s", alert.rule_id)
