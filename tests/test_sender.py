"""The OTLP/HTTP sender against a real local HTTP server that parses what it receives."""

from __future__ import annotations

import gzip
import logging
import random
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from gpuwarden.agent.sender import OtlpHttpSender, SendResult, SendStatus
from gpuwarden.agent.spool import Spool

NOW_UNIX = 1_700_000_000.0
TOKEN = "s3cret-token"  # must never appear in logs


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    close: bool = False  # drop the connection without answering


@dataclass
class Request:
    headers: dict[str, str]
    values: list[int]
    client_port: int
    status: int | None


@dataclass
class Collector:
    """What the fake collector answers and what it saw."""

    port: int = 0
    default: Reply = Reply()
    script: deque[Reply] = field(default_factory=deque)  # next replies, before the default
    reject_values: set[int] = field(default_factory=set)  # a body with one of these: 400
    requests: list[Request] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)  # values of 2xx requests, in order
    received: threading.Event = field(default_factory=threading.Event)
    down: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None

    def start(self) -> None:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                if collector.down:  # an old keep-alive connection to a stopped server
                    self.close_connection = True
                    return
                body = gzip.decompress(raw) if self.headers["Content-Encoding"] == "gzip" else raw
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                values = [
                    point.as_int
                    for rm in request.resource_metrics
                    for sm in rm.scope_metrics
                    for metric in sm.metrics
                    for point in metric.gauge.data_points
                ]
                with collector.lock:
                    reply = collector.script.popleft() if collector.script else collector.default
                    if not collector.script and collector.reject_values.intersection(values):
                        reply = Reply(400, body=b"bad data point " + b"x" * 300)
                    status = None if reply.close else reply.status
                    port = self.client_address[1]
                    collector.requests.append(Request(dict(self.headers), values, port, status))
                    if status is not None and 200 <= status < 300:
                        collector.accepted.extend(values)
                collector.received.set()
                if reply.close:
                    self.close_connection = True
                    return
                self.send_response(reply.status)
                for name, value in reply.headers:
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.down = False
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.down = True
        if self.server is not None and self.thread is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(timeout=10)
            self.server = self.thread = None

    def fail_next(self, count: int, reply: Reply) -> None:
        with self.lock:
            self.script.extend([reply] * count)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/metrics"


class FakeClock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


class MidpointRandom(random.Random):
    """Jitter pinned to the middle, so backoff delays are exact."""

    def uniform(self, a: float, b: float) -> float:
        return (a + b) / 2


def record(n: int) -> bytes:
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    attribute = rm.resource.attributes.add()
    attribute.key = "host.name"
    attribute.value.string_value = "node-1"
    sm = rm.scope_metrics.add()
    sm.scope.name = "gpuwarden.test"
    metric = sm.metrics.add()
    metric.name = "test.record"
    point = metric.gauge.data_points.add()
    point.time_unix_nano = n
    point.as_int = n
    return request.SerializeToString()


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    return Spool(tmp_path / "spool", max_bytes=10**7, fsync=False)


class _Factory(Protocol):
    def __call__(self, *, max_batch_bytes: int = ..., gzip_level: int = ...) -> OtlpHttpSender: ...


@pytest.fixture
def make_sender(spool: Spool, collector: Collector) -> Iterator[_Factory]:
    made: list[OtlpHttpSender] = []

    def factory(*, max_batch_bytes: int = 4 << 20, gzip_level: int = 6) -> OtlpHttpSender:
        sender = OtlpHttpSender(
            spool,
            collector.url,
            headers={"Authorization": f"Bearer {TOKEN}"},
            gzip_level=gzip_level,
            max_batch_bytes=max_batch_bytes,
            clock=FakeClock(),
            wall_clock=lambda: NOW_UNIX,
            rng=MidpointRandom(),
        )
        made.append(sender)
        return sender

    yield factory
    for sender in made:
        sender.close()


def fill(spool: Spool, numbers: range) -> None:
    for n in numbers:
        spool.append(record(n))


def drain(sender: OtlpHttpSender) -> list[SendResult]:
    results: list[SendResult] = []
    while (result := sender.send_once()).status is not SendStatus.EMPTY:
        assert result.status is SendStatus.SENT
        results.append(result)
    return results


def test_batch_merges_records_in_order_with_gzip_and_headers(
    spool: Spool, collector: Collector, make_sender: _Factory
) -> None:
    fill(spool, range(1, 6))
    sender = make_sender()
    result = sender.send_once()
    assert result == SendResult(SendStatus.SENT, records_sent=5, http_status=200)
    assert [r.values for r in collector.requests] == [[1, 2, 3, 4, 5]]
    headers = collector.requests[0].headers
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert len(spool) == 0
    assert sender.sent_records == 5
    assert sender.sent_bytes == sum(len(record(n)) for n in range(1, 6))
    assert sender.last_success_unix == NOW_UNIX
    assert sender.send_once() == SendResult(SendStatus.EMPTY)


