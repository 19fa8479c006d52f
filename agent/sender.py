"""Drains the spool to the collector over OTLP/HTTP: in order, nothing dropped on an outage.

Why not the SDK's OTLP exporter: it drops a batch after its retries (reference §3.5). Here a
record leaves the spool only when the collector accepted it (2xx) or rejected that very record
for good (400/413/415 on a one-record request). Everything else keeps the records and backs off.

Several spooled requests go out as one body: concatenating serialized protobuf messages of the
same type merges them, and ``ExportMetricsServiceRequest`` has a single repeated field, so the
``resource_metrics`` of every record arrive appended in spool order.

Delivery is at-least-once on the wire, once in the store: if the connection breaks after the
collector processed a body but before its answer arrived, the same records are sent again, and
the ``Gpuwarden-Agent-Instance`` / ``Gpuwarden-Agent-Rounds`` headers
(:mod:`~gpuwarden.agent.rounds`) let the collector recognise the rounds it already stored and
acknowledge them without storing.

A receiver slower than the timeout per big batch cannot livelock the sender. After a timeout the
next batch is one record; each batch accepted at the full limit doubles the limit up to half the
size that timed out, then adds an eighth (at least one record) up to ``MAX_BATCH_RECORDS``: TCP's
slow start and congestion avoidance, in records. Why not halve from the batch that timed out: on
the way down every timed-out half is resent whole (about as many rounds again as the first batch),
and while the collector stores each round once either way, every resend is work for a collector
that is already slow.
Each change of failure kind (``HTTP 503`` → timeout → connection refused ...) is logged once, not
every attempt.
"""

from __future__ import annotations

import email.utils
import enum
import gzip
import http.client
import logging
import math
import random
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC
from urllib.parse import urlsplit

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from gpuwarden.agent.rounds import (
    INSTANCE_HEADER,
    MAX_ROUNDS_HEADER_CHARS,
    ROUNDS_HEADER,
    Round,
    encode_rounds,
)
from gpuwarden.agent.spool import Spool

log = logging.getLogger(__name__)

MAX_BATCH_RECORDS = 1024
INITIAL_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 60.0
MAX_RETRY_AFTER_SECONDS = 900.0  # a broken or hostile Retry-After must not park the agent for days
IDLE_RECHECK_SECONDS = 30.0
MAX_RESPONSE_BYTES = 64 * 1024
PERMANENT_STATUSES = frozenset({400, 413, 415})
AUTH_STATUSES = frozenset({401, 403})
TRANSIENT_STATUSES = frozenset({408, 429})  # plus every 5xx
RESERVED_HEADERS = frozenset(
    {
        "content-type",
        "content-encoding",
        "content-length",
        "host",
        INSTANCE_HEADER.lower(),
        ROUNDS_HEADER.lower(),
    }
)
_STALE_CONNECTION = (BrokenPipeError, ConnectionAbortedError, ConnectionResetError)
_TLS_CUT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)
_KEPT = "%d record(s) kept in the spool, retrying with backoff"
_STREAK_LOG = {  # logged once when a streak of failures of this kind starts
    "unavailable": (logging.WARNING, "collector %s unavailable (%s); " + _KEPT),
    "timeout": (
        logging.WARNING,
        "collector %s did not answer in time (%s); smaller batches follow; " + _KEPT,
    ),
    "auth": (
        logging.ERROR,
        "collector %s refused this agent (%s): a 401 is a token it does not know, a 403 a "
        "role or node the token may not write; " + _KEPT,
    ),
    "unexpected": (logging.ERROR, "collector %s answered %s (check the endpoint); " + _KEPT),
    "tls": (
        logging.ERROR,
        "collector %s: TLS handshake failed (%s); check collector.ca_file (the CA that signed "
        "the collector's certificate) and collector.cert_file/key_file (mTLS); " + _KEPT,
    ),
    "tls-closed": (
        logging.ERROR,
        "collector %s closed a new TLS connection without answering (%s): it refuses this "
        "agent's client certificate (collector.cert_file/key_file missing, expired or from "
        "another CA) or it is restarting; " + _KEPT,
    ),
}


class SendStatus(enum.Enum):
    """What one ``send_once`` call did."""

    EMPTY = "empty"  # nothing spooled
    SENT = "sent"  # records were accepted
    REJECTED = "rejected"  # a record was permanently rejected and dropped; the rest went on
    RETRY = "retry"  # collector unavailable or erroring: records kept, wait delay_seconds
    UNAUTHORIZED = "unauthorized"  # 401/403 or a TLS refusal: records kept, wait delay_seconds


