"""Incident alerts: each open incident fires once per route, is re-sent where the service wants
it, and resolves once; nothing is lost across failures or restarts.

Every pass compares the incidents with what each route was told (the ``notifications`` table)
and sends the difference:

- an open incident a route has not heard of: **firing** (its rule's routes plus the routing
  table's, by severity and team);
- a route that wants firing alerts re-sent (Alertmanager): again every ``resend_seconds``;
- an incident that resolved while a route knows it as firing: **resolved**, once;
- a push the service answered as retryable (no answer, 429, 5xx): retried on later passes with
  backoff (never sooner than its ``Retry-After``), for ``give_up_seconds``, then logged as lost;
  a push it rejected for good (400...): lost at once, with its reason. The dispatcher is the
  only place that retries: a notifier answers each push once;
- the remediator's pages (approval requests, escalations, the breaker), handed over through
  :meth:`AlertDispatcher.enqueue`: stored, then delivered and retried the same way;
- many new (or resolved) incidents of one rule in one pass on a chat route: one grouped message;
- while a real action on the incident settles: a silence of our own Alertmanager alert until
  its verification, expired when the incident resolves;
- a page whose incident a real action is working on: acknowledged, once;
- optionally, the real remediation audit as PagerDuty change events (:mod:`.audit_mirror`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from gpuwarden.collector.alerts.model import (
    Alert,
    AlertStatus,
    Delivery,
    DeliveryResult,
    Notifier,
    ProposedAction,
)
from gpuwarden.collector.alerts.redact import redact
from gpuwarden.collector.alerts.runbooks import UNKNOWN, Links
from gpuwarden.collector.notify.audit_mirror import AuditMirror, ChangeEvents
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.storage.base import NotificationRecord, PageRecord, Storage
from gpuwarden.collector.storage.records import Incident, IncidentState

log = logging.getLogger(__name__)

FIRING = "firing"
RESOLVED = "resolved"
LOST = "lost"
PENDING = "pending"
DELIVERED = "delivered"
GROUPED_SCHEMES = frozenset({"slack", "pagerduty"})
"""Routes where a flood of messages (or pages) is worse than one list. Alertmanager groups by
itself and needs each alert's own identity (silences, resolves)."""
GROUP_RESOLVED_SCHEMES = frozenset({"pagerduty"})
"""Routes where a grouped alert is one object that resolves when its last member does."""
_LABEL_KEYS = ("node", "gpu", "job", "model", "deployment", "team")
_GROUP_LINES = 9  # and a "more" line: Slack shows at most 10 fields
_MAX_BACKOFF = 300.0
_VERIFYING = "verifying"
ACK_SCHEMES = frozenset({"pagerduty"})
"""Paging routes whose alert is acknowledged once automation acts on the incident for real."""
_ACTING = frozenset({"executing", "verifying", "verified"})


@runtime_checkable
class Silencer(Protocol):
    """A notifier that can silence its own alert (Alertmanager)."""

    def silence(self, alert: Alert, route: str, *, until: float, comment: str) -> str | None:
        """Create a silence; its id, or None when the service refused."""
        ...

    def expire_silence(self, route: str, silence_id: str) -> bool:
        """End a silence early."""
        ...


@runtime_checkable
class BatchNotifier(Protocol):
    """A notifier whose service takes many alerts in one request."""

    def send_many(self, alerts: Sequence[Alert], route: str) -> DeliveryResult:
        """Deliver all of ``alerts`` to ``route`` in one request, once."""
        ...


BATCH = 500


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """What one pass did (``failed`` and ``lost`` count the remediator's pages too)."""

    sent: int = 0
    failed: int = 0
    grouped: int = 0
    lost: int = 0
    silenced: int = 0
    mirrored: int = 0
    acknowledged: int = 0
    paged: int = 0


@dataclass(frozen=True, slots=True)
class _Due:
    incident: Incident
    route: str
    status: str
    record: NotificationRecord | None
    resend: bool
    group_key: str | None = None  # resolving a grouped alert (its last member resolved)


