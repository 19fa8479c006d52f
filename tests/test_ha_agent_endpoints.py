"""Agents with several collector endpoints (active/standby): the sender fails over on a
connection error or a 5xx, stays on the collector that works, resends the same rounds (same
headers, so collectors sharing a database store them once), and backs off only when every
endpoint failed; the configuration takes a list from the file or the environment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.agent.config import ConfigError, load_agent_config
from gpuwarden.agent.rounds import INSTANCE_HEADER, ROUNDS_HEADER
from gpuwarden.agent.sender import OtlpHttpSender, SendStatus
from gpuwarden.agent.spool import Spool
from tests.test_sender import Collector, FakeClock, MidpointRandom, Reply, fill


@pytest.fixture
def pair() -> Iterator[tuple[Collector, Collector]]:
    first, second = Collector(), Collector()
    first.start()
    second.start()
    yield first, second
    first.stop()
    second.stop()


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    return Spool(tmp_path / "spool", max_bytes=10**7, fsync=False)


@pytest.fixture
def sender(spool: Spool, pair: tuple[Collector, Collector]) -> Iterator[OtlpHttpSender]:
    """A sender to the pair, first endpoint first."""
    urls = [collector.url for collector in pair]
    made = OtlpHttpSender(
        spool, urls, clock=FakeClock(), wall_clock=lambda: 0.0, rng=MidpointRandom()
    )
    yield made
    made.close()


def test_a_dead_collector_fails_over_at_once_and_the_sender_stays(
    spool: Spool, sender: OtlpHttpSender, pair: tuple[Collector, Collector]
) -> None:
    first, second = pair
    fill(spool, range(1, 4))
    assert sender.send_once().records_sent == 3  # the first while it works
    first.stop()
    fill(spool, range(4, 6))
    moved = sender.send_once()
    assert (moved.status, moved.delay_seconds) == (SendStatus.RETRY, 0.0)  # next one, now
    assert sender.endpoint == second.url
    assert sender.send_once().records_sent == 2
    first.start()  # back on its port: the sender stays where it works
    fill(spool, range(6, 7))
    assert sender.send_once().records_sent == 1
    assert (first.accepted, second.accepted) == ([1, 2, 3], [4, 5, 6])
    assert sender.failovers == 1


def test_a_503_moves_the_same_rounds_to_the_standby(
    spool: Spool, sender: OtlpHttpSender, pair: tuple[Collector, Collector]
) -> None:
    first, second = pair
    first.fail_next(1, Reply(503, headers=(("Retry-After", "120"),)))
    fill(spool, range(1, 3))
    refused = sender.send_once()
    assert (refused.http_status, refused.delay_seconds) == (503, 0.0)
    assert sender.send_once().records_sent == 2
    (asked,), (took,) = first.requests, second.requests
    for header in (INSTANCE_HEADER, ROUNDS_HEADER):
        assert asked.headers[header] == took.headers[header]
    assert second.accepted == [1, 2]


def test_every_endpoint_down_backs_off(
    spool: Spool, sender: OtlpHttpSender, pair: tuple[Collector, Collector]
) -> None:
    first, second = pair
    first.fail_next(5, Reply(502))
    second.fail_next(5, Reply(500))
    fill(spool, range(1, 2))
    delays = [sender.send_once().delay_seconds for _ in range(4)]
    assert delays == [0.0, 2.0, 0.0, 8.0]  # the other one at once; after both, backoff
    assert len(spool) == 1


def test_429_and_401_do_not_fail_over(
    spool: Spool, sender: OtlpHttpSender, pair: tuple[Collector, Collector]
) -> None:
    first, second = pair
    first.fail_next(1, Reply(429))
    first.fail_next(1, Reply(401))
    fill(spool, range(1, 2))
    assert sender.send_once().http_status == 429  # alive, asks to slow down
    assert sender.send_once().status is SendStatus.UNAUTHORIZED  # the same token elsewhere
    assert sender.endpoint == first.url
    assert second.requests == []


def test_endpoints_from_the_file_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "collector:\n  endpoints: [http://a:4318/v1/metrics, http://b:4318/v1/metrics]\n"
    )
    config = load_agent_config(path, {})
    assert config.collector.urls == ("http://a:4318/v1/metrics", "http://b:4318/v1/metrics")
    env = {"GPUWARDEN_COLLECTOR_ENDPOINTS": "http://c:4318/v1/metrics,http://d:4318/v1/metrics"}
    assert load_agent_config(None, env).collector.urls == (
        "http://c:4318/v1/metrics",
        "http://d:4318/v1/metrics",
    )
    assert load_agent_config(None, {}).collector.urls == ("http://127.0.0.1:4318/v1/metrics",)
    both = {"GPUWARDEN_COLLECTOR_ENDPOINT": "http://e:4318/v1/metrics"}
    with pytest.raises(ConfigError, match="either endpoint"):
        load_agent_config(path, both)
    with pytest.raises(ConfigError, match="GPUWARDEN_COLLECTOR_ENDPOINTS"):
        load_agent_config(None, {"GPUWARDEN_COLLECTOR_ENDPOINTS": "http://f:4318,g:4318"})
