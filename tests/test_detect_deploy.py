"""Deploy regression: before/after around a deploy event, through the real store and storage."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.deploy import two_sample_p
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.incidents import IncidentTracker
from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint
from gpuwarden.collector.rules.loader import default_rules_dir
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.storage.records import Event, EventKind, Incident, ModelDeployment
from tests.detectors import run_rule

T0 = 1_767_225_600.0
STEP = 10
N = 2 * 360  # 2 h of 10 s points
DEPLOY = T0 + 3600.0
END = T0 + N * STEP
BOUNDS = tuple(float(b) for b in np.geomspace(0.05, 50.0, 61))


def latency_points(factor: np.ndarray, model: str, seed: int = 5) -> list[HistogramPoint]:
    rng = np.random.default_rng(seed)
    nb = len(BOUNDS) + 1
    cumulative = np.zeros(nb)
    total = 0.0
    out = []
    for i in range(factor.size):
        values = rng.lognormal(0.0, 0.4, 60) * factor[i]
        cumulative += np.bincount(np.searchsorted(BOUNDS, values), minlength=nb)
        total += float(values.sum())
        out.append(
            HistogramPoint(
                resource={"host.name": "gpu-1"},
                metric="gpuwarden.model.request.latency",
                unit="s",
                attributes={"model": model},
                time_unix_nano=int((T0 + (i + 1) * STEP) * 1e9),
                bounds=BOUNDS,
                bucket_counts=tuple(int(c) for c in cumulative),
                sum_value=total,
            )
        )
    return out


def request_points(fail_ratio: np.ndarray, model: str) -> list[NumberPoint]:
    rng = np.random.default_rng(9)
    ok = failed = 0.0
    out = []
    for i in range(fail_ratio.size):
        n = rng.poisson(50)
        bad = rng.binomial(n, fail_ratio[i])
        ok, failed = ok + n - bad, failed + bad
        ns = int((T0 + (i + 1) * STEP) * 1e9)
        for outcome, value in (("success", ok), ("failure", failed)):
            out.append(
                NumberPoint(
                    {"host.name": "gpu-1"}, "gpuwarden.model.requests", "{request}", "sum", True,
                    {"model": model, "outcome": outcome}, ns, value,
                )
            )  # fmt: skip
    return out


@pytest.fixture
def service(tmp_path: Path):
    svc = build_service(
        CollectorConfig(database=tmp_path / "c.db", recent_hours=6), clock=lambda: END + STEP
    )
    after = (T0 + (np.arange(N) + 1) * STEP) > DEPLOY
    for model, size in (("slower", 1.3), ("same", 1.0)):
        factor = np.where(after, size, 1.0)
        assert svc.accept_histograms(latency_points(factor, model), "test") == 0
        svc.storage.record_event(
            Event(time=DEPLOY, kind=EventKind.DEPLOY, subject=model, attributes={"version": "v2"})
        )
    svc.accept(request_points(np.where(after, 0.05, 0.01), "slower"), "test")
    svc.accept(request_points(np.full(N, 0.01), "same"), "test")
    return svc


def rule_with(**params: float | str) -> Rule:
    rules = load_rules([default_rules_dir()], runbooks_dir=None)
    base = rules.get("deploy-regression")
    assert base is not None
    return replace(base, parameters={**base.parameters, **params})


@pytest.mark.parametrize("test", ["mann_whitney", "ks", "welch"])
def test_a_slower_deploy_fires_and_an_unchanged_one_does_not(service, test):
    rule = rule_with(test=test)
    found = {f.evidence["model"]: f for f in run_rule(service, rule, END)}
    assert set(found) == {"slower", "same"}
    slow = found["slower"]
    assert slow.verdict is Verdict.FIRING, slow.summary
    p = slow.evidence["p_value"]
    assert isinstance(p, float)
    assert p < 0.01
    assert slow.evidence["relative_change"] == pytest.approx(0.3, abs=0.12)
    assert slow.evidence["version"] == "v2"
    assert slow.subject.startswith("slower/gpuwarden.model.request.latency/p95@deploy:")
    assert slow.points
    assert found["same"].verdict is Verdict.CLEAR, found["same"].summary


def test_error_ratio_after_a_deploy(service):
    rule = rule_with(statistic="error_ratio", min_relative_change=0.5)
    rule = replace(rule, selector=replace(rule.selector, metrics=("gpuwarden.model.requests",)))
    found = {f.evidence["model"]: f for f in run_rule(service, rule, END)}
    assert found["slower"].verdict is Verdict.FIRING, found["slower"].summary
    assert found["same"].verdict is Verdict.CLEAR, found["same"].summary


def test_direction_decrease_ignores_a_slowdown(service):
    found = run_rule(service, rule_with(direction="decrease"), END)
    assert all(f.verdict is Verdict.CLEAR for f in found)


def test_a_deploy_is_not_judged_before_its_after_window_is_complete(service):
    assert run_rule(service, rule_with(), DEPLOY + 1200) == []


def test_a_deploy_without_data_after_it_is_unknown(tmp_path: Path):
    svc = build_service(
        CollectorConfig(database=tmp_path / "c.db", recent_hours=6), clock=lambda: END
    )
    before_only = latency_points(np.ones(N // 2), "m")  # points stop at the deploy
    svc.accept_histograms(before_only, "test")
    svc.storage.record_event(Event(time=DEPLOY, kind=EventKind.DEPLOY, subject="m"))
    (finding,) = run_rule(svc, rule_with(), END)
    assert finding.verdict is Verdict.UNKNOWN


@pytest.mark.parametrize(
    ("test", "direction", "shift", "small"),
    [
        ("mann_whitney", "increase", 1.0, True),
        ("mann_whitney", "increase", -1.0, False),
        ("mann_whitney", "decrease", -1.0, True),
        ("ks", "increase", 1.0, True),
        ("ks", "increase", -1.0, False),
        ("welch", "both", -1.0, True),
        ("welch", "increase", 0.0, False),
    ],
)
def test_two_sample_p_directions(test, direction, shift, small):
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 1.0, 40)
    y = rng.normal(shift, 1.0, 40)
    p = two_sample_p(x, y, test, direction)
    assert (p < 0.01) is small, p


def rollback(svc, at: float, model: str = "slower") -> None:
    """The on-call rolls ``model`` back to v1 at ``at`` (event and deployment record)."""
    svc.storage.upsert_model(ModelDeployment(name=model, version="v1", replicas=1))
    svc.storage.record_event(
        Event(
            time=at, kind=EventKind.ROLLBACK, subject=model, attributes={"from": "v2", "to": "v1"}
        )
    )


def test_a_deploy_rolled_back_before_it_is_judged_never_fires(service):
    rollback(service, DEPLOY + 1200)  # 20 minutes in: before the after-window completes
    found = {f.evidence["model"]: f for f in run_rule(service, rule_with(), END)}
    slow = found["slower"]
    assert slow.verdict is Verdict.CLEAR, slow.summary
    assert "no longer serving" in slow.summary
    assert slow.evidence["superseded_by"] == "rollback"
    assert found["same"].verdict is Verdict.CLEAR


def test_a_rollback_resolves_the_deploy_regression_incident(service):
    tracker = IncidentTracker(service.storage, clock=lambda: END, resolve_after=3)
    opened = tracker.fold(run_rule(service, rule_with(), END)).opened
    assert [i.rule_id for i in opened] == ["deploy-regression"]
    rollback(service, END + 30)
    resolved: list[Incident] = []
    for k in range(1, 4):
        resolved += tracker.fold(run_rule(service, rule_with(), END + 30 + 30 * k)).resolved
    assert [i.incident_id for i in resolved] == [opened[0].incident_id]
    # and the rolled-back deploy keeps reporting clear while anything could still be open
    later = run_rule(service, rule_with(), END + 1800)
    assert {f.verdict for f in later if f.evidence["model"] == "slower"} == {Verdict.CLEAR}


def test_a_version_no_longer_serving_is_not_judged(service):
    """No rollback event, but the deployment record says v1 now: v2 is not serving."""
    service.storage.upsert_model(ModelDeployment(name="slower", version="v1", replicas=1))
    found = {f.evidence["model"]: f for f in run_rule(service, rule_with(), END)}
    assert found["slower"].verdict is Verdict.CLEAR, found["slower"].summary
    assert found["slower"].evidence["superseded_by"] == "deployment"


def test_a_newer_deploy_ends_the_older_one(service):
    service.storage.record_event(
        Event(time=END - 60, kind=EventKind.DEPLOY, subject="slower", attributes={"to": "v3"})
    )
    found = [f for f in run_rule(service, rule_with(), END) if f.evidence["model"] == "slower"]
    # v2 is clear on each of the rule's metrics; v3 is not judged yet
    assert [f.verdict for f in found] == [Verdict.CLEAR, Verdict.CLEAR]
    assert {f.evidence["version"] for f in found} == {"v2"}
    assert found[0].evidence["superseded_by"] == "deploy"
