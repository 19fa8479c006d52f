"""Requests in flight together are stored together (``remote_write_receiver``'s queue and
``prom_columns.store_many``), and each still gets the answer it gets alone: a malformed
request 400, another agent's node 403, the rest 204; the store, the counts and the answers
are those of the same requests posted one at a time."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import aiohttp
import pytest

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.prom_map_columns import PromTranslator
from gpuwarden.collector.remote_write.wire import Series, encode
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import STATS
from gpuwarden.collector.web.remote_write_receiver import RW_QUEUE, RW_WORKERS, worker_count
from tests.test_prom_map_columns import (
    scrape,
    scripted,
    services,  # noqa: F401 - the fixture
    store_state,
)
from tests.test_remote_write_receiver import TABLE, headers


async def client_of(aiohttp_client, service: CollectorService) -> Any:
    app = create_app(
        CollectorConfig(tokens=TABLE),
        service=service,
        background=False,
        prom_translate=PromTranslator(),
    )
    return await aiohttp_client(app)


def node(series: list[Series], host: str) -> list[Series]:
    return [s for s in series if dict(s.labels).get("Hostname") == host]


async def test_requests_in_flight_together_get_their_own_answers(
    aiohttp_client,
    services,  # noqa: F811 - the fixture
    monkeypatch,
):
    one_at_a_time, together = services
    clients = [await client_of(aiohttp_client, s) for s in services]
    writes = []
    counted = together.intake.accept_rows

    def count(*args: Any) -> Any:
        writes.append(args[0].spec_of_point.size)
        return counted(*args)

    monkeypatch.setattr(together.intake, "accept_rows", count)
    fleet = scripted()
    t = int(time.time() * 1000) - 300_000
    rounds = [scrape(fleet, t + r * 15_000, r) for r in range(3)]
    nameless = Series((("Hostname", "node-a"), ("gpu", "0")), (t,), (1.0,))
    first = [
        ("prometheus", [node(rounds[0], "node-a")[0], nameless]),  # malformed: 400
        ("prometheus", rounds[0]),
    ]
    # every label set seen once (then read flat), the same on both
    for who, series in first:
        for client in clients:
            resp = await client.post("/api/v1/write", data=encode(series), headers=headers(who))
            assert resp.status == (400 if nameless in series else 204)
    posts = [
        ("prometheus", rounds[1][:120]),
        ("prometheus", [node(rounds[1], "node-a")[0], nameless]),  # read flat, still 400
        ("agent-a", node(rounds[1], "node-b")),  # not agent-a's node: 403
        ("prometheus", rounds[1][120:]),
        ("agent-a", node(rounds[2], "node-a")),
        ("prometheus", rounds[2]),
    ]
    alone = []
    for who, series in posts:
        resp = await clients[0].post("/api/v1/write", data=encode(series), headers=headers(who))
        alone.append(resp.status)
    assert alone == [204, 400, 403, 204, 204, 204]

    # hold every worker, post everything, release: one worker's turn takes all six
    app = clients[1].server.app
    held = threading.Event()
    for _ in range(worker_count()):
        app[RW_WORKERS].submit(held.wait)
    sent = [
        asyncio.ensure_future(
            clients[1].post("/api/v1/write", data=encode(series), headers=headers(who))
        )
        for who, series in posts
    ]
    for _ in range(500):
        if len(app[RW_QUEUE]) == len(posts):
            break
        await asyncio.sleep(0.01)
    assert len(app[RW_QUEUE]) == len(posts)
    before = len(writes)
    held.set()
    answers = [(await s).status for s in sent]
    assert answers == alone
    # the prometheus requests: the malformed one refuses the turn's joint mapping, so each of
    # that caller's is stored alone; agent-a's two (one refused) share one write
    assert len(writes) - before == 4
    end_s = (t + 3 * 15_000) / 1000
    assert store_state(one_at_a_time, end_s) == store_state(together, end_s)
    stats = [client.server.app[STATS] for client in clients]
    assert stats[0].remote_write_samples == stats[1].remote_write_samples
    assert stats[0].responses == stats[1].responses
    assert (stats[0].points_accepted, stats[0].points_rejected) == (
        stats[1].points_accepted,
        stats[1].points_rejected,
    )


class BrokenSink:
    """A sink that fails the way a bug would (not an answer the receiver knows)."""

    def __init__(self) -> None:
        self.calls = 0

    def accept(self, points: Any, source: str) -> int:
        self.calls += 1
        raise RuntimeError("the disk is gone")

    def accept_histograms(self, points: Any, source: str) -> int:
        raise RuntimeError("the disk is gone")


async def test_a_worker_that_fails_answers_500_and_takes_the_next_request(aiohttp_client, caplog):
    sink = BrokenSink()
    app = create_app(
        CollectorConfig(tokens=TABLE), sink, background=False, prom_translate=PromTranslator()
    )
    client = await aiohttp_client(app)
    body = encode(scrape(scripted(), int(time.time() * 1000), 0)[:50])
    for attempt in (1, 2):  # the same thread again: it was not lost, nothing waits forever
        resp = await asyncio.wait_for(
            client.post("/api/v1/write", data=body, headers=headers()), 30
        )
        assert resp.status == 500, attempt
        assert "failed" in await resp.text()
    assert sink.calls == 2
    assert "a worker failed" in caplog.text
    assert app[STATS].responses[500] == 2


async def test_a_request_given_up_before_its_turn_is_not_stored(
    aiohttp_client,
    services,  # noqa: F811 - the fixture
):
    service, _ = services
    client = await client_of(aiohttp_client, service)
    app = client.server.app
    fleet = scripted()
    t = int(time.time() * 1000) - 60_000
    held = threading.Event()
    for _ in range(worker_count()):
        app[RW_WORKERS].submit(held.wait)
    body = encode(node(scrape(fleet, t, 0), "node-a"))
    post = asyncio.ensure_future(client.post("/api/v1/write", data=body, headers=headers()))
    for _ in range(500):
        if len(app[RW_QUEUE]):
            break
        await asyncio.sleep(0.01)
    queue = app[RW_QUEUE]
    (waiting,) = queue._waiting
    waiting.answer.cancel()  # as aiohttp cancels a handler whose client went away
    held.set()
    with pytest.raises(aiohttp.ServerDisconnectedError):  # the handler was cancelled
        await post
    # every worker at one barrier: the turns submitted before (this request's) are done
    everyone = threading.Barrier(worker_count())
    done = [app[RW_WORKERS].submit(everyone.wait) for _ in range(worker_count())]
    await asyncio.gather(*(asyncio.wrap_future(d) for d in done))
    assert len(queue) == 0
    assert service.totals.accepted == 0
    # the next request is stored
    resp = await client.post("/api/v1/write", data=body, headers=headers())
    assert resp.status == 204
    assert service.totals.accepted > 0
