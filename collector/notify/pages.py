"""The remediator's pages (approval requests, escalations, the breaker): stored by
:meth:`PageOutbox.enqueue` (the remediator's :class:`AlertOutbox`), then delivered by the
dispatcher's passes and retried like incident alerts (the ``pages`` table)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpuwarden.collector.alerts.model import Alert, AlertStatus, Delivery, ProposedAction
from gpuwarden.collector.notify.notices import LOST, backoff_seconds
from gpuwarden.collector.notify.senders import Senders
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.storage.base import PageRecord, Storage

# The dispatcher's log lines keep the logger name they have always had (operators filter on it).
log = logging.getLogger("gpuwarden.collector.notify.dispatcher")

PENDING = "pending"
DELIVERED = "delivered"


class PageOutbox:
    """Stores pages and delivers the ones that are due.

    Args:
        storage: the ``pages`` table.
        settings: the ``alerting:`` section (give-up, backoff).
        senders: the notifiers (a page for a route without one waits).
        clock: wall clock.
    """

    def __init__(
        self,
        storage: Storage,
        settings: AlertingSettings,
        senders: Senders,
        clock: Callable[[], float],
    ) -> None:
        self._storage = storage
        self._settings = settings
        self._senders = senders
        self._clock = clock

    def enqueue(self, alert: Alert, routes: Sequence[str]) -> None:
        """Store ``alert`` for each route that has a notifier."""
        now = self._clock()
        body = alert_json(alert)
        for route in dict.fromkeys(routes):
            if self._senders.get(route) is not None:
                self._storage.add_page(PageRecord(route=route, alert=body, created_at=now))

    def deliver(self, now: float) -> tuple[int, int, int]:
        """Send the pages that are due; (delivered, not delivered, given up)."""
        sent = failed = lost = 0
        for page in self._storage.pages(status=PENDING):
            if (page.next_attempt_at or 0.0) > now or self._senders.get(page.route) is None:
                continue
            alert = alert_from_json(page.alert)
            result = self._senders.send(alert, page.route)
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
            wait = backoff_seconds(self._settings.interval_seconds, attempts, result)
            self._storage.save_page(
                replace(
                    page,
                    attempts=attempts,
                    next_attempt_at=now + wait,
                    last_error=result.reason or "not accepted",
                )
            )
        return sent, failed, lost


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
