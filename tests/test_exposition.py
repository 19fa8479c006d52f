"""``/metrics`` through the real app: exact samples, bounded job labels, isolated failures."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.collector.exposition import FleetMetrics
from gpuwarden.collector.service import CollectorService
from tests.test_collector_api import AUTH, GIB, H100, NOW, collector_app, fleet

A0 = {"node": "node-a", "gpu": "GPU-A0", "model": H100, "job": "api:train-1", "team": "vision",
      "model_name": "resnet"}  # fmt: skip
A1 = {**A0, "gpu": "GPU-A1", "job": "slurm:77", "team": "", "model_name": ""}
B0 = {"node": "node-b", "gpu": "GPU-B0", "model": "NVIDIA L4", "job": "", "team": "",
      "model_name": ""}  # fmt: skip
TRAIN = {"job": "api:train-1", "team": "vision", "model": "resnet"}
INFER = {"job": "api:infer-2", "team": "nlp", "model": "llama"}


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str, prefix: str = "") -> Samples:
    """Every sample whose name starts with ``prefix``, keyed by name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(prefix)
    }


def expect(*rows: tuple[str, dict[str, str], float]) -> Samples:
    return {(name, frozenset(labels.items())): value for name, labels, value in rows}


@pytest.fixture
def service():
    service = fleet()
    yield service
    service.storage.close()


async def scrape(aiohttp_client: Any, service: CollectorService) -> str:
    client = await aiohttp_client(collector_app(service))
    resp = await client.get("/metrics")  # no token: scraped like a node exporter
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    text: str = await resp.text()
    return text


async def test_gpu_families(aiohttp_client, service):
    text = await scrape(aiohttp_client, service)
    assert samples(text, "gpuwarden_gpu_") == expect(
        ("gpuwarden_gpu_utilization_ratio", A0, 0.75),
        ("gpuwarden_gpu_utilization_ratio", A1, 0.0),
        ("gpuwarden_gpu_utilization_ratio", B0, 0.25),
        ("gpuwarden_gpu_memory_used_bytes", A0, 32 * GIB),
        ("gpuwarden_gpu_memory_used_bytes", A1, 0.0),
        ("gpuwarden_gpu_memory_total_bytes", A0, 80 * GIB),
        ("gpuwarden_gpu_memory_total_bytes", A1, 80 * GIB),
        ("gpuwarden_gpu_power_watts", A0, 350.0),
        ("gpuwarden_gpu_power_watts", A1, 70.0),
        # the die, not the memory sensor (which reads 10 degrees more)
        ("gpuwarden_gpu_temperature_celsius", A0, 61.0),
        ("gpuwarden_gpu_temperature_celsius", A1, 40.0),
        ("gpuwarden_gpu_status", {**A0, "state": "ok"}, 1.0),
        ("gpuwarden_gpu_status", {**A0, "state": "degraded"}, 0.0),
        ("gpuwarden_gpu_status", {**A0, "state": "failed"}, 0.0),
        ("gpuwarden_gpu_status", {**A1, "state": "ok"}, 0.0),
        ("gpuwarden_gpu_status", {**A1, "state": "degraded"}, 1.0),
        ("gpuwarden_gpu_status", {**A1, "state": "failed"}, 0.0),
    )


def _hours(
    labels: dict[str, str],
    allocated: float,
    busy: float,
    idle: float,
    name: str = "gpuwarden_job_gpu_hours",
) -> list[tuple[str, dict[str, str], float]]:
    return [
        (name, {**labels, "kind": "allocated"}, allocated),
        (name, {**labels, "kind": "busy"}, busy),
        (name, {**labels, "kind": "idle"}, idle),
    ]


async def test_job_and_team_accounting_over_the_last_day(aiohttp_client, service):
    text = await scrape(aiohttp_client, service)
    assert samples(text, "gpuwarden_job_") == expect(
        *_hours(TRAIN, 1.5, 1.0, 0.25),
        *_hours(INFER, 0.5, 0.5, 0.0),
        ("gpuwarden_job_energy_kwh", TRAIN, 1.0),
        ("gpuwarden_job_energy_kwh", INFER, 0.5),
        ("gpuwarden_job_cost_usd", TRAIN, 5.0),
        ("gpuwarden_job_cost_usd", INFER, 2.0),
        ("gpuwarden_job_carbon_kg", TRAIN, 0.4),
        ("gpuwarden_job_carbon_kg", INFER, 0.2),
    )
    team = "gpuwarden_team_gpu_hours"
    assert samples(text, team) == expect(
        *_hours({"team": "vision"}, 1.5, 1.0, 0.25, team),
        *_hours({"team": "nlp"}, 0.5, 0.5, 0.0, team),
    )
    assert samples(text, "gpuwarden_collector_accounting") == expect(
        ("gpuwarden_collector_accounting_jobs_omitted", {}, 0.0)
    )


