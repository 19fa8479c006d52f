"""Remote-write into real TSDBs: Debian's VictoriaMetrics and Prometheus.

Points go into a real ``CollectorService`` as OTLP bodies (the receiver's path); its history
writer queues them on disk and sends them; the TSDB is then read back and must hold every
point, with its exact timestamp and value, once. The TSDB is stopped in the middle (ingest goes
on, the queue grows) and started again; the collector is replaced by a new one on the same
queue folder while the queue is not empty. Backoff runs on a fake clock the tests advance.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE

from gpuwarden.collector.build import build_service
from gpuwarden.collector.clients.http import HttpClient
from gpuwarden.collector.config import load_collector_config
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.remote_write.derived import job_samples
from gpuwarden.collector.remote_write.queue import DiskQueue
from gpuwarden.collector.remote_write.sender import RemoteWriteSender
from gpuwarden.collector.remote_write.writer import HistoryWriter
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import AccountingRow
from gpuwarden.collector.storage.sqlite import MEMORY, SqliteStorage
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.exposition import FleetMetrics
from tests.tsdb_servers import PrometheusReceiver, VictoriaMetrics, _Server, binary

NS = 1_000_000_000
NODES = ("node-a", "node-b")
GPUS = ("GPU-0", "GPU-1")
POWER = "hw_power_watts"
ENERGY = "hw_energy_joules_total"


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def request(node: str, t_ns: int, step: int) -> bytes:
    """One agent round: power (gauge, W) and energy (monotonic sum, J) of two GPUs."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(kv("host.name", node))
    sm = rm.scope_metrics.add()
    power = sm.metrics.add()
    power.name, power.unit = "hw.power", "W"
    energy = sm.metrics.add()
    energy.name, energy.unit = "hw.energy", "J"
    energy.sum.is_monotonic = True
    energy.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
    for g, gpu in enumerate(GPUS):
        p = power.gauge.data_points.add()
        p.time_unix_nano = t_ns
        p.as_double = watts(node, g, step)
        p.attributes.extend([kv("hw.id", gpu), kv("hw.type", "gpu")])
        e = energy.sum.data_points.add()
        e.time_unix_nano = t_ns
        e.start_time_unix_nano = t_ns - (step + 1) * 10 * NS
        e.as_int = 1000 * (step + 1) * (g + 1)
        e.attributes.append(kv("hw.id", gpu))
    return req.SerializeToString()


