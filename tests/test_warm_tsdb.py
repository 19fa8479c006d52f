"""Warm start from a real TSDB: what one collector wrote by remote-write, another reads back.

A real ``CollectorService`` with a real history writer takes agent rounds (OTLP bodies: a gauge,
a counter and the info metric with its integer ``gpuwarden.gpu.index``) and sends them to a real
VictoriaMetrics or Prometheus; a new, empty store is filled from that TSDB by the real readers
and must hold the same series (same identity, integer attribute included) with the same values
and counter increases. A writer started after the restart and fed the same rounds again (the
agents' resends) must not write them a second time, whether the TSDB or its queue's files told it.
"""

from __future__ import annotations

import math
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE

from gpuwarden.collector.clients.http import HttpClient
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.remote_write.inverse import Inverse, MetricOrigin
from gpuwarden.collector.remote_write.naming import labels
from gpuwarden.collector.remote_write.queue import DiskQueue
from gpuwarden.collector.remote_write.reader import ReadApi, reader_for
from gpuwarden.collector.remote_write.sender import RemoteWriteSender
from gpuwarden.collector.remote_write.warm_start import warm_from_tsdb
from gpuwarden.collector.remote_write.wire import Series, encode
from gpuwarden.collector.remote_write.writer import HistoryWriter
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.sqlite import MEMORY, SqliteStorage
from gpuwarden.collector.store.types import SeriesKey
from gpuwarden.collector.store.window import WindowStore
from tests.collector_server import free_port
from tests.tsdb_servers import PrometheusReceiver, VictoriaMetrics, _Server, binary

NS = 1_000_000_000
NODES = ("node-a", "node-b")
GPUS = ("GPU-0", "GPU-1")
STEPS = 40
SERVERS: dict[str, tuple[type[_Server], ReadApi]] = {
    "victoria-metrics": (VictoriaMetrics, "victoriametrics"),
    "prometheus": (PrometheusReceiver, "prometheus"),
}


def _string(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _int(key: str, value: int) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(int_value=value))


