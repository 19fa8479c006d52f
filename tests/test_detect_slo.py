"""Multi-window multi-burn-rate SLO alerts: the workbook arithmetic, then through the real store."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.slo import (
    PairVerdict,
    budget_remaining,
    burn_rate,
    judge_pairs,
    share_above,
)
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import ParamValue, Rule
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import ModelDeployment
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.store.window import WindowStore
from tests.detectors import run_rule

T0 = 1_767_225_600.0  # midnight UTC, aligned to every window
STEP = 10
HOUR = 3600.0
RPS = 10.0


# --- the arithmetic (SRE workbook, 99.9 % over 30 days) ------------------------------------------


@pytest.mark.parametrize(
    ("bad", "total", "objective", "want"),
    [
        (144, 10_000, 0.999, 14.4),  # 1.44 % errors burns a 0.1 % budget 14.4x
        (60, 10_000, 0.999, 6.0),
        (10, 10_000, 0.999, 1.0),  # exactly the budget
        (0, 10_000, 0.999, 0.0),
        (0, 0, 0.999, 0.0),  # no traffic burns nothing
        (100, 10_000, 0.99, 1.0),
    ],
)
def test_burn_rate_is_the_error_ratio_over_the_budget(bad, total, objective, want):
    assert burn_rate(bad, total, objective) == pytest.approx(want)


def test_the_workbook_pairs_spend_two_and_five_percent_of_a_30_day_budget():
    period_h = 30 * 24
    assert 14.4 * 1 / period_h == pytest.approx(0.02)
    assert 6 * 6 / period_h == pytest.approx(0.05)
    # and a 14.4x burn empties the budget in 50 hours
    assert budget_remaining(bad=14.4 * 50, total=1000 * 50 / 0.001 / 1000, objective=0.999) < 0


@pytest.mark.parametrize(
    ("long_burn", "short_burn", "want"),
    [
        (20.0, 20.0, Verdict.FIRING),
        (20.0, 1.0, Verdict.CLEAR),  # the burn stopped: reset quickly
        (1.0, 20.0, Verdict.CLEAR),  # a short spike is not significant
        (14.4, 20.0, Verdict.CLEAR),  # "faster than", not "at"
        (None, 20.0, Verdict.UNKNOWN),
        (20.0, None, Verdict.UNKNOWN),
        (None, 1.0, Verdict.CLEAR),  # one known window already rules it out
    ],
)
def test_a_pair_fires_only_when_both_windows_exceed(long_burn, short_burn, want):
    assert PairVerdict(3600, 300, 14.4, long_burn, short_burn).verdict is want


def test_any_firing_pair_fires_and_unknown_beats_clear():
    fire = PairVerdict(3600, 300, 14.4, 20, 20)
    clear = PairVerdict(21600, 1800, 6, 1, 1)
    unknown = PairVerdict(21600, 1800, 6, None, None)
    assert judge_pairs([clear, fire]) is Verdict.FIRING
    assert judge_pairs([clear, unknown]) is Verdict.UNKNOWN
    assert judge_pairs([clear, clear]) is Verdict.CLEAR


def test_share_above_interpolates_inside_the_bucket():
    bounds = (0.1, 0.5, 1.0)
    counts = np.array([10.0, 40.0, 40.0, 10.0])
    assert share_above(0.5, bounds, counts) == 50.0
    assert share_above(0.75, bounds, counts) == pytest.approx(30.0)
    assert share_above(5.0, bounds, counts) == 10.0  # the +Inf bucket is all above


# --- through the store ---------------------------------------------------------------------------


def rule(rule_id: str = "slo-burn-fast", **params: ParamValue) -> Rule:
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    found = rules.get(rule_id)
    assert found is not None
    return dataclasses.replace(found, parameters={**found.parameters, **params})


def make_service(tmp_path: Path, now: float, *, recent_hours: int = 6) -> CollectorService:
    storage = SqliteStorage(tmp_path / "c.db", clock=lambda: now)
    return CollectorService(
        store=WindowStore(step_seconds=STEP, recent_seconds=recent_hours * 3600, clock=lambda: now),
        storage=storage,
        registry=JobRegistry(storage),
        clock=lambda: now,
    )


def feed_requests(
    svc: CollectorService,
    model: str,
    start: float,
    end: float,
    error_ratio: Callable[[float], float | None],
) -> None:
    """Counters per outcome at 10 s; ``error_ratio(t)`` None means no scrape at t (a gap)."""
    totals = {"success": 0.0, "failure": 0.0}
    points: list[NumberPoint] = []
    resource: dict[str, str | int | float | bool] = {"host.name": "srv"}
    for t in np.arange(start, end, STEP):
        e = error_ratio(float(t))
        totals["failure"] += RPS * STEP * (e or 0.0)
        totals["success"] += RPS * STEP * (1 - (e or 0.0))
        if len(points) >= 720:  # in time order, as agents send: nothing is too old on arrival
            assert svc.accept(points, "test") == 0
            points = []
        if e is None:
            continue
        for outcome, value in totals.items():
            points.append(
                NumberPoint(
                    resource,
                    "gpuwarden.model.requests",
                    "{request}",
                    "sum",
                    True,
                    {"model": model, "outcome": outcome},
                    int(t * 1e9),
                    value,
                )
            )
    assert svc.accept(points, "test") == 0


END = T0 + 7 * HOUR


@pytest.mark.parametrize(
    ("name", "error_ratio", "want", "burn_1h"),
    [
        ("steady 2 % errors", lambda t: 0.02, Verdict.FIRING, 20.0),
        ("steady 0.8 %: only the 6h/30m pair", lambda t: 0.008, Verdict.FIRING, 8.0),
        ("steady 0.05 %", lambda t: 0.0005, Verdict.CLEAR, 0.5),
        (
            "5-minute spike: the long window is not significant",
            lambda t: 0.02 if t >= END - 300 else 0.0,
            Verdict.CLEAR,
            20.0 / 12,
        ),
        (
            "burn stopped 10 minutes ago: resets",
            lambda t: 0.02 if END - HOUR <= t < END - 600 else 0.0,
            Verdict.CLEAR,
            20.0 * 50 / 60,
        ),
        (
            "no data for the last 10 minutes",
            lambda t: 0.02 if t < END - 600 else None,
            Verdict.UNKNOWN,
            None,
        ),
    ],
)
def test_burn_verdicts_on_scripted_traffic(tmp_path, name, error_ratio, want, burn_1h):
    svc = make_service(tmp_path, END)
    feed_requests(svc, "llama", T0, END, error_ratio)
    found = run_rule(svc, rule(), END)
    assert [f.subject for f in found] == ["llama"], name
    finding = found[0]
    assert finding.verdict is want, (name, dict(finding.evidence))
    got = finding.evidence["burn_rate_1h"]
    if burn_1h is None:
        assert got is None or finding.evidence["burn_rate_5m"] is None
    else:
        assert got == pytest.approx(burn_1h, rel=0.02), name


def test_evidence_has_burn_rates_per_window_and_budget_left(tmp_path):
    svc = make_service(tmp_path, END)
    feed_requests(svc, "llama", T0, END, lambda t: 0.0005)
    ev = run_rule(svc, rule(), END)[0].evidence
    for window in ("5m", "30m", "1h", "6h"):
        assert ev[f"burn_rate_{window}"] == pytest.approx(0.5, rel=0.02)
    assert ev["budget_remaining_ratio"] == pytest.approx(0.5, rel=0.02)  # half the budget used
    assert ev["objective"] == 0.999


def test_slow_rule_windows_beyond_the_recent_ring_use_the_long_ring(tmp_path):
    now = T0 + 4 * 86400
    svc = make_service(tmp_path, now, recent_hours=1)
    feed_requests(svc, "llama", T0, now, lambda t: 0.004)  # 4x: the 1d/2h at 3x pair fires
    finding = run_rule(svc, rule("slo-burn-slow"), now)[0]
    assert finding.verdict is Verdict.FIRING
    assert finding.evidence["burn_rate_3d"] == pytest.approx(4.0, rel=0.02)


def test_the_deployments_own_objective_wins(tmp_path):
    svc = make_service(tmp_path, END)
    svc.storage.upsert_model(ModelDeployment("llama", "v1", 2, slo_error_ratio=0.05))
    feed_requests(svc, "llama", T0, END, lambda t: 0.02)  # 2 % of a 5 % budget: burn 0.4
    finding = run_rule(svc, rule(), END)[0]
    assert finding.verdict is Verdict.CLEAR
    assert finding.evidence["objective_source"] == "deployment"
    assert finding.evidence["burn_rate_1h"] == pytest.approx(0.4, rel=0.02)


def feed_latency(svc: CollectorService, model: str, start: float, end: float, slow: float) -> None:
    """A latency histogram where ``slow`` of the requests take 0.5-1 s, the rest under 0.25 s."""
    bounds = (0.1, 0.25, 0.5, 1.0, 2.5)
    counts = np.zeros(len(bounds) + 1)
    total = 0.0
    for t in np.arange(start, end, STEP):
        n = RPS * STEP
        counts += np.array([0.0, n * (1 - slow), 0.0, n * slow, 0.0, 0.0])
        total += n * 0.2
        svc.store.ingest_histogram(
            "gpuwarden.model.request.latency",
            {"model": model, "host.name": "srv"},
            time_unix_nano=int(t * 1e9),
            bounds=bounds,
            bucket_counts=counts.tolist(),
            sum_value=total,
            unit="s",
        )


@pytest.mark.parametrize(("slow", "want"), [(0.20, Verdict.FIRING), (0.005, Verdict.CLEAR)])
def test_latency_slo_counts_slow_requests_from_the_buckets(tmp_path, slow, want):
    svc = make_service(tmp_path, END)
    svc.storage.upsert_model(ModelDeployment("llama", "v1", 2, slo_latency_p99_seconds=0.75))
    feed_requests(svc, "llama", T0, END, lambda t: 0.0)
    feed_latency(svc, "llama", END - 6.5 * HOUR, END, slow)
    found = {f.subject: f for f in run_rule(svc, rule(), END)}
    assert found["llama"].verdict is Verdict.CLEAR  # no errors
    latency = found["llama:latency"]
    assert latency.verdict is want
    # half of the 0.5-1 s bucket is above 0.75 s; the budget of a p99 SLO is 1 %
    assert latency.evidence["burn_rate_1h"] == pytest.approx(slow / 2 / 0.01, rel=0.02)


def test_a_model_without_any_data_is_unknown(tmp_path):
    svc = make_service(tmp_path, END)
    svc.storage.upsert_model(ModelDeployment("quiet", "v1", 1))
    found = run_rule(svc, rule(), END)
    assert [(f.subject, f.verdict) for f in found] == [("quiet", Verdict.UNKNOWN)]


def test_points_plot_the_burn_rate_in_short_window_bins(tmp_path):
    svc = make_service(tmp_path, END)
    feed_requests(svc, "llama", T0, END, lambda t: 0.02 if t >= END - 600 else 0.0)
    points = run_rule(svc, rule(), END)[0].points
    assert len(points) == 12  # the 1 h window in 5 min bins
    assert [t for t, _ in points] == [END - 3600 + 300 * k for k in range(12)]
    assert [round(b) for _, b in points] == [0] * 10 + [20, 20]
