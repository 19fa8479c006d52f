"""Alertmanager (API v2): push incidents as alerts, resolve them, silence them while an action
settles.

An incident is one Alertmanager alert whose identity is its label set: ``alertname`` (the rule
id), ``gpuwarden_fingerprint`` (the incident's stable fingerprint), ``severity``, ``team`` and
the routing labels (node, job, model...). Alertmanager expects firing alerts to be re-sent at
regular intervals; each push carries ``endsAt = now + hold``, so if the collector stops
re-sending (it died), Alertmanager resolves the alert by itself instead of keeping it forever.
A resolved incident is pushed with the same labels and ``endsAt`` at its resolve time.

Routes are ``alertmanager:<name>``, each name mapping to a base URL in the config. Each push is
sent once: 5xx and network errors come back retryable, 400 (the alert is invalid) rejected; the
dispatcher decides whether to try again.

Labels and annotations are JSON strings (``json.dumps``), exactly as received: labels are the
alert's identity and must not change. Alertmanager's own templates do not escape them for
Slack; a receiver there should escape ``&``, ``<``, ``>`` in its templates (docs/security.md).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from gpuwarden.collector.alerts.model import FINGERPRINT_LABEL, Alert, AlertStatus, DeliveryResult
from gpuwarden.collector.clients.http import HttpClient, HttpResult
from gpuwarden.collector.notify.answers import delivery

log = logging.getLogger(__name__)

_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")
_VALUE_CHARS = 1024
_ANNOTATION_CHARS = 8192


def _iso(unix_seconds: float) -> str:
    return datetime.fromtimestamp(unix_seconds, UTC).isoformat(timespec="milliseconds")


def _label(name: str) -> str:
    """A Prometheus label name: ``[a-zA-Z_][a-zA-Z0-9_]*``."""
    cleaned = _LABEL_NAME.sub("_", name)
    return cleaned if cleaned and not cleaned[0].isdigit() else f"_{cleaned}"


def alert_labels(alert: Alert) -> dict[str, str]:
    """The alert's identity in Alertmanager (the same for firing and resolved pushes)."""
    labels = {_label(k): v[:_VALUE_CHARS] for k, v in alert.labels.items() if v}
    labels |= {
        "alertname": alert.rule_id,
        FINGERPRINT_LABEL: alert.fingerprint,
        "severity": alert.severity,
        "source": "gpuwarden",
    }
    if alert.team:
        labels["team"] = alert.team
    return labels


def postable_alert(alert: Alert, *, now: float, hold_seconds: float) -> dict[str, Any]:
    """One ``postableAlert`` of ``POST /api/v2/alerts``."""
    facts = "\n".join(f"{k}: {v}" for k, v in alert.facts.items())
    actions = "\n".join(f"{a.kind} {a.target} ({a.mode}): {a.state}" for a in alert.actions)
    annotations = {
        "summary": alert.summary,
        "description": "\n".join(part for part in (facts, actions) if part),
        "runbook_url": alert.runbook_url,
        "incident_url": alert.incident_url or "",
        "dashboard_url": alert.dashboard_url or "",
    }
    if alert.status is AlertStatus.RESOLVED:
        ends = alert.ends_at if alert.ends_at is not None else now
        ends = min(ends, now)  # an end in the future would keep it firing
    else:
        ends = now + hold_seconds
    body: dict[str, Any] = {
        "labels": alert_labels(alert),
        "annotations": {k: v[:_ANNOTATION_CHARS] for k, v in annotations.items() if v},
        "startsAt": _iso(min(alert.starts_at, ends)),
        "endsAt": _iso(ends),
    }
    if alert.incident_url:
        body["generatorURL"] = alert.incident_url
    return body