def _fact(value: object) -> str | None:
    if value is None or isinstance(value, list | dict | tuple):
        return None  # plot points and nested structures are for the incident page
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class AlertDispatcher:
    """Keeps every route's view of the incidents in step with the store.

    Args:
        storage: incidents, actions and the notification state.
        rules: the loaded rules (routes, owner, severity).
        notifiers: by route scheme.
        settings: the ``alerting:`` section.
        links: runbook, incident and dashboard URLs.
        clock: wall clock.
    """

    def __init__(
        self,
        storage: Storage,
        rules: Iterable[Rule],
        notifiers: Mapping[str, Notifier],
        settings: AlertingSettings,
        links: Links,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._storage = storage
        self._rules = {rule.id: rule for rule in rules}
        self._notifiers = dict(notifiers)
        self._settings = settings
        self._links = links
        self._clock = clock
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._mirror: AuditMirror | None = None
        if settings.audit_change_events:
            service = settings.audit_change_events.partition(":")[2]
            pagerduty: object = self._notifiers.get("pagerduty")
            if isinstance(pagerduty, ChangeEvents):
                self._mirror = AuditMirror(storage, pagerduty, service)
            else:
                log.warning("audit_change_events: no PagerDuty notifier configured; not mirrored")

    # The pass -------------------------------------------------------------------------------

    def tick(self) -> DispatchResult:
        """One pass: fire, re-send, resolve, retry, silence."""
        with self._lock:
            now = self._clock()
            open_incidents = {
                i.incident_id: i
                for i in self._storage.incidents(state=IncidentState.OPEN)
                if i.incident_id is not None
            }
            silenced = self._silences(now, open_incidents, self._known())
            due = self._due(now, open_incidents, self._known())
            result = self._deliver(now, due)
            acked = self._acks(now, open_incidents)
            mirrored = self._mirror.tick() if self._mirror is not None else 0
            paged, failed, lost = self._deliver_pages(now)
        return replace(
            result,
            silenced=silenced,
            mirrored=mirrored,
            acknowledged=acked,
            paged=paged,
            failed=result.failed + failed,
            lost=result.lost + lost,
        )

    # The remediator's pages -----------------------------------------------------------------

    def enqueue(self, alert: Alert, routes: Sequence[str]) -> None:
        """Store ``alert`` for each route (the :class:`AlertOutbox` port of the remediator); the
        passes deliver it and retry what is not accepted, like incident alerts."""
        now = self._clock()
        body = alert_json(alert)
        for route in dict.fromkeys(routes):
            if self._notifier(route) is not None:
                self._storage.add_page(PageRecord(route=route, alert=body, created_at=now))

    def _deliver_pages(self, now: float) -> tuple[int, int, int]:
        """Send the pages that are due; (delivered, not delivered, given up)."""
        sent = failed = lost = 0
        for page in self._storage.pages(status=PENDING):
            if (page.next_attempt_at or 0.0) > now or self._notifier(page.route) is None:
                continue
            alert = alert_from_json(page.alert)
            result = self._send(alert, page.route)
            if result.delivered:
                # what was sent stays readable; its approval links (bearer tokens) do not
                kept = alert_json(_without_links(alert))
                self._storage.save_page(
                    replace(page, status=DELIVERED, sent_at=now, last_error=None, alert=kept)
                )
                sent += 1
                continue
            failed += 1
            attempts = page.attempts + 1
            if result.outcome is Delivery.REJECTED or (
                now - page.created_at >= self._settings.give_up_seconds
            ):
                log.warning(
                    "page %s (%s) to %s given up after %d attempts: %s",
                    page.page_id,
                    alert.rule_id,
                    page.route,
                    attempts,
                    result.reason,
                )
                kept = alert_json(_without_links(alert))
                self._storage.save_page(
                    replace(
                        page, status=LOST, attempts=attempts, last_error=result.reason, alert=kept
                    )
                )
                lost += 1
                continue
            self._storage.save_page(
                replace(
                    page,
                    attempts=attempts,
                    next_attempt_at=now + self._wait(attempts, result),
                    last_error=result.reason or "not accepted",
                )
            )
        return sent, failed, lost

    def _known(self) -> dict[tuple[int, str], NotificationRecord]:
        """Every route's firing (or given-up) state, and the resolves not delivered yet."""
        return {
            (r.incident_id, r.route): r
            for status in (FIRING, LOST, RESOLVED)
            for r in self._storage.notifications(status=status)
            if status != RESOLVED or not r.delivered
        }

    def routes(self, incident: Incident) -> tuple[str, ...]:
        """Where alerts about ``incident`` go: its rule's routes, then the routing table's."""
        rule = self._rules.get(incident.rule_id)
        own = rule.routes if rule else ()
        extra = self._settings.routes_for(incident.severity, rule.owner if rule else None)
        return tuple(dict.fromkeys((*own, *extra)))

    def _due(
        self,
        now: float,
        open_incidents: Mapping[int, Incident],
        known: Mapping[tuple[int, str], NotificationRecord],
    ) -> list[_Due]:
        due: list[_Due] = []
        for incident_id, incident in open_incidents.items():
            for route in self.routes(incident):
                notifier = self._notifier(route)
                if notifier is None:
                    continue
                record = known.get((incident_id, route))
                if record is not None and record.status == LOST:
                    continue  # given up on: logged once, not retried forever
                if record is None or record.status != FIRING:
                    due.append(_Due(incident, route, FIRING, None, resend=False))
                elif not record.delivered:
                    if (record.next_attempt_at or 0.0) <= now:
                        due.append(_Due(incident, route, FIRING, record, resend=False))
                elif getattr(notifier, "resends", False) and (
                    now - (record.sent_at or 0.0) >= self._settings.resend_seconds
                ):
                    due.append(_Due(incident, route, FIRING, record, resend=True))
        return due + self._due_resolved(now, open_incidents, known)

    def _due_resolved(
        self,
        now: float,
        open_incidents: Mapping[int, Incident],
        known: Mapping[tuple[int, str], NotificationRecord],
    ) -> list[_Due]:
        due: list[_Due] = []
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
            if record.status == LOST or (record.status == FIRING and not record.delivered):
                # never told it was firing and it is over: nothing to resolve
                self._storage.save_notification(
                    replace(record, status=RESOLVED, delivered=True, last_error=None)
                )
                continue
            if record.status == RESOLVED and (record.next_attempt_at or 0.0) > now:
                continue
            stored = self._storage.incident(incident_id)
            if stored is None or self._notifier(route) is None:
                continue
            fresh = record if record.status == RESOLVED else None
            group = record.group_key if grouped else None
            due.append(_Due(stored, route, RESOLVED, fresh, resend=False, group_key=group))
        return due

    def _notifier(self, route: str) -> Notifier | None:
        scheme = route.partition(":")[0]
        notifier = self._notifiers.get(scheme)
        if notifier is None and scheme not in self._warned:
            self._warned.add(scheme)
            log.warning("no notifier configured for route scheme %r: alerts not sent", scheme)
        return notifier

    # Delivery -------------------------------------------------------------------------------

    def _deliver(self, now: float, due: Sequence[_Due]) -> DispatchResult:
        sent = failed = grouped = lost = 0
        groups: dict[tuple[str, str, str], list[_Due]] = {}
        for item in due:
            scheme = item.route.partition(":")[0]
            if scheme in GROUPED_SCHEMES and not item.resend and item.group_key is None:
                groups.setdefault((item.route, item.incident.rule_id, item.status), []).append(item)
        in_groups: set[int] = set()
        for (route, rule_id, status), items in groups.items():
            if len(items) < self._settings.group_threshold:
                continue
            alert = self._group_alert(rule_id, status, items, now)
            result = self._send(alert, route)
            for item in items:
                lost += self._record(item, result, now, group_key=alert.fingerprint)
                in_groups.add(id(item))
            ok = result.delivered
            sent, failed, grouped = sent + ok, failed + (not ok), grouped + 1
        singles = [item for item in due if id(item) not in in_groups]
        batched = self._deliver_batches(now, singles)
        for item in singles:
            if id(item) in batched:
                result = batched[id(item)]
                lost += self._record(item, result, now)
                sent, failed = sent + result.delivered, failed + (not result.delivered)
        group_resolves: dict[tuple[str, str], DeliveryResult] = {}
        for item in (item for item in singles if id(item) not in batched):
            if item.group_key is not None and (item.group_key, item.route) in group_resolves:
                lost += self._record(item, group_resolves[(item.group_key, item.route)], now)
                continue  # the group's resolve went out for another member this pass
            if item.group_key is not None:
                alert = self._group_resolved(item.incident, item.group_key, now)
            else:
                alert = self._alert(item.incident, item.status, now)
            result = self._send(alert, item.route)
            if item.group_key is not None:
                group_resolves[(item.group_key, item.route)] = result
            lost += self._record(item, result, now)
            sent, failed = sent + result.delivered, failed + (not result.delivered)
        return DispatchResult(sent=sent, failed=failed, grouped=grouped, lost=lost)

    def _deliver_batches(self, now: float, items: Sequence[_Due]) -> dict[int, DeliveryResult]:
        """Routes whose service takes many alerts in one request (Alertmanager): one request per
        ``BATCH`` alerts instead of one each (a re-send of every firing alert each minute)."""
        by_route: dict[str, list[_Due]] = {}
        for item in items:
            candidate: object = self._notifiers.get(item.route.partition(":")[0])
            if isinstance(candidate, BatchNotifier) and item.group_key is None:
                by_route.setdefault(item.route, []).append(item)
        out: dict[int, DeliveryResult] = {}
        for route, queued in by_route.items():
            scheme, _, where = route.partition(":")
            notifier: object = self._notifiers[scheme]
            assert isinstance(notifier, BatchNotifier)  # noqa: S101 - selected just above
            for start in range(0, len(queued), BATCH):
                chunk = queued[start : start + BATCH]
                alerts = [self._alert(i.incident, i.status, now) for i in chunk]
                try:
                    result = notifier.send_many(alerts, where)
                except Exception as exc:  # a notifier bug must not stop the others; retried
                    log.exception("notifier %s failed for %d alerts", scheme, len(alerts))
                    result = DeliveryResult.retry(f"notifier error: {type(exc).__name__}")
                out.update(dict.fromkeys((id(i) for i in chunk), result))
        return out

    def _send(self, alert: Alert, route: str) -> DeliveryResult:
        scheme, _, where = route.partition(":")
        notifier = self._notifiers[scheme]
        try:
            return notifier.send(alert, where)
        except Exception as exc:  # a notifier bug must not stop the others; retried next pass
            log.exception("notifier %s failed for %s", scheme, alert.rule_id)
            return DeliveryResult.retry(f"notifier error: {type(exc).__name__}")

    def _wait(self, attempts: int, result: DeliveryResult) -> float:
        """Backoff before the next try: doubling from the pass interval, never sooner than the
        service's ``Retry-After``."""
        backoff = min(_MAX_BACKOFF, self._settings.interval_seconds * 2.0 ** (attempts - 1))
        return max(backoff, result.retry_after_seconds or 0.0)

    def _record(
        self, item: _Due, result: DeliveryResult, now: float, *, group_key: str | None = None
    ) -> int:
        """Save the route's new state; 1 when the notice is given up as lost."""
        incident_id = item.incident.incident_id
        assert incident_id is not None  # noqa: S101 - only stored incidents are dispatched
        previous = item.record
        first_at = previous.first_at if previous is not None else now
        group_key = group_key or item.group_key or (previous.group_key if previous else None)
        if result.delivered:
            record = NotificationRecord(
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
            self._storage.save_notification(record)
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
            log.warning(
                "%s notice of incident %s to %s %s (%d attempts): given up",
                item.status,
                incident_id,
                item.route,
                f"rejected: {result.reason}"
                if rejected
                else f"not accepted for {now - first_at:.0f} s: {result.reason}",
                attempts,
            )
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
        record = NotificationRecord(
            incident_id,
            item.route,
            item.status,
            delivered=False,
            first_at=first_at,
            sent_at=previous.sent_at if previous else None,
            attempts=attempts,
            next_attempt_at=now + self._wait(attempts, result),
            last_error=result.reason or "not accepted",
            silence_id=previous.silence_id if previous else None,
            silenced_until=previous.silenced_until if previous else None,
            group_key=group_key if item.status == RESOLVED else None,
        )
        self._storage.save_notification(record)
        return 0

    # Messages -------------------------------------------------------------------------------

    def _alert(self, incident: Incident, status: str, now: float) -> Alert:
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

    def _group_alert(self, rule_id: str, status: str, items: Sequence[_Due], now: float) -> Alert:
        rule = self._rules.get(rule_id)
        resolved = status == RESOLVED
        first = items[0].incident
        lines: dict[str, str] = {}
        for item in items[:_GROUP_LINES]:
            ev: Mapping[str, Any] = item.incident.evidence
            subject = str(ev.get("subject") or item.incident.fingerprint)
            lines[f"#{item.incident.incident_id} {subject}"] = str(ev.get("summary") or "")[:200]
        if len(items) > _GROUP_LINES:
            lines["…"] = f"and {len(items) - _GROUP_LINES} more"
        verb = "resolved" if resolved else "open"
        return Alert(
            fingerprint=f"group-{rule_id}-{status}-{int(now)}",
            rule_id=rule_id,
            status=AlertStatus.RESOLVED if resolved else AlertStatus.FIRING,
            severity=first.severity,
            summary=f"{len(items)} incidents {verb}",
            starts_at=min(i.incident.first_seen for i in items),
            ends_at=now if resolved else None,
            runbook_url=self._links.runbook_url(rule_id),
            team=rule.owner if rule else None,
            incident_url=f"{self._links.base_url}/status",
            facts=lines,
        )

    def _group_resolved(self, last: Incident, group_key: str, now: float) -> Alert:
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

    # Acknowledgements -----------------------------------------------------------------------

    def _acks(self, now: float, open_incidents: Mapping[int, Incident]) -> int:
        """Acknowledge a page once a real action runs on its incident: automation is on it."""
        done = 0
        for record in self._storage.notifications(status=FIRING, delivered=True):
            scheme = record.route.partition(":")[0]
            if scheme not in ACK_SCHEMES or record.acked_at is not None or record.group_key:
                continue
            incident = open_incidents.get(record.incident_id)
            if incident is None or not any(
                not row.dry_run and row.state in _ACTING
                for row in self._storage.actions(incident_id=record.incident_id)
            ):
                continue
            alert = replace(self._alert(incident, FIRING, now), status=AlertStatus.ACKNOWLEDGED)
            if self._send(alert, record.route).delivered:
                self._storage.save_notification(replace(record, acked_at=now))
                done += 1
        return done

    # Silences -------------------------------------------------------------------------------

    def _silences(
        self,
        now: float,
        open_incidents: Mapping[int, Incident],
        known: Mapping[tuple[int, str], NotificationRecord],
    ) -> int:
        """Silence our Alertmanager alert while a real action settles; lift it when resolved."""
        done = 0
        for (incident_id, route), record in known.items():
            notifier: object = self._notifiers.get(route.partition(":")[0])
            if not isinstance(notifier, Silencer) or not record.delivered:
                continue
            where = route.partition(":")[2]
            incident = open_incidents.get(incident_id)
            if incident is None:
                if record.silence_id and (record.silenced_until or 0.0) > now:
                    notifier.expire_silence(where, record.silence_id)
                    self._storage.save_notification(replace(record, silence_id=None))
                continue
            if not self._settings.silence_while_settling:
                continue
            settling = [
                row
                for row in self._storage.actions(incident_id=incident_id)
                if row.state == _VERIFYING and not row.dry_run and (row.verify_at or 0.0) > now
            ]
            if not settling:
                continue
            until = max(row.verify_at or 0.0 for row in settling)
            if (record.silenced_until or 0.0) >= until:
                continue
            row = settling[0]
            comment = (
                f"gpuwarden: {row.action} {row.target} (action {row.action_id}) is settling; "
                f"verification at {time.strftime('%H:%M:%SZ', time.gmtime(until))}"
            )
            alert = self._alert(incident, FIRING, now)
            silence_id = notifier.silence(alert, where, until=until, comment=comment)
            if silence_id is not None:
                self._storage.save_notification(
                    replace(record, silence_id=silence_id, silenced_until=until)
                )
                done += 1
        return done


# Alerts as JSON (the pages table) --------------------------------------------------------------


def alert_json(alert: Alert) -> dict[str, Any]:
    """``alert`` as a JSON object (:func:`alert_from_json` reads it back)."""
    return {
        "fingerprint": alert.fingerprint,
        "rule_id": alert.rule_id,
        "status": str(alert.status),
        "severity": alert.severity,
        "summary": alert.summary,
        "starts_at": alert.starts_at,
        "runbook_url": alert.runbook_url,
        "ends_at": alert.ends_at,
        "team": alert.team,
        "incident_url": alert.incident_url,
        "dashboard_url": alert.dashboard_url,
        "labels": dict(alert.labels),
        "facts": dict(alert.facts),
        "actions": [
            {
                "kind": a.kind,
                "target": a.target,
                "mode": a.mode,
                "state": a.state,
                "approval_url": a.approval_url,
            }
            for a in alert.actions
        ],
    }


def alert_from_json(data: Mapping[str, Any]) -> Alert:
    """The alert :func:`alert_json` wrote."""
    return Alert(
        fingerprint=str(data["fingerprint"]),
        rule_id=str(data["rule_id"]),
        status=AlertStatus(data["status"]),
        severity=str(data["severity"]),
        summary=str(data["summary"]),
        starts_at=float(data["starts_at"]),
        runbook_url=str(data["runbook_url"]),
        ends_at=None if data.get("ends_at") is None else float(data["ends_at"]),
        team=data.get("team"),
        incident_url=data.get("incident_url"),
        dashboard_url=data.get("dashboard_url"),
        labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
        facts={str(k): str(v) for k, v in (data.get("facts") or {}).items()},
        actions=tuple(
            ProposedAction(
                kind=str(a["kind"]),
                target=str(a["target"]),
                mode=str(a["mode"]),
                state=str(a["state"]),
                approval_url=a.get("approval_url"),
            )
            for a in data.get("actions") or ()
        ),
    )


def _without_links(alert: Alert) -> Alert:
    return replace(alert, actions=tuple(replace(a, approval_url=None) for a in alert.actions))
