"""Send the queue's requests to the TSDB, oldest first, with the remote-write retry rules.

A 2xx answer acknowledges the request. 5xx, 429, a timeout or no answer at all is retryable:
the request stays at the head of the queue and the sender waits (exponential backoff, or the
server's ``Retry-After``) before trying it again, so nothing is lost and order is kept. Any
other 4xx means the request will never be accepted (the specification's rule, which
Prometheus, vmagent and the OpenTelemetry Collector follow): it is dropped, its samples
counted and the answer logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpuwarden.collector.clients.http import HttpClient, HttpResult
from gpuwarden.collector.remote_write.queue import DiskQueue
from gpuwarden.collector.remote_write.wire import HEADERS

log = logging.getLogger(__name__)

MIN_BACKOFF_SECONDS = 0.5
_DETAIL_BYTES = 300
USER_AGENT = "gpuwarden-collector"


@dataclass
class SendStats:
    """What the sender did, for ``/metrics``."""

    sent_samples: int = 0
    sent_requests: int = 0
    failed_requests: dict[str, int] = field(default_factory=dict)
    """Retryable failures by kind (``5xx``, ``429``, ``unreachable``)."""
    dropped_samples: dict[str, int] = field(default_factory=dict)
    """Samples given up by reason (``rejected``: a 4xx; ``queue_full``; ``out_of_order``)."""

    def drop(self, reason: str, samples: int) -> None:
        """Count ``samples`` given up for ``reason``."""
        if samples:
            self.dropped_samples[reason] = self.dropped_samples.get(reason, 0) + samples


def retryable(result: HttpResult) -> bool:
    """Whether a failed answer may succeed later: none at all, 429, or 5xx."""
    return result.status in {0, 429} or result.status >= 500


def _retry_after(result: HttpResult) -> float | None:
    value = result.header("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


class RemoteWriteSender:
    """Drain a :class:`DiskQueue` to ``url``.

    Args:
        queue: the durable queue.
        http: the collector's HTTP client (no retries of its own).
        url: the receiver's endpoint.
        headers: extra headers (tenant, ``Authorization``).
        timeout_seconds: connect and read timeout of one request.
        max_backoff_seconds: the longest wait between two tries.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        queue: DiskQueue,
        http: HttpClient,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = 30.0,
        max_backoff_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        stats: SendStats | None = None,
    ) -> None:
        self._queue = queue
        self._http = http
        self._url = url
        self._headers = {**HEADERS, "User-Agent": USER_AGENT, **(headers or {})}
        self._timeout = timeout_seconds
        self._max_backoff = max_backoff_seconds
        self._clock = clock
        self.stats = stats if stats is not None else SendStats()
        self._failures = 0
        self._retry_at = 0.0
        self._last_failure = ""

    def drain(self, max_requests: int = 1000) -> int:
        """Send queued requests until the queue is empty, one fails, or ``max_requests``.

        Does nothing while a backoff runs. Returns the requests acknowledged (sent or dropped).
        """
        done = 0
        if self._clock() < self._retry_at:
            return 0
        while done < max_requests:
            record = self._queue.peek()
            if record is None:
                break
            result = self._http.request(
                "POST",
                self._url,
                body=record.payload,
                headers=self._headers,
                timeout_seconds=self._timeout,
                max_body_bytes=_DETAIL_BYTES,
            )
            if result.ok:
                self._recovered()
                self.stats.sent_samples += record.samples
                self.stats.sent_requests += 1
            elif retryable(result):
                self._failed(result)
                break
            else:
                self.stats.drop("rejected", record.samples)
                log.error(
                    "remote-write: %s refused a request of %d samples with %d, dropped: %s",
                    self._url,
                    record.samples,
                    result.status,
                    result.body.decode("utf-8", "replace").strip() or result.detail,
                )
            self._queue.ack(record)
            done += 1
        return done

    def _failed(self, result: HttpResult) -> None:
        kind = "unreachable" if result.status == 0 else str(result.status)
        kind = "5xx" if result.status >= 500 else kind
        self.stats.failed_requests[kind] = self.stats.failed_requests.get(kind, 0) + 1
        self._failures += 1
        wait = _retry_after(result)
        if wait is None:
            wait = min(self._max_backoff, MIN_BACKOFF_SECONDS * 2 ** min(self._failures - 1, 16))
        self._retry_at = self._clock() + min(wait, self._max_backoff)
        if kind != self._last_failure:  # log the switch of failure kind, not every retry
            log.warning(
                "remote-write: %s failed (%s: %s); retrying, the queue keeps the data",
                self._url,
                kind,
                result.detail,
            )
            self._last_failure = kind

    def _recovered(self) -> None:
        if self._failures:
            log.info("remote-write: %s accepts again after %d failures", self._url, self._failures)
        self._failures = 0
        self._retry_at = 0.0
        self._last_failure = ""
