"""Generic webhook actuator: POST the action as signed JSON to a configured endpoint.

Each request carries three headers:

- ``X-Gpuwarden-Timestamp``: Unix seconds when it was signed;
- ``X-Gpuwarden-Signature``: ``sha256=<hex>``, HMAC-SHA256 with the shared secret over
  ``<timestamp>.<body>`` (so a receiver can refuse replays older than its tolerance);
- ``Idempotency-Key``: the remediator's key, so a receiver can drop a repeated delivery.

The secret comes from a file or an environment variable named in the configuration (read by the
caller through :func:`load_secret`, which takes the environment as an argument), and appears in
no log, detail or ``undo``. Answers map to outcomes: 2xx DONE, 409 ALREADY_DONE (the receiver saw
this idempotency key), 404/410 NOT_FOUND, other 4xx REFUSED, 408/429/5xx and network errors
FAILED. A dry run sends nothing (a webhook has no dry-run); it checks the named webhook exists.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.collector.remediate.actuator import ActionRequest, ActionResult, Outcome

TIMESTAMP_HEADER = "X-Gpuwarden-Timestamp"
SIGNATURE_HEADER = "X-Gpuwarden-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
SIGNATURE_PREFIX = "sha256="
DEFAULT_TOLERANCE_SECONDS = 300.0
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_RETRYABLE = frozenset({408, 425, 429})


class WebhookConfigError(ValueError):
    """A webhook's configuration is unusable; the message names the webhook, never the secret."""


@dataclass(frozen=True, slots=True)
class Webhook:
    """One configured endpoint; ``secret`` is excluded from ``repr``."""

    name: str
    url: str
    secret: bytes = field(repr=False)
    timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise WebhookConfigError(f"webhook name {self.name!r} is not a plain identifier")
        if not self.url.startswith(("https://", "http://")):
            raise WebhookConfigError(f"webhook {self.name}: url must be http(s)")
        if len(self.secret) < 16:
            raise WebhookConfigError(f"webhook {self.name}: secret shorter than 16 bytes")
        if self.timeout_seconds <= 0:
            raise WebhookConfigError(f"webhook {self.name}: timeout_seconds must be positive")


def load_secret(
    name: str,
    *,
    secret_file: Path | None = None,
    secret_env: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> bytes:
    """Read a webhook secret from a file (first) or the named environment variable.

    Raises:
        WebhookConfigError: neither source is given or yields a secret.
    """
    if secret_file is not None:
        try:
            text = secret_file.read_text(encoding="utf-8").strip()
        except OSError as error:
            message = f"webhook {name}: cannot read {secret_file}: {error.strerror}"
            raise WebhookConfigError(message) from None
        if text:
            return text.encode()
    if secret_env is not None and (value := (environ or {}).get(secret_env, "").strip()):
        return value.encode()
    raise WebhookConfigError(f"webhook {name}: no secret in secret_file or secret_env")


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256(secret, ``<timestamp>.<body>``)."""
    digest = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return SIGNATURE_PREFIX + digest


def verify(
    secret: bytes,
    *,
    timestamp: str,
    body: bytes,
    header: str,
    now: float,
    tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS,
) -> bool:
    """Whether ``header`` signs ``body`` at ``timestamp`` and the timestamp is recent enough."""
    try:
        sent = float(timestamp)
    except ValueError:
        return False
    if abs(now - sent) > tolerance_seconds:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), header)


@dataclass(frozen=True, slots=True)
class Response:
    """What the endpoint answered (``status`` 0: no answer)."""

    status: int
    detail: str


Sender = Callable[[str, bytes, Mapping[str, str], float], Response]


def urllib_sender(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
    """POST with the standard library; network failures become status 0."""
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
            return Response(answer.status, "")
    except urllib.error.HTTPError as error:
        return Response(error.code, str(error.reason))
    except (urllib.error.URLError, OSError) as error:
        return Response(0, f"unreachable: {type(error).__name__}")


class WebhookActuator:
    """Sends ``webhook`` actions (``parameters["name"]`` picks the endpoint).

    Args:
        webhooks: the configured endpoints.
        clock: Unix seconds, for the signed timestamp.
        sender: the HTTP seam (``urllib_sender`` by default).
    """

    def __init__(
        self,
        webhooks: list[Webhook],
        *,
        clock: Callable[[], float],
        sender: Sender = urllib_sender,
    ) -> None:
        self._webhooks = {webhook.name: webhook for webhook in webhooks}
        self._clock = clock
        self._sender = sender

    @property
    def kinds(self) -> frozenset[str]:
        """Action kinds taken."""
        return frozenset({"webhook"})

    def execute(self, request: ActionRequest) -> ActionResult:
        """POST the action (a dry run only checks the webhook and target)."""
        return self._post(request, "action")

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