@dataclass(frozen=True, slots=True)
class SendResult:
    """Outcome of one ``send_once``; ``delay_seconds`` is how long to wait before the next."""

    status: SendStatus
    records_sent: int = 0
    records_rejected: int = 0
    http_status: int | None = None
    delay_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class _Target:
    """One collector endpoint, parsed."""

    https: bool
    host: str
    port: int | None
    path: str
    where: str  # for logs: never the headers

    @classmethod
    def parse(cls, endpoint: str) -> _Target:
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"endpoint must be an http:// or https:// URL, got {endpoint!r}")
        if url.username or url.password:
            raise ValueError("endpoint must not carry credentials; pass an Authorization header")
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        where = f"{url.scheme}://{url.netloc}{url.path}"
        return cls(url.scheme == "https", url.hostname, url.port, path, where)


class OtlpHttpSender:
    """Sends spooled OTLP ``ExportMetricsServiceRequest`` records over one keep-alive connection.

    ``run`` is the body of a daemon thread; set ``wake`` after each ``Spool.append``.
    ``ssl_context`` is used for ``https`` endpoints only (default: the system trust store).
    ``clock`` is monotonic (waits, deadlines); ``wall_clock`` is Unix time (HTTP dates,
    ``last_success_unix``); ``rng`` draws the backoff jitter.

    With several ``endpoint`` URLs (collectors in active/standby), the sender uses one at a
    time and stays on it while it works; a connection error, a timeout or a 5xx (503 included)
    moves it to the next one, tried at once; only when every endpoint failed in a row does it
    back off. The records stay in the spool throughout, and their round headers are the same
    whichever collector gets them, so collectors sharing a database store each round once.
    """

    def __init__(
        self,
        spool: Spool,
        endpoint: str | Sequence[str],
        *,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = 10.0,
        gzip_level: int = 6,
        max_batch_bytes: int = 4 * 1024 * 1024,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
        if not endpoints:
            raise ValueError("at least one endpoint is needed")
        self._targets = [_Target.parse(e) for e in endpoints]
        self._current = 0
        self._failovers = 0  # endpoints left for a failure since the last success
        if not 0 <= gzip_level <= 9:
            raise ValueError(f"gzip_level must be in [0, 9], got {gzip_level}")
        if timeout_seconds <= 0 or max_batch_bytes < 1:
            raise ValueError("timeout_seconds and max_batch_bytes must be positive")
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": "gpuwarden-agent"}
        if gzip_level:
            self._headers["Content-Encoding"] = "gzip"
        for name, value in (headers or {}).items():
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"header {name!r} is set by the sender")
            if any(c in name + value for c in "\r\n\0"):
                raise ValueError(f"header {name!r} contains a line break or NUL")
            self._headers[name] = value
        self._spool = spool
        self._timeout = timeout_seconds
        self._gzip_level = gzip_level
        self._max_batch_bytes = max_batch_bytes
        self._ssl_context = ssl_context
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._conn: http.client.HTTPConnection | None = None
        self._send_lock = threading.Lock()
        self._failures = 0  # consecutive failed attempts: drives backoff and streak logging
        self._streak: str | None = None  # the failure (kind and cause) logged last in this streak
        self._limit_records = MAX_BATCH_RECORDS  # one after a timeout, regrown on success
        self._threshold = MAX_BATCH_RECORDS  # half the last batch that timed out
        self.wake = threading.Event()
        self.sent_records = 0
        self.sent_bytes = 0  # uncompressed protobuf bytes accepted by the collector
        self.rejected_records = 0
        self.rejected_data_points = 0  # from partial_success in 2xx answers
        self.failed_attempts = 0
        self.timeouts = 0
        self.last_success_unix: float | None = None
        self.failovers = 0  # moves to another endpoint

    @property
    def endpoint(self) -> str:
        """The endpoint in use now (for logs and the health page)."""
        return self._targets[self._current].where

    @property
    def _where(self) -> str:
        return self._targets[self._current].where

    @property
    def _https(self) -> bool:
        return self._targets[self._current].https

    def send_once(self) -> SendResult:
        """Send the oldest spooled records as one request (splitting only to isolate a reject)."""
        with self._send_lock:
            return self._send_once(self._timeout)

    def run(self, stop: threading.Event) -> None:
        """Send while there is data; then wait for ``wake``, a backoff deadline or ``stop``.

        To stop the loop, set ``stop`` and then ``wake``.
        """
        try:
            while not stop.is_set():
                self.wake.clear()  # before peeking, so an append during the send is not missed
                try:
                    result = self.send_once()
                except Exception:  # one broad except per loop iteration, by design
                    log.exception("sending failed unexpectedly; the records stay in the spool")
                    self._failures += 1
                    result = SendResult(SendStatus.RETRY, delay_seconds=self._backoff())
                if result.status is SendStatus.EMPTY:
                    self._wait_for_wake(stop, IDLE_RECHECK_SECONDS)
                elif result.status in (SendStatus.RETRY, SendStatus.UNAUTHORIZED):
                    # `wake` is ignored here: new samples must not cut a backoff short.
                    deadline = self._clock() + result.delay_seconds
                    while not stop.is_set() and (remaining := deadline - self._clock()) > 0:
                        stop.wait(remaining)
        finally:
            self.close()

    def flush(self, timeout_seconds: float) -> bool:
        """Try to drain the spool before the deadline; return whether it is empty."""
        deadline = self._clock() + timeout_seconds
        pause = threading.Event()  # never set: a bounded wait between retries
        try:
            while len(self._spool) > 0:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return False
                with self._send_lock:
                    result = self._send_once(min(self._timeout, remaining))
                if result.status in (SendStatus.RETRY, SendStatus.UNAUTHORIZED):
                    if result.delay_seconds >= deadline - self._clock():
                        return False
                    pause.wait(result.delay_seconds)
            return True
        finally:
            self.close()

    def close(self) -> None:
        """Close the keep-alive connection (the next send opens a new one)."""
        with self._send_lock:
            self._close()

    def _wait_for_wake(self, stop: threading.Event, limit_seconds: float) -> None:
        # No polling: whoever sets ``stop`` also sets ``wake`` (see ``Agent.shutdown``), so an
        # idle agent costs no CPU between rounds.
        if not stop.is_set():
            self.wake.wait(limit_seconds)

    @property
    def batch_limit(self) -> int:
        """The records the next batch may hold (one after a timeout, then growing)."""
        return self._limit_records

    def _send_once(self, timeout: float) -> SendResult:
        batch = self._spool.peek(self._limit_records, self._max_batch_bytes)
        if not batch:
            return SendResult(SendStatus.EMPTY)
        result = self._attempt(_fit_header(batch), timeout)
        if result.status in (SendStatus.RETRY, SendStatus.UNAUTHORIZED):
            self._spool.release()  # not delivered: what was evicted meanwhile is lost
        return result

    def _attempt(self, batch: list[tuple[int, bytes]], timeout: float) -> SendResult:
        body = b"".join(payload for _, payload in batch)
        wire = gzip.compress(body, self._gzip_level, mtime=0) if self._gzip_level else body
        headers = {
            **self._headers,
            INSTANCE_HEADER: self._spool.instance_id,
            ROUNDS_HEADER: _rounds_header(batch),
        }
        try:
            status, retry_after, content_type, data = self._post(wire, headers, timeout)
        except (OSError, http.client.HTTPException) as exc:
            self._close()
            if isinstance(exc, TimeoutError):
                self._shrink(len(batch))
                return self._failed("timeout", None, None, _failure_reason(exc), "timeout")
            kind = self._failure_kind(exc)
            return self._failed(kind, None, None, _failure_reason(exc), _cause(exc))
        if 200 <= status < 300:
            self._spool.ack(batch[-1][0])
            self._succeeded(len(batch), len(body), content_type, data)
            if len(batch) >= self._limit_records:  # the limit was tried and it worked
                self._grow()
            return SendResult(SendStatus.SENT, records_sent=len(batch), http_status=status)
        if status not in PERMANENT_STATUSES:
            kind = "auth" if status in AUTH_STATUSES else "unavailable"
            if kind != "auth" and status < 500 and status not in TRANSIENT_STATUSES:
                kind = "unexpected"
            reason = f"HTTP {status}: {data[:200]!r}"
            return self._failed(kind, status, retry_after, reason, f"HTTP {status}")
        self.failed_attempts += 1
        if len(batch) > 1:
            return self._isolate(batch, timeout, status)
        self._spool.drop(batch[0][0])
        self.rejected_records += 1
        log.error(
            "collector permanently rejected spool record %d (HTTP %d, %d bytes); dropped it: %r",
            batch[0][0],
            status,
            len(body),
            data[:200],
        )
        return SendResult(SendStatus.REJECTED, records_rejected=1, http_status=status)

    def _isolate(self, batch: list[tuple[int, bytes]], timeout: float, status: int) -> SendResult:
        log.warning(
            "collector rejected a batch of %d records with HTTP %d; resending one at a time "
            "to find the bad one",
            len(batch),
            status,
        )
        sent = rejected = 0
        result = SendResult(SendStatus.SENT, http_status=status)
        for record in batch:
            result = self._attempt([record], timeout)
            sent += result.records_sent
            rejected += result.records_rejected
            if result.status is not SendStatus.SENT:
                break  # found the bad one (the rest go back to batching) or must wait
        return replace(result, records_sent=sent, records_rejected=rejected)

    def _post(
        self, body: bytes, headers: Mapping[str, str], timeout: float
    ) -> tuple[int, str | None, str, bytes]:
        """POST ``body``; return status, Retry-After, Content-Type and the (capped) body."""
        reused = self._conn is not None and self._conn.sock is not None
        try:
            return self._request(body, headers, timeout)
        except _STALE_CONNECTION + _TLS_CUT:
            self._close()
            if not reused:
                raise
            # The collector closed the idle keep-alive connection; one immediate fresh try.
            log.debug("keep-alive connection to %s was closed; reconnecting", self._where)
            return self._request(body, headers, timeout)

    def _request(
        self, body: bytes, headers: Mapping[str, str], timeout: float
    ) -> tuple[int, str | None, str, bytes]:
        conn = self._conn
        target = self._targets[self._current]
        if conn is None:
            if target.https:
                context = self._ssl_context or ssl.create_default_context()
                conn = http.client.HTTPSConnection(
                    target.host, target.port, timeout=timeout, context=context
                )
            else:
                conn = http.client.HTTPConnection(target.host, target.port, timeout=timeout)
            self._conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        conn.request("POST", target.path, body=body, headers=dict(headers))
        response = conn.getresponse()
        try:
            data = response.read(MAX_RESPONSE_BYTES)
            if not response.isclosed():  # an over-long answer: the connection is not reusable
                self._close()
            content_type = response.getheader("Content-Type", "")
            return response.status, response.getheader("Retry-After"), content_type, data
        finally:
            response.close()

    def _failure_kind(self, exc: OSError | http.client.HTTPException) -> str:
        """``tls`` for a refused handshake, ``tls-closed`` for a new TLS connection the collector
        closed without an answer, else ``unavailable``.

        Why ``tls-closed``: under TLS 1.3 the client's side of the handshake ends before the
        server has checked the client certificate, and a collector on asyncio closes the
        connection without sending its alert, so a refused client certificate reaches the agent
        as a connection closed before any answer. (``_post`` retries a reused connection once,
        so such an error here always comes from a new connection.)
        """
        if isinstance(exc, ssl.SSLError) and not isinstance(exc, _TLS_CUT):
            return "tls"
        if self._https and isinstance(exc, _STALE_CONNECTION + _TLS_CUT):
            return "tls-closed"
        return "unavailable"

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _shrink(self, records: int) -> None:
        """A batch of ``records`` timed out: the next is one record (see the module docstring)."""
        self.timeouts += 1
        self._threshold = max(1, records // 2)
        self._limit_records = 1

    def _grow(self) -> None:
        """A batch at the limit was accepted: double up to the threshold, then add an eighth."""
        limit = self._limit_records
        if limit < self._threshold:
            limit = min(2 * limit, self._threshold)
        else:
            limit += max(1, limit // 8)
        self._limit_records = min(MAX_BATCH_RECORDS, limit)

    def _succeeded(self, records: int, nbytes: int, content_type: str, data: bytes) -> None:
        if self._failures:
            log.info("collector accepts data again after %d failed attempt(s)", self._failures)
        self._failures = 0
        self._failovers = 0
        self._streak = None
        self.sent_records += records
        self.sent_bytes += nbytes
        self.last_success_unix = self._wall_clock()
        if not data or "json" in content_type:
            return
        response = ExportMetricsServiceResponse()
        try:
            response.ParseFromString(data)
        except DecodeError:
            log.debug("ignoring an undecodable response body from %s", self._where)
            return
        points = response.partial_success.rejected_data_points
        if points:
            self.rejected_data_points += points
            log.warning(
                "collector accepted the request but rejected %d data point(s): %s",
                points,
                response.partial_success.error_message[:200],
            )

    def _failed(
        self, kind: str, status: int | None, retry_after: str | None, reason: str, cause: str
    ) -> SendResult:
        """Keep the records; log when the failure changes (kind or ``cause``: ``HTTP 503``,
        ``timeout``, ``ConnectionRefusedError``...), not every attempt; compute the delay."""
        self.failed_attempts += 1
        self._failures += 1
        delay = self._retry_after_seconds(retry_after)
        if delay is None:
            delay = self._backoff()
        streak = f"{kind}/{cause}"
        if streak != self._streak:
            level, message = _STREAK_LOG[kind]
            if self._streak is not None:
                message += f" (until now: {self._streak.partition('/')[2]})"
            self._streak = streak
            log.log(level, message, self._where, reason, len(self._spool))
        collector_down = kind in ("unavailable", "timeout") and (status is None or status >= 500)
        if collector_down and self._fail_over(reason):
            delay = 0.0  # the next endpoint has not failed yet: try it now
        outcome = SendStatus.UNAUTHORIZED if kind in ("auth", "tls") else SendStatus.RETRY
        return SendResult(outcome, http_status=status, delay_seconds=delay)

    def _fail_over(self, reason: str) -> bool:
        """Move to the next endpoint (a connection error, timeout or 5xx here); whether it is
        one that has not failed since the last success (then it is tried at once)."""
        if len(self._targets) == 1:
            return False
        self._close()
        before = self._where
        self._current = (self._current + 1) % len(self._targets)
        self._failovers += 1
        self.failovers += 1
        fresh = self._failovers < len(self._targets)
        if fresh:
            log.warning("collector %s failed (%s); sending to %s", before, reason, self._where)
        else:
            self._failovers = 0  # every endpoint failed once: back off, then go round again
        return fresh

    def _backoff(self) -> float:
        """Exponential from 1 s with ±20 % jitter, capped at 60 s."""
        base = INITIAL_BACKOFF_SECONDS * 2.0 ** min(max(self._failures - 1, 0), 16)
        return min(MAX_BACKOFF_SECONDS, base * self._rng.uniform(0.8, 1.2))

    def _retry_after_seconds(self, value: str | None) -> float | None:
        """Seconds from a Retry-After value (delta seconds or HTTP date); None if unusable."""
        if not value:
            return None
        try:
            seconds = float(value.strip())
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                return None
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            seconds = when.timestamp() - self._wall_clock()
        if not math.isfinite(seconds):
            return None
        # Never faster than the first backoff step: a "Retry-After: 0" loop would hammer.
        return min(max(seconds, INITIAL_BACKOFF_SECONDS), MAX_RETRY_AFTER_SECONDS)


def _rounds_header(batch: list[tuple[int, bytes]]) -> str:
    return encode_rounds([Round(seq, len(payload)) for seq, payload in batch])


def _fit_header(batch: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """The longest head of ``batch`` whose rounds header fits ``MAX_ROUNDS_HEADER_CHARS``."""
    while len(batch) > 1 and len(_rounds_header(batch)) > MAX_ROUNDS_HEADER_CHARS:
        batch = batch[: len(batch) // 2]
    return batch


def _cause(exc: OSError | http.client.HTTPException) -> str:
    """The failure's cause for streak logging: what changed is worth one log line."""
    return type(exc).__name__


def otlp_points(payload: bytes) -> int:
    """The data points of an OTLP ``ExportMetricsServiceRequest`` (the spool's eviction count);
    raises ``ValueError`` for a body that does not parse."""
    request = ExportMetricsServiceRequest()
    try:
        request.ParseFromString(payload)
    except DecodeError as exc:
        raise ValueError(str(exc)) from None
    total = 0
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                if kind is not None:
                    total += len(getattr(metric, kind).data_points)
    return total


def _failure_reason(exc: OSError | http.client.HTTPException) -> str:
    """What failed, in short words: the TLS layer's own (``certificate verify failed: unable
    to get local issuer certificate``, ``TLSV1_ALERT_UNKNOWN_CA``) or the exception's."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError) and exc.reason and not isinstance(exc, _TLS_CUT):
        return str(exc.reason)
    return f"{type(exc).__name__}: {exc}"
