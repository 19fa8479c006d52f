"""Ingest sheds early under overload, on the real app over loopback: a request that waited
longer than ``max_queue_wait_seconds`` before its handler ran (the event loop was busy) is
answered 503 with ``Retry-After`` and not stored; a request whose client closed its connection
before the collector got to it is neither decoded nor stored, and counted on ``/metrics``; the
same two checks guard a big body waiting for a worker thread.

The overload is made, not timed: the test blocks the server's own event loop (it runs in the
test's loop) while a client thread sends its request, so the request provably waited as long as
the block (a loaded machine only makes it longer). Nothing asserts on a duration.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import parse_tokens
from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint
from gpuwarden.collector.ingest.sink import SeriesLog
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import LOOP_LAG, STATS
from gpuwarden.collector.web.shed import MAX_RETRY_AFTER_SECONDS, LoopLag, retry_after_seconds
from tests.test_web_guard import BIG, body

TOKEN = "token-of-agent-shed-0123456789"
READER = "token-of-reader-shed-0123456789"
BLOCK_SECONDS = 1.0
"""How long the tests hold the server's event loop: five times the wait limit they set."""
LIMIT_SECONDS = 0.2


def config(**settings: object) -> CollectorConfig:
    tokens = parse_tokens(f"agent a {TOKEN} nodes=*\nreader r {READER}\n", "tokens")
    return CollectorConfig(tokens=tokens, **settings)  # type: ignore[arg-type]


