"""Hostile input against the collector with its real store: clear 4xx, bounded memory, counted."""

from __future__ import annotations

import gzip
import io
import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import STATS

TOKENS = {"token-of-agent-a-0123456789": "a", "token-of-agent-b-0123456789": "b"}
TABLE = TokenTable(tuple(credential(t, Role.AGENT, n, ("*",)) for t, n in TOKENS.items()))
PB = {"Content-Type": "application/x-protobuf"}


def auth(name: str) -> dict[str, str]:
    token = next(t for t, n in TOKENS.items() if n == name)
    return {**PB, "Authorization": f"Bearer {token}"}


def many_series(n: int, host: str, offset: int = 0) -> bytes:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value=host)))
    metric = rm.scope_metrics.add().metrics.add()
    metric.name = "hw.gpu.utilization"
    now = time.time_ns()
    for i in range(n):
        dp = metric.gauge.data_points.add()
        dp.as_double = 0.5
        dp.time_unix_nano = now
        dp.attributes.append(
            KeyValue(key="hw.id", value=AnyValue(string_value=f"GPU-{i + offset}"))
        )
    return req.SerializeToString()


@pytest.fixture
def service(tmp_path: Path) -> CollectorService:
    svc = build_service(CollectorConfig(database=tmp_path / "c.db"))
    svc.max_new_series_per_source_hour = 1000
    return svc


@pytest.fixture
async def client(aiohttp_client, service):
    config = CollectorConfig(tokens=TABLE, max_body_bytes=4 << 20, max_decompressed_bytes=16 << 20)
    yield await aiohttp_client(create_app(config, service=service, background=False))
    service.storage.close()


async def test_a_flood_of_new_series_from_one_source_is_capped_and_counted(client, service):
    for batch in range(5):  # 5,000 new series from agent a, in five requests
        resp = await client.post(
            "/v1/metrics", data=many_series(1000, "a", batch * 1000), headers=auth("a")
        )
        assert resp.status == 200
        body = ExportMetricsServiceResponse.FromString(await resp.read())
        assert body.partial_success.rejected_data_points == (0 if batch == 0 else 1000)
    assert service.store.series_count() == 1000
    # another source still has its own budget
    resp = await client.post("/v1/metrics", data=many_series(10, "b"), headers=auth("b"))
    assert (
        ExportMetricsServiceResponse.FromString(
            await resp.read()
        ).partial_success.rejected_data_points
        == 0
    )
    assert service.store.series_count() == 1010
    # points of series that already exist are never refused
    resp = await client.post("/v1/metrics", data=many_series(1000, "a"), headers=auth("a"))
    assert (
        ExportMetricsServiceResponse.FromString(
            await resp.read()
        ).partial_success.rejected_data_points
        == 0
    )
    assert service.totals.rejected == 4000
    assert client.server.app[STATS].points_rejected == 4000


async def test_a_100_mb_body_is_refused_before_it_is_read(client):
    body = io.BytesIO(b"\0" * (100 << 20))
    resp = await client.post("/v1/metrics", data=body, headers=auth("a"))
    assert resp.status == 413


async def test_a_gzip_bomb_is_refused(client, service):
    bomb = gzip.compress(b"\0" * (64 << 20), 9)
    assert len(bomb) < 4 << 20
    resp = await client.post(
        "/v1/metrics", data=bomb, headers={**auth("a"), "Content-Encoding": "gzip"}
    )
    assert resp.status == 413
    assert service.store.series_count() == 0


async def test_summaries_are_counted_as_rejected_not_crashes(client):
    req = ExportMetricsServiceRequest()
    metric = req.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "latency"
    dp = metric.summary.data_points.add()
    dp.count = 3
    resp = await client.post("/v1/metrics", data=req.SerializeToString(), headers=auth("a"))
    assert resp.status == 200
    assert (
        ExportMetricsServiceResponse.FromString(
            await resp.read()
        ).partial_success.rejected_data_points
        == 1
    )


async def test_back_pressure_answers_503_with_retry_after(aiohttp_client, service):
    config = CollectorConfig(tokens=TABLE, max_inflight_requests=0)
    client = await aiohttp_client(create_app(config, service=service, background=False))
    resp = await client.post("/v1/metrics", data=many_series(1, "a"), headers=auth("a"))
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "2"
    assert service.store.series_count() == 0
