"""``/metrics`` through the real app: exact samples, bounded job labels, isolated failures."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.collector.accounting.prices import TIERS
from gpuwarden.collector.config import load_collector_config
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.base import ActionRecord, BreakerRecord
from gpuwarden.collector.storage.records import Event, EventKind, Incident, ModelDeployment
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.web.exposition import PRICE_FAMILY, PRICE_LABELS, FleetMetrics
from tests.test_collector_api import AUTH, GIB, H100, NOW, collector_app, fleet, fleet_points

A0 = {"node": "node-a", "gpu": "GPU-A0", "gpu_model": H100, "job_key": "api:train-1",
      "team": "vision", "model": "resnet"}  # fmt: skip
PRICE_H100_SPOT = {
    "gpu_model": "h100",
    "tier": "spot",
    "currency": "USD",
    "cluster": "",
    "region": "",
}
A1 = {**A0, "gpu": "GPU-A1", "job_key": "slurm:77", "team": "", "model": ""}
B0 = {"node": "node-b", "gpu": "GPU-B0", "gpu_model": "NVIDIA L4", "job_key": "", "team": "",
      "model": ""}  # fmt: skip
TRAIN = {"job_key": "api:train-1", "team": "vision", "model": "resnet"}
INFER = {"job_key": "api:infer-2", "team": "nlp", "model": "llama"}


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
    resp = await client.get("/metrics", headers=AUTH)  # a reader's (here an admin's) token
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
        # the fleet's points are 5 s old
        ("gpuwarden_gpu_last_seen_age_seconds", {"node": "node-a", "gpu": "GPU-A0"}, 5.0),
        ("gpuwarden_gpu_last_seen_age_seconds", {"node": "node-a", "gpu": "GPU-A1"}, 5.0),
        ("gpuwarden_gpu_last_seen_age_seconds", {"node": "node-b", "gpu": "GPU-B0"}, 5.0),
    )


async def test_a_silent_node_is_down_and_its_gpus_are_absent(aiohttp_client, tmp_path):
    """node-b's agent stops: past the staleness bound its GPU's readings vanish (Prometheus
    staleness semantics), node-b reads down with its age; node-a, still reporting, is up."""
    now = [NOW]
    store = WindowStore(step_seconds=10, recent_seconds=3600, clock=lambda: now[0])
    storage = SqliteStorage(tmp_path / "c.db", clock=lambda: now[0])
    service = CollectorService(store, storage, JobRegistry(storage), clock=lambda: now[0])
    assert service.accept(fleet_points(), "agents") == 0  # both nodes at NOW - 5
    bound = store.staleness_seconds
    now[0] = NOW + bound  # node-b's point is bound + 5 s old; node-a reports again
    again = [
        replace(p, time_unix_nano=int((now[0] - 5) * 1e9))
        for p in fleet_points()
        if p.resource["host.name"] == "node-a"
    ]
    assert service.accept(again, "agents") == 0
    text = await scrape(aiohttp_client, service)
    storage.close()
    assert samples(text, "gpuwarden_node_") == expect(
        ("gpuwarden_node_up", {"node": "node-a"}, 1.0),
        ("gpuwarden_node_up", {"node": "node-b"}, 0.0),
        ("gpuwarden_node_last_seen_age_seconds", {"node": "node-a"}, 5.0),
        ("gpuwarden_node_last_seen_age_seconds", {"node": "node-b"}, bound + 5),
    )
    for name in ("gpuwarden_gpu_utilization_ratio", "gpuwarden_gpu_status"):
        assert {dict(labels)["gpu"] for _, labels in samples(text, name)} == {"GPU-A0", "GPU-A1"}
    assert samples(text, "gpuwarden_gpu_last_seen_age_seconds") == expect(
        ("gpuwarden_gpu_last_seen_age_seconds", {"node": "node-a", "gpu": "GPU-A0"}, 5.0),
        ("gpuwarden_gpu_last_seen_age_seconds", {"node": "node-a", "gpu": "GPU-A1"}, 5.0),
        ("gpuwarden_gpu_last_seen_age_seconds", {"node": "node-b", "gpu": "GPU-B0"}, bound + 5),
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
    assert {dict(labels)["job_key"] for _, labels in samples(text, "gpuwarden_job_")} == {
        "api:train-1"
    }
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
    agent = {"Gpuwarden-Agent-Instance": "ab" * 16, "Gpuwarden-Agent-Rounds": f"1:{len(body)}"}
    for _ in range(2):  # the same round twice: stored once, the resend counted
        resp = await client.post("/v1/metrics", data=body, headers={**AUTH, **pb, **agent})
        assert resp.status == 200
    assert (await client.post("/v1/metrics", data=body, headers=pb)).status == 401
    text = await (await client.get("/metrics", headers=AUTH)).text()
    refused = {"method": "POST", "route": "/v1/metrics", "status": "401", "reason": "missing"}
    health = samples(text, "gpuwarden_collector_")
    # the event loop's lag is what it is (a gauge of the moment); it is there and not negative
    assert health.pop(("gpuwarden_collector_event_loop_lag_seconds", frozenset())) >= 0
    assert health == expect(
        ("gpuwarden_collector_points_total", {"outcome": "accepted"}, 24.0),  # 23 + 1 over OTLP
        ("gpuwarden_collector_points_total", {"outcome": "rejected"}, 0.0),
        ("gpuwarden_collector_duplicate_rounds_total", {}, 1.0),
        ("gpuwarden_collector_requests_total", {"code": "200"}, 2.0),
        ("gpuwarden_collector_requests_total", {"code": "401"}, 1.0),
        ("gpuwarden_collector_requests_abandoned_total", {}, 0.0),
        ("gpuwarden_collector_auth_refusals_total", refused, 1.0),
        ("gpuwarden_collector_series", {}, 24.0),
        ("gpuwarden_collector_store_memory_bytes", {}, float(service.store.memory_bytes())),
        ("gpuwarden_collector_nodes", {}, 3.0),
        ("gpuwarden_collector_jobs", {}, 1.0),
        ("gpuwarden_collector_lag_seconds", {}, 2.0),
        ("gpuwarden_collector_accounting_jobs_omitted", {}, 0.0),
        ("gpuwarden_collector_scrape_success", {"section": "gpus"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "nodes"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "accounting"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "prices"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "budgets"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "models"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "fairness"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "incidents"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "remediation"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "health"}, 1.0),
    )


async def test_a_failing_section_is_reported_and_the_others_still_served(
    aiohttp_client, service, caplog
):
    service.storage.close()
    with caplog.at_level(logging.ERROR, logger="gpuwarden.collector.web.exposition"):
        text = await scrape(aiohttp_client, service)
    assert samples(text, "gpuwarden_collector_scrape_success") == expect(
        ("gpuwarden_collector_scrape_success", {"section": "gpus"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "nodes"}, 1.0),
        ("gpuwarden_collector_scrape_success", {"section": "accounting"}, 0.0),
        ("gpuwarden_collector_scrape_success", {"section": "prices"}, 1.0),  # no storage read
        ("gpuwarden_collector_scrape_success", {"section": "budgets"}, 1.0),  # none configured
        ("gpuwarden_collector_scrape_success", {"section": "models"}, 0.0),
        ("gpuwarden_collector_scrape_success", {"section": "fairness"}, 1.0),  # the registry's
        ("gpuwarden_collector_scrape_success", {"section": "incidents"}, 0.0),
        ("gpuwarden_collector_scrape_success", {"section": "remediation"}, 0.0),
        ("gpuwarden_collector_scrape_success", {"section": "health"}, 1.0),
    )
    assert samples(text, "gpuwarden_job_") == {}
    assert (
        samples(text, "gpuwarden_gpu_utilization_ratio")[
            ("gpuwarden_gpu_utilization_ratio", frozenset(A0.items()))
        ]
        == 0.75
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"metrics section {name} failed"
        for name in ("accounting", "models", "incidents", "remediation")
    ]


async def test_openmetrics_when_asked(aiohttp_client, service):
    client = await aiohttp_client(collector_app(service))
    resp = await client.get("/metrics", headers={**AUTH, "Accept": "application/openmetrics-text"})
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


def _requests(host: str, model: str, outcome: str, t: float, total: float) -> NumberPoint:
    return NumberPoint(
        resource={"host.name": host},
        metric="gpuwarden.model.requests",
        unit="{request}",
        kind="sum",
        monotonic=True,
        attributes={"model": model, "outcome": outcome},
        time_unix_nano=int(t * 1e9),
        value=total,
    )


async def test_model_families_sum_replicas_and_merge_their_histograms(aiohttp_client, service):
    # Two replicas of llama: 0.5 + 0.3 successes/s and 0.1 failures/s over the last 5 minutes.
    points = []
    for i, t in enumerate((NOW - 300, NOW - 10)):
        points += [
            _requests("node-a", "llama", "success", t, 1000 + i * 150.0),
            _requests("node-b", "llama", "success", t, 50 + i * 90.0),
            _requests("node-b", "llama", "failure", t, 7 + i * 30.0),
        ]
    assert service.accept(points, "scraper") == 0
    store = service.store
    for host, counts in (("node-a", (60, 30, 10, 0)), ("node-b", (40, 0, 50, 10))):
        for t, scale in ((NOW - 300, 0), (NOW - 10, 1)):
            store.ingest_histogram(
                "gpuwarden.model.request.latency",
                {"host.name": host, "model": "llama"},
                time_unix_nano=int(t * 1e9),
                bounds=(0.1, 0.5, 1.0),
                bucket_counts=tuple(c * scale for c in counts),
                sum_value=10.0 * scale,
            )
    store.ingest(
        [
            NumberPoint(
                resource={"host.name": h},
                metric="gpuwarden.model.queue.size",
                unit="{request}",
                kind="gauge",
                monotonic=False,
                attributes={"model": "llama", "state": "waiting"},
                time_unix_nano=int((NOW - 10) * 1e9),
                value=v,
            )
            for h, v in (("node-a", 3.0), ("node-b", 4.0))
        ]
    )
    service.storage.upsert_model(
        ModelDeployment(name="llama", version="v2", replicas=2, slo_latency_p99_seconds=0.8)
    )
    service.storage.record_event(Event(NOW - 7200, EventKind.DEPLOY, "llama", {"version": "v1"}))
    service.storage.record_event(
        Event(NOW - 600, EventKind.DEPLOY, "llama", {"from": "v1", "to": "v2"})
    )
    text = await scrape(aiohttp_client, service)
    got = samples(text, "gpuwarden_model_")
    rates = {k: v for k, v in got.items() if k[0] == "gpuwarden_model_request_rate"}
    assert rates == pytest.approx(
        expect(
            ("gpuwarden_model_request_rate", {"model": "llama", "outcome": "success"}, 0.8),
            ("gpuwarden_model_request_rate", {"model": "llama", "outcome": "failure"}, 0.1),
        )
    )
    # merged buckets (0.1, 0.5, 1, +Inf): 100, 30, 60, 10 of 200 observations
    latency = {
        dict(k[1])["quantile"]: v
        for k, v in got.items()
        if k[0] == "gpuwarden_model_latency_seconds"
    }
    assert latency == pytest.approx({"0.5": 0.1, "0.95": 1.0, "0.99": 1.0})
    assert (
        got[
            (
                "gpuwarden_model_queue_size",
                frozenset({"model": "llama", "state": "waiting"}.items()),
            )
        ]
        == 7.0
    )
    assert (
        got[("gpuwarden_model_replicas", frozenset({"model": "llama", "version": "v2"}.items()))]
        == 2.0
    )
    assert (
        got[("gpuwarden_model_slo_latency_p99_seconds", frozenset({"model": "llama"}.items()))]
        == 0.8
    )
    assert not any(k[0] == "gpuwarden_model_slo_error_ratio" for k in got)
    deploys = {k: v for k, v in got.items() if k[0] == "gpuwarden_model_deploy_time_seconds"}
    assert deploys == expect(
        ("gpuwarden_model_deploy_time_seconds", {"model": "llama", "version": "v2"}, NOW - 600)
    )


async def test_open_incidents_by_rule_and_severity(aiohttp_client, service):
    for i, rule in enumerate(("idle-gpu", "idle-gpu", "gpu-hardware-fault")):
        service.storage.open_incident(
            Incident(
                fingerprint=f"fp{i}",
                rule_id=rule,
                severity="warning" if rule == "idle-gpu" else "page",
                first_seen=NOW - 60,
                last_seen=NOW,
            )
        )
    got = samples(await scrape(aiohttp_client, service), "gpuwarden_incidents_open")
    assert got == expect(
        ("gpuwarden_incidents_open", {"rule": "idle-gpu", "severity": "warning"}, 2.0),
        ("gpuwarden_incidents_open", {"rule": "gpu-hardware-fault", "severity": "page"}, 1.0),
    )


async def test_remediation_actions_breaker_and_audit(aiohttp_client, service):
    incident_id = service.storage.open_incident(
        Incident(
            fingerprint="fp", rule_id="idle-gpu", severity="warning", first_seen=NOW, last_seen=NOW
        )
    )
    assert incident_id is not None
    for i, (state, dry) in enumerate((("dry_run", True), ("dry_run", True), ("verified", False))):
        service.storage.insert_action(
            ActionRecord(
                incident_id=incident_id,
                idempotency_key=f"k{i}",
                action="requeue",
                target=f"slurm:c:{i}",
                mode="auto",
                dry_run=dry,
                state=state,
                created_at=NOW,
                updated_at=NOW,
            )
        )
    got = samples(await scrape(aiohttp_client, service), "gpuwarden_remediation_")
    base = {"action": "requeue", "mode": "auto"}
    assert got == expect(
        ("gpuwarden_remediation_actions", {**base, "state": "dry_run", "dry_run": "true"}, 2.0),
        ("gpuwarden_remediation_actions", {**base, "state": "verified", "dry_run": "false"}, 1.0),
        ("gpuwarden_remediation_breaker_open", {"scope": "global"}, 0.0),
    )
    service.storage.set_breaker(
        BreakerRecord(scope="global", state="open", updated_at=NOW, reason="test"),
        expect_state="closed",
    )
    got = samples(await scrape(aiohttp_client, service), "gpuwarden_remediation_breaker")
    assert got == expect(("gpuwarden_remediation_breaker_open", {"scope": "global"}, 1.0))


async def test_pending_notifications_by_scheme_and_status(aiohttp_client, service):
    from gpuwarden.collector.storage.base import NotificationRecord

    ids = []
    for i in range(3):
        incident_id = service.storage.open_incident(
            Incident(
                fingerprint=f"fp{i}",
                rule_id="idle-gpu",
                severity="warning",
                first_seen=NOW,
                last_seen=NOW,
            )
        )
        assert incident_id is not None
        ids.append(incident_id)
    save = service.storage.save_notification
    save(NotificationRecord(ids[0], "pagerduty:oncall", "firing", False, NOW, attempts=2))
    save(NotificationRecord(ids[1], "pagerduty:oncall", "firing", False, NOW, attempts=1))
    save(NotificationRecord(ids[2], "slack:#gpu", "firing", True, NOW, sent_at=NOW))  # delivered
    save(NotificationRecord(ids[2], "alertmanager:main", "lost", False, NOW, attempts=9))
    got = samples(await scrape(aiohttp_client, service), "gpuwarden_notifications_pending")
    assert got == expect(
        ("gpuwarden_notifications_pending", {"scheme": "alertmanager", "status": "lost"}, 1.0),
        ("gpuwarden_notifications_pending", {"scheme": "pagerduty", "status": "firing"}, 2.0),
    )


async def test_the_effective_price_table(aiohttp_client, service):
    text = await scrape(aiohttp_client, service)
    got = samples(text, PRICE_FAMILY)
    assert len(got) == 4 * len(TIERS)  # three built-in models and the default
    assert got[PRICE_FAMILY, frozenset(PRICE_H100_SPOT.items())] == 1.60
    assert got[PRICE_FAMILY, frozenset({**PRICE_H100_SPOT, "gpu_model": "(default)"}.items())] == (
        0.80
    )


async def test_a_configured_price_table_with_a_cluster_override(aiohttp_client, tmp_path):
    path = tmp_path / "collector.yaml"
    path.write_text(
        "prices:\n  currency: EUR\n  models: {H100: {on-demand: 3.7, spot: 1.5}}\n"
        "  default: {on-demand: 1.8}\n  clusters: {onprem: {default: {on-demand: 0.9}}}\n",
        encoding="utf-8",
    )
    prices = load_collector_config(path).prices
    service = fleet()
    service.fleet.accounting = replace(service.fleet.accounting, prices=prices)
    try:
        text = await scrape(aiohttp_client, service)
    finally:
        service.storage.close()
    labels = {"currency": "EUR", "cluster": "", "region": ""}
    assert samples(text, PRICE_FAMILY) == expect(
        *(
            (PRICE_FAMILY, {**labels, "gpu_model": "H100", "tier": tier}, price)
            for tier, price in (("on-demand", 3.7), ("spot", 1.5), ("reserved", 3.7))
        ),
        *(
            (PRICE_FAMILY, {**labels, "gpu_model": "(default)", "tier": tier}, 1.8)
            for tier in TIERS
        ),
        *(
            (
                PRICE_FAMILY,
                {
                    "currency": "EUR",
                    "cluster": "onprem",
                    "region": "",
                    "gpu_model": "(default)",
                    "tier": tier,
                },
                0.9,
            )
            for tier in TIERS
        ),
    )


def test_the_freshness_families_are_documented_with_their_labels():
    docs = (Path(__file__).parent.parent / "docs" / "metrics.md").read_text(encoding="utf-8")
    for family, labels in (
        ("gpuwarden_node_up", "`node`"),
        ("gpuwarden_node_last_seen_age_seconds", "`node`"),
        ("gpuwarden_gpu_last_seen_age_seconds", "`node`, `gpu`"),
    ):
        assert f"| `{family}` | gauge | {labels} |" in docs


def test_the_price_family_is_documented_with_its_labels():
    docs = (Path(__file__).parent.parent / "docs" / "metrics.md").read_text(encoding="utf-8")
    row = f"| `{PRICE_FAMILY}` | gauge | {', '.join(f'`{label}`' for label in PRICE_LABELS)} |"
    assert row in docs
