"""Generic webhook actuator: POST the action as signed JSON to a configured endpoint.

Each request carries three headers:

- ``X-Gpuwarden-Timestamp``: Unix seconds when it was signed;
- ``X-Gpuwarden-Signature``: ``sha256=<hex>``, HMAC-SHA256 with the shared secret over
  ``<timestamp>.<body>`` (so a receiver can refuse replays older than its tolerance);
- ``Idempotency-Key``: the remediator's key; a receiver must drop a repeated delivery (answer
  409): after a crash or a failover mid-call, the action is sent once more with the same key.

The secret comes from a file or an environment variable named in the configuration (read by the
caller through :func:`load_secret`, which takes the environment as an argument), and appears in
no log, detail or ``undo``. Answers map to outcomes: 2xx DONE, 409 ALREADY_DONE (the receiver saw
this idempotency key), 404/410 NOT_FOUND, other 4xx REFUSED, 408/429/5xx and network errors
FAILED. A dry run sends nothing (a webhook has no dry-run); it checks the named webhook exists.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gpuwarden.collector.alerts.signing import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Response,
    Sender,
    Webhook,
    http_sender,
    signature,
)
from gpuwarden.collector.clients.http import HttpClient
from gpuwarden.collector.remediate.actuators.base import ActionRequest, ActionResult, Outcome

_RETRYABLE = frozenset({408, 425, 429})


class WebhookActuator:
    """Sends ``webhook`` actions (``parameters["name"]`` picks the endpoint).

    Args:
        webhooks: the configured endpoints.
        clock: Unix seconds, for the signed timestamp.
        http: the shared HTTP client (default: one of its own).
        sender: the HTTP seam (default: a POST through ``http``).
    """

    def __init__(
        self,
        webhooks: list[Webhook],
        *,
        clock: Callable[[], float],
        http: HttpClient | None = None,
        sender: Sender | None = None,
    ) -> None:
        self._webhooks = {webhook.name: webhook for webhook in webhooks}
        self._clock = clock
        self._sender = sender or http_sender(http or HttpClient())

    @property
    def kinds(self) -> frozenset[str]:
        """Action kinds taken."""
        return frozenset({"webhook"})

    def execute(self, request: ActionRequest) -> ActionResult:
        """POST the action (a dry run only checks the webhook and target)."""
        return self._post(request, "action")

    def redeliverable(self, request: ActionRequest) -> bool:
        """A webhook may be sent again after a crash or failover: every delivery carries the
        ``Idempotency-Key`` a receiver must drop repeats of (answering 409, ``ALREADY_DONE``)
        (``remediate.states.Redeliverable``); a receiver that cannot must not be a target."""
        return request.kind in self.kinds

    def rollback(self, request: ActionRequest, result: ActionResult) -> ActionResult:
        """POST a ``rollback`` event for the same action; the receiver decides what undo means."""
        return self._post(request, "rollback")

    def _post(self, request: ActionRequest, event: str) -> ActionResult:
        name = request.parameters.get("name")
        webhook = self._webhooks.get(name) if isinstance(name, str) else None
        if webhook is None:
            return ActionResult(Outcome.REFUSED, f"no webhook named {name!r} is configured")
        if not request.target.strip():
            return ActionResult(Outcome.REFUSED, "empty target")
        if request.dry_run:
            return ActionResult(Outcome.DRY_RUN, f"would POST {event} to webhook {webhook.name}")
        payload: dict[str, Any] = {
            "event": event,
            "kind": request.kind,
            "target": request.target,
            "idempotency_key": request.idempotency_key,
            "parameters": dict(request.parameters),
        }
        body = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()
        timestamp = str(int(self._clock()))
        key = request.idempotency_key if event == "action" else f"{request.idempotency_key}:{event}"
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: signature(webhook.secret, timestamp, body),
            IDEMPOTENCY_HEADER: key,
        }
        answer = self._sender(webhook.url, body, headers, webhook.timeout_seconds)
        return ActionResult(_outcome(answer.status), _detail(webhook.name, event, answer))


def _outcome(status: int) -> Outcome:
    if 200 <= status < 300:
        return Outcome.DONE
    if status == 409:
        return Outcome.ALREADY_DONE
    if status in (404, 410):
        return Outcome.NOT_FOUND
    if 400 <= status < 500 and status not in _RETRYABLE:
        return Outcome.REFUSED
    return Outcome.FAILED


def _detail(name: str, event: str, answer: Response) -> str:
    if answer.status == 0:
        return f"webhook {name} {event}: {answer.detail}"
    return f"webhook {name} {event}: HTTP {answer.status} {answer.detail}".rstrip()
