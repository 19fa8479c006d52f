"""Two collectors on one real PostgreSQL, one agent failing over between them and back: every
round is stored once. The first collector cached the agent's window before the agent left; with
a database shared by several collectors the window is read through (``RoundsLedger``), so a
round the other collector stored is acknowledged, not stored again."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from gpuwarden.agent.build import AgentRuntime, build_agent
from gpuwarden.agent.config import AgentConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.config import CollectorConfig as AgentCollector
from gpuwarden.agent.rounds import Round, encode_rounds
from gpuwarden.agent.spool import Spool
from gpuwarden.collector.ingest.rounds_seen import RoundsLedger, agent_rounds
from gpuwarden.collector.ingest.sink import SeriesLog
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.postgres import PostgresStorage
from tests.collector_server import TOKEN, CollectorThread, free_port
from tests.test_rounds_once import INSTANCE, T0, CountingStore, _round, points_by_time


class Replica:
    """One collector's ingest over the shared database."""

    def __init__(self, database: str, handed: Counter[int], *, read_through: bool) -> None:
        self.storage = PostgresStorage(database)
        self.service = CollectorService(
            CountingStore(handed), self.storage, JobRegistry(self.storage, [])
        )
        self.service.intake.rounds_ledger = RoundsLedger(read_through=read_through)

    def send(self, seqs: list[int]) -> int:
        """The agent's request carrying rounds ``seqs``; the points stored."""
        payloads = {s: _round(s) for s in seqs}
        body = b"".join(payloads.values())
        header = encode_rounds([Round(s, len(payloads[s])) for s in seqs])
        rounds = agent_rounds(
            {"Gpuwarden-Agent-Instance": INSTANCE, "Gpuwarden-Agent-Rounds": header}
        )
        return self.service.accept_payload(body, "application/x-protobuf", "agents", rounds).points


@pytest.mark.parametrize("read_through", [True, False])
def test_rounds_stored_once_across_replicas(fresh_database: str, read_through: bool) -> None:
    handed: Counter[int] = Counter()
    alpha = Replica(fresh_database, handed, read_through=read_through)
    beta = Replica(fresh_database, handed, read_through=read_through)
    try:
        assert alpha.send([1, 2]) == 2  # alpha caches the window: high water 2
        assert beta.send([3, 4, 5]) == 3  # the agent failed over to beta
        # beta's answer to 3..5 was lost: the agent went back to alpha and resends them
        stored_again = alpha.send([3, 4, 5, 6])
    finally:
        alpha.storage.close()
        beta.storage.close()
    if read_through:  # the shared database's window: 3..5 acknowledged, 6 stored
        assert stored_again == 1
        assert handed == Counter(dict.fromkeys(range(1, 7), 1))
    else:  # what a per-process cache does: 3..5 stored twice (why read-through is needed)
        assert stored_again == 4
        assert handed[4] == 2


def test_a_real_agent_fails_over_and_back_and_each_round_is_stored_once(
    tmp_path: Path, fresh_database: str
) -> None:
    """The real agent (simulated GPUs) with two endpoints, two real collector apps on one
    PostgreSQL: it pushes to the first, the first stops (its rounds wait in the spool), the
    agent moves to the second, the first comes back and the second stops: every round of the
    agent's spool reached one store, once."""
    handed: Counter[int] = Counter()
    ports = free_port(), free_port()
    replicas = [_collector(fresh_database, port, handed) for port in ports]
    endpoints = tuple(f"http://127.0.0.1:{port}/v1/metrics" for port in ports)
    runtime = _agent(tmp_path / "spool", endpoints)
    agent, sender = runtime.agent, runtime.agent.sender
    assert sender is not None
    assert agent.spool is not None
    truth: Counter[int] = Counter()
    stops = {4: 0, 8: 1}  # before round 4 the first collector stops, before round 8 the second
    replicas[0].start()
    try:
        for n in range(12):
            if n in stops:
                replicas[stops[n]].stop()
                replicas[1 - stops[n]].start()
            agent.sample_once()
            truth.update(_last_round(agent.spool))
            assert sender.flush(timeout_seconds=30), f"round {n} not delivered"
    finally:
        for replica in replicas:
            replica.stop()
    assert handed == truth  # every point of every round once, none twice
    assert sender.failovers == 2
    assert sender.endpoint == endpoints[0]


def _collector(database: str, port: int, handed: Counter[int]) -> CollectorThread:
    storage = PostgresStorage(database)
    service = CollectorService(CountingStore(handed), storage, JobRegistry(storage, []))
    service.intake.rounds_ledger = RoundsLedger(read_through=True)
    return CollectorThread(port, SeriesLog(), service=service)


def _agent(spool_dir: Path, endpoints: tuple[str, ...]) -> AgentRuntime:
    ticks = itertools.count()
    config = AgentConfig(
        node_name="node-ha",
        interval_seconds=1,
        source="simulated",
        collector=AgentCollector(endpoints=endpoints, token=TOKEN, timeout_seconds=5),
        spool=SpoolConfig(directory=spool_dir, max_bytes=1 << 26, fsync=False),
        http=HttpConfig(enabled=False),
    )
    return build_agent(config, clock=lambda: T0 + 10 * next(ticks), with_host=False)


def _last_round(spool: Spool) -> Counter[int]:
    """The points of the newest spooled round, per point time (what must be stored once)."""
    records = spool.peek(10**6, 1 << 40)
    return points_by_time(records[-1][1]) if records else Counter()
