"""Each agent round stored once: an agent that resends its spool (killed in the middle of a
replay, or after a lost answer) and a collector restart store every round exactly once.

Real agent (simulated GPUs, real OTel SDK, spool and sender), real collector app on loopback,
real SQLite file. The store below counts, per point time, every point it is handed.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import threading
from collections import Counter
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from gpuwarden.agent.build import AgentRuntime, build_agent
from gpuwarden.agent.config import AgentConfig, CollectorConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.rounds import MAX_ROUNDS_HEADER_CHARS, Round, decode_rounds, encode_rounds
from gpuwarden.agent.sender import OtlpHttpSender, SendStatus
from gpuwarden.agent.spool import Spool
from gpuwarden.collector.ingest.otlp_limits import DEFAULT_LIMITS, IngestLimits
from gpuwarden.collector.ingest.otlp_transport import OtlpError
from gpuwarden.collector.ingest.rounds_seen import WINDOW, SeenWindow, agent_rounds
from gpuwarden.collector.ingest.sink import SeriesLog
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.base import RoundsRecord
from gpuwarden.collector.storage.migrations import LATEST_VERSION
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.store.window_payload import RequestIngest
from tests.collector_server import TOKEN, CollectorThread, free_port
from tests.loopback_process import wait_for
from tests.test_agent_process import agent_command, http_get

T0 = 1_700_000_000.0
INSTANCE = "0123456789abcdef0123456789abcdef"


SAMPLES = "gpuwarden.agent.samples"  # one point per round


def points_by_time(payload: bytes, metric_name: str | None = None) -> Counter[int]:
    """The data points of an OTLP request (of one metric, or all), counted per point time."""
    request = ExportMetricsServiceRequest()
    request.ParseFromString(payload)
    counts: Counter[int] = Counter()
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                if kind is not None and metric_name in (None, metric.name):
                    counts.update(p.time_unix_nano for p in getattr(metric, kind).data_points)
    return counts


class CountingStore(WindowStore):
    """The real window store, counting per point time every point it is handed to store."""

    def __init__(self, handed: Counter[int]) -> None:
        super().__init__(staleness_seconds=1e9, max_future_seconds=1e9)
        self.handed = handed
        self.lock = threading.Lock()
        self.first = threading.Event()  # set once a payload was handed over
        self.samples: Counter[int] = Counter()  # rounds handed over, by time

    def ingest_payload(
        self,
        payload: bytes,
        kind: str,
        *,
        new_series_budget: int | None = None,
        limits: IngestLimits = DEFAULT_LIMITS,
    ) -> RequestIngest:
        with self.lock:
            self.handed.update(points_by_time(payload))
            self.samples.update(points_by_time(payload, SAMPLES))
        self.first.set()
        return super().ingest_payload(
            payload, kind, new_series_budget=new_series_budget, limits=limits
        )


def collector_on(
    database: Path, port: int, handed: Counter[int], store: CountingStore | None = None
) -> CollectorThread:
    storage = SqliteStorage(database)
    store = CountingStore(handed) if store is None else store
    service = CollectorService(store, storage, JobRegistry(storage, []))
    return CollectorThread(port, SeriesLog(), service=service)


def make_agent(spool_dir: Path, port: int) -> AgentRuntime:
    ticks = itertools.count()
    config = AgentConfig(
        node_name="node-once",
        interval_seconds=1,
        source="simulated",
        scenario="mixed",
        collector=CollectorConfig(
            endpoint=f"http://127.0.0.1:{port}/v1/metrics", token=TOKEN, timeout_seconds=5
        ),
        spool=SpoolConfig(directory=spool_dir, max_bytes=1 << 26, fsync=False),
        http=HttpConfig(enabled=False),
    )
    return build_agent(config, clock=lambda: T0 + 10 * next(ticks), with_host=False)


def spooled(spool_dir: Path) -> Counter[int]:
    """What a spool directory holds, as points per time (the truth to compare with)."""
    spool = Spool(spool_dir, max_bytes=1 << 26, fsync=False)
    counts: Counter[int] = Counter()
    for _, payload in spool.peek(10**6, 1 << 40):
        counts.update(points_by_time(payload))
    return counts


def test_an_agent_killed_mid_replay_and_a_collector_restart_store_every_round_once(
    tmp_path: Path,
) -> None:
    port = free_port()
    spool_dir, on_disk = tmp_path / "spool", tmp_path / "spool-at-the-kill"
    database = tmp_path / "collector.db"
    rounds = 12
    first = make_agent(spool_dir, port)  # the collector is away: every round is spooled
    for _ in range(rounds):
        first.agent.sample_once()
    assert first.agent.spool is not None
    instance = first.agent.spool.instance_id
    expected = spooled(spool_dir)
    assert len(expected) == rounds
    # The agent is killed (-9) in the middle of its replay: the collector stored the first
    # batches, the agent's acks never reached the disk. Its spool, as the kill leaves it:
    shutil.copytree(spool_dir, on_disk)
    handed: Counter[int] = Counter()
    collector = collector_on(database, port, handed)
    collector.start()
    try:
        one_round = max(len(p) for _, p in first.agent.spool.peek(1, 1 << 30))
        replay = OtlpHttpSender(  # small batches: the replay the kill cuts short
            first.agent.spool,
            collector.endpoint,
            headers={"Authorization": f"Bearer {TOKEN}"},
            max_batch_bytes=3 * one_round,
        )
        for _ in range(2):
            assert replay.send_once().status is SendStatus.SENT
        replay.close()
        stored_before_kill = sum(handed.values())
        assert 0 < stored_before_kill < expected.total()
        # restart: the agent finds its spool as the kill left it and replays all of it
        shutil.rmtree(spool_dir)
        shutil.copytree(on_disk, spool_dir)
        second = make_agent(spool_dir, port)
        assert second.agent.spool is not None
        assert second.agent.spool.instance_id == instance  # the identity survives the restart
        assert second.agent.sender is not None
        assert second.agent.sender.flush(timeout_seconds=30)
        assert collector.service is not None
        duplicates = collector.service.totals.duplicate_rounds
    finally:
        collector.stop()
    assert handed == expected  # every point of every round once, none twice
    assert 0 < duplicates < rounds

    # The collector restarts (new process state, same database) and the agent resends again.
    again: Counter[int] = Counter()
    restarted = collector_on(database, port, again)
    restarted.start()
    try:
        shutil.rmtree(spool_dir)
        shutil.copytree(on_disk, spool_dir)
        third = make_agent(spool_dir, port)
        assert third.agent.sender is not None
        assert third.agent.sender.flush(timeout_seconds=30)
        assert restarted.service is not None
        assert restarted.service.totals.duplicate_rounds == rounds
    finally:
        restarted.stop()
    assert again == Counter()  # acknowledged, not stored again
    assert len(third.agent.spool or []) == 0


def test_an_agent_process_killed_9_while_its_replay_is_stored_stores_each_round_once(
    tmp_path: Path,
) -> None:
    """The real agent process: ``kill -9`` once its replay reaches the collector, restart it,
    let it flush on SIGTERM; every round of the spool it found is stored exactly once."""
    port = free_port()
    spool_dir = tmp_path / "spool"
    backlog = make_agent(spool_dir, port)  # an outage left 60 rounds in the spool
    for _ in range(60):
        backlog.agent.sample_once()
    expected = spooled(spool_dir)
    config = tmp_path / "agent.yaml"
    http_port = free_port()
    config.write_text(
        "node_name: node-once\nsource: simulated\nscenario: mixed\ninterval_seconds: 0.5\n"
        f"http:\n  port: {http_port}\nspool:\n  directory: {spool_dir}\n  fsync: false\n"
    )
    endpoint = f"http://127.0.0.1:{port}/v1/metrics"
    command = agent_command("--config", str(config), "--collector", endpoint)
    env = {**os.environ, "GPUWARDEN_AGENT_TOKEN": TOKEN}
    handed: Counter[int] = Counter()
    store = CountingStore(handed)
    collector = collector_on(tmp_path / "c.db", port, handed, store)
    collector.start()
    try:
        first = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
        try:
            assert store.first.wait(60), "the agent's replay never reached the collector"
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(20)
        second = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        try:

            def replayed() -> bool:
                with store.lock:
                    return all(handed[t] >= n for t, n in expected.items())

            health = f"http://127.0.0.1:{http_port}/healthz"
            wait_for(lambda: http_get(health)[0] == 200, 60, "the restarted agent's /healthz")
            wait_for(replayed, 60, "the restarted agent's replay")
            second.send_signal(signal.SIGTERM)
            _, stderr = second.communicate(timeout=30)
        finally:
            if second.poll() is None:
                second.kill()
                second.communicate()
        assert second.returncode == 0, stderr
        assert collector.service is not None
        duplicates = collector.service.totals.duplicate_rounds
    finally:
        collector.stop()
    assert list(spool_dir.glob("*.otlp")) == []  # flushed: every round it took was delivered
    # the backlog's rounds once each, and every round the processes took once too
    assert {t: handed[t] for t in expected} == expected
    assert len(store.samples) > len(expected)  # the processes took rounds of their own
    assert set(store.samples.values()) == {1}
    print(f"\nkill -9 during the replay of 60 rounds: {duplicates} duplicate round(s) acknowledged")


def test_a_new_round_after_the_duplicates_is_stored(tmp_path: Path) -> None:
    """A batch that overlaps what was stored: the new rounds of it are stored, the old not."""
    handed: Counter[int] = Counter()
    storage = SqliteStorage(tmp_path / "c.db")
    service = CollectorService(CountingStore(handed), storage, JobRegistry(storage, []))
    payloads = [_round(n) for n in range(1, 6)]

    def send(seqs: list[int]) -> int:
        body = b"".join(payloads[s - 1] for s in seqs)
        header = encode_rounds([Round(s, len(payloads[s - 1])) for s in seqs])
        rounds = agent_rounds(
            {"Gpuwarden-Agent-Instance": INSTANCE, "Gpuwarden-Agent-Rounds": header}
        )
        return service.accept_payload(body, "application/x-protobuf", "agents", rounds).points

    assert send([1, 2]) == 2
    assert send([1, 2, 3, 4]) == 2  # 1 and 2 acknowledged, 3 and 4 stored
    assert send([5]) == 1
    assert handed == Counter(dict.fromkeys(range(1, 6), 1))
    assert service.totals.duplicate_rounds == 2
    # another caller's rounds are its own: the same instance and numbers under another token
    header = f"1:{len(payloads[0])}"
    rounds = agent_rounds({"Gpuwarden-Agent-Instance": INSTANCE, "Gpuwarden-Agent-Rounds": header})
    assert (
        service.accept_payload(payloads[0], "application/x-protobuf", "other", rounds).points == 1
    )


def _round(n: int) -> bytes:
    request = ExportMetricsServiceRequest()
    resource = request.resource_metrics.add()
    attribute = resource.resource.attributes.add()
    attribute.key = "host.name"
    attribute.value.string_value = "node-1"
    metric = resource.scope_metrics.add().metrics.add()
    metric.name = "hw.gpu.utilization"
    point = metric.gauge.data_points.add()
    point.time_unix_nano = n
    point.as_double = 0.5
    return request.SerializeToString()


# --- the window -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "probe", "seen"),
    [
        ([], 1, False),
        ([1], 1, True),
        ([1], 2, False),
        ([1, 2, 3], 2, True),
        ([1, 3], 2, False),  # a hole below the mark: a late first arrival is still stored
        ([1, 3, 2], 2, True),
        ([5], 4, False),
        ([5, 5 + WINDOW], 5, True),  # the last round the window holds
        ([5, 5 + WINDOW], 4, True),  # older than the window: taken as stored (the limit)
        ([5, 6 + WINDOW], 5, True),
        ([1, 200], 150, False),
        ([1, 200], 100, True),
    ],
)
def test_seen_window(stored: list[int], probe: int, seen: bool) -> None:
    window = SeenWindow()
    for seq in stored:
        window = window.add(seq)
    assert window.seen(probe) is seen
    assert all(window.seen(seq) for seq in stored)
    assert 0 <= window.below < 2**WINDOW  # fits a signed 64-bit column


def test_rounds_header_round_trip_and_refusals() -> None:
    rounds = [Round(7, 100), Round(8, 120), Round(10, 5), Round(11, 0)]
    assert encode_rounds(rounds) == "7:100,:120,10:5,:0"
    assert decode_rounds(encode_rounds(rounds)) == tuple(rounds)
    for bad in ["", ":5", "7:100,7:1", "8:1,7:1", "0:1", "x:1", "7:", "7:1;8:1", "9" * 25 + ":1"]:
        with pytest.raises(ValueError):
            decode_rounds(bad)
    with pytest.raises(ValueError, match="characters"):
        decode_rounds("1:1" + ",:1" * MAX_ROUNDS_HEADER_CHARS)
    assert agent_rounds({}) is None
    for headers in [
        {"Gpuwarden-Agent-Instance": INSTANCE},
        {"Gpuwarden-Agent-Rounds": "1:1"},
        {"Gpuwarden-Agent-Instance": "XYZ", "Gpuwarden-Agent-Rounds": "1:1"},
        {"Gpuwarden-Agent-Instance": INSTANCE, "Gpuwarden-Agent-Rounds": "1:1,1:1"},
    ]:
        with pytest.raises(OtlpError) as caught:
            agent_rounds(headers)
        assert caught.value.status == 400


def test_rounds_that_do_not_add_up_to_the_body_are_refused(tmp_path: Path) -> None:
    storage = SqliteStorage(tmp_path / "c.db")
    service = CollectorService(WindowStore(), storage, JobRegistry(storage, []))
    body = _round(1)
    rounds = agent_rounds(
        {"Gpuwarden-Agent-Instance": INSTANCE, "Gpuwarden-Agent-Rounds": f"1:{len(body) + 1}"}
    )
    with pytest.raises(OtlpError) as caught:
        service.accept_payload(body, "application/x-protobuf", "agents", rounds)
    assert caught.value.status == 400
    assert storage.rounds_record("agents", INSTANCE) is None


# --- storage ----------------------------------------------------------------------------------


def test_the_rounds_record_survives_a_reopen_and_never_goes_back(tmp_path: Path) -> None:
    database = tmp_path / "c.db"
    with SqliteStorage(database) as storage:
        assert LATEST_VERSION >= 6
        assert storage.rounds_record("agents", INSTANCE) is None
        storage.save_rounds_record(RoundsRecord("agents", INSTANCE, 40, 0b101, T0))
        storage.save_rounds_record(RoundsRecord("agents", INSTANCE, 39, 0, T0 + 1))  # ignored
        storage.save_rounds_record(RoundsRecord("other", INSTANCE, 3, 0, T0))
    with SqliteStorage(database) as reopened:
        assert reopened.rounds_record("agents", INSTANCE) == RoundsRecord(
            "agents", INSTANCE, 40, 0b101, T0
        )
        assert reopened.rounds_record("other", INSTANCE) == RoundsRecord(
            "other", INSTANCE, 3, 0, T0
        )
        reopened.save_rounds_record(RoundsRecord("agents", INSTANCE, 41, 2**WINDOW - 1, T0 + 2))
        record = reopened.rounds_record("agents", INSTANCE)
        assert record is not None
        assert (record.high_water, record.stored_below) == (41, 2**WINDOW - 1)


# --- the agent's identity ---------------------------------------------------------------------


def test_the_instance_id_is_kept_while_the_numbering_continues(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**6, fsync=False)
    instance = spool.instance_id
    assert len(instance) == 32
    spool.append(b"a")
    assert Spool(tmp_path, max_bytes=10**6, fsync=False).instance_id == instance  # a record
    reopened = Spool(tmp_path, max_bytes=10**6, fsync=False)
    reopened.ack(1)
    assert Spool(tmp_path, max_bytes=10**6, fsync=False).instance_id == instance  # the marker
    (tmp_path / "last-sequence").unlink()  # numbers would restart at 1: a new identity
    fresh = Spool(tmp_path, max_bytes=10**6, fsync=False)
    assert fresh.append(b"b") == 1
    assert fresh.instance_id != instance


def test_a_request_of_an_instance_being_stored_is_answered_503(tmp_path: Path) -> None:
    """The agent gave up on a slow request and sent again: the second waits for the first."""
    storage = SqliteStorage(tmp_path / "c.db")
    service = CollectorService(WindowStore(), storage, JobRegistry(storage, []))
    body = _round(1)
    header = {"Gpuwarden-Agent-Instance": INSTANCE, "Gpuwarden-Agent-Rounds": f"1:{len(body)}"}
    rounds = agent_rounds(header)
    with service.intake.rounds_ledger.claim("agents", INSTANCE):  # the first request
        with pytest.raises(OtlpError) as caught:
            service.accept_payload(body, "application/x-protobuf", "agents", rounds)
        assert caught.value.status == 503
        # another caller, or another instance, is not held up
        assert service.accept_payload(body, "application/x-protobuf", "other", rounds).points == 1
    assert service.accept_payload(body, "application/x-protobuf", "agents", rounds).points == 1
    assert service.accept_payload(body, "application/x-protobuf", "agents", rounds).points == 0
