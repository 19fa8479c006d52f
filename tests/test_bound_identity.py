"""Bound identities: an agent token writes only the nodes it is bound to, with the real store.

A request that writes any other node, through a resource's or a point's ``host.name``, in
protobuf or JSON, is refused with 403 before anything of it is stored, logged once per
(caller, node) and counted on ``/metrics``. Admins, and everyone under
``allow_unauthenticated``, write any node.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gpuwarden.agent.sender import SendStatus
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.ingest.otlp_hosts import claimed_hosts
from gpuwarden.collector.ingest.otlp_transport import JSON, PROTOBUF
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import AUTH_STATS
from tests.collector_server import CollectorThread
from tests.test_outage import make_agent

NODE_A = "node-a-token-0123456789abcdef"
RACK3 = "rack3-token-0123456789abcdef"
ADMIN = "admin-token-0123456789abcdef"
TOKENS = TokenTable(
    (
        credential(NODE_A, Role.AGENT, "node-a"),  # bound to its subject
        credential(RACK3, Role.AGENT, "rack3", ("gpu-rack3-*",)),
        credential(ADMIN, Role.ADMIN, "root"),
    )
)
PB = {"Content-Type": PROTOBUF}


def sent_by(token: str, kind: str = PROTOBUF) -> dict[str, str]:
    return {"Content-Type": kind, "Authorization": f"Bearer {token}"}


def request(*hosts: str | None, point_host: str | None = None) -> ExportMetricsServiceRequest:
    """One resource per host (None: a resource without host.name), one GPU point each."""
    req = ExportMetricsServiceRequest()
    for i, host in enumerate(hosts):
        rm = req.resource_metrics.add()
        if host is not None:
            value = AnyValue(string_value=host)
            rm.resource.attributes.append(KeyValue(key="host.name", value=value))
        rm.resource.attributes.append(KeyValue(key="host.type", value=AnyValue(string_value="x")))
        metric = rm.scope_metrics.add().metrics.add()
        metric.name, metric.unit = "hw.gpu.utilization", "1"
        dp = metric.gauge.data_points.add()
        dp.as_double, dp.time_unix_nano = 0.5, time.time_ns()
        dp.attributes.append(KeyValue(key="hw.id", value=AnyValue(string_value=f"GPU-{i}")))
        if point_host is not None:
            value = AnyValue(string_value=point_host)
            dp.attributes.append(KeyValue(key="host.name", value=value))
    return req


def body(*hosts: str | None, point_host: str | None = None) -> bytes:
    return request(*hosts, point_host=point_host).SerializeToString()


@pytest.fixture
def service(tmp_path: Path) -> CollectorService:
    return build_service(CollectorConfig(database=tmp_path / "c.db"))


@pytest.fixture
async def client(aiohttp_client, service):
    yield await aiohttp_client(
        create_app(CollectorConfig(tokens=TOKENS), service=service, background=False)
    )
    service.storage.close()


def stored(service: CollectorService) -> tuple[int, set[str], set[str]]:
    """Series in the store, hosts the store saw, and nodes the intake kept facts of."""
    return (
        service.store.series_count(),
        set(service.store.last_seen_by_host()),
        set(service.nodes),
    )


async def test_node_a_writing_node_b_is_refused_and_nothing_is_stored(client, service):
    resp = await client.post("/v1/metrics", data=body("node-b"), headers=sent_by(NODE_A))
    assert resp.status == 403
    assert await resp.text() == "node-a may not write host.name 'node-b'; nothing stored\n"
    assert stored(service) == (0, set(), set())


async def test_node_a_writing_node_a_is_stored(client, service):
    resp = await client.post("/v1/metrics", data=body("node-a"), headers=sent_by(NODE_A))
    assert resp.status == 200
    assert stored(service) == (1, {"node-a"}, {"node-a"})


async def test_all_or_nothing_when_one_resource_of_a_request_is_another_node(client, service):
    resp = await client.post("/v1/metrics", data=body("node-a", "node-b"), headers=sent_by(NODE_A))
    assert resp.status == 403
    assert stored(service) == (0, set(), set())  # not even node-a's own resource


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        (body("node-a", point_host="node-b"), PROTOBUF),  # a point's host.name wins in the store
        (body(None), PROTOBUF),  # a resource without host.name is no node of node-a's
        (json_format.MessageToJson(request("node-b")).encode(), JSON),
        (json_format.MessageToJson(request("node-a", point_host="node-b")).encode(), JSON),
    ],
)
async def test_other_ways_of_writing_another_node_are_refused(client, service, payload, kind):
    resp = await client.post("/v1/metrics", data=payload, headers=sent_by(NODE_A, kind))
    assert resp.status == 403
    assert stored(service) == (0, set(), set())


async def test_a_glob_binds_a_rack(client, service):
    ok = await client.post("/v1/metrics", data=body("gpu-rack3-07"), headers=sent_by(RACK3))
    assert ok.status == 200
    refused = await client.post("/v1/metrics", data=body("gpu-rack4-01"), headers=sent_by(RACK3))
    assert refused.status == 403
    assert stored(service) == (1, {"gpu-rack3-07"}, {"gpu-rack3-07"})


async def test_an_admin_writes_any_node(client, service):
    resp = await client.post("/v1/metrics", data=body("node-b"), headers=sent_by(ADMIN))
    assert resp.status == 200
    assert stored(service) == (1, {"node-b"}, {"node-b"})


async def test_anyone_writes_any_node_without_authentication(aiohttp_client, service):
    config = CollectorConfig(allow_unauthenticated=True)
    client = await aiohttp_client(create_app(config, service=service, background=False))
    resp = await client.post("/v1/metrics", data=body("node-b"), headers=PB)
    assert resp.status == 200
    assert stored(service) == (1, {"node-b"}, {"node-b"})
    service.storage.close()


async def test_logged_once_per_caller_and_node_and_counted_every_time(client, caplog):
    with caplog.at_level(logging.WARNING, logger="gpuwarden.collector.web.receiver"):
        for _ in range(3):
            await client.post("/v1/metrics", data=body("node-b"), headers=sent_by(NODE_A))
        await client.post("/v1/metrics", data=body("node-c"), headers=sent_by(NODE_A))
    logged = [r.getMessage() for r in caplog.records]
    assert [m.split(" may not write ")[1].split(" (")[0] for m in logged] == [
        "host.name 'node-b'",
        "host.name 'node-c'",
    ]
    assert all(m.startswith("node-a (127.0.0.1) may not write") for m in logged)
    refusals = client.app[AUTH_STATS].refusals
    assert refusals == {("POST", "/v1/metrics", 403, "node"): 4}


@pytest.mark.parametrize(
    ("req", "hosts"),
    [
        (request("node-a"), {"node-a"}),
        (request("node-a", "node-b"), {"node-a", "node-b"}),
        (request(None), {""}),
        (request("node-a", point_host="node-b"), {"node-a", "node-b"}),
    ],
)
def test_claimed_hosts_read_without_and_with_a_full_parse_agree(req, hosts):
    assert claimed_hosts(req.SerializeToString(), PROTOBUF) == hosts
    assert claimed_hosts(json_format.MessageToJson(req).encode(), JSON) == hosts


def test_a_value_holding_the_key_bytes_does_not_hide_or_invent_a_host():
    req = request("node-a")
    dp = req.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]
    dp.attributes.append(KeyValue(key="note", value=AnyValue(string_value="host.name")))
    assert claimed_hosts(req.SerializeToString(), PROTOBUF) == {"node-a"}


def test_a_real_agent_with_another_nodes_token_is_refused_and_keeps_its_rounds(tmp_path):
    service = build_service(CollectorConfig(database=tmp_path / "c.db"))
    collector = CollectorThread(service=service)
    collector.config = CollectorConfig(port=collector.port, tokens=TOKENS)
    spoofer = make_agent(tmp_path / "spool-b", collector.port, node="node-b", token=NODE_A)
    honest = make_agent(tmp_path / "spool-a", collector.port, node="node-a", token=NODE_A)
    collector.start()
    try:
        assert spoofer.agent.sender is not None
        assert honest.agent.sender is not None
        spoofer.agent.sample_once()
        assert spoofer.agent.sender.send_once().status is SendStatus.UNAUTHORIZED
        assert len(spoofer.agent.spool or []) == 1  # kept for when its token is fixed
        assert stored(service) == (0, set(), set())
        honest.agent.sample_once()
        assert honest.agent.sender.send_once().status is SendStatus.SENT
        series, hosts, nodes = stored(service)
        assert series > 0
        assert (hosts, nodes) == ({"node-a"}, {"node-a"})
    finally:
        spoofer.agent.shutdown(flush_timeout_seconds=0)
        honest.agent.shutdown(flush_timeout_seconds=2)
        collector.stop()
        service.storage.close()
