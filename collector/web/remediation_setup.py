"""What the remediation routes serve: the :class:`Remediation` bundle and its assembly.

Kept apart from the routes so the composition root (``collector.build``) and the web layer's
keys can name it without importing a route module.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.collector.alerts.model import Notifier
from gpuwarden.collector.alerts.runbooks import Links, RunbookRenderer
from gpuwarden.collector.alerts.silencing import holding
from gpuwarden.collector.notify.dispatcher import AlertDispatcher
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.policy.guard import PolicyGuard
from gpuwarden.collector.remediate.actuators.base import Actuator
from gpuwarden.collector.remediate.approvals import (
    SECRET_ENV,
    Approvals,
    TokenSigner,
    load_secret,
)
from gpuwarden.collector.remediate.policy import RemediationSettings
from gpuwarden.collector.remediate.remediator import Remediator
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import Incident

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Remediation:
    """What the routes need."""

    storage: Storage
    remediator: Remediator
    renderer: RunbookRenderer
    links: Links
    rules: dict[str, Rule]
    """By id; an admin reload replaces its content in place (everyone holding it sees it)."""
    approvals: Approvals | None = None
    dispatcher: AlertDispatcher | None = None


def create_remediation(
    storage: Storage,
    rules: Iterable[Rule],
    settings: RemediationSettings,
    *,
    actuators: Sequence[Actuator],
    notifiers: Mapping[str, Notifier],
    runbooks_dir: Path,
    environ: Mapping[str, str],
    fleet_size: Callable[[], int | None] = lambda: None,
    alerting: AlertingSettings | None = None,
    clock: Callable[[], float] = time.time,
    guard: PolicyGuard | None = None,
) -> Remediation:
    """Assemble the remediator, runbooks and approval links the settings describe.

    Raises:
        PolicyError: a rule names an unknown action kind.
        ValueError: the approval secret is configured but unreadable or too short.
    """
    rules = list(rules)
    by_id = {rule.id: rule for rule in rules}

    def held(incident: Incident) -> bool:
        """Whether an operator's silence with ``actions: true`` holds the incident's actions."""
        now = clock()
        rule = by_id.get(incident.rule_id)
        silences = storage.silences(ending_after=now)
        owner = rule.owner if rule else None
        return holding(silences, incident, owner, now, actions=True) is not None

    links = Links(settings.external_url, settings.runbook_base_url, settings.dashboard_base_url)
    approvals = None
    if settings.approval_secret_file or environ.get(SECRET_ENV):
        path = Path(settings.approval_secret_file) if settings.approval_secret_file else None
        signer = TokenSigner(load_secret(path, environ), clock=clock)
        ttl = settings.policy.approval_ttl_seconds
        approvals = Approvals(storage, signer, ttl_seconds=ttl, clock=clock)
    else:
        log.info("no approval secret: approval links off (approve with the CLI or the API)")
    dispatcher = (
        None
        if alerting is None
        else AlertDispatcher(storage, rules, notifiers, alerting, links, clock=clock)
    )
    remediator = Remediator(
        storage,
        rules,
        actuators,
        config=settings.policy,
        outbox=dispatcher,
        escalation_routes=settings.escalation_routes,
        approvals=approvals,
        links=links,
        fleet_size=fleet_size,
        held=held,
        clock=clock,
        guard=guard,
    )
    return Remediation(
        storage=storage,
        remediator=remediator,
        renderer=RunbookRenderer(runbooks_dir),
        links=links,
        rules=by_id,
        approvals=approvals,
        dispatcher=dispatcher,
    )