def watts(node: str, gpu: int, step: int) -> float:
    return 100.0 + 7.25 * step + 1000 * gpu + (0.5 if node == "node-b" else 0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Run:
    """A collector with a history writer, fed agent rounds, and what it was fed."""

    def __init__(self, url: str, queue_dir: Path, clock: Clock) -> None:
        storage = SqliteStorage(MEMORY)
        store = WindowStore(step_seconds=10, recent_seconds=3600, staleness_seconds=1e6)
        queue = DiskQueue(queue_dir, max_bytes=64 << 20)
        sender = RemoteWriteSender(queue, HttpClient(), url, timeout_seconds=10, clock=clock)
        self.writer = HistoryWriter(queue, sender, batch_samples=7)
        self.service = CollectorService(
            store=store, storage=storage, registry=JobRegistry(storage, []), history=self.writer
        )

    def ingest(self, t0_ns: int, steps: range) -> None:
        for step in steps:
            for node in NODES:
                payload = request(node, t0_ns + step * 10 * NS, step)
                accepted = self.service.accept_payload(payload, PROTOBUF, node)
                assert accepted.rejected == 0

    def drain(self, clock: Clock) -> None:
        """Tick until the queue is empty (the backoff's clock moved past each wait)."""
        for _ in range(100):
            self.writer.tick()
            if self.writer.queue.pending_bytes() == 0:
                return
            clock.now += 60.0
        raise AssertionError(f"queue not drained: {self.writer.stats}")


def expected(t0_ns: int, steps: range) -> dict[str, dict[tuple[str, str], list[tuple[int, float]]]]:
    power: dict[tuple[str, str], list[tuple[int, float]]] = {}
    energy: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for step in steps:
        t_ms = (t0_ns + step * 10 * NS) // 1_000_000
        for node in NODES:
            for g, gpu in enumerate(GPUS):
                power.setdefault((node, gpu), []).append((t_ms, watts(node, g, step)))
                energy.setdefault((node, gpu), []).append((t_ms, 1000.0 * (step + 1) * (g + 1)))
    return {POWER: power, ENERGY: energy}


def read_back(
    tsdb: _Server, name: str, cluster: str | None = None
) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """The TSDB's series of ``name`` by (node, GPU); each labelled with the writer's ``cluster``
    (a collector built from its config always names its cluster)."""
    out = {}
    for labels, samples in tsdb.samples(name).items():
        label = dict(labels)
        out[(label["host_name"], label["hw_id"])] = samples
        wanted = {"__name__", "host_name", "hw_id"} | ({"hw_type"} if name == POWER else set())
        assert set(label) == wanted | ({"cluster"} if cluster else set())
        assert label.get("cluster") == cluster
    return out


def start_ns() -> int:
    """A recent round time (10 s aligned), early enough for 30 rounds to stay in the past."""
    return (int(time.time()) // 10 * 10 - 400) * NS


SERVERS = {"victoria-metrics": VictoriaMetrics, "prometheus": PrometheusReceiver}


@pytest.fixture(params=sorted(SERVERS))
def tsdb(request: pytest.FixtureRequest) -> Iterator[_Server]:
    name = request.param
    if binary(name) is None:
        pytest.skip(f"{name} is not installed (scripts/system-packages.sh installs it)")
    with SERVERS[name]() as server:
        yield server


def test_points_reach_the_tsdb_exactly(tsdb, tmp_path):
    clock = Clock()
    run = Run(tsdb.write_url, tmp_path / "queue", clock)
    t0, steps = start_ns(), range(6)
    run.ingest(t0, steps)
    run.drain(clock)
    want = expected(t0, steps)
    for name in (POWER, ENERGY):
        assert read_back(tsdb, name) == want[name], tsdb.log_tail()
    stats = run.writer.stats
    assert stats.sent_samples == 6 * len(NODES) * len(GPUS) * 2
    assert stats.dropped_samples == {}


def test_an_outage_loses_nothing_and_duplicates_nothing(tsdb, tmp_path):
    clock = Clock()
    run = Run(tsdb.write_url, tmp_path / "queue", clock)
    t0 = start_ns()
    run.ingest(t0, range(5))
    run.drain(clock)
    tsdb.stop()
    run.ingest(t0, range(5, 15))  # the TSDB is away: requests fail, the queue keeps them
    for _ in range(3):
        run.writer.tick()
        clock.now += 60.0
    assert run.writer.stats.failed_requests.get("unreachable", 0) >= 1
    assert run.writer.queue.pending_samples() == 10 * len(NODES) * len(GPUS) * 2
    tsdb.start()
    run.ingest(t0, range(15, 20))
    run.drain(clock)
    want = expected(t0, range(20))
    for name in (POWER, ENERGY):
        assert read_back(tsdb, name) == want[name], tsdb.log_tail()
    assert run.writer.stats.dropped_samples == {}


def test_a_new_collector_drains_the_queue_the_old_one_left(tsdb, tmp_path):
    clock = Clock()
    tsdb.stop()
    first = Run(tsdb.write_url, tmp_path / "queue", clock)
    t0 = start_ns()
    first.ingest(t0, range(8))
    first.writer.tick()  # fails: the TSDB is down
    first.writer.flush()  # what the web layer does on shutdown
    left = first.writer.queue.pending_samples()
    assert left == 8 * len(NODES) * len(GPUS) * 2
    tsdb.start()
    second = Run(tsdb.write_url, tmp_path / "queue", Clock())
    second.drain(clock)
    assert second.writer.stats.sent_samples == left
    want = expected(t0, range(8))
    for name in (POWER, ENERGY):
        assert read_back(tsdb, name) == want[name], tsdb.log_tail()


def test_the_config_section_builds_the_writer_and_metrics_show_it(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config_file = tmp_path / "collector.yaml"
    config_file.write_text(
        "database: ':memory:'\n"
        "remote_write:\n"
        "  url: http://127.0.0.1:9/api/v1/write\n"
        f"  queue_dir: {tmp_path / 'queue'}\n"
        f"  bearer_token_file: {token}\n"
        "  batch_samples: 100\n"
    )
    service = build_service(load_collector_config(config_file))
    assert service.history is not None
    assert service.intake.tap is service.history
    service.accept_payload(request("node-a", start_ns(), 0), PROTOBUF, "node-a")
    assert service.history.flush() == 4
    families = {m.name: m for m in FleetMetrics(service).collect()}
    queued = families["gpuwarden_remote_write_queue_bytes"].samples[0].value
    assert queued == service.history.queue.pending_bytes() > 0
    assert "gpuwarden_remote_write_samples_dropped" in families
    assert build_service(load_collector_config(None, {"database": ":memory:"})).history is None


async def test_the_app_runs_the_writer_and_flushes_it_on_shutdown(aiohttp_client, tmp_path):
    """Points posted to the receiver are in the queue once the app has stopped (the TSDB is
    unreachable here, so the loop's sends fail and the queue keeps everything)."""
    config = load_collector_config(
        None,
        {
            "database": ":memory:",
            "allow_unauthenticated": True,
            "remote_write": {
                "url": "http://127.0.0.1:9/api/v1/write",
                "queue_dir": str(tmp_path / "queue"),
                "batch_samples": 1000,
            },
        },
    )
    service = build_service(config)
    client = await aiohttp_client(create_app(config, service=service))
    t0 = start_ns()
    for step in range(3):
        answer = await client.post(
            "/v1/metrics",
            data=request("node-a", t0 + step * 10 * NS, step),
            headers={"Content-Type": "application/x-protobuf"},
        )
        assert answer.status == 200
    await client.close()
    assert DiskQueue(tmp_path / "queue", max_bytes=1 << 20).pending_samples() == 3 * 4


def test_job_totals_from_the_accounting_reach_the_tsdb(tsdb, tmp_path):
    clock = Clock()
    run = Run(tsdb.write_url, tmp_path / "queue", clock)
    now = time.time() // 60 * 60
    rows = [
        AccountingRow(
            period_start=now - 120 + 60 * i,
            period_seconds=60,
            job_key="slurm:42",
            team="vision",
            model=None,
            node="node-a",
            gpu_uuid=gpu,
            price_tier="on-demand",
            gpu_seconds_allocated=60.0,
            gpu_seconds_busy=45.0,
            gpu_seconds_idle=15.0,
            energy_joules=None,  # missing stays missing
            cost=0.05 * (i + 1),
            currency="USD",
        )
        for i in range(2)
        for gpu in GPUS
    ]
    run.service.storage.write_rollups(rows)
    run.writer.add(job_samples(run.service.storage, now))
    run.drain(clock)
    t_ms = int(now * 1000)
    job = {"job_key": "slurm:42", "team": "vision"}
    hours = {
        dict(labels)["kind"]: s for labels, s in tsdb.samples("gpuwarden_job_gpu_hours").items()
    }
    # VictoriaMetrics keeps about 12 significant digits of a float: compare to that
    assert hours == {
        "allocated": [(t_ms, pytest.approx(4 * 60 / 3600, rel=1e-11))],
        "busy": [(t_ms, pytest.approx(4 * 45 / 3600, rel=1e-11))],
        "idle": [(t_ms, pytest.approx(4 * 15 / 3600, rel=1e-11))],
    }
    cost = tsdb.samples("gpuwarden_job_cost_usd")
    assert list(cost) == [tuple(sorted({"__name__": "gpuwarden_job_cost_usd", **job}.items()))]
    assert list(cost.values()) == [[(t_ms, pytest.approx(2 * 0.05 + 2 * 0.10, rel=1e-11))]]
    assert tsdb.samples("gpuwarden_job_energy_kwh") == {}


KILLED = """
import sys, time
from pathlib import Path
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import load_collector_config
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF
from tests.test_remote_write_tsdb import NODES, NS, request
service = build_service(load_collector_config(Path(sys.argv[1])))
t0 = int(sys.argv[2])
for step in range(6):
    for node in NODES:
        assert service.accept_payload(request(node, t0 + step * 10 * NS, step), PROTOBUF, node)
print("ingested", flush=True)
time.sleep(600)
"""


def test_a_collector_killed_before_its_flush_loses_nothing(tsdb, tmp_path):
    """kill -9 after the agents were answered, before the bodies were queued: the next collector
    on the same folder takes them back from the intake log and sends them."""
    config = tmp_path / "collector.yaml"
    config.write_text(
        "database: ':memory:'\n"
        "remote_write:\n"
        f"  url: {tsdb.write_url}\n"
        f"  queue_dir: {tmp_path / 'queue'}\n"
    )
    t0 = start_ns()
    root = Path(__file__).resolve().parent.parent
    with subprocess.Popen(
        [sys.executable, "-c", KILLED, str(config), str(t0)],
        stdout=subprocess.PIPE,
        cwd=root,
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == b"ingested\n"
        finally:
            process.kill()  # SIGKILL: no flush, no cleanup
            process.wait()
    assert DiskQueue(tmp_path / "queue", max_bytes=1 << 20).pending_samples() == 0
    service = build_service(load_collector_config(config))
    assert service.history is not None
    service.history.tick()
    assert service.history.queue.pending_bytes() == 0
    assert service.history.stats.sent_samples == 6 * len(NODES) * len(GPUS) * 2
    want = expected(t0, range(6))
    for name in (POWER, ENERGY):
        assert read_back(tsdb, name, cluster="default") == want[name], tsdb.log_tail()
    service.history.tick()  # the recovered log is gone: nothing is sent twice
    assert service.history.stats.sent_samples == 6 * len(NODES) * len(GPUS) * 2
    again = build_service(load_collector_config(config))
    assert again.history is not None
    assert again.history.flush() == 0
