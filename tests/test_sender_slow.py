"""The sender against a real aiohttp receiver on 127.0.0.1 that is slow per byte, answers 503 or
is gone: no livelock, each change of failure logged once, evictions counted exactly.

The receiver is slow in a deterministic way: a body bigger than its capacity is stored (as the
collector did: it works on abandoned requests) and answered only after the sender's timeout, so
what times out depends on the batch size alone, never on how loaded the machine is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from gpuwarden.agent.rounds import INSTANCE_HEADER, ROUNDS_HEADER, decode_rounds
from gpuwarden.agent.sender import MAX_BATCH_RECORDS, OtlpHttpSender, SendStatus, otlp_points
from gpuwarden.agent.spool import HEADER_BYTES, Spool
from tests.collector_server import free_port

TIMEOUT_SECONDS = 0.5
POINTS_PER_ROUND = 3


def round_payload(n: int) -> bytes:
    """One spooled round: ``POINTS_PER_ROUND`` gauge points stamped ``n``."""
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "test.round"
    for i in range(POINTS_PER_ROUND):
        point = metric.gauge.data_points.add()
        point.time_unix_nano = n
        point.as_int = 100 * n + i
    return request.SerializeToString()


ROUND_BYTES = len(round_payload(1))


@dataclass
class Receiver:
    """An OTLP receiver on aiohttp: ``mode`` ok | unavailable | slow; ``capacity_bytes`` is what
    a slow receiver takes within the sender's timeout."""

    port: int = field(default_factory=free_port)
    mode: str = "ok"
    capacity_bytes: int = 12 * ROUND_BYTES
    sends: Counter[int] = field(default_factory=Counter)  # round -> times it arrived
    stored: Counter[int] = field(default_factory=Counter)  # round -> times it was stored
    timed_out: list[int] = field(default_factory=list)  # rounds per request answered too late
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None
    _release: asyncio.Event | None = None
    _thread: threading.Thread | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()  # aiohttp inflates the gzip body itself
        assert request.headers[INSTANCE_HEADER]
        rounds = decode_rounds(request.headers[ROUNDS_HEADER])
        assert sum(r.nbytes for r in rounds) == len(body)
        seqs = [r.seq for r in rounds]
        self.sends.update(seqs)
        if self.mode == "unavailable":
            return web.Response(status=503, text="busy\n")
        self.stored.update(seqs)  # a slow collector still does the work
        if self.mode == "slow" and len(body) > self.capacity_bytes:
            self.timed_out.append(len(seqs))
            assert self._release is not None
            with contextlib.suppress(TimeoutError):  # answer long after the sender gave up
                await asyncio.wait_for(self._release.wait(), 10 * TIMEOUT_SECONDS)
        return web.Response(status=200, content_type="application/x-protobuf")

    def start(self) -> None:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def serve() -> None:
            self._release = asyncio.Event()
            app = web.Application()
            app.router.add_post("/v1/metrics", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()
            ready.set()

        def main() -> None:
            assert self._loop is not None
            self._loop.run_until_complete(serve())
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        assert ready.wait(10)

    def stop(self) -> None:
        loop, runner = self._loop, self._runner
        if loop is None or runner is None:
            return

        async def down() -> None:
            assert self._release is not None
            self._release.set()
            await runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()
        self._loop = self._runner = self._thread = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/metrics"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    server.start()
    yield server
    server.stop()


def make_sender(spool: Spool, url: str) -> OtlpHttpSender:
    return OtlpHttpSender(spool, url, timeout_seconds=TIMEOUT_SECONDS, gzip_level=1)


def spool_of(tmp_path: Path, rounds: int, **kwargs: object) -> Spool:
    spool = Spool(tmp_path / "spool", max_bytes=10**8, fsync=False, **kwargs)  # type: ignore[arg-type]
    for n in range(1, rounds + 1):
        spool.append(round_payload(n))
    return spool


def drain(sender: OtlpHttpSender, max_calls: int) -> int:
    """Send until the spool is empty; return the calls it took (fail past ``max_calls``)."""
    for calls in range(1, max_calls + 1):
        if sender.send_once().status is SendStatus.EMPTY:
            return calls
    raise AssertionError(f"the spool did not drain in {max_calls} sends: livelock")


def test_a_receiver_slower_than_the_timeout_per_big_batch_still_drains_the_spool(
    tmp_path: Path, receiver: Receiver
) -> None:
    rounds = 200
    spool = spool_of(tmp_path, rounds)
    receiver.mode = "slow"  # takes 12 rounds within the timeout
    sender = make_sender(spool, receiver.url)
    try:
        calls = drain(sender, max_calls=100)
    finally:
        sender.close()
    assert len(spool) == 0
    assert set(receiver.stored) == set(range(1, rounds + 1))  # every round arrived
    duplicates = sum(receiver.sends.values()) - rounds
    # Each timed-out batch is sent again, nothing else is: the duplicates are exactly those,
    # and after the first (the whole spool) a timed-out batch is at most twice the capacity.
    assert duplicates == sum(receiver.timed_out)
    assert receiver.timed_out[0] == rounds
    assert all(n <= 2 * 12 for n in receiver.timed_out[1:])
    assert sender.timeouts == len(receiver.timed_out) <= 6
    print(  # the figures quoted in the report
        f"\n{rounds} rounds, receiver takes 12 per timeout: {calls} sends, "
        f"{sender.timeouts} timeouts, {duplicates} duplicate rounds sent"
    )


def test_the_batch_limit_comes_back_after_the_receiver_recovers(
    tmp_path: Path, receiver: Receiver
) -> None:
    spool = spool_of(tmp_path, 40)
    receiver.mode = "slow"
    receiver.capacity_bytes = 4 * ROUND_BYTES
    sender = make_sender(spool, receiver.url)
    try:
        assert sender.send_once().status is SendStatus.RETRY  # 40 rounds: too slow
        assert sender.batch_limit == 1
        receiver.mode = "ok"
        drain(sender, max_calls=40)
        for n in range(41, 3000):  # a backlog again, the receiver fast: the limit grows back
            spool.append(round_payload(n))
        drain(sender, max_calls=200)
    finally:
        sender.close()
    # 20 (half the batch that timed out) was reached by doubling, then it grew by an eighth
    assert 10 * 20 < sender.batch_limit <= MAX_BATCH_RECORDS
    assert sender.timeouts == 1


def test_each_change_of_failure_kind_is_logged_once(
    tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    spool = spool_of(tmp_path, 30)
    sender = make_sender(spool, receiver.url)
    caplog.set_level(logging.INFO, logger="gpuwarden.agent.sender")
    try:
        receiver.mode = "unavailable"
        for _ in range(3):
            assert sender.send_once().status is SendStatus.RETRY
        receiver.mode = "slow"
        receiver.capacity_bytes = 0  # every body times out
        for _ in range(3):
            assert sender.send_once().status is SendStatus.RETRY
        receiver.stop()
        for _ in range(3):
            assert sender.send_once().status is SendStatus.RETRY
        receiver.start()
        receiver.mode = "ok"
        drain(sender, max_calls=40)
    finally:
        sender.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4, lines
    assert "unavailable (HTTP 503" in lines[0]
    assert "did not answer in time" in lines[1]
    assert "(until now: HTTP 503)" in lines[1]
    assert "ConnectionRefusedError" in lines[2]
    assert "(until now: timeout)" in lines[2]
    assert lines[3] == "collector accepts data again after 9 failed attempt(s)"
    assert len(spool) == 0


def test_the_eviction_counter_counts_exactly_the_rounds_lost(
    tmp_path: Path, receiver: Receiver
) -> None:
    keep = 10
    spool = Spool(
        tmp_path / "spool",
        max_bytes=keep * (HEADER_BYTES + ROUND_BYTES),
        fsync=False,
        count_points=otlp_points,
    )
    sender = make_sender(spool, receiver.url)
    receiver.mode = "unavailable"
    try:
        appended = 0
        for _ in range(5):  # an outage: rounds pile up, the oldest are evicted
            for _ in range(7):
                appended += 1
                spool.append(round_payload(appended))
            assert sender.send_once().status is SendStatus.RETRY
        receiver.mode = "ok"
        drain(sender, max_calls=10)
    finally:
        sender.close()
    delivered = set(receiver.stored)
    lost = set(range(1, appended + 1)) - delivered
    assert len(lost) == appended - keep
    assert spool.evicted_records == len(lost)
    assert spool.evicted_points == POINTS_PER_ROUND * len(lost)
    assert spool.evicted_bytes == len(lost) * (HEADER_BYTES + ROUND_BYTES)


@pytest.mark.parametrize("answer", ["ok", "unavailable"])
def test_a_round_evicted_while_in_flight_counts_as_lost_only_if_its_send_failed(
    tmp_path: Path, answer: str
) -> None:
    """The over-count of issue 16: rounds evicted from disk during a send that then succeeded
    were counted as lost although the collector had them."""
    spool = Spool(
        tmp_path / "spool",
        max_bytes=4 * (HEADER_BYTES + ROUND_BYTES),
        fsync=False,
        count_points=otlp_points,
    )
    for n in range(1, 5):
        spool.append(round_payload(n))
    in_flight = spool.peek(MAX_BATCH_RECORDS, 1 << 20)  # the sender's batch: rounds 1..4
    for n in range(5, 8):  # the sampler goes on meanwhile: rounds 1..3 leave the disk
        spool.append(round_payload(n))
    assert spool.evicted_records == 0  # not yet known to be lost
    if answer == "ok":
        spool.ack(in_flight[-1][0])  # the collector took 1..4
        expected = (0, 0, [5, 6, 7])
    else:
        spool.release()  # the send failed: 1..3 are gone for good
        expected = (3, 3 * POINTS_PER_ROUND, [4, 5, 6, 7])
    left = [seq for seq, _ in spool.peek(MAX_BATCH_RECORDS, 1 << 20)]
    assert (spool.evicted_records, spool.evicted_points, left) == expected