def test_batches_respect_max_bytes_and_reuse_one_connection(
    spool: Spool, collector: Collector, make_sender: _Factory
) -> None:
    fill(spool, range(1, 8))
    sender = make_sender(max_batch_bytes=3 * len(record(1)))
    assert [r.records_sent for r in drain(sender)] == [3, 3, 1]
    assert [r.values for r in collector.requests] == [[1, 2, 3], [4, 5, 6], [7]]
    assert len({r.client_port for r in collector.requests}) == 1  # keep-alive


def test_uncompressed_when_gzip_level_zero(
    spool: Spool, collector: Collector, make_sender: _Factory
) -> None:
    fill(spool, range(1, 3))
    assert make_sender(gzip_level=0).send_once().records_sent == 2
    assert "Content-Encoding" not in collector.requests[0].headers
    assert collector.accepted == [1, 2]


def test_503_outage_then_recovery_delivers_everything_once_in_order(
    spool: Spool, collector: Collector, make_sender: _Factory
) -> None:
    sender = make_sender(max_batch_bytes=2 * len(record(1)))
    collector.fail_next(3, Reply(503))
    delays = []
    for n in range(1, 4):
        spool.append(record(n))
        result = sender.send_once()
        assert (result.status, result.http_status) == (SendStatus.RETRY, 503)
        delays.append(result.delay_seconds)
    assert delays == [1.0, 2.0, 4.0]  # exponential; jitter pinned to its midpoint
    fill(spool, range(4, 6))
    assert [r.records_sent for r in drain(sender)] == [2, 2, 1]
    assert collector.accepted == [1, 2, 3, 4, 5]
    assert sender.failed_attempts == 3
    assert len(spool) == 0


def test_backoff_is_capped(spool: Spool, collector: Collector, make_sender: _Factory) -> None:
    spool.append(record(1))
    sender = make_sender()
    collector.fail_next(9, Reply(502))
    delays = [sender.send_once().delay_seconds for _ in range(9)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]


def test_collector_down_then_back_delivers_everything_once_in_order(
    spool: Spool, collector: Collector, make_sender: _Factory
) -> None:
    sender = make_sender()
    fill(spool, range(1, 3))
    assert sender.send_once().records_sent == 2  # opens the keep-alive connection
    collector.stop()
    for n in range(3, 6):
        spool.append(record(n))
        result = sender.send_once()
        assert (result.status, result.http_status) == (SendStatus.RETRY, None)
    collector.start()  # same port
    assert [r.records_sent for r in drain(sender)] == [3]
    assert collector.accepted == [1, 2, 3, 4, 5]


def test_400_isolates_and_drops_only_the_bad_record(
    spool: Spool, collector: Collector, make_sender: _Factory, caplog: pytest.LogCaptureFixture
) -> None:
    fill(spool, range(1, 6))
    collector.reject_values = {3}
    sender = make_sender()
    result = sender.send_once()
    assert result == SendResult(
        SendStatus.REJECTED, records_sent=2, records_rejected=1, http_status=400
    )
    assert sender.send_once().records_sent == 2
    assert [r.values for r in collector.requests] == [[1, 2, 3, 4, 5], [1], [2], [3], [4, 5]]
    assert collector.accepted == [1, 2, 4, 5]
    assert sender.rejected_records == 1
    assert len(spool) == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "collector permanently rejected spool record 3 (HTTP 400, "
        f"{len(record(3))} bytes); dropped it: {(b'bad data point ' + b'x' * 185)!r}"
    ]


def test_401_keeps_everything_and_logs_once_per_streak(
    spool: Spool, collector: Collector, make_sender: _Factory, caplog: pytest.LogCaptureFixture
) -> None:
    fill(spool, range(1, 4))
    sender = make_sender()
    collector.fail_next(3, Reply(401))
    results = [sender.send_once() for _ in range(3)]
    assert [(r.status, r.http_status, r.delay_seconds) for r in results] == [
        (SendStatus.UNAUTHORIZED, 401, 1.0),
        (SendStatus.UNAUTHORIZED, 401, 2.0),
        (SendStatus.UNAUTHORIZED, 401, 4.0),
    ]
    assert len(spool) == 3
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "refused this agent" in errors[0].getMessage()
    assert sender.send_once().records_sent == 3
    assert collector.accepted == [1, 2, 3]
    assert TOKEN not in caplog.text