def test_job_families_are_capped_largest_first_and_team_totals_stay_complete(service):
    registry = CollectorRegistry()
    registry.register(FleetMetrics(service, max_jobs=1))
    text = generate_latest(registry).decode()
    assert {dict(labels)["job"] for _, labels in samples(text, "gpuwarden_job_")} == {"api:train-1"}
    assert samples(text, "gpuwarden_team_gpu_hours") == expect(
        *_hours({"team": "vision"}, 1.5, 1.0, 0.25, "gpuwarden_team_gpu_hours"),
        *_hours({"team": "nlp"}, 0.5, 0.5, 0.0, "gpuwarden_team_gpu_hours"),
    )
    assert samples(text, "gpuwarden_collector_accounting") == expect(
        ("gpuwarden_collector_accounting_jobs_omitted", {}, 1.0)
    )
    assert "at most 1 jobs, the largest by allocated GPU-hours" in text


def test_window_and_cap_are_checked(service):
    with pytest.raises(ValueError, match="accounting_window_seconds must be > 0"):
        FleetMetrics(service, accounting_window_seconds=0)


def otlp_request(host: str, uuid: str, value: float) -> bytes:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value=host)))
    metric = rm.scope_metrics.add().metrics.add()
    metric.name, metric.unit = "hw.gpu.utilization", "1"
    dp = metric.gauge.data_points.add()
    dp.as_double, dp.time_unix_nano = value, int((NOW - 2) * 1e9)
    dp.attributes.append(KeyValue(key="hw.id", value=AnyValue(string_value=uuid)))
    return req.SerializeToString()


async def test_collector_health(aiohttp_client, service):
    client = await aiohttp_client(collector_app(service))
    pb = {"Content-Type": "application/x-protobuf"}
    body = otlp_request("node-c", "GPU-C0", 0.5)
    assert (await client.post("/v1/metrics", data=body, headers={**AUTH, **pb})).status == 200
    assert (await client.post("/v1/metrics", data=body, headers=pb)).status == 401
    text = await (await client.get("/metrics")).text()
    assert samples(text, "gpuwarden_collector_") == expect(
        ("gpuwarden_collector_points_total", {"outcome": "accepted"}, 24.0),  # 23 + 1 over OTLP
        ("gpuwarden_collector_points_total", {"outcome": "rejected"}, 0.0),
        ("gpuwarden_collector_requests_total", {"code": "200"}, 1.0),
        ("gpuwarden_collector_requests_total", {"code": "401"}, 1.0),
        ("gpuwarden_collector_series", {}, 24.0),
        ("gpuwarden_collector_store_memory_bytes", {}, float(service.store.memory_bytes())),
        ("gpuwarden_collector_nodes", {}, 3.0),
        ("gpuwarden_collector_jobs", {}, 1.0),
        ("gpuwarden_collector_lag_seconds", {}, 2.0),
        ("gpuwarden_collector_accounting_jobs_omitted", {}, 0.0),
        ("gpuwarden_collector_scrape_success", {"section": "gpus"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "accounting"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "health"}, 1.0),
    )


async def test_a_failing_section_is_reported_and_the_others_still_served(
    aiohttp_client, service, caplog
):
    service.storage.close()
    with caplog.at_level(logging.ERROR, logger="gpuwarden.collector.exposition"):
        text = await scrape(aiohttp_client, service)
    assert samples(text, "gpuwarden_collector_scrape_success") == expect(
        ("gpuwarden_collector_scrape_success", {"section": "gpus"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "accounting"}, 0.0),
        ("gpuwarden_collector_scrape_success", {"section": "health"}, 1.0),
    )
    assert samples(text, "gpuwarden_job_") == {}
    assert (
        samples(text, "gpuwarden_gpu_utilization_ratio")[
            ("gpuwarden_gpu_utilization_ratio", frozenset(A0.items()))
        ]
        == 0.75
    )
    assert [r.getMessage() for r in caplog.records] == ["metrics section accounting failed"]


async def test_openmetrics_when_asked(aiohttp_client, service):
    client = await aiohttp_client(collector_app(service))
    resp = await client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    text = await resp.text()
    assert text.endswith("# EOF\n")
    assert 'gpuwarden_collector_points_total{outcome="accepted"} 23.0' in text


async def test_each_app_has_its_own_registry(aiohttp_client):
    first, second = fleet(), fleet()
    await scrape(aiohttp_client, first)
    await scrape(aiohttp_client, second)  # no duplicate-timeseries error
    assert b"gpuwarden_" not in generate_latest(REGISTRY)
    first.storage.close()
    second.storage.close()
