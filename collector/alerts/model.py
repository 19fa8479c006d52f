"""The contract between the remediator, the dispatcher and the notifiers: one alert about one
incident, what a service answered to it, and the durable outbox the remediator pages through."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

FINGERPRINT_LABEL = "gpuwarden_fingerprint"
"""The label that carries an incident's fingerprint on the alerts gpuwarden sends Alertmanager;
the Alertmanager webhook receiver drops alerts that carry it (they are gpuwarden's own)."""


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


class Delivery(enum.StrEnum):
    """How a service answered one delivery."""

    DELIVERED = "delivered"
    RETRYABLE = "retryable"  # no answer, 408, 425, 429, 5xx: worth trying again later
    REJECTED = "rejected"  # any other refusal (400...): trying again cannot help


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """One answer of a notifier: delivered, retryable (with the service's ``Retry-After`` when
    it gave one) or rejected for good. ``reason`` is short and carries no secret."""

    outcome: Delivery
    reason: str = ""
    retry_after_seconds: float | None = None

    @property
    def delivered(self) -> bool:
        """The service accepted it."""
        return self.outcome is Delivery.DELIVERED

    def __bool__(self) -> bool:
        """Refused: a result is not a yes/no (``if notifier.send(...)`` was the old contract)."""
        raise TypeError("DeliveryResult has no truth value: use .delivered or .outcome")

    @classmethod
    def ok(cls) -> DeliveryResult:
        """Accepted."""
        return cls(Delivery.DELIVERED)

    @classmethod
    def retry(cls, reason: str, retry_after_seconds: float | None = None) -> DeliveryResult:
        """Not accepted this time; the dispatcher tries again with backoff."""
        return cls(Delivery.RETRYABLE, reason, retry_after_seconds)

    @classmethod
    def reject(cls, reason: str) -> DeliveryResult:
        """Refused for good; the dispatcher gives up at once."""
        return cls(Delivery.REJECTED, reason)


class Notifier(Protocol):
    """Delivers alerts to one service, once per call: it never retries itself. What to do with
    an answer that is not a delivery is the durable dispatcher's business."""

    @property
    def name(self) -> str:
        """Route scheme it serves: ``slack``, ``pagerduty``, ``alertmanager``, ``webhook``."""
        ...

    def send(self, alert: Alert, route: str) -> DeliveryResult:
        """Deliver ``alert`` to ``route`` (the part after ``scheme:`` in a rule's route)."""
        ...


class AlertOutbox(Protocol):
    """Where the remediator hands its pages (approval requests, escalations, the breaker): they
    are stored, then delivered and retried like incident alerts (the dispatcher implements it)."""

    def enqueue(self, alert: Alert, routes: Sequence[str]) -> None:
        """Store ``alert`` for each of ``routes`` (``scheme:target``) for delivery."""
        ...
