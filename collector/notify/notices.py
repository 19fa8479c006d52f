"""What each route was told about each incident (the ``notifications`` table): which notices are
due this pass, and each push's answer recorded (delivered, retried with backoff, or given up)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from gpuwarden.collector.alerts.model import Delivery, DeliveryResult
from gpuwarden.collector.notify.senders import Senders
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.storage.base import NotificationRecord, SilenceRecord, Storage
from gpuwarden.collector.storage.records import Incident

# The dispatcher's log lines keep the logger name they have always had (operators filter on it).
log = logging.getLogger("gpuwarden.collector.notify.dispatcher")

FIRING = "firing"
RESOLVED = "resolved"
LOST = "lost"
SUPPRESSED = "suppressed"
"""Held by an operator's silence (its id in ``silence_id``): sent once the silence ends while
the incident is still open; nothing to resolve if it ends first."""
GROUP_RESOLVED_SCHEMES = frozenset({"pagerduty"})
"""Routes where a grouped alert is one object that resolves when its last member does."""
_MAX_BACKOFF = 300.0


@dataclass(frozen=True, slots=True)
class Due:
    """A notice to push this pass."""

    incident: Incident
    route: str
    status: str
    record: NotificationRecord | None
    resend: bool
    group_key: str | None = None  # resolving a grouped alert (its last member resolved)


def backoff_seconds(interval_seconds: float, attempts: int, result: DeliveryResult) -> float:
    """Backoff before the next try: doubling from the pass interval, never sooner than the
    service's ``Retry-After``."""
    backoff = min(_MAX_BACKOFF, interval_seconds * 2.0 ** (attempts - 1))
    return max(backoff, result.retry_after_seconds or 0.0)