class AlertmanagerNotifier:
    """Pushes alerts to Alertmanagers and manages silences of our own alerts.

    Args:
        urls: name (as in the route, ``alertmanager:<name>``) → base URL (``http://am:9093``).
        hold_seconds: ``endsAt`` of a firing push is now + this; re-send faster than that.
        timeout_seconds: connect and read timeout of each request.
        clock: wall clock.
        http: the shared HTTP client.
    """

    def __init__(
        self,
        urls: Mapping[str, str],
        *,
        hold_seconds: float = 300.0,
        timeout_seconds: float = 10.0,
        clock: Callable[[], float] = time.time,
        http: HttpClient | None = None,
    ) -> None:
        for name, url in urls.items():
            if not url.startswith(("https://", "http://")):
                raise ValueError(f"alertmanager {name}: the URL must be http(s)")
        self._urls = {name: url.rstrip("/") for name, url in urls.items()}
        self._hold = hold_seconds
        self._timeout = timeout_seconds
        self._clock = clock
        self._http = http or HttpClient()

    @property
    def name(self) -> str:
        """The route scheme."""
        return "alertmanager"

    @property
    def resends(self) -> bool:
        """Firing alerts must be pushed again before ``hold_seconds`` run out."""
        return True

    def send(self, alert: Alert, route: str) -> DeliveryResult:
        """Push ``alert`` (firing or resolved) to the Alertmanager ``route``."""
        return self.send_many([alert], route)

    def send_many(self, alerts: Sequence[Alert], route: str) -> DeliveryResult:
        """Push several alerts in one ``POST /api/v2/alerts`` (the body is an array)."""
        base = self._urls.get(route)
        if base is None:
            log.warning("alertmanager: no URL for %r; %d alerts not sent", route, len(alerts))
            return DeliveryResult.reject(f"no URL for alertmanager {route}")
        now = self._clock()
        body = [postable_alert(alert, now=now, hold_seconds=self._hold) for alert in alerts]
        answer = self._request("POST", f"{base}/api/v2/alerts", body, route)
        return delivery(answer, accepted={200})

    def silence(self, alert: Alert, route: str, *, until: float, comment: str) -> str | None:
        """Silence ``alert`` (matched by its fingerprint label) until ``until``; the silence id."""
        base = self._urls.get(route)
        if base is None:
            return None
        now = self._clock()
        body = {
            "matchers": [
                {"name": "alertname", "value": alert.rule_id, "isRegex": False, "isEqual": True},
                {
                    "name": FINGERPRINT_LABEL,
                    "value": alert.fingerprint,
                    "isRegex": False,
                    "isEqual": True,
                },
            ],
            "startsAt": _iso(now),
            "endsAt": _iso(max(until, now + 60.0)),
            "createdBy": "gpuwarden-remediator",
            "comment": comment[:_ANNOTATION_CHARS],
        }
        reply = self._request("POST", f"{base}/api/v2/silences", body, route)
        answer = _json(reply.body) if reply.status == 200 else None
        if not isinstance(answer, dict):
            return None
        silence_id = answer.get("silenceID")
        return str(silence_id) if silence_id else None

    def expire_silence(self, route: str, silence_id: str) -> bool:
        """End a silence early (the action settled); an unknown or expired one is fine."""
        base = self._urls.get(route)
        if base is None:
            return False
        url = f"{base}/api/v2/silence/{quote(silence_id, safe='')}"
        return self._request("DELETE", url, None, route).status in (200, 404)

    def _request(self, method: str, url: str, body: object, route: str) -> HttpResult:
        """One request, no retry; a refusal or no answer is logged."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        answer = self._http.request(
            method, url, body=data, headers=headers, timeout_seconds=self._timeout
        )
        if not answer.ok and not (method == "DELETE" and answer.status == 404):
            log.warning(
                "alertmanager %s: %s %s: HTTP %s %s: %s",
                route,
                method,
                url.rsplit("/api/", 1)[-1],
                answer.status,
                answer.detail,
                answer.body[:200].decode("utf-8", "replace"),
            )
        return answer


def _json(raw: bytes) -> object:
    try:
        return json.loads(raw) if raw.strip() else None
    except ValueError:
        return None