@pytest.mark.parametrize(
    ("status", "retry_after", "expected_seconds"),
    [
        (503, "7", 7.0),
        (429, formatdate(NOW_UNIX + 120, usegmt=True), 120.0),
        (429, formatdate(NOW_UNIX - 120, usegmt=True), 1.0),  # past: never faster than 1 s
        (503, "999999", 900.0),  # capped
        (503, "soon", 1.0),  # unusable: normal backoff
    ],
)
def test_retry_after_is_honoured(
    spool: Spool,
    collector: Collector,
    make_sender: _Factory,
    status: int,
    retry_after: str,
    expected_seconds: float,
) -> None:
    spool.append(record(1))
    collector.fail_next(1, Reply(status, headers=(("Retry-After", retry_after),)))
    result = make_sender().send_once()
    assert result == SendResult(
        SendStatus.RETRY, http_status=status, delay_seconds=expected_seconds
    )
    assert len(spool) == 1


def test_dropped_connection_is_retried_later_and_stale_keepalive_at_once(
    spool: Spool, collector: Collector, make_sender: _Factory
) -> None:
    sender = make_sender()
    spool.append(record(1))
    collector.fail_next(1, Reply(close=True))
    assert sender.send_once() == SendResult(SendStatus.RETRY, delay_seconds=1.0)
    assert sender.send_once().records_sent == 1
    spool.append(record(2))
    collector.fail_next(1, Reply(close=True))  # on the reused connection: looks stale
    assert sender.send_once().records_sent == 1
    assert collector.accepted == [1, 2]
    assert [r.status for r in collector.requests] == [None, 200, None, 200]


def test_partial_success_is_counted(
    spool: Spool, collector: Collector, make_sender: _Factory, caplog: pytest.LogCaptureFixture
) -> None:
    answer = ExportMetricsServiceResponse()
    answer.partial_success.rejected_data_points = 2
    answer.partial_success.error_message = "too old"
    collector.fail_next(1, Reply(200, body=answer.SerializeToString()))
    spool.append(record(1))
    sender = make_sender()
    assert sender.send_once().records_sent == 1
    assert sender.rejected_data_points == 2
    assert "rejected 2 data point(s): too old" in caplog.text


def test_flush_drains_and_reports_failure_without_waiting(
    spool: Spool, collector: Collector, make_sender: _Factory
) -> None:
    fill(spool, range(1, 11))
    assert make_sender(max_batch_bytes=len(record(1)) * 4).flush(5.0) is True
    assert collector.accepted == list(range(1, 11))
    assert len(spool) == 0
    spool.append(record(11))
    collector.stop()
    assert make_sender().flush(0.5) is False  # the first backoff (1 s) is past the deadline
    assert len(spool) == 1


class ObservedEvent(threading.Event):
    """An event that counts the times someone started waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0
        self._changed = threading.Condition()

    def wait(self, timeout: float | None = None) -> bool:
        with self._changed:
            self.waits += 1
            self._changed.notify_all()
        return super().wait(timeout)

    def wait_for_waits(self, count: int, timeout: float) -> bool:
        """Until someone has started waiting ``count`` times in all (False on timeout)."""
        with self._changed:
            return self._changed.wait_for(lambda: self.waits >= count, timeout)


def test_run_sends_on_wake_and_stops_promptly_when_idle(
    spool: Spool, collector: Collector, make_sender: _Factory
) -> None:
    sender = make_sender()
    sender.wake = wake = ObservedEvent()
    stop = threading.Event()
    thread = threading.Thread(target=sender.run, args=(stop,), daemon=True)
    fill(spool, range(1, 3))
    thread.start()
    assert wake.wait_for_waits(1, 30)  # sent what there was, now idle
    assert collector.accepted == [1, 2]
    idle_waits = wake.waits
    spool.append(record(3))
    wake.set()
    assert wake.wait_for_waits(idle_waits + 1, 30)  # woke, sent, and is idle again
    assert collector.accepted == [1, 2, 3]
    stop.set()
    wake.set()  # the documented way to stop: stop, then wake
    thread.join(timeout=2)
    assert not thread.is_alive()


def test_run_stops_promptly_during_backoff(
    spool: Spool, collector: Collector, make_sender: _Factory
) -> None:
    sender = make_sender()
    stop = ObservedEvent()
    thread = threading.Thread(target=sender.run, args=(stop,), daemon=True)
    collector.fail_next(1, Reply(503, headers=(("Retry-After", "900"),)))
    spool.append(record(1))
    thread.start()
    assert stop.wait_for_waits(1, 30)  # parked in a 900 s backoff
    spool.append(record(2))
    sender.wake.set()  # new data must not cut the backoff short
    stop.set()
    thread.join(timeout=2)
    assert not thread.is_alive()
    assert [r.status for r in collector.requests] == [503]
    assert len(spool) == 2
