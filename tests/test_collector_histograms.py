"""OTLP histograms (model latency, token counts) land in the store as bucket counts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.store.types import series_key
from gpuwarden.collector.web.app import create_app

TOKEN = "histogram-test-token-0123456789"
HEADERS = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}
BOUNDS = [0.1, 0.2, 0.5, 1.0]
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE


def histogram(
    t_ns: int,
    counts: list[int],
    total: float,
    temporality: AggregationTemporality.ValueType = CUMULATIVE,
) -> bytes:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value="srv")))
    metric = rm.scope_metrics.add().metrics.add()
    metric.name = "vllm.e2e_request_latency"
    metric.unit = "s"
    metric.histogram.aggregation_temporality = temporality
    dp = metric.histogram.data_points.add()
    dp.time_unix_nano = t_ns
    dp.explicit_bounds.extend(BOUNDS)
    dp.bucket_counts.extend(counts)
    dp.count = sum(counts)
    dp.sum = total
    dp.attributes.append(KeyValue(key="model", value=AnyValue(string_value="llama")))
    return req.SerializeToString()


@pytest.fixture
async def setup(aiohttp_client, tmp_path: Path):
    service = build_service(CollectorConfig(database=tmp_path / "c.db"))
    config = CollectorConfig(tokens=TokenTable((credential(TOKEN, Role.AGENT, "srv"),)))
    client = await aiohttp_client(create_app(config, service=service, background=False))
    yield client, service
    service.storage.close()


async def test_cumulative_histograms_are_stored_and_give_quantiles(setup):
    client, service = setup
    now = time.time()
    t0 = int((now - 30) * 1e9)
    t1 = int((now - 10) * 1e9)
    for t, counts, total in ((t0, [10, 0, 0, 0, 0], 0.5), (t1, [10, 100, 0, 0, 0], 15.5)):
        resp = await client.post("/v1/metrics", data=histogram(t, counts, total), headers=HEADERS)
        assert resp.status == 200
        assert (
            ExportMetricsServiceResponse.FromString(
                await resp.read()
            ).partial_success.rejected_data_points
            == 0
        )
    key = series_key("vllm.e2e_request_latency", {"model": "llama", "host.name": "srv"})
    # between the two points 100 observations fell in (0.1, 0.2]: the median is 0.15
    assert service.store.quantile(key, 0.5, now - 25, now + 1) == pytest.approx(0.15)


async def test_delta_histograms_are_counted_as_rejected(setup):
    client, service = setup
    body = histogram(
        time.time_ns(),
        [1, 2, 3, 4, 5],
        9.0,
        temporality=AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA,
    )
    resp = await client.post("/v1/metrics", data=body, headers=HEADERS)
    assert resp.status == 200
    assert (
        ExportMetricsServiceResponse.FromString(
            await resp.read()
        ).partial_success.rejected_data_points
        == 1
    )
    assert service.store.series_count() == 0
