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
- while an operator's silence (``/v1/silences``) matches an open incident: its firing notices
  are not sent but recorded as ``suppressed`` with the silence's id, and re-sends to routes that
  already know it fires pause; when the silence ends and the incident is still open, the firing
  notice goes out, once. A resolve of what a route was told before the silence still goes out
  (a page must not stay open forever); a held notice whose incident resolves is dropped;
- while a real action on the incident settles: a silence of our own Alertmanager alert until
  its verification, expired when the incident resolves;
- a page whose incident a real action is working on: acknowledged, once;
- optionally, the real remediation audit as PagerDuty change events (:mod:`.audit_mirror`).

The dispatcher runs the pass; the work is in modules of one job each: :mod:`.notices` (what each
route was told, what is due, each answer recorded with backoff), :mod:`.incident_alerts` (the
alerts built from incidents), :mod:`.pages` (the remediator's stored pages), :mod:`.silences`
(Alertmanager silences) and :mod:`.senders` (the one call into a notifier).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuwarden.collector.alerts.model import Alert, AlertStatus, DeliveryResult, Notifier
from gpuwarden.collector.alerts.runbooks import Links
from gpuwarden.collector.alerts.silencing import holding
from gpuwarden.collector.notify.audit_mirror import AuditMirror, ChangeEvents
from gpuwarden.collector.notify.incident_alerts import IncidentAlerts
from gpuwarden.collector.notify.notices import FIRING, Due, Notices
from gpuwarden.collector.notify.pages import PageOutbox
from gpuwarden.collector.notify.senders import BatchNotifier, Senders
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.notify.silences import Silences
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.storage.base import NotificationRecord, Storage
from gpuwarden.collector.storage.records import Incident, IncidentState

log = logging.getLogger(__name__)

GROUPED_SCHEMES = frozenset({"slack", "pagerduty"})
"""Routes where a flood of messages (or pages) is worse than one list. Alertmanager groups by
itself and needs each alert's own identity (silences, resolves)."""
ACK_SCHEMES = frozenset({"pagerduty"})
"""Paging routes whose alert is acknowledged once automation acts on the incident for real."""
_ACTING = frozenset({"executing", "verifying", "verified"})
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
    suppressed: int = 0
    """Firing notices newly held by an operator's silence."""


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
        self._links = links
        self._settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._senders = Senders(notifiers)
        self._alerts = IncidentAlerts(storage, self._rules.values(), links)
        self._notices = Notices(storage, settings, self._senders, self.routes)
        self._pages = PageOutbox(storage, settings, self._senders, clock)
        self._silences = Silences(storage, settings, self._senders, self._alerts)
        self._mirror: AuditMirror | None = None
        if settings.audit_change_events:
            service = settings.audit_change_events.partition(":")[2]
            pagerduty = self._senders.peek("pagerduty")
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
            silenced = self._silences.tick(now, open_incidents, self._notices.known())
            known = self._notices.known()
            due, suppressed = self._hold(now, self._notices.due(now, open_incidents, known), known)
            result = self._deliver(now, due)
            acked = self._acks(now, open_incidents)
            mirrored = self._mirror.tick() if self._mirror is not None else 0
            paged, failed, lost = self._pages.deliver(now)
        return replace(
            result,
            silenced=silenced,
            mirrored=mirrored,
            acknowledged=acked,
            paged=paged,
            suppressed=suppressed,
            failed=result.failed + failed,
            lost=result.lost + lost,
        )

    def send_only_while(self, leading: Callable[[], bool]) -> None:
        """Push nothing unless ``leading()`` holds right before the push (active/standby)."""
        self._senders.leading = leading

    def replace_rules(self, rules: Iterable[Rule]) -> None:
        """Route and describe incidents by ``rules`` from the next pass on (an admin reload)."""
        with self._lock:
            self._rules = {rule.id: rule for rule in rules}
            self._alerts = IncidentAlerts(self._storage, self._rules.values(), self._links)
            self._silences = Silences(self._storage, self._settings, self._senders, self._alerts)

    def enqueue(self, alert: Alert, routes: Sequence[str]) -> None:
        """Store ``alert`` for each route (the :class:`AlertOutbox` port of the remediator); the
        passes deliver it and retry what is not accepted, like incident alerts."""
        self._pages.enqueue(alert, routes)

    def routes(self, incident: Incident) -> tuple[str, ...]:
        """Where alerts about ``incident`` go: its rule's routes, then the routing table's."""
        rule = self._rules.get(incident.rule_id)
        own = rule.routes if rule else ()
        extra = self._settings.routes_for(incident.severity, rule.owner if rule else None)
        return tuple(dict.fromkeys((*own, *extra)))

    # Operators' silences --------------------------------------------------------------------

    def _hold(
        self,
        now: float,
        due: Sequence[Due],
        known: Mapping[tuple[int, str], NotificationRecord],
    ) -> tuple[list[Due], int]:
        """The notices to send: firing ones an active silence matches are recorded as
        suppressed instead, and re-sends of them wait; the count of newly held notices."""
        silences = [s for s in self._storage.silences(ending_after=now) if s.active(now)]
        if not silences:
            return list(due), 0
        send: list[Due] = []
        held = 0
        for item in due:
            rule = self._rules.get(item.incident.rule_id)
            silence = (
                holding(silences, item.incident, rule.owner if rule else None, now)
                if item.status == FIRING
                else None
            )
            if silence is None:
                send.append(item)
            elif not item.resend:
                key = (item.incident.incident_id or 0, item.route)
                held += self._notices.suppress(item, silence, now, known.get(key))
        return send, held

    # Delivery -------------------------------------------------------------------------------

    def _deliver(self, now: float, due: Sequence[Due]) -> DispatchResult:
        sent = failed = grouped = lost = 0
        groups: dict[tuple[str, str, str], list[Due]] = {}
        for item in due:
            scheme = item.route.partition(":")[0]
            if scheme in GROUPED_SCHEMES and not item.resend and item.group_key is None:
                groups.setdefault((item.route, item.incident.rule_id, item.status), []).append(item)
        in_groups: set[int] = set()
        for (route, rule_id, status), items in groups.items():
            if len(items) < self._settings.group_threshold:
                continue
            alert = self._alerts.group(rule_id, status, [i.incident for i in items], now)
            result = self._senders.send(alert, route)
            for item in items:
                lost += self._notices.record(item, result, now, group_key=alert.fingerprint)
                in_groups.add(id(item))
            ok = result.delivered
            sent, failed, grouped = sent + ok, failed + (not ok), grouped + 1
        singles = [item for item in due if id(item) not in in_groups]
        batched = self._deliver_batches(now, singles)
        for item in singles:
            if id(item) in batched:
                result = batched[id(item)]
                lost += self._notices.record(item, result, now)
                sent, failed = sent + result.delivered, failed + (not result.delivered)
        group_resolves: dict[tuple[str, str], DeliveryResult] = {}
        for item in (item for item in singles if id(item) not in batched):
            if item.group_key is not None and (item.group_key, item.route) in group_resolves:
                lost += self._notices.record(
                    item, group_resolves[(item.group_key, item.route)], now
                )
                continue  # the group's resolve went out for another member this pass
            if item.group_key is not None:
                alert = self._alerts.group_resolved(item.incident, item.group_key, now)
            else:
                alert = self._alerts.incident(item.incident, item.status, now)
            result = self._senders.send(alert, item.route)
            if item.group_key is not None:
                group_resolves[(item.group_key, item.route)] = result
            lost += self._notices.record(item, result, now)
            sent, failed = sent + result.delivered, failed + (not result.delivered)
        return DispatchResult(sent=sent, failed=failed, grouped=grouped, lost=lost)

    def _deliver_batches(self, now: float, items: Sequence[Due]) -> dict[int, DeliveryResult]:
        """Routes whose service takes many alerts in one request (Alertmanager): one request per
        ``BATCH`` alerts instead of one each (a re-send of every firing alert each minute)."""
        by_route: dict[str, list[Due]] = {}
        for item in items:
            candidate = self._senders.peek(item.route)
            if isinstance(candidate, BatchNotifier) and item.group_key is None:
                by_route.setdefault(item.route, []).append(item)
        out: dict[int, DeliveryResult] = {}
        for route, queued in by_route.items():
            notifier = self._senders.peek(route)
            assert isinstance(notifier, BatchNotifier)  # noqa: S101 - selected just above
            for start in range(0, len(queued), BATCH):
                chunk = queued[start : start + BATCH]
                alerts = [self._alerts.incident(i.incident, i.status, now) for i in chunk]
                result = self._senders.send_many(notifier, alerts, route)
                out.update(dict.fromkeys((id(i) for i in chunk), result))
        return out

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
            alert = self._alerts.incident(incident, FIRING, now)
            alert = replace(alert, status=AlertStatus.ACKNOWLEDGED)
            if self._senders.send(alert, record.route).delivered:
                self._storage.save_notification(replace(record, acked_at=now))
                done += 1
        return done
