"""Alerts to a generic webhook (``webhook:<name>``), signed like the webhook action.

The body is one alert as JSON (``event: "alert"``, status, fingerprint, rule, severity,
summary, runbook and incident URLs, labels, facts, actions). The headers are the webhook
action's: ``X-Gpuwarden-Timestamp``, ``X-Gpuwarden-Signature`` (``sha256=`` HMAC-SHA256 of
``<timestamp>.<body>`` with the endpoint's secret) and ``Idempotency-Key``
(``<fingerprint>:<status>``), so a receiver verifies, refuses replays and drops repeats.
Each alert is posted once: 429, 425, 408 and 5xx (and no answer) come back retryable, any other
4xx rejected; the dispatcher decides whether to try again.

Values from telemetry, jobs and alerts are JSON strings (``json.dumps`` of a dict, never text
built by hand), exactly as received: escaping them for a page or a chat is the receiver's
job, for its own output format.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpuwarden.collector.alerts.model import Alert, DeliveryResult
from gpuwarden.collector.alerts.signing import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Sender,
    Webhook,
    http_sender,
    signature,
)
from gpuwarden.collector.clients.http import HttpClient, HttpResult
from gpuwarden.collector.notify.answers import delivery

log = logging.getLogger(__name__)


def alert_body(alert: Alert) -> dict[str, Any]:
    """The JSON an endpoint receives for ``alert``."""
    return {
        "event": "alert",
        "status": str(alert.status),
        "fingerprint": alert.fingerprint,
        "rule": alert.rule_id,
        "severity": alert.severity,
        "team": alert.team,
        "summary": alert.summary,
        "starts_at": alert.starts_at,
        "ends_at": alert.ends_at,
        "runbook_url": alert.runbook_url,
        "incident_url": alert.incident_url,
        "dashboard_url": alert.dashboard_url,
        "labels": dict(alert.labels),
        "facts": dict(alert.facts),
        "actions": [
            {"kind": a.kind, "target": a.target, "mode": a.mode, "state": a.state}
            for a in alert.actions
        ],
    }


class WebhookNotifier:
    """Posts alerts to the configured webhooks.

    Args:
        webhooks: the endpoints (secrets loaded at start-up, never logged).
        clock: Unix seconds, for the signed timestamp.
        http: the shared HTTP client (default: one of its own).
        sender: the HTTP seam (default: a POST through ``http``).
    """

    def __init__(
        self,
        webhooks: Iterable[Webhook],
        *,
        clock: Callable[[], float] = time.time,
        http: HttpClient | None = None,
        sender: Sender | None = None,
    ) -> None:
        self._webhooks = {webhook.name: webhook for webhook in webhooks}
        self._clock = clock
        self._sender = sender or http_sender(http or HttpClient())

    @property
    def name(self) -> str:
        """The route scheme."""
        return "webhook"

    def send(self, alert: Alert, route: str) -> DeliveryResult:
        """POST ``alert`` to the webhook ``route``, once; delivered on a 2xx."""
        webhook = self._webhooks.get(route)
        if webhook is None:
            log.warning("webhook: none named %r is configured; %s not sent", route, alert.rule_id)
            return DeliveryResult.reject(f"no webhook named {route}")
        body = json.dumps(alert_body(alert), sort_keys=True, separators=(",", ":")).encode()
        timestamp = str(int(self._clock()))
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: signature(webhook.secret, timestamp, body),
            IDEMPOTENCY_HEADER: f"{alert.fingerprint}:{alert.status}",
        }
        answer = self._sender(webhook.url, body, headers, webhook.timeout_seconds)
        retry_after = {"retry-after": answer.retry_after} if answer.retry_after else {}
        result = delivery(HttpResult(answer.status, headers=retry_after, detail=answer.detail))
        if not result.delivered:
            log.warning("webhook %s: %s (%s)", route, result.reason, result.outcome)
        return result
