"""The remediation audit, mirrored as PagerDuty change events.

Each real (not dry-run) audit entry that records an outcome (an action executed, verified,
rolled back, approved or rejected, the breaker tripped or reset) becomes one change event on
the configured PagerDuty service, where responders see it next to their incidents. Intents
(written before an actuator call) are skipped: their outcome follows. A cursor in the store
remembers the last entry sent, so a restart neither repeats nor skips; an entry PagerDuty did
not accept for now (no answer, 429, 5xx) stops the pass and is tried again on the next one; an
entry it rejected for good (400) is logged and passed over.
"""

from __future__ import annotations

import logging
from typing import Protocol, runtime_checkable

from gpuwarden.collector.alerts.model import Delivery, DeliveryResult
from gpuwarden.collector.alerts.redact import redact
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import AuditEntry

log = logging.getLogger(__name__)

CURSOR = "audit-pagerduty-mirror"
INTENT = "intent"
BATCH = 100


@runtime_checkable
class ChangeEvents(Protocol):
    """What sends change events (the PagerDuty notifier)."""

    def change_event(self, route: str, summary: str, details: dict[str, object]) -> DeliveryResult:
        """Send one, once."""
        ...


def change_summary(entry: AuditEntry) -> str:
    """One line a responder reads in PagerDuty's change timeline."""
    what = f"{entry.action} {entry.target}".strip()
    return f"gpuwarden remediation: {what}: {entry.result} ({entry.verdict}) by {entry.actor}"


class AuditMirror:
    """Sends new real audit entries to one PagerDuty service as change events.

    Args:
        storage: the audit log and the cursor.
        pagerduty: the PagerDuty notifier.
        service: its service name (as in ``pagerduty:<service>``).
    """

    def __init__(self, storage: Storage, pagerduty: ChangeEvents, service: str) -> None:
        self._storage = storage
        self._pagerduty = pagerduty
        self._service = service

    def tick(self) -> int:
        """Mirror what is new; the number of change events sent."""
        position = self._storage.cursor(CURSOR)
        sent = 0
        for entry in self._storage.audit(after_id=position, limit=BATCH):
            if entry.entry_id is None:  # pragma: no cover - stored entries have ids
                continue
            if not entry.dry_run and entry.result != INTENT:
                details: dict[str, object] = {
                    "action": entry.action,
                    "target": entry.target,
                    "verdict": entry.verdict,
                    "result": entry.result,
                    "reason": entry.reason,
                    "actor": entry.actor,
                    "incident": entry.incident_fingerprint or "",
                    "inputs": redact(entry.inputs),
                }
                result = self._pagerduty.change_event(self._service, change_summary(entry), details)
                if result.outcome is Delivery.RETRYABLE:
                    log.warning("audit mirror: entry %s not accepted; retried", entry.entry_id)
                    break
                if result.delivered:
                    sent += 1
                else:
                    log.warning(
                        "audit mirror: entry %s rejected (%s); skipped",
                        entry.entry_id,
                        result.reason,
                    )
            position = entry.entry_id
            self._storage.set_cursor(CURSOR, position)
        return sent
