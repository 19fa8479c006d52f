"""The web layer against hostile clients, each guard on its own, on the real app over loopback:
header and body read timeouts, in-flight slots charged only while processing with a per-caller
cap, 4xx for bad header bytes and ids, and an access log without secrets."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gpuwarden.collector.build import build_remediation, build_service, load_configured_rules
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import TokenTable, parse_tokens
from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint
from gpuwarden.collector.web.access_log import redact_target
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import STATS, Admits, add_route
from gpuwarden.collector.web.receiver import SMALL_PAYLOAD_BYTES


def agent_tokens() -> TokenTable:
    """:data:`TOKENS` as agent credentials that may write any node (the limits are the subject
    here; tests/test_bound_identity.py binds them)."""
    agents = "".join(f"agent {name} {token} nodes=*\n" for token, name in TOKENS.items())
    return parse_tokens(agents + f"reader r {READER}\n", "tokens")


READER = "token-of-reader-r-0123456789"
AS_READER = f"Authorization: Bearer {READER}\r\n".encode()


TOKENS = {"token-of-agent-a-0123456789": "a", "token-of-agent-b-0123456789": "b"}


def headers(name: str) -> dict[str, str]:
    token = next(t for t, n in TOKENS.items() if n == name)
    return {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {token}"}


def body(host: str = "node-1", points: int = 1) -> bytes:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value=host)))
    m = rm.scope_metrics.add().metrics.add()
    m.name = "util"
    for i in range(points):
        dp = m.gauge.data_points.add()
        dp.as_double = 1.0
        dp.time_unix_nano = 1
        label = f"{i:08d}" + "x" * 100
        dp.attributes.append(KeyValue(key="gpu", value=AnyValue(string_value=label)))
    return req.SerializeToString()


BIG = body(points=3000)
"""Past ``receiver.SMALL_PAYLOAD_BYTES``: decoded and stored in a worker thread, in a slot."""


def config(**settings: object) -> CollectorConfig:
    return CollectorConfig(tokens=agent_tokens(), **settings)  # type: ignore[arg-type]


async def raw(port: int, data: bytes) -> bytes:
    """Send raw bytes; everything the server answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return answer


# --- header and body read timeouts ------------------------------------------------------


async def test_a_half_sent_request_head_is_cut_off(aiohttp_client):
    client = await aiohttp_client(create_app(config(header_timeout_seconds=0.3)))
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    writer.write(b"POST /v1/metrics HTTP/1.1\r\nHost: c\r\nContent-Le")
    await writer.drain()
    # closed by the collector, no answer (the bound only keeps a regression from hanging)
    assert await asyncio.wait_for(reader.read(), 30) == b""
    writer.close()


async def test_a_trickled_body_is_answered_408_and_takes_no_slot(aiohttp_client):
    app = create_app(config(body_timeout_seconds=0.3))
    client = await aiohttp_client(app)
    never = asyncio.Event()
    inflight: list[int] = []

    async def trickle() -> AsyncIterator[bytes]:
        yield b"\x0a"
        inflight.append(app[STATS].inflight)
        await never.wait()
        yield b"never sent"

    resp = await client.post("/v1/metrics", data=trickle(), headers=headers("a"))
    assert resp.status == 408
    assert inflight == [0]
    assert app[STATS].responses[408] == 1


async def test_a_body_still_awaited_when_the_stop_begins_is_answered_503_at_once(aiohttp_client):
    """At SIGTERM aiohttp answers the requests in progress: one waiting for its body used to wait
    out the body timeout (30 s) and get a 408, so the stop took 34 s (tests/test_sigterm_load.py,
    intermittently). Now the stop ends the wait: 503 with Retry-After (nothing stored, the agent
    sends again), long before the timeout."""
    app = create_app(config(body_timeout_seconds=60))
    client = await aiohttp_client(app)
    never = asyncio.Event()
    waiting = asyncio.Event()

    async def trickle() -> AsyncIterator[bytes]:
        yield b"\x0a"
        waiting.set()
        await never.wait()
        yield b"never sent"

    posted = asyncio.ensure_future(client.post("/v1/metrics", data=trickle(), headers=headers("a")))
    await asyncio.wait_for(waiting.wait(), 30)
    await asyncio.sleep(0.2)  # the guard is waiting for the rest of the body
    await app.shutdown()  # the stop's first step (on_shutdown hooks), as run_app does it
    # the 60 s body timeout would give a 408 (and this bound would trip first): the stop ended it
    resp = await asyncio.wait_for(posted, 30)
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "1"
    assert app[STATS].responses[503] == 1


# --- in-flight slots: while processing only, and at most N per caller --------------------


