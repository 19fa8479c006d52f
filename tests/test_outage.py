"""Nothing lost: the collector goes away for several rounds, then comes back.

The real agent (simulated GPUs), the real OTel SDK, the real spool and sender, and the real
collector app on loopback. Rounds are driven explicitly, so the test needs no sleeps.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pytest

from gpuwarden.agent.build import AgentRuntime, build_agent
from gpuwarden.agent.config import AgentConfig, CollectorConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.sender import SendStatus
from tests.collector_server import TOKEN, CollectorThread, free_port


def make_agent(
    spool_dir: Path,
    port: int,
    *,
    node: str = "node-out",
    max_bytes: int = 1 << 26,
    clock_start: float = 1_700_000_000.0,
    token: str | None = TOKEN,
) -> AgentRuntime:
    ticks = itertools.count()
    config = AgentConfig(
        node_name=node,
        interval_seconds=1,
        source="simulated",
        scenario="mixed",
        collector=CollectorConfig(
            endpoint=f"http://127.0.0.1:{port}/v1/metrics", token=token, timeout_seconds=2
        ),
        spool=SpoolConfig(directory=spool_dir, max_bytes=max_bytes, fsync=False),
        http=HttpConfig(enabled=False),
    )
    return build_agent(config, clock=lambda: clock_start + 10 * next(ticks), with_host=False)


def rounds_received(collector: CollectorThread, node: str) -> list[tuple[int, float]]:
    series = collector.log.series("gpuwarden.agent.samples", node)
    assert len(series) == 1
    return next(iter(series.values()))


def test_outage_then_recovery_delivers_every_round_in_order_once(tmp_path):
    port = free_port()
    collector = CollectorThread(port)
    collector.start()
    runtime = make_agent(tmp_path / "spool", port)
    agent, sender = runtime.agent, runtime.agent.sender
    assert sender is not None
    try:
        for _ in range(3):
            agent.sample_once()
            assert sender.send_once().status is SendStatus.SENT
        collector.stop()  # the collector goes away: port closed
        for _ in range(6):
            agent.sample_once()
            result = sender.send_once()
            assert result.status is SendStatus.RETRY
            assert result.delay_seconds > 0
        assert len(agent.spool or []) == 6
        collector.start()  # back on the same port
        assert sender.flush(timeout_seconds=10)
        for _ in range(2):
            agent.sample_once()
            assert sender.send_once().status is SendStatus.SENT
    finally:
        agent.shutdown(flush_timeout_seconds=2)
        collector.stop()
    received = rounds_received(collector, "node-out")
    assert [value for _, value in received] == [float(n) for n in range(1, 12)]
    times = [t for t, _ in received]
    assert times == sorted(times)
    assert len(set(times)) == len(times)
    # every GPU series got every round too: nothing lost, nothing twice
    util = collector.log.series("hw.gpu.utilization", "node-out")
    assert len(util) == 8
    assert {len(points) for points in util.values()} == {11}


def test_spool_survives_an_agent_restart(tmp_path):
    port = free_port()
    spool_dir = tmp_path / "spool"
    first = make_agent(spool_dir, port)
    for _ in range(4):
        first.agent.sample_once()
    assert first.agent.shutdown(flush_timeout_seconds=0.5) is False  # collector still away
    with CollectorThread(port) as collector:
        second = make_agent(spool_dir, port, clock_start=1_800_000_000.0)
        assert len(second.agent.spool or []) == 4
        for _ in range(2):
            second.agent.sample_once()
        assert second.agent.sender is not None
        assert second.agent.sender.flush(timeout_seconds=10)
        second.agent.shutdown(flush_timeout_seconds=2)
    received = rounds_received(collector, "node-out")
    # the first agent's four rounds, then the second agent's (its counter starts again at 1)
    assert [value for _, value in received] == [1.0, 2.0, 3.0, 4.0, 1.0, 2.0]
    times = [t for t, _ in received]
    assert times == sorted(times)


def test_spool_cap_drops_oldest_counts_and_logs(tmp_path, caplog):
    port = free_port()
    probe = make_agent(tmp_path / "probe", port)
    probe.agent.sample_once()
    assert probe.agent.spool is not None
    room_for_three = int(probe.agent.spool.bytes_used * 3.5)  # one 8-GPU request: ~40 kB
    probe.agent.shutdown(flush_timeout_seconds=0)
    runtime = make_agent(tmp_path / "spool", port, max_bytes=room_for_three)
    agent = runtime.agent
    assert agent.spool is not None
    with caplog.at_level(logging.WARNING, logger="gpuwarden.agent.spool"):
        for _ in range(10):
            agent.sample_once()
    assert len(agent.spool) == 3
    assert agent.spool.evicted_records == 7
    assert agent.spool.bytes_used <= room_for_three
    assert any("evict" in r.getMessage().lower() for r in caplog.records)
    with CollectorThread(port) as collector:
        assert agent.sender is not None
        assert agent.sender.flush(timeout_seconds=10)
        agent.sample_once()  # this round reports the evictions in its own metrics
        assert agent.sender.flush(timeout_seconds=10)
        agent.shutdown(flush_timeout_seconds=2)
    received = rounds_received(collector, "node-out")
    assert [value for _, value in received] == [8.0, 9.0, 10.0, 11.0]
    evicted = collector.log.latest("gpuwarden.agent.spool.evicted", "node-out")
    assert list(evicted.values()) == [7.0]


@pytest.mark.parametrize("token", ["wrong-token-0123456789abcdef", None])
def test_a_rejected_token_keeps_the_data(tmp_path, token):
    port = free_port()
    runtime = make_agent(tmp_path / "spool", port, token=token)
    agent, sender = runtime.agent, runtime.agent.sender
    assert sender is not None
    with CollectorThread(port):
        agent.sample_once()
        assert sender.send_once().status is SendStatus.UNAUTHORIZED
    assert len(agent.spool or []) == 1
    agent.shutdown(flush_timeout_seconds=0.1)
