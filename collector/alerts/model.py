"""The contract between the remediator and the notifiers: one alert about one incident."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


class AlertStatus(enum.StrEnum):
    """Firing while the incident is open; resolved once, when it resolves. Acknowledged (for
    paging services only) once automation acts on it for real."""

    FIRING = "firing"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class ProposedAction:
    """An action taken or proposed for the incident, as the alert shows it."""

    kind: str
    target: str
    mode: str  # auto | approve | notify
    state: str  # e.g. proposed, awaiting_approval, done, dry_run, failed, rolled_back
    approval_url: str | None = None


@dataclass(frozen=True, slots=True)
class Alert:
    """What every notifier receives. ``fingerprint`` is the incident's stable identity: the
    PagerDuty ``dedup_key`` and the Alertmanager alert identity derive from it, never from text.

    ``labels`` are short routing labels (rule, severity, team, job, model, node); ``facts`` the
    evidence figures an operator reads (already formatted as text, e.g. ``"idle GPU-h": "1.5"``).
    """

    fingerprint: str
    rule_id: str
    status: AlertStatus
    severity: str  # info | warning | critical | page
    summary: str
    starts_at: float
    runbook_url: str
    ends_at: float | None = None
    team: str | None = None
    incident_url: str | None = None
    dashboard_url: str | None = None
    labels: Mapping[str, str] = field(default_factory=_empty)
    facts: Mapping[str, str] = field(default_factory=_empty)
    actions: Sequence[ProposedAction] = ()


class Notifier(Protocol):
    """Delivers alerts to one service. Returns whether the service accepted the alert; retries
    what the service says is transient (429, 5xx) itself, never what it rejected (4xx)."""

    @property
    def name(self) -> str:
        """Route scheme it serves: ``slack``, ``pagerduty``, ``alertmanager``, ``webhook``."""
        ...

    def send(self, alert: Alert, route: str) -> bool:
        """Deliver ``alert`` to ``route`` (the part after ``scheme:`` in a rule's route)."""
        ...