class BlockingSink:
    """A sink whose ``accept`` waits until released: holds its request in processing."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def accept(self, points: Iterable[NumberPoint], source: str) -> int:
        self.entered.release()
        self.release.wait(30)
        return 0

    def accept_histograms(self, points: Sequence[HistogramPoint], source: str) -> int:
        return 0


def test_big_is_big():
    assert len(BIG) > SMALL_PAYLOAD_BYTES


async def test_one_caller_cannot_take_every_slot(aiohttp_client):
    sink = BlockingSink()
    app = create_app(config(max_inflight_requests=3, max_inflight_per_token=2), sink)
    client = await aiohttp_client(app)
    held = [
        asyncio.create_task(client.post("/v1/metrics", data=BIG, headers=headers("a")))
        for _ in range(2)
    ]
    for _ in range(2):
        assert await asyncio.to_thread(sink.entered.acquire, True, 30)
    third = await client.post("/v1/metrics", data=BIG, headers=headers("a"))
    assert third.status == 503
    assert third.headers["Retry-After"] == "2"
    assert "2 requests of this caller" in await third.text()
    other = asyncio.create_task(client.post("/v1/metrics", data=BIG, headers=headers("b")))
    assert await asyncio.to_thread(sink.entered.acquire, True, 30)  # b got the last slot
    busy = await client.post("/v1/metrics", data=BIG, headers=headers("b"))
    assert busy.status == 503
    assert "collector busy" in await busy.text()
    sink.release.set()
    assert [r.status for r in await asyncio.gather(*held, other)] == [200, 200, 200]
    assert app[STATS].inflight == 0
    assert not app[STATS].inflight_by_caller


# --- bad bytes and ids are 4xx ------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        b"POST /v1/metrics HTTP/1.1\r\nHost: c\r\nAuthorization: Bearer \xff\xfe\r\n"
        b"Content-Length: 0\r\nConnection: close\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: c\r\nX-Note: caf\xe9\r\nConnection: close\r\n\r\n",
        b"GET /status/incidents/"
        + b"9" * 30
        + b" HTTP/1.1\r\nHost: c\r\nConnection: close\r\n"
        + AS_READER
        + b"\r\n",
        b"GET /status/incidents/%C2%B2 HTTP/1.1\r\nHost: c\r\nConnection: close\r\n"
        + AS_READER
        + b"\r\n",
        b"GET /v1/incidents/"
        + b"9" * 30
        + b" HTTP/1.1\r\nHost: c\r\nConnection: close\r\n"
        + AS_READER
        + b"\r\n",
    ],
    ids=["authorization", "any header", "status id", "superscript id", "api id"],
)
async def test_bad_bytes_and_ids_are_400(aiohttp_client, tmp_path: Path, head: bytes):
    service = build_service(CollectorConfig(database=tmp_path / "c.db"))
    cfg = config(database=tmp_path / "c.db")
    rules = load_configured_rules(cfg)
    remediation = build_remediation(cfg, service, rules, actuators=[], notifiers={}, environ={})
    app = create_app(cfg, service=service, background=False, remediation=remediation)
    client = await aiohttp_client(app)
    answer = await raw(client.port, head)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    service.storage.close()


# --- the access log -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        ("/approve/eyJhY3Rpb24iOjEyfQ.c2lnbmF0dXJlLW9mLXRoZS1saW5r", "/approve/<redacted>"),
        ("/v1/incidents/12", "/v1/incidents/12"),
        ("/runbooks/idle-gpu?token=abc&x=1", "/runbooks/idle-gpu?token=<redacted>&x=<redacted>"),
    ],
)
def test_targets_are_redacted(target, shown):
    assert redact_target(target) == shown


def test_a_route_secret_is_redacted_however_short():
    assert redact_target("/approve/short", ("short",)) == "/approve/<redacted>"


async def test_the_access_log_has_no_token_and_no_link_secret(aiohttp_client, caplog):
    secret = "eyJhY3Rpb24iOjEyfQ.c2lnbmF0dXJlLW9mLXRoZS1saW5r"
    client = await aiohttp_client(create_app(config()))
    with caplog.at_level(logging.INFO, logger="aiohttp.access"):
        await client.post("/v1/metrics", data=body(), headers=headers("a"))
        await client.get(f"/approve/{secret}", headers={"Referer": f"https://x/approve/{secret}"})
    lines = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert len(lines) == 2
    assert '"POST /v1/metrics HTTP/1.1" 200' in lines[0]
    assert '"GET /approve/<redacted> HTTP/1.1"' in lines[1]
    assert '"https://x/approve/<redacted>"' in lines[1]
    for line in lines:
        assert secret not in line
        assert "token-of-agent" not in line


async def test_a_request_the_parser_refuses_is_one_quiet_line(aiohttp_client, caplog):
    client = await aiohttp_client(create_app(config()))
    with caplog.at_level(logging.INFO):
        answer = await raw(client.port, b"GET /a\x01b HTTP/1.1\r\nHost: c\r\n\r\n")
    assert answer.startswith(b"HTTP/1.0 400 ")
    assert [r.levelno for r in caplog.records if r.levelno > logging.INFO] == []
    assert all(r.exc_info is None for r in caplog.records)
    server = [r.getMessage() for r in caplog.records if r.name.endswith("web.server")]
    assert len(server) == 1
    assert "Invalid char in url path" in server[0]
    access = [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]
    assert len(access) == 1
    assert '" 400 ' in access[0]


async def test_a_multipart_form_is_parsed_once_and_a_broken_one_is_400(aiohttp_client):
    seen: list[dict[str, str]] = []

    async def form(request: web.Request) -> web.Response:
        seen.append({k: str(v) for k, v in (await request.post()).items()})
        return web.Response(text="ok")

    app = create_app(config())
    add_route(app, "POST", "/form", form, Admits(open_because="a test route"))
    client = await aiohttp_client(app)
    data = aiohttp.FormData()
    data.add_field("approver", "alice")
    data.add_field("note", "x", filename="n.txt")  # a file field: multipart
    resp = await client.post("/form", data=data)
    assert resp.status == 200
    assert seen == [{"approver": "alice", "note": seen[0]["note"]}]
    broken = await client.post(
        "/form",
        data=b"--b\r\nno headers, no end",
        headers={"Content-Type": "multipart/form-data; boundary=zz"},
    )
    assert broken.status == 400
    assert len(seen) == 1
