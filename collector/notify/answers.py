"""What an HTTP answer means for a delivery: the one table every HTTP notifier shares.

Accepted statuses (each service says which) are delivered; no answer, 408, 425, 429 and 5xx are
worth trying again (with the service's ``Retry-After`` when it sent seconds); anything else is
refused for good (400: the alert is invalid and would stay so; a redirect is not followed).
"""

from __future__ import annotations

from collections.abc import Container

from gpuwarden.collector.alerts.model import DeliveryResult
from gpuwarden.collector.clients.http import HttpResult

RETRYABLE_STATUSES = frozenset({0, 408, 425, 429})
_OK = range(200, 300)


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` in seconds (an HTTP date or garbage: None)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def delivery(answer: HttpResult, *, accepted: Container[int] = _OK) -> DeliveryResult:
    """The delivery result of one HTTP answer."""
    if answer.status in accepted:
        return DeliveryResult.ok()
    if answer.status == 0:
        return DeliveryResult.retry(answer.detail or "no answer")
    reason = f"HTTP {answer.status}" + (f" {answer.detail}" if answer.detail else "")
    if answer.status in RETRYABLE_STATUSES or answer.status >= 500:
        return DeliveryResult.retry(reason, retry_after_seconds(answer.header("Retry-After")))
    return DeliveryResult.reject(reason)