def request_bytes(payload: bytes) -> bytes:
    head = (
        "POST /v1/metrics HTTP/1.1\r\nHost: collector\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/x-protobuf\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def answer_of(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes, or the first complete answer head."""
    sock.settimeout(60)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


class Client(threading.Thread):
    """Sends one request from another thread; ``sent`` is set once its bytes are out, then it
    reads the answer or, with ``hang_up``, closes its socket once that event is set (or at
    once with ``hang_up_at_once``), before any answer."""

    def __init__(
        self,
        port: int,
        payload: bytes,
        *,
        hang_up: threading.Event | None = None,
        hang_up_at_once: bool = False,
    ) -> None:
        super().__init__(daemon=True)
        self.port, self.payload = port, payload
        self.hang_up = hang_up
        if hang_up_at_once:
            self.hang_up = threading.Event()
            self.hang_up.set()
        self.sent = threading.Event()
        self.closed = threading.Event()
        self.answer = b""

    def run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as sock:
            sock.sendall(request_bytes(self.payload))
            self.sent.set()
            if self.hang_up is not None:
                assert self.hang_up.wait(60)
                sock.close()  # the agent's timeout: it closes and will resend later
                self.closed.set()
                return
            self.answer = answer_of(sock)


def block_loop_until(event: threading.Event, then_seconds: float = 0.0) -> None:
    """Hold the calling (the server's) event loop until ``event``, then ``then_seconds``
    more: the requests sent meanwhile wait in the socket buffers, as under overload."""
    assert event.wait(60)
    time.sleep(then_seconds)


@asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[int]:
    """``app`` on a loopback port as the CLI serves it (``aiohttp_client``'s test server would
    cancel a handler whose client went; ``run_app`` does not, so the check is the receiver's)."""
    runner = web.AppRunner(app, handler_cancellation=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def post(port: int, payload: bytes, token: str = TOKEN) -> int:
    async with aiohttp.ClientSession() as session:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-protobuf"}
        url = f"http://127.0.0.1:{port}/v1/metrics"
        async with session.post(url, data=payload, headers=headers) as response:
            return response.status


async def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "condition not met within 60 s"
        await asyncio.sleep(0.02)


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def header(answer: bytes, name: bytes) -> bytes:
    for line in answer.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == name.lower():
            return value.strip()
    raise AssertionError(f"no {name!r} in {answer[:300]!r}")


async def test_a_request_that_waited_past_the_limit_is_shed_then_one_on_time_is_stored():
    sink = SeriesLog()
    app = create_app(config(max_queue_wait_seconds=LIMIT_SECONDS), sink)
    # the stall counts for 5 s: the request is handled within that on any loaded machine
    app[LOOP_LAG].window_seconds = 5.0
    async with served(app) as port:
        late = Client(port, body(host="node-late"))
        late.start()
        block_loop_until(late.sent, BLOCK_SECONDS)
        await asyncio.to_thread(late.join, 60)
        assert status_of(late.answer) == 503, late.answer[:300]
        assert int(header(late.answer, b"Retry-After")) >= 2
        assert b"requests wait" in late.answer
        assert app[STATS].shed == {"wait": 1}
        assert app[STATS].responses[503] == 1
        assert not sink.sources  # nothing of it stored: the agent keeps it in its spool

        await wait_for(lambda: app[LOOP_LAG].seconds() <= LIMIT_SECONDS)  # caught up
        assert await post(port, body(host="node-on-time")) == 200
        assert set(sink.sources) == {"a"}


async def test_a_request_whose_client_has_gone_is_neither_stored_nor_answered(tmp_path: Path):
    service = build_service(CollectorConfig(database=tmp_path / "c.db"))
    app = create_app(config(database=tmp_path / "c.db"), service=service, background=False)
    async with served(app) as port:
        gone = Client(port, body(host="node-gone"), hang_up_at_once=True)
        gone.start()
        block_loop_until(gone.closed)  # closed before the collector read a byte of it
        await asyncio.to_thread(gone.join, 60)
        await wait_for(lambda: app[STATS].gone == 1)
        assert not app[STATS].responses  # no answer counted: nobody was there to read it
        assert "node-gone" not in service.nodes
        assert service.store.series_count() == 0
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/metrics"
            auth = {"Authorization": f"Bearer {READER}"}
            async with session.get(url, headers=auth) as response:
                text = await response.text()
    assert "gpuwarden_collector_requests_abandoned_total 1.0" in text
    assert "gpuwarden_collector_event_loop_lag_seconds" in text
    service.storage.close()


class HeldSink(SeriesLog):
    """A sink whose first ``accept`` holds until released: the one worker thread stays busy."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def accept(self, points: Iterable[NumberPoint], source: str) -> int:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(60)
        return super().accept(points, source)

    def accept_histograms(self, points: Sequence[HistogramPoint], source: str) -> int:
        return 0


@pytest.mark.parametrize("hang_up", [False, True], ids=["waited", "gone"])
async def test_a_big_body_waiting_for_a_worker_thread_is_shed_or_dropped(hang_up: bool):
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
    sink = HeldSink()
    app = create_app(config(max_queue_wait_seconds=LIMIT_SECONDS), sink)
    async with served(app) as port:
        await shed_or_drop(app, sink, port, hang_up=hang_up)
    assert sink.sources["a"].requests == 1  # the first only


async def shed_or_drop(app: web.Application, sink: HeldSink, port: int, *, hang_up: bool) -> None:
    # (no asyncio.to_thread here: the one worker thread is what the requests queue for)
    first = Client(port, BIG)
    first.start()
    await wait_for(sink.entered.is_set)  # the only worker thread is taken
    hang_up_now = threading.Event()
    second = Client(port, BIG, hang_up=hang_up_now if hang_up else None)
    second.start()
    await wait_for(lambda: app[STATS].inflight == 2)  # queued for the worker
    if hang_up:
        hang_up_now.set()
        await wait_for(second.closed.is_set)  # gone while it waits
    await asyncio.sleep(BLOCK_SECONDS)  # it waits longer than the limit
    sink.release.set()
    await wait_for(lambda: not first.is_alive() and not second.is_alive())
    assert status_of(first.answer) == 200
    await wait_for(lambda: app[STATS].inflight == 0)
    if hang_up:
        assert app[STATS].gone == 1
        assert not app[STATS].shed
    else:
        assert status_of(second.answer) == 503, second.answer[:300]
        assert b"for a worker thread" in second.answer
        assert app[STATS].shed == {"wait": 1}


def test_retry_after_follows_the_lag_within_bounds():
    assert retry_after_seconds(0.3) == 2
    assert retry_after_seconds(6.2) == 7
    assert retry_after_seconds(600.0) == MAX_RETRY_AFTER_SECONDS


def test_the_lag_is_zero_before_it_is_measured():
    assert LoopLag().seconds() == 0.0


def test_the_default_limit_is_half_the_agents_default_timeout():
    from gpuwarden.agent.config import CollectorConfig as AgentCollectorConfig

    assert CollectorConfig().max_queue_wait_seconds == AgentCollectorConfig().timeout_seconds / 2


async def test_a_stall_counts_for_the_window_after_the_loop_caught_up():
    lag = LoopLag(window_seconds=60.0)
    lag.start(asyncio.get_running_loop())
    try:
        await asyncio.sleep(0.3)  # a few timers on time
        time.sleep(BLOCK_SECONDS)  # the stall: no timer can fire
        await asyncio.sleep(0.3)  # timers on time again
        # the timer due during the stall fired at least BLOCK - period late; it still counts
        assert lag.seconds() >= BLOCK_SECONDS - lag.period_seconds
    finally:
        lag.stop()
    assert lag.seconds() == 0.0