def round_body(node: str, t_ns: int, step: int) -> bytes:
    """One agent round: utilisation (gauge), energy (counter) and the info metric of two GPUs."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(_string("host.name", node))
    sm = rm.scope_metrics.add()
    util, energy, info = sm.metrics.add(), sm.metrics.add(), sm.metrics.add()
    util.name, util.unit = "hw.gpu.utilization", "1"
    energy.name, energy.unit = "hw.energy", "J"
    energy.sum.is_monotonic = True
    energy.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
    info.name, info.unit = "gpuwarden.gpu.info", "1"
    for g, gpu in enumerate(GPUS):
        u = util.gauge.data_points.add()
        u.time_unix_nano, u.as_double = t_ns, ((step * 7 + g * 3) % 10) / 10
        u.attributes.extend([_string("hw.id", gpu), _string("hw.type", "gpu")])
        e = energy.sum.data_points.add()
        e.time_unix_nano, e.start_time_unix_nano = t_ns, t_ns - (step + 1) * 10 * NS
        e.as_int = 300 * (step + 1) * (g + 1) + 7 * step * step
        e.attributes.extend([_string("hw.id", gpu), _string("hw.type", "gpu")])
        i = info.gauge.data_points.add()
        i.time_unix_nano, i.as_double = t_ns, 1.0
        i.attributes.extend(
            [_string("hw.id", gpu), _string("hw.model", "H100"), _int("gpuwarden.gpu.index", g)]
        )
    return req.SerializeToString()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def new_store() -> WindowStore:
    return WindowStore(step_seconds=10, recent_seconds=3600, staleness_seconds=1e6)


class Collector:
    """A service with a history writer on ``queue_dir``, sending to ``url``."""

    def __init__(self, url: str, queue_dir: Path, clock: Clock, cluster: str | None = None) -> None:
        storage = SqliteStorage(MEMORY)
        queue = DiskQueue(queue_dir, max_bytes=64 << 20)
        sender = RemoteWriteSender(queue, HttpClient(), url, timeout_seconds=10, clock=clock)
        self.writer = HistoryWriter(queue, sender, batch_samples=50, cluster=cluster)
        self.service = CollectorService(
            store=new_store(),
            storage=storage,
            registry=JobRegistry(storage, []),
            history=self.writer,
        )
        self.clock = clock

    def take(self, t0_ns: int, steps: range) -> None:
        for step in steps:
            for node in NODES:
                body = round_body(node, t0_ns + step * 10 * NS, step)
                assert self.service.accept_payload(body, PROTOBUF, node).rejected == 0

    def drain(self) -> None:
        for _ in range(100):
            self.writer.tick()
            if self.writer.queue.pending_bytes() == 0:
                return
            self.clock.now += 60.0
        raise AssertionError(f"queue not drained: {self.writer.stats}")


def start_ns() -> int:
    """A 10 s aligned time early enough for every round to be in the past."""
    return (int(time.time()) // 10 * 10 - (STEPS + 5) * 10) * NS


def searchable(tsdb: _Server) -> None:
    """VictoriaMetrics makes fresh samples searchable within a second; ask it to now."""
    if isinstance(tsdb, VictoriaMetrics):
        with urllib.request.urlopen(f"{tsdb.url}/internal/force_flush", timeout=30):  # noqa: S310
            pass


@pytest.fixture(params=sorted(SERVERS))
def tsdb(request: pytest.FixtureRequest) -> Iterator[tuple[_Server, ReadApi]]:
    name = request.param
    if binary(name) is None:
        pytest.skip(f"{name} is not installed (scripts/system-packages.sh installs it)")
    cls, api = SERVERS[name]
    with cls() as server:
        yield server, api


def rows_of(
    store: WindowStore, metric: str, start: float, end: float
) -> dict[SeriesKey, list[float]]:
    matrix = store.matrix(metric, start=start, end=end)
    return {
        info.key: [round(float(v), 6) if not math.isnan(v) else math.nan for v in row]
        for info, row in zip(matrix.series, matrix.values, strict=True)
    }


def same(a: dict[SeriesKey, list[float]], b: dict[SeriesKey, list[float]]) -> bool:
    if a.keys() != b.keys():
        return False
    return all(np.array_equal(np.array(a[k]), np.array(b[k]), equal_nan=True) for k in a)


def test_a_store_read_back_from_the_tsdb_is_the_store_that_wrote_it(tsdb, tmp_path):
    server, api = tsdb
    clock = Clock()
    first = Collector(server.write_url, tmp_path / "queue", clock)
    t0 = start_ns()
    first.take(t0, range(STEPS))
    first.drain()
    searchable(server)

    fresh = new_store()
    reader = reader_for(api, HttpClient(), server.url, page_seconds=70)  # several pages
    warm = warm_from_tsdb(fresh, reader, start=t0 / NS - 30, end=time.time())
    assert warm.error is None
    assert warm.series == 3 * len(NODES) * len(GPUS)
    assert warm.samples == STEPS * len(NODES) * len(GPUS) * 3
    assert warm.unknown_series == 0
    start, end = t0 / NS - 60, time.time() + 10
    for metric in ("hw.gpu.utilization", "hw.energy", "gpuwarden.gpu.info"):
        want = rows_of(first.service.store, metric, start, end)
        got = rows_of(fresh, metric, start, end)
        assert len(want) == len(NODES) * len(GPUS)
        assert same(got, want), (metric, got, want)
    # the integer attribute came back as an integer: the agents' next point joins the series
    keys = {
        dict(k[1])["gpuwarden.gpu.index"] for k in rows_of(fresh, "gpuwarden.gpu.info", start, end)
    }
    assert keys == {0, 1}


def test_a_warm_start_reads_only_its_own_clusters_series(tsdb, tmp_path):
    """Two clusters with the same node names write to one TSDB; each reads back only its own
    series, and without the ``cluster`` label (the agents' points never carry it)."""
    server, api = tsdb
    clock = Clock()
    east = Collector(server.write_url, tmp_path / "east", clock, cluster="east")
    west = Collector(server.write_url, tmp_path / "west", clock, cluster="west")
    t0 = start_ns()
    east.take(t0, range(STEPS))
    west.take(t0, range(0, STEPS, 2))  # half of east's rounds: the two must not mix
    east.drain()
    west.drain()
    searchable(server)

    start, end = t0 / NS - 60, time.time() + 10
    for cluster, source in (("east", east), ("west", west)):
        fresh = new_store()
        reader = reader_for(api, HttpClient(), server.url, page_seconds=70, cluster=cluster)
        warm = warm_from_tsdb(fresh, reader, start=t0 / NS - 30, end=time.time())
        assert warm.error is None
        assert warm.unknown_series == 0
        for metric in ("hw.gpu.utilization", "gpuwarden.gpu.info"):
            want = rows_of(source.service.store, metric, start, end)
            got = rows_of(fresh, metric, start, end)
            assert same(got, want), (cluster, metric)
            assert all("cluster" not in dict(key[1]) for key in got)


def test_resent_rounds_after_a_restart_reach_the_tsdb_once(tsdb, tmp_path):
    server, api = tsdb
    clock = Clock()
    first = Collector(server.write_url, tmp_path / "queue", clock)
    t0 = start_ns()
    first.take(t0, range(20))
    first.drain()
    searchable(server)
    # the restart: a new collector on a new queue folder (the TSDB alone knows what was sent)
    second = Collector(server.write_url, tmp_path / "queue-2", clock)
    second.service.warm_from_tsdb(reader_for(api, HttpClient(), server.url), 3000)
    assert second.service.warm is not None
    assert second.service.warm.samples == 20 * 12
    second.take(t0, range(10, 30))  # the agents resend rounds 10..19, then go on
    second.drain()
    searchable(server)
    for name in ("hw_gpu_utilization", "hw_energy_joules_total", "gpuwarden_gpu_info"):
        samples = server.samples(name)
        assert len(samples) == len(NODES) * len(GPUS), (name, list(samples))
        for series_labels, points in samples.items():
            times = [t for t, _ in points]
            assert times == sorted(set(times)), (name, series_labels)  # no timestamp twice
            assert len(times) == 30, (name, series_labels)  # none missing


def test_a_restarted_writer_does_not_queue_again_what_its_queue_holds(tmp_path):
    clock = Clock()
    url = f"http://127.0.0.1:{free_port()}/api/v1/write"  # nobody listens: all stays queued
    first = Collector(url, tmp_path / "queue", clock)
    t0 = start_ns()
    first.take(t0, range(5))
    first.writer.flush()
    queued = first.writer.queue.pending_samples()
    assert queued == 5 * len(NODES) * len(GPUS) * 3
    second = Collector(url, tmp_path / "queue", clock)  # the same folder after a restart
    second.take(t0, range(7))  # 5 rounds resent, 2 new
    second.writer.flush()
    assert second.writer.queue.pending_samples() == 7 * len(NODES) * len(GPUS) * 3
    assert second.writer.stats.dropped_samples == {"out_of_order": queued}


def test_unknown_names_are_left_out_and_an_unreachable_tsdb_is_an_error_not_a_crash(tmp_path):
    only_util = Inverse(
        names={"hw_gpu_utilization": MetricOrigin("hw.gpu.utilization", "1", False)}
    )
    assert only_util.origin((("__name__", "hw_power_watts"), ("hw_id", "G"))) is None
    origin = only_util.origin(
        (("__name__", "hw_gpu_utilization"), ("host_name", "n1"), ("hw_id", "G"))
    )
    assert origin is not None
    assert (origin.host, dict(origin.attributes)) == ("n1", {"hw.id": "G"})
    store = new_store()
    reader = reader_for("victoriametrics", HttpClient(), f"http://127.0.0.1:{free_port()}")
    warm = warm_from_tsdb(store, reader, start=time.time() - 600, end=time.time())
    assert warm.error is not None
    assert "no answer" in warm.error
    assert warm.series == 0
    assert store.series_count() == 0


def test_the_long_window_comes_back_as_per_minute_means(tmp_path):
    """Two days of one GPU in VictoriaMetrics (a sample a minute): a store with a 1 h recent and
    a 2-day long window, warm-started without a snapshot, holds the long window's minutes
    (gauge: the value; counter: its per-second rate) and says its data goes back two days."""
    if binary("victoria-metrics") is None:
        pytest.skip("victoria-metrics is not installed (scripts/system-packages.sh installs it)")
    now = float(int(time.time()) // 60 * 60)
    minutes = list(range(int(now) - 2 * 86400 + 60, int(now) - 60, 60))
    util = [0.25 + 0.5 * ((t // 3600) % 2) for t in minutes]
    energy = [1000.0 + 90.0 * i for i in range(len(minutes))]  # 1.5 W
    host, gpu = [("host.name", "n1")], [("hw.id", "GPU-0")]
    series = [
        Series(
            labels("hw_gpu_utilization", [*host, *gpu]),
            tuple(t * 1000 for t in minutes),
            tuple(util),
        ),
        Series(
            labels("hw_energy_joules_total", [*host, *gpu]),
            tuple(t * 1000 for t in minutes),
            tuple(energy),
        ),
    ]
    server = VictoriaMetrics()
    with server:
        request = urllib.request.Request(  # noqa: S310 - loopback
            server.write_url,
            data=encode(series),
            headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"},
        )
        with urllib.request.urlopen(request, timeout=30):  # noqa: S310
            pass
        searchable(server)
        store = WindowStore(
            step_seconds=10, recent_seconds=3600, long_seconds=2 * 86400, clock=lambda: now
        )
        reader = reader_for("victoriametrics", HttpClient(), server.url)
        storage = SqliteStorage(MEMORY)
        service = CollectorService(
            store=store, storage=storage, registry=JobRegistry(storage, []), clock=lambda: now
        )
        warm = service.warm_from_tsdb(reader, 3600, 2 * 86400)
    assert warm.error is None
    assert warm.long_slots > 2 * (len(minutes) - 70)
    held = store.held_since()
    assert held is not None
    assert held <= minutes[0] + 60  # two days back, not one hour
    start, end = now - 2 * 86400, now - 3600
    m = store.matrix("hw.gpu.utilization", start=start, end=end, resolution="long")
    (row,) = m.values
    want = dict(zip(minutes, util, strict=True))
    compared = 0
    for t, got in zip(m.times.tolist(), row.tolist(), strict=True):
        if int(t) in want and not math.isnan(got):
            assert got == pytest.approx(want[int(t)], abs=1e-6), t
            compared += 1
    assert compared > len(minutes) - 70  # every minute older than the recent window
    e = store.matrix("hw.energy", start=start, end=end, resolution="long")
    (rates,) = e.values
    known = rates[~np.isnan(rates)]
    assert known.size > len(minutes) - 70
    assert np.allclose(known, 1.5, rtol=1e-3)


def test_over_the_sample_bound_the_newest_data_comes_back(tsdb, tmp_path):
    server, api = tsdb
    clock = Clock()
    first = Collector(server.write_url, tmp_path / "queue", clock)
    t0 = start_ns()
    first.take(t0, range(STEPS))
    first.drain()
    searchable(server)
    fresh = new_store()
    per_page = 7 * len(NODES) * len(GPUS) * 3  # 70 s pages: 7 rounds of 12 series
    reader = reader_for(api, HttpClient(), server.url, page_seconds=70, max_samples=2 * per_page)
    warm = warm_from_tsdb(fresh, reader, start=t0 / NS - 30, end=time.time())
    assert warm.error is not None
    assert "max_samples" in warm.error
    newest_ms = (t0 + (STEPS - 1) * 10 * NS) // 1_000_000
    assert set(warm.newest_ms.values()) == {newest_ms}  # the writer knows the newest of each
    latest = fresh.latest("hw.gpu.utilization")
    assert latest.times.size == len(NODES) * len(GPUS)
    assert set(latest.times.tolist()) == {newest_ms / 1000}
    held = fresh.held_since()
    assert held is not None
    assert held > t0 / NS + 60  # the oldest rounds were left out, not the newest


def test_a_standby_following_the_tsdb_holds_what_the_leader_stored(tsdb, tmp_path):
    """Active/standby: agents send to the leader only; the standby reads back what the leader
    wrote to the TSDB (at start, then ``follow_tsdb`` every so often) and so holds the leader's
    window when it takes over. Its clock is set to the rounds' times: the leader's points reach
    the TSDB as they happen."""
    server, api = tsdb
    leader = Collector(server.write_url, tmp_path / "leader", Clock())
    t0 = start_ns()
    half = STEPS // 2
    leader.take(t0, range(half))
    leader.drain()
    searchable(server)

    standby_clock = Clock()
    standby_clock.now = t0 / NS + half * 10 + 5
    storage = SqliteStorage(MEMORY)
    standby = CollectorService(
        store=new_store(),
        storage=storage,
        registry=JobRegistry(storage, []),
        clock=lambda: standby_clock.now,
    )
    reader = reader_for(api, HttpClient(), server.url, page_seconds=70)
    assert standby.follow_tsdb() is None  # no reader until the start-up read-back set it
    assert standby.warm_from_tsdb(reader, 3600.0).error is None

    leader.take(t0, range(half, STEPS))  # the standby's own window has none of these
    leader.drain()
    searchable(server)
    start, end = t0 / NS - 60, time.time() + 10
    want = rows_of(leader.service.store, "hw.gpu.utilization", start, end)
    assert not same(rows_of(standby.store, "hw.gpu.utilization", start, end), want)

    standby_clock.now = time.time()
    followed = standby.follow_tsdb()
    assert followed is not None
    assert followed.error is None
    assert followed.samples > 0
    for metric in ("hw.gpu.utilization", "hw.energy", "gpuwarden.gpu.info"):
        got = rows_of(standby.store, metric, start, end)
        assert same(got, rows_of(leader.service.store, metric, start, end)), metric
