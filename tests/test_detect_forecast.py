"""Demand forecasts: STL + ARIMA on the long ring, capacity from labels or saturation, reuse."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.detect.forecast import bin_seconds, fit_demand, rebin, saturation_capacity
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import ParamValue, Rule
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import ModelDeployment
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.store.window import WindowStore
from tests.detectors import run_rule

T0 = 1_767_225_600.0  # midnight UTC
DAY = 86400.0
MINUTE = 60.0
DAYS = 3
CAPACITY_PER_REPLICA = 10.0
REPLICAS = 4  # 40 req/s; the default rule fires at 80 %: 32 req/s


def forecast_rule(**params: ParamValue) -> Rule:
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    found = rules.get("demand-forecast")
    assert found is not None
    return dataclasses.replace(found, parameters={**found.parameters, **params})


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_service(tmp_path: Path, clock: Clock, *, capacity_label: bool = True) -> CollectorService:
    storage = SqliteStorage(tmp_path / "c.db", clock=clock)
    labels = {"capacity_rps_per_replica": str(CAPACITY_PER_REPLICA)} if capacity_label else {}
    storage.upsert_model(ModelDeployment("llama", "v1", REPLICAS, labels=labels))
    return CollectorService(
        store=WindowStore(
            step_seconds=60, recent_seconds=3600, long_seconds=5 * 86400, clock=clock
        ),
        storage=storage,
        registry=JobRegistry(storage),
        clock=clock,
    )


def feed(
    svc: CollectorService,
    clock: Clock,
    start: float,
    end: float,
    demand: Callable[[float], float | None],
    *,
    queue: Callable[[float], float] | None = None,
    seed: int = 1,
) -> None:
    """A request counter (and queue gauge) each minute; ``demand(t)`` None is a gap."""
    rng = np.random.default_rng(seed)
    resource: dict[str, str | int | float | bool] = {"host.name": "srv"}
    total = 0.0
    batch: list[NumberPoint] = []
    for t in np.arange(start, end, MINUTE):
        rate = demand(float(t))
        total += max(0.0, (rate or 0.0) + rng.normal(0, 0.5)) * MINUTE
        if rate is not None:
            ns = int(t * 1e9)
            attrs: dict[str, str | int | float | bool] = {"model": "llama", "outcome": "success"}
            batch.append(
                NumberPoint(
                    resource, "gpuwarden.model.requests", "{request}", "sum", True, attrs, ns, total
                )
            )
            if queue is not None:
                batch.append(
                    NumberPoint(
                        resource,
                        "gpuwarden.model.queue.size",
                        "{request}",
                        "gauge",
                        False,
                        {"model": "llama", "state": "waiting"},
                        ns,
                        queue(float(t)),
                    )
                )
        if len(batch) >= 60:
            clock.now = float(t)
            assert svc.accept(batch, "test") == 0
            batch = []
    clock.now = end
    assert svc.accept(batch, "test") == 0


def daily(t: float) -> float:
    return float(np.sin(2 * np.pi * ((t - T0) % DAY) / DAY))


def growing(t: float) -> float:
    """A daily cycle whose level grows 4 req/s a day: 32 req/s is first reached on day 3."""
    return 16.0 + 4.0 * (t - T0) / DAY + 4.0 * daily(t)


def crossing() -> float:
    """When ``growing`` first reaches 32 req/s (by scanning minutes)."""
    times = np.arange(T0, T0 + 5 * DAY, MINUTE)
    values = np.array([growing(float(t)) for t in times])
    return float(times[np.argmax(values >= 32.0)])


def run(svc: CollectorService, now: float, **params: ParamValue) -> Finding:
    found = run_rule(svc, forecast_rule(**params), now)
    assert [f.subject for f in found] == ["llama"]
    return found[0]


# --- pieces --------------------------------------------------------------------------------------


def test_forecast_bins_follow_the_horizon_and_season():
    assert bin_seconds(1800, DAY) == 300  # 6 per horizon, 288 per day
    assert bin_seconds(300, 0) == 60
    assert bin_seconds(3 * 3600, DAY) == 1800


def test_rebin_keeps_missing_data_missing():
    values = np.array([1.0, 3.0, np.nan, np.nan, 5.0, np.nan])
    got = rebin(values, 2)
    assert got[0] == 2.0
    assert np.isnan(got[1])
    assert got[2] == 5.0  # half the bin is enough


def test_saturation_capacity_is_the_rate_while_requests_queue():
    rate = np.array([10.0, 20.0, 30.0, 31.0, 29.0, 30.0, 30.5, 12.0])
    waiting = np.array([0.0, 0.0, 3.0, 5.0, 2.0, 4.0, 1.0, 0.0])
    got = saturation_capacity(rate, waiting)
    assert got is not None
    assert got.rps == 30.0
    assert got.source == "saturation"
    assert saturation_capacity(rate, np.zeros(rate.size)) is None  # never saturated: unknown


def test_a_short_history_cannot_remove_the_season():
    values = np.ones(200)
    assert fit_demand(0, values, 300.0, DAY) is None  # 200 bins < two days of 288


# --- through the store ---------------------------------------------------------------------------


def test_a_growing_load_predicts_the_breach_before_it_happens(tmp_path):
    breach = crossing()
    now = breach - 20 * MINUTE
    clock = Clock(now)
    svc = make_service(tmp_path, clock)
    feed(svc, clock, T0, now, growing)
    assert growing(now) < 32.0  # it has not happened yet
    finding = run(svc, now)
    ev = finding.evidence
    assert finding.verdict is Verdict.FIRING, dict(ev)
    assert ev["capacity_rps"] == 40.0
    assert ev["capacity_source"] == "label"
    ttb = ev["time_to_breach_seconds"]
    assert isinstance(ttb, float)
    assert 0 <= ttb <= breach - now  # the upper bound crosses no later than the truth does


def test_the_same_load_hours_earlier_is_not_a_breach_yet(tmp_path):
    now = crossing() - 3 * 3600
    clock = Clock(now)
    svc = make_service(tmp_path, clock)
    feed(svc, clock, T0, now, growing)
    finding = run(svc, now)
    assert finding.verdict is Verdict.CLEAR, dict(finding.evidence)


def test_a_flat_seasonal_load_below_capacity_does_not_fire(tmp_path):
    now = T0 + DAYS * DAY + 14 * 3600  # near the daily peak
    clock = Clock(now)
    svc = make_service(tmp_path, clock)
    feed(svc, clock, T0, now, lambda t: 22.0 + 6.0 * daily(t))  # peaks at 28 < 32
    finding = run(svc, now)
    assert finding.verdict is Verdict.CLEAR, dict(finding.evidence)
    upper = finding.evidence["forecast_upper_rps_max"]
    assert isinstance(upper, float)
    assert upper < 32.0


def test_the_fit_is_reused_on_later_cycles(tmp_path):
    now = T0 + DAYS * DAY
    clock = Clock(now)
    svc = make_service(tmp_path, clock)
    feed(svc, clock, T0, now, lambda t: 20.0)
    first = run(svc, now)
    feed(svc, clock, now, now + 30 * MINUTE, lambda t: 20.0, seed=2)
    second = run(svc, now + 30 * MINUTE)
    assert (first.evidence["fit_reused"], second.evidence["fit_reused"]) == (False, True)
    assert second.verdict is Verdict.CLEAR
    mean = second.evidence["forecast_mean_rps_at_horizon"]
    assert isinstance(mean, float)
    assert mean == pytest.approx(20.0, abs=1.0)


def test_without_capacity_the_forecast_is_unknown(tmp_path):
    now = T0 + DAYS * DAY
    clock = Clock(now)
    svc = make_service(tmp_path, clock, capacity_label=False)
    feed(svc, clock, T0, now, growing)
    finding = run(svc, now)
    assert finding.verdict is Verdict.UNKNOWN
    assert finding.evidence["forecast_upper_rps_max"] is not None


def test_capacity_from_saturation_when_requests_queue(tmp_path):
    now = T0 + DAYS * DAY
    clock = Clock(now)
    svc = make_service(tmp_path, clock, capacity_label=False)

    def served(t: float) -> float:
        return min(30.0, 24.0 + 8.0 * daily(t))  # saturates at 30 req/s around the peak

    feed(svc, clock, T0, now, served, queue=lambda t: 5.0 if 24.0 + 8.0 * daily(t) > 30 else 0.0)
    finding = run(svc, now)
    assert finding.evidence["capacity_source"] == "saturation"
    capacity = finding.evidence["capacity_rps"]
    assert isinstance(capacity, float)
    assert capacity == pytest.approx(30.0, abs=1.0)


def test_a_gap_in_the_latest_data_is_unknown(tmp_path):
    now = T0 + DAYS * DAY
    clock = Clock(now)
    svc = make_service(tmp_path, clock)
    feed(svc, clock, T0, now, lambda t: None if t > now - 3600 else 20.0)
    finding = run(svc, now)
    assert finding.verdict is Verdict.UNKNOWN
