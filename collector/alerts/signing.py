"""Signed JSON over HTTP: the contract the webhook action and the webhook notifier share.

Each request carries three headers:

- ``X-Gpuwarden-Timestamp``: Unix seconds when it was signed;
- ``X-Gpuwarden-Signature``: ``sha256=<hex>``, HMAC-SHA256 with the shared secret over
  ``<timestamp>.<body>`` (so a receiver can refuse replays older than its tolerance);
- ``Idempotency-Key``: so a receiver can drop a repeated delivery.

The secret comes from a file or an environment variable named in the configuration (read through
:func:`load_secret`, which takes the environment as an argument), and appears in no log or detail.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuwarden.collector.clients.http import HttpClient

TIMESTAMP_HEADER = "X-Gpuwarden-Timestamp"
SIGNATURE_HEADER = "X-Gpuwarden-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
SIGNATURE_PREFIX = "sha256="
DEFAULT_TOLERANCE_SECONDS = 300.0
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


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
    """What the endpoint answered (``status`` 0: no answer); ``retry_after`` is its
    ``Retry-After`` header, if any."""

    status: int
    detail: str
    retry_after: str | None = None


Sender = Callable[[str, bytes, Mapping[str, str], float], Response]


def http_sender(http: HttpClient) -> Sender:
    """A sender that POSTs through ``http`` (once: no retry, no redirect)."""

    def send(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Response:
        answer = http.request("POST", url, body=body, headers=headers, timeout_seconds=timeout)
        return Response(answer.status, answer.detail, answer.header("Retry-After"))

    return send
