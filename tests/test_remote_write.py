"""Remote-write out: names, the wire format, the durable queue and the sender's retry rules.

The sender talks to a real HTTP server on loopback (an aiohttp app answering as a TSDB would,
with scripted failures first); backoff runs on a fake monotonic clock the tests advance.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import cramjam
import pytest
from aiohttp import web

from gpuwarden.collector.clients.http import HttpClient
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.remote_write.naming import labels, metric_name
from gpuwarden.collector.remote_write.queue import DiskQueue
from gpuwarden.collector.remote_write.sender import RemoteWriteSender
from gpuwarden.collector.remote_write.wire import Series, WireError, decode, encode
from gpuwarden.collector.remote_write.writer import HistoryWriter
from tests.capture_servers import ServedApp


@pytest.mark.parametrize(
    ("metric", "unit", "counter", "expected"),
    [
        ("hw.power", "W", False, "hw_power_watts"),
        ("hw.energy", "J", True, "hw_energy_joules_total"),
        ("hw.gpu.utilization", "1", False, "hw_gpu_utilization"),
        ("hw.gpu.memory.usage", "By", False, "hw_gpu_memory_usage_bytes"),
        ("hw.temperature", "Cel", False, "hw_temperature_celsius"),
        ("gpuwarden.model.requests", "{request}", True, "gpuwarden_model_requests_total"),
        ("requests_total", "", True, "requests_total"),
        ("latency_seconds", "s", False, "latency_seconds"),
        ("9lives", "", False, "_lives"),
    ],
)
def test_metric_names_follow_the_agents_prometheus_endpoint(metric, unit, counter, expected):
    assert metric_name(metric, unit, counter=counter) == expected


def test_labels_are_sorted_sanitised_and_keep_the_last_repeat():
    attrs = [("host.name", "n1"), ("hw.id", "GPU-1"), ("hw.id", "GPU-2"), ("z", None), ("e", "")]
    got = labels("m", attrs)
    assert got == (("__name__", "m"), ("host_name", "n1"), ("hw_id", "GPU-2"))
    assert labels("m", [("a.b", "x"), ("a_b", "y"), ("flag", True)]) == (
        ("__name__", "m"),
        ("a_b", "x;y"),
        ("flag", "true"),
    )


def test_wire_round_trip_is_snappy_block_protobuf():
    series = [
        Series((("__name__", "a"), ("x", "1")), (1000, 2000), (1.5, float("inf"))),
        Series((("__name__", "b"),), (3000,), (-2.0,)),
    ]
    body = encode(series)
    assert decode(body) == series
    raw = bytes(cramjam.snappy.decompress_raw(body))  # the block format, not the framed one
    assert b"__name__" in raw
    with pytest.raises(WireError):
        decode(b"not snappy at all")
    with pytest.raises(WireError):
        decode(bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff")))


# --- the durable queue ----------------------------------------------------------------------


def test_queue_survives_reopening_and_keeps_order(tmp_path):
    queue = DiskQueue(tmp_path, max_bytes=1 << 20)
    for i in range(5):
        queue.append(f"body-{i}".encode(), samples=i + 1)
    first = queue.peek()
    assert first is not None
    assert first.payload == b"body-0"
    queue.ack(first)
    reopened = DiskQueue(tmp_path, max_bytes=1 << 20)
    got = []
    while (record := reopened.peek()) is not None:
        got.append((record.payload, record.samples))
        reopened.ack(record)
    assert got == [(f"body-{i}".encode(), i + 1) for i in range(1, 5)]
    assert reopened.pending_bytes() == 0
    assert DiskQueue(tmp_path, max_bytes=1 << 20).peek() is None


def test_a_torn_record_at_the_end_is_cut_off(tmp_path):
    queue = DiskQueue(tmp_path, max_bytes=1 << 20)
    queue.append(b"whole", samples=3)
    queue.append(b"torn-record", samples=4)
    segment = sorted(tmp_path.glob("*.seg"))[-1]
    segment.write_bytes(segment.read_bytes()[:-3])  # a crash in the middle of the write
    reopened = DiskQueue(tmp_path, max_bytes=1 << 20)
    assert reopened.pending_samples() == 3
    reopened.append(b"after", samples=5)
    payloads = []
    while (record := reopened.peek()) is not None:
        payloads.append(record.payload)
        reopened.ack(record)
    assert payloads == [b"whole", b"after"]


def test_over_max_bytes_the_oldest_segment_goes_and_is_counted(tmp_path):
    body = b"x" * 1000
    queue = DiskQueue(tmp_path, max_bytes=20_000, segment_bytes=3000)
    dropped = 0
    for _ in range(30):  # ~30 kB into a 20 kB queue
        dropped += queue.append(body, samples=10)
    assert dropped > 0
    assert dropped == queue.dropped_samples
    assert queue.pending_bytes() <= 20_000
    assert queue.pending_samples() + dropped == 30 * 10
    first = queue.peek()
    assert first is not None  # reading resumes at the oldest segment kept


# --- the sender -----------------------------------------------------------------------------


class Tsdb:
    """A remote-write endpoint on loopback: answers ``script`` first, then 204."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, str]]] = []
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        app = web.Application()
        app.router.add_post("/api/v1/write", self.write)
        self.served = ServedApp(app)
        self.url = f"{self.served.url}/api/v1/write"

    async def write(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.headers.append(dict(request.headers))
        if self.script:
            status, headers = self.script.pop(0)
            return web.Response(status=status, text="scripted", headers=headers)
        self.bodies.append(body)
        return web.Response(status=204)


@pytest.fixture
def tsdb() -> Iterator[Tsdb]:
    server = Tsdb()
    yield server
    server.served.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def queued(tmp_path: Path, n: int) -> DiskQueue:
    queue = DiskQueue(tmp_path, max_bytes=1 << 20)
    for i in range(n):
        series = Series((("__name__", "m"),), (i * 1000,), (float(i),))
        queue.append(encode([series]), samples=1)
    return queue


def test_retryable_failures_keep_the_request_and_back_off(tmp_path, tsdb):
    clock = Clock()
    queue = queued(tmp_path, 3)
    tsdb.script = [(500, {}), (503, {}), (429, {"Retry-After": "7"})]
    sender = RemoteWriteSender(queue, HttpClient(), tsdb.url, clock=clock)
    assert sender.drain() == 0  # 500: backoff 0.5 s
    assert sender.drain() == 0  # still backing off: nothing sent
    assert len(tsdb.headers) == 1
    clock.now += 0.5
    assert sender.drain() == 0  # 503: backoff 1 s
    clock.now += 1.0
    assert sender.drain() == 0  # 429 with Retry-After: 7 s
    clock.now += 6.9
    assert sender.drain() == 0
    assert len(tsdb.headers) == 3
    clock.now += 0.1
    assert sender.drain() == 3
    values = [decode(body)[0].values for body in tsdb.bodies]
    assert values == [(0.0,), (1.0,), (2.0,)]  # in order, none lost
    assert sender.stats.sent_samples == 3
    assert sender.stats.failed_requests == {"5xx": 2, "429": 1}
    assert sender.stats.dropped_samples == {}
    assert queue.pending_bytes() == 0


def test_a_4xx_other_than_429_drops_the_request_and_counts_it(tmp_path, tsdb, caplog):
    queue = queued(tmp_path, 2)
    tsdb.script = [(400, {})]
    sender = RemoteWriteSender(queue, HttpClient(), tsdb.url, clock=Clock())
    assert sender.drain() == 2
    assert [decode(body)[0].values for body in tsdb.bodies] == [(1.0,)]
    assert sender.stats.dropped_samples == {"rejected": 1}
    assert "refused a request of 1 samples with 400" in caplog.text


def test_an_unreachable_tsdb_is_retried(tmp_path, tsdb):
    clock = Clock()
    queue = queued(tmp_path, 1)
    sender = RemoteWriteSender(queue, HttpClient(), "http://127.0.0.1:9/api/v1/write", clock=clock)
    assert sender.drain() == 0
    assert sender.stats.failed_requests == {"unreachable": 1}
    assert queue.pending_samples() == 1


def test_requests_carry_the_remote_write_headers(tmp_path, tsdb):
    sender = RemoteWriteSender(
        queued(tmp_path, 1),
        HttpClient(),
        tsdb.url,
        headers={"Authorization": "Bearer s3cret", "X-Scope-OrgID": "fleet"},
        clock=Clock(),
    )
    assert sender.drain() == 1
    headers = tsdb.headers[0]
    assert headers["Content-Encoding"] == "snappy"
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["X-Prometheus-Remote-Write-Version"] == "0.1.0"
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["X-Scope-OrgID"] == "fleet"


# --- the writer -----------------------------------------------------------------------------


def point(attrs: dict[str, object], t_s: int, value: float, *, kind: str = "gauge") -> NumberPoint:
    return NumberPoint(
        resource={"host.name": "node-a"},
        metric="hw.power",
        unit="W",
        kind=kind,
        monotonic=False,
        attributes=attrs,  # type: ignore[arg-type]
        time_unix_nano=t_s * 1_000_000_000,
        value=value,
    )


def test_the_writer_keeps_one_series_in_order_and_counts_late_points(tmp_path, tsdb):
    queue = DiskQueue(tmp_path, max_bytes=1 << 20)
    writer = HistoryWriter(
        queue, RemoteWriteSender(queue, HttpClient(), tsdb.url, clock=Clock()), batch_samples=3
    )
    writer.points([point({"hw.id": "G0", "hw.type": "gpu"}, 10, 1.0)])
    writer.points([point({"hw.type": "gpu", "hw.id": "G0"}, 20, 2.0)])  # same series, reordered
    writer.points([point({"hw.id": "G0", "hw.type": "gpu"}, 15, 9.0)])  # late: left out
    writer.points([point({"hw.id": "G0", "hw.type": "gpu"}, 20, 9.0)])  # a resend: left out
    writer.points([point({"hw.id": "G1", "hw.type": "gpu"}, 20, 3.0)])
    writer.points([point({"hw.id": "G0", "hw.type": "gpu"}, 30, 4.0)])
    assert writer.tick() == 2  # four samples in requests of at most three
    sent = [series for body in tsdb.bodies for series in decode(body)]
    g0 = (
        ("__name__", "hw_power_watts"),
        ("host_name", "node-a"),
        ("hw_id", "G0"),
        ("hw_type", "gpu"),
    )
    by_series: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
    for series in sent:
        by_series.setdefault(series.labels, []).extend(
            zip(series.timestamps_ms, series.values, strict=True)
        )
    assert by_series[g0] == [(10_000, 1.0), (20_000, 2.0), (30_000, 4.0)]
    assert len(by_series) == 2
    assert writer.stats.dropped_samples == {"out_of_order": 2}
    assert writer.stats.sent_samples == 4
