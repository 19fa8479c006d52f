"""PagerDuty Events API v2: trigger, and resolve with the same ``dedup_key``.

The ``dedup_key`` is ``gpuwarden-<fingerprint>`` (stable across restarts, at most 255
characters), so every update of an incident lands on the same PagerDuty alert and its resolve
closes it. Routing keys come per service (``pagerduty:<service>``) from the config or the
environment and are never logged. Each event is sent once: 429 and 5xx (and network errors) come
back retryable, 400 rejected (the event is invalid and would stay so); the dispatcher decides
whether to try again. ``change_event`` sends the audit breadcrumbs PagerDuty shows next to
incidents.

Values from telemetry, jobs and alerts travel as JSON strings (the body is ``json.dumps`` of a
dict, never built as text), which PagerDuty shows as text. The ``links`` are only the URLs we
built (runbook, incident, dashboard, approval) and only ``http(s)``; no ``images`` are sent. A
URL an Alertmanager annotation carried stays a text in ``custom_details``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gpuwarden.collector.alerts.model import Alert, AlertStatus, DeliveryResult
from gpuwarden.collector.clients.http import HttpClient
from gpuwarden.collector.notify.answers import delivery

log = logging.getLogger(__name__)

EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
CHANGE_URL = "https://events.pagerduty.com/v2/change/enqueue"
SUMMARY_CHARS = 1024
DEDUP_CHARS = 255
_SEVERITY = {"page": "critical", "critical": "critical", "warning": "warning", "info": "info"}


def dedup_key(alert: Alert) -> str:
    """The stable PagerDuty key of the incident behind ``alert``."""
    return f"gpuwarden-{alert.fingerprint}"[:DEDUP_CHARS]


def _iso(unix_seconds: float) -> str:
    return datetime.fromtimestamp(unix_seconds, UTC).isoformat()


def _http(url: str) -> bool:
    """Only ``http(s)`` links (the URLs we build are; anything else is not ours)."""
    return url.startswith(("https://", "http://"))


def pagerduty_event(alert: Alert, routing_key: str, source: str) -> dict[str, Any]:
    """The Events v2 body: a trigger while firing; an acknowledge or a resolve (key only)."""
    if alert.status in (AlertStatus.RESOLVED, AlertStatus.ACKNOWLEDGED):
        action = "resolve" if alert.status is AlertStatus.RESOLVED else "acknowledge"
        return {"routing_key": routing_key, "event_action": action, "dedup_key": dedup_key(alert)}
    summary = f"[{alert.rule_id}] {alert.summary}"
    ours = [
        (alert.runbook_url, "Runbook"),
        (alert.incident_url, "Incident"),
        (alert.dashboard_url, "Dashboard"),
        *((a.approval_url, f"Approve {a.kind} {a.target}") for a in alert.actions),
    ]
    links = [{"href": url, "text": text} for url, text in ours if url and _http(url)]
    client_url = next(
        (url for url in (alert.incident_url, alert.runbook_url) if url and _http(url)), None
    )
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup_key(alert),
        "payload": {
            "summary": summary[: SUMMARY_CHARS - 1] + "…"
            if len(summary) > SUMMARY_CHARS
            else summary,
            "source": source,
            "severity": _SEVERITY.get(alert.severity, "error"),
            "timestamp": _iso(alert.starts_at),
            "component": alert.labels.get("node") or alert.labels.get("model") or alert.rule_id,
            "group": alert.team or "",
            "class": alert.rule_id,
            "custom_details": {
                **dict(alert.facts),
                "actions": [f"{a.kind} {a.target} ({a.mode}): {a.state}" for a in alert.actions],
            },
        },
        "links": links,
        "client": "gpuwarden",
        **({"client_url": client_url} if client_url else {}),
    }


class PagerDutyNotifier:
    """Sends alerts to PagerDuty services.

    Args:
        routing_keys: service (as in the route, ``pagerduty:<service>``) → integration key.
        events_url: the Events v2 endpoint (tests point it at a local server).
        change_url: the change-events endpoint (default: next to ``events_url``,
            ``.../v2/change/enqueue``).
        source: ``payload.source`` (this collector).
        timeout_seconds: connect and read timeout of each request.
        http: the shared HTTP client.
    """

    def __init__(
        self,
        routing_keys: Mapping[str, str],
        *,
        events_url: str = EVENTS_URL,
        change_url: str | None = None,
        source: str = "gpuwarden-collector",
        timeout_seconds: float = 10.0,
        http: HttpClient | None = None,
    ) -> None:
        if change_url is None:
            base = events_url.removesuffix("/v2/enqueue")
            change_url = CHANGE_URL if base == events_url else f"{base}/v2/change/enqueue"
        for url in (events_url, change_url):
            if not url.startswith(("https://", "http://")):
                raise ValueError("PagerDuty URLs must be http(s)")
        self._keys = dict(routing_keys)
        self._events_url = events_url
        self._change_url = change_url
        self._source = source
        self._timeout = timeout_seconds
        self._http = http or HttpClient()

    @property
    def name(self) -> str:
        """The route scheme."""
        return "pagerduty"

    def send(self, alert: Alert, route: str) -> DeliveryResult:
        """Trigger, acknowledge or resolve on the service ``route``, once."""
        key = self._keys.get(route)
        if not key:
            log.warning(
                "pagerduty: no routing key for service %s; %s not sent", route, alert.rule_id
            )
            return DeliveryResult.reject(f"no routing key for service {route}")
        return self._post(self._events_url, pagerduty_event(alert, key, self._source), route)

    def change_event(self, route: str, summary: str, details: Mapping[str, Any]) -> DeliveryResult:
        """A change event (the remediation audit's breadcrumb) on the service ``route``."""
        key = self._keys.get(route)
        if not key:
            return DeliveryResult.reject(f"no routing key for service {route}")
        body = {
            "routing_key": key,
            "payload": {
                "summary": summary[:SUMMARY_CHARS],
                "source": self._source,
                "timestamp": _iso(time.time()),
                "custom_details": dict(details),
            },
        }
        return self._post(self._change_url, body, route)

    def _post(self, url: str, body: Mapping[str, Any], route: str) -> DeliveryResult:
        answer = self._http.request(
            "POST",
            url,
            body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            timeout_seconds=self._timeout,
        )
        result = delivery(answer, accepted={202})
        if not result.delivered:
            log.warning("pagerduty: service %s: %s (%s)", route, result.reason, result.outcome)
        return result