class Notices:
    """The notification state of every (incident, route).

    Args:
        storage: the incidents and the notification state.
        settings: the ``alerting:`` section (re-send, give-up, backoff).
        senders: the notifiers (a route without one is skipped).
        routes: where alerts about an incident go.
    """

    def __init__(
        self,
        storage: Storage,
        settings: AlertingSettings,
        senders: Senders,
        routes: Callable[[Incident], tuple[str, ...]],
    ) -> None:
        self._storage = storage
        self._settings = settings
        self._senders = senders
        self._routes = routes

    def known(self) -> dict[tuple[int, str], NotificationRecord]:
        """Every route's firing (given-up, suppressed) state, and the resolves not delivered
        yet."""
        return {
            (r.incident_id, r.route): r
            for status in (FIRING, LOST, SUPPRESSED, RESOLVED)
            for r in self._storage.notifications(status=status)
            if status != RESOLVED or not r.delivered
        }

    def due(
        self,
        now: float,
        open_incidents: Mapping[int, Incident],
        known: Mapping[tuple[int, str], NotificationRecord],
    ) -> list[Due]:
        """The firing notices, re-sends, retries and resolves to push now."""
        due: list[Due] = []
        for incident_id, incident in open_incidents.items():
            for route in self._routes(incident):
                notifier = self._senders.get(route)
                if notifier is None:
                    continue
                record = known.get((incident_id, route))
                if record is not None and record.status == LOST:
                    continue  # given up on: logged once, not retried forever
                if record is None or record.status != FIRING:
                    due.append(Due(incident, route, FIRING, None, resend=False))
                elif not record.delivered:
                    if (record.next_attempt_at or 0.0) <= now:
                        due.append(Due(incident, route, FIRING, record, resend=False))
                elif getattr(notifier, "resends", False) and (
                    now - (record.sent_at or 0.0) >= self._settings.resend_seconds
                ):
                    due.append(Due(incident, route, FIRING, record, resend=True))
        return due + self._due_resolved(now, open_incidents, known)

    def _due_resolved(
        self,
        now: float,
        open_incidents: Mapping[int, Incident],
        known: Mapping[tuple[int, str], NotificationRecord],
    ) -> list[Due]:
        due: list[Due] = []
        open_groups = {
            (r.group_key, route)
            for (incident_id, route), r in known.items()
            if r.group_key and r.status == FIRING and incident_id in open_incidents
        }
        for (incident_id, route), record in known.items():
            if incident_id in open_incidents:
                continue
            grouped = record.group_key is not None and (
                route.partition(":")[0] in GROUP_RESOLVED_SCHEMES
            )
            if record.status == FIRING and grouped and (record.group_key, route) in open_groups:
                # the group's alert stays until its last member resolves
                self._storage.save_notification(replace(record, status=RESOLVED))
                continue
            if record.status in (LOST, SUPPRESSED) or (
                record.status == FIRING and not record.delivered
            ):
                # never told it was firing and it is over: nothing to resolve
                self._storage.save_notification(
                    replace(record, status=RESOLVED, delivered=True, last_error=None)
                )
                continue
            if record.status == RESOLVED and (record.next_attempt_at or 0.0) > now:
                continue
            stored = self._storage.incident(incident_id)
            if stored is None or self._senders.get(route) is None:
                continue
            fresh = record if record.status == RESOLVED else None
            group = record.group_key if grouped else None
            due.append(Due(stored, route, RESOLVED, fresh, resend=False, group_key=group))
        return due

    def suppress(
        self,
        item: Due,
        silence: SilenceRecord,
        now: float,
        previous: NotificationRecord | None,
    ) -> int:
        """Record ``item`` as held by ``silence`` instead of sending it (``previous``: what the
        route's state was); 1 when newly held, 0 when it already was."""
        incident_id = item.incident.incident_id
        assert incident_id is not None  # noqa: S101 - only stored incidents are dispatched
        silence_id = str(silence.silence_id)
        if previous is not None and (previous.status, previous.silence_id) == (
            SUPPRESSED,
            silence_id,
        ):
            return 0
        log.info(
            "firing notice of incident %s to %s suppressed by silence %s until %.0f",
            incident_id,
            item.route,
            silence_id,
            silence.ends_at,
        )
        self._storage.save_notification(
            NotificationRecord(
                incident_id,
                item.route,
                SUPPRESSED,
                delivered=False,
                first_at=now,
                silence_id=silence_id,
                silenced_until=silence.ends_at,
            )
        )
        return 1

    def record(
        self, item: Due, result: DeliveryResult, now: float, *, group_key: str | None = None
    ) -> int:
        """Save the route's new state; 1 when the notice is given up as lost."""
        incident_id = item.incident.incident_id
        assert incident_id is not None  # noqa: S101 - only stored incidents are dispatched
        previous = item.record
        first_at = previous.first_at if previous is not None else now
        group_key = group_key or item.group_key or (previous.group_key if previous else None)
        if result.delivered:
            self._storage.save_notification(_delivered(item, incident_id, first_at, now, group_key))
            return 0
        attempts = (previous.attempts if previous is not None else 0) + 1
        if item.resend:
            # the route already knows it is firing; try again at the next resend
            if item.record is not None:
                self._storage.save_notification(
                    replace(item.record, last_error=f"re-send not accepted: {result.reason}")
                )
            return 0
        rejected = result.outcome is Delivery.REJECTED
        if rejected or now - first_at >= self._settings.give_up_seconds:
            _log_given_up(item, incident_id, result, now - first_at, attempts)
            self._storage.save_notification(
                NotificationRecord(
                    incident_id,
                    item.route,
                    LOST,
                    False,
                    first_at,
                    None,
                    attempts,
                    last_error=result.reason,
                )
            )
            return 1
        wait = backoff_seconds(self._settings.interval_seconds, attempts, result)
        self._storage.save_notification(
            _retrying(item, incident_id, result, first_at, attempts, now + wait, group_key)
        )
        return 0


def _delivered(
    item: Due, incident_id: int, first_at: float, now: float, group_key: str | None
) -> NotificationRecord:
    previous = item.record
    return NotificationRecord(
        incident_id,
        item.route,
        item.status,
        delivered=True,
        first_at=first_at,
        sent_at=now,
        silence_id=previous.silence_id if previous else None,
        silenced_until=previous.silenced_until if previous else None,
        group_key=group_key,
        acked_at=previous.acked_at if previous and item.status == FIRING else None,
    )


def _retrying(
    item: Due,
    incident_id: int,
    result: DeliveryResult,
    first_at: float,
    attempts: int,
    next_attempt_at: float,
    group_key: str | None,
) -> NotificationRecord:
    previous = item.record
    return NotificationRecord(
        incident_id,
        item.route,
        item.status,
        delivered=False,
        first_at=first_at,
        sent_at=previous.sent_at if previous else None,
        attempts=attempts,
        next_attempt_at=next_attempt_at,
        last_error=result.reason or "not accepted",
        silence_id=previous.silence_id if previous else None,
        silenced_until=previous.silenced_until if previous else None,
        group_key=group_key if item.status == RESOLVED else None,
    )


def _log_given_up(
    item: Due, incident_id: int, result: DeliveryResult, waited_seconds: float, attempts: int
) -> None:
    rejected = result.outcome is Delivery.REJECTED
    log.warning(
        "%s notice of incident %s to %s %s (%d attempts): given up",
        item.status,
        incident_id,
        item.route,
        f"rejected: {result.reason}"
        if rejected
        else f"not accepted for {waited_seconds:.0f} s: {result.reason}",
        attempts,
    )
