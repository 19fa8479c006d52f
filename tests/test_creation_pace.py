"""The pace of series creation (``ingest.creation_pace``): while the collector creates series at
``max_new_series_per_second``, a node with no series yet is answered 503 with ``Retry-After``
and nothing of it is stored; known nodes, their new series included, are never refused by it.
On the real app over loopback, and on the service with a fake clock for the refill.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import parse_tokens
from gpuwarden.collector.ingest.creation_pace import (
    MAX_RETRY_AFTER_SECONDS,
    CreationPace,
    CreationPacedError,
)
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import STATS
from tests.test_shed import served
from tests.test_web_guard import body

TOKEN = "token-of-agent-pace-0123456789"
READER = "token-of-reader-pace-0123456789"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_holds_a_second_and_refills_at_the_rate():
    clock = FakeClock()
    pace = CreationPace(100, clock=clock)
    assert not pace.behind()
    pace.spend(130)  # a request's series are created whole: the bucket goes below zero
    assert pace.behind()
    clock.now += 0.25  # 25 back: still 5 short
    assert pace.behind()
    clock.now += 0.1
    assert not pace.behind()
    clock.now += 60  # never more than a second's worth
    pace.spend(100)
    assert pace.behind()


@pytest.mark.parametrize(("jitter", "seconds"), [(0.0, 1), (0.5, 16), (0.999999, 30)])
def test_retry_after_is_spread_from_one_second_to_the_bound(jitter: float, seconds: int):
    pace = CreationPace(10, clock=FakeClock(), jitter=lambda: jitter)
    error = pace.refuse()
    assert error.status == 503
    assert error.retry_after == seconds <= MAX_RETRY_AFTER_SECONDS
    assert pace.paced == 1


def test_the_rate_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        CreationPace(0)


def test_a_new_node_waits_while_known_nodes_and_their_new_series_go_on(tmp_path: Path):
    clock = FakeClock()
    service = build_service(CollectorConfig(database=tmp_path / "g.db"))
    service.pace = CreationPace(5, clock=clock)
    service.accept_payload(body(host="node-1", points=10), PROTOBUF, "a")  # 10 series: 5 short
    with pytest.raises(CreationPacedError):
        service.accept_payload(body(host="node-2", points=1), PROTOBUF, "a")
    assert not service.store.knows_nodes(["node-2"])  # nothing of it stored
    service.accept_payload(body(host="node-1", points=12), PROTOBUF, "a")  # 2 new series of it
    assert service.store.series_count() == 12
    clock.now += 1.5  # 7 short, then 7.5 back
    service.accept_payload(body(host="node-2", points=1), PROTOBUF, "a")
    assert service.store.knows_nodes(["node-1", "node-2"])
    assert service.pace is not None
    assert service.pace.paced == 1


async def test_the_app_answers_a_paced_node_503_with_retry_after_and_counts_it(tmp_path: Path):
    tokens = parse_tokens(f"agent a {TOKEN} nodes=*\nreader r {READER}\n", "tokens")
    config = CollectorConfig(tokens=tokens, database=tmp_path / "g.db", max_new_series_per_second=5)
    service = build_service(config)
    app = create_app(config, service=service, background=False)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-protobuf"}
    async with served(app) as port, aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{port}/v1/metrics"
        async with session.post(url, data=body(host="n1", points=10), headers=headers) as first:
            assert first.status == 200
        async with session.post(url, data=body(host="n2"), headers=headers) as paced:
            assert paced.status == 503
            assert 1 <= int(paced.headers["Retry-After"]) <= MAX_RETRY_AFTER_SECONDS
            assert "max_new_series_per_second" in await paced.text()
        async with session.post(url, data=body(host="n1", points=11), headers=headers) as known:
            assert known.status == 200
        metrics = f"http://127.0.0.1:{port}/metrics"
        reader = {"Authorization": f"Bearer {READER}"}
        async with session.get(metrics, headers=reader) as exposition:
            text = await exposition.text()
    assert app[STATS].shed == {"new_series": 1}
    assert app[STATS].responses[503] == 1
    assert 'gpuwarden_collector_requests_shed_total{reason="new_series"} 1.0' in text
    assert not service.store.knows_nodes(["n2"])
    assert service.store.series_count() == 11
