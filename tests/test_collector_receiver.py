"""The first collector endpoint answers OTLP/HTTP correctly, and never 5xx for bad input."""

from __future__ import annotations

import gzip
import json

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.ingest.sink import SeriesLog
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import STATS

TOKEN = "t0ken-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PB = {"Content-Type": "application/x-protobuf"}


def request_with(values: list[float], host: str = "node-1") -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value=host)))
    metric = rm.scope_metrics.add().metrics.add()
    metric.name = "hw.gpu.utilization"
    metric.unit = "1"
    for i, v in enumerate(values):
        dp = metric.gauge.data_points.add()
        dp.as_double = v
        dp.time_unix_nano = 1_000 + i
        dp.attributes.append(KeyValue(key="hw.id", value=AnyValue(string_value=f"GPU-{i}")))
    return req


@pytest.fixture
def log() -> SeriesLog:
    return SeriesLog()


@pytest.fixture
async def client(aiohttp_client, log):
    config = CollectorConfig(
        tokens=TokenTable((credential(TOKEN, Role.AGENT, "agent-a", ("node-*",)),)),
        max_body_bytes=64 * 1024,
        max_decompressed_bytes=1024 * 1024,
    )
    return await aiohttp_client(create_app(config, log))


async def test_accepts_protobuf_and_stores_points(client, log):
    body = request_with([0.25, 0.5]).SerializeToString()
    resp = await client.post("/v1/metrics", data=body, headers={**AUTH, **PB})
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/x-protobuf"
    parsed = ExportMetricsServiceResponse.FromString(await resp.read())
    assert parsed.partial_success.rejected_data_points == 0
    latest = log.latest("hw.gpu.utilization", "node-1")
    assert sorted(latest.values()) == [0.25, 0.5]


async def test_accepts_gzip_and_json(client, log):
    body = gzip.compress(request_with([0.75]).SerializeToString())
    resp = await client.post(
        "/v1/metrics", data=body, headers={**AUTH, **PB, "Content-Encoding": "gzip"}
    )
    assert resp.status == 200
    from google.protobuf import json_format

    js = json_format.MessageToJson(request_with([0.125], host="node-2"))
    resp = await client.post(
        "/v1/metrics", data=js, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert resp.status == 200
    assert json.loads(await resp.text()) == {}
    assert list(log.latest("hw.gpu.utilization", "node-2").values()) == [0.125]


async def test_non_finite_points_are_rejected_with_partial_success(client, log):
    body = request_with([float("nan"), 0.5, float("inf")]).SerializeToString()
    resp = await client.post("/v1/metrics", data=body, headers={**AUTH, **PB})
    assert resp.status == 200
    parsed = ExportMetricsServiceResponse.FromString(await resp.read())
    assert parsed.partial_success.rejected_data_points == 2
    assert list(log.latest("hw.gpu.utilization").values()) == [0.5]


@pytest.mark.parametrize(
    ("headers", "body", "status"),
    [
        ({**PB}, b"", 401),
        ({**PB, "Authorization": "Bearer wrong-token-0123456789"}, b"", 401),
        ({**PB, "Authorization": f"Basic {TOKEN}"}, b"", 401),
        ({**AUTH, "Content-Type": "text/plain"}, b"x", 415),
        ({**AUTH}, b"x", 415),
        ({**AUTH, **PB, "Content-Encoding": "br"}, b"x", 415),
        ({**AUTH, **PB}, b"\x0a\xff\xff\xff\xff\x0f", 400),
        ({**AUTH, **PB}, request_with([1.0]).SerializeToString()[:-3], 400),
        ({**AUTH, **PB, "Content-Encoding": "gzip"}, b"not gzip at all", 400),
        ({**AUTH, **PB, "Content-Encoding": "gzip"}, gzip.compress(b"\x00" * 10)[:-6], 400),
        ({**AUTH, "Content-Type": "application/json"}, b"{not json", 400),
        ({**AUTH, **PB}, b"\x00" * (64 * 1024 + 1), 413),
        (
            {**AUTH, **PB, "Content-Encoding": "gzip"},
            gzip.compress(b"\x00" * (2 * 1024 * 1024)),
            413,
        ),
    ],
    ids=[
        "no-token",
        "wrong-token",
        "wrong-scheme",
        "text-plain",
        "no-content-type",
        "brotli",
        "garbage-protobuf",
        "truncated-protobuf",
        "bad-gzip",
        "truncated-gzip",
        "bad-json",
        "body-too-large",
        "gzip-bomb",
    ],
)
async def test_bad_requests_get_a_clear_4xx(client, log, headers, body, status):
    resp = await client.post("/v1/metrics", data=body, headers=headers)
    assert resp.status == status
    assert (await resp.text()).strip()
    if status == 401:
        assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert log.metric_names() == set()
    assert client.server.app[STATS].responses[status] == 1


async def test_no_tokens_configured_refuses_everyone(aiohttp_client):
    client = await aiohttp_client(create_app(CollectorConfig()))
    resp = await client.post("/v1/metrics", data=b"", headers=PB)
    assert resp.status == 401


async def test_healthz(client):
    resp = await client.get("/healthz")
    assert resp.status == 200
    assert await resp.json() == {"status": "ok"}
