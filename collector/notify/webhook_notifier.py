"""Alerts to a generic webhook (``webhook:<name>``), signed like the webhook action.

The body is one alert as JSON (``event: "alert"``, status, fingerprint, rule, severity,
summary, runbook and incident URLs, labels, facts, actions). The headers are the webhook
action's: ``X-Gpuwarden-Timestamp``, ``X-Gpuwarden-Signature`` (``sha256=`` HMAC-SHA256 of
``<timestamp>.<body>`` with the endpoint's secret) and ``Idempotency-Key``
(``<fingerprint>:<status>``), so a receiver verifies, refuses replays and drops repeats.
429, 408 and 5xx (and no answer) are retried with backoff; any other 4xx is final.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpuwarden.collector.alerts.model import Alert
from gpuwarden.collector.alerts.signing import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Sender,
    Webhook,
    signature,
    urllib_sender,
)

log = logging.getLogger(__name__)
_RETRYABLE = frozenset({0, 408, 425, 429})


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
        max_attempts: tries per alert on 429, 408, 5xx and network errors.
        backoff_seconds: the first wait; doubled each retry.
        sleep: waits (tests make it instant).
        sender: the HTTP seam.
    """

    def __init__(
        self,
        webhooks: Iterable[Webhook],
        *,
        clock: Callable[[], float] = time.time,
        max_attempts: int = 3,
        backoff_seconds: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
        sender: Sender = urllib_sender,
    ) -> None:
        self._webhooks = {webhook.name: webhook for webhook in webhooks}
        self._clock = clock
        self._attempts = max(1, max_attempts)
        self._backoff = backoff_seconds
        self._sleep = sleep
        self._sender = sender

    @property
    def name(self) -> str:
        """The route scheme."""
        return "webhook"

    def send(self, alert: Alert, route: str) -> bool:
        """POST ``alert`` to the webhook ``route``; True on a 2xx."""
        webhook = self._webhooks.get(route)
        if webhook is None:
            log.warning("webhook: none named %r is configured; %s not sent", route, alert.rule_id)
            return False
        body = json.dumps(alert_body(alert), sort_keys=True, separators=(",", ":")).encode()
        wait = self._backoff
        status = 0
        for attempt in range(1, self._attempts + 1):
            timestamp = str(int(self._clock()))
            headers = {
                "Content-Type": "application/json",
                TIMESTAMP_HEADER: timestamp,
                SIGNATURE_HEADER: signature(webhook.secret, timestamp, body),
                IDEMPOTENCY_HEADER: f"{alert.fingerprint}:{alert.status}",
            }
            status = self._sender(webhook.url, body, headers, webhook.timeout_seconds).status
            if 200 <= status < 300:
                return True
            if status not in _RETRYABLE and status < 500:
                log.warning("webhook %s refused the alert (HTTP %s)", route, status)
                return False
            if attempt < self._attempts:
                self._sleep(wait)
                wait *= 2
        log.warning("webhook %s: HTTP %s after %d attempts", route, status, self._attempts)
        return False
