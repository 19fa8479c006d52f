"""Deploy regression and model drift on model latency histograms in a real store.

Latency is simulated per 10 s slot as bucket counts of a log-normal around a median; the
detectors read the cumulative histograms the way scraped vLLM metrics arrive.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import Event, EventKind
from tests.detectors import run_rule

T0 = 1_767_225_600.0
STEP = 10
BOUNDS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
METRIC = "gpuwarden.model.request.latency"


def slot_counts(rng: np.random.Generator, median: float, n: int = 40) -> np.ndarray:
    samples = median * np.exp(rng.normal(0.0, 0.3, n))
    return np.bincount(np.searchsorted(BOUNDS, samples), minlength=len(BOUNDS) + 1).astype(float)


def feed(
    service: CollectorService, medians: list[tuple[float, float]], hours: float, seed: int = 1
) -> None:
    """``medians``: (from trace second, median latency) steps, over ``hours`` of 10 s slots."""
    rng = np.random.default_rng(seed)
    cumulative = np.zeros(len(BOUNDS) + 1)
    total = 0.0
    for k in range(int(hours * 3600 / STEP)):
        t = k * STEP
        median = [m for start, m in medians if start <= t][-1]
        counts = slot_counts(rng, median)
        cumulative += counts
        total += float(counts.sum()) * median
        service.store.ingest_histogram(
            METRIC,
            {"host.name": "serve-1", "model": "llama"},
            time_unix_nano=int((T0 + t) * 1e9),
            bounds=BOUNDS,
            bucket_counts=tuple(cumulative),
            sum_value=total,
        )


@pytest.fixture
def rules():
    return load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())


def service_at(tmp_path: Path, now: float) -> CollectorService:
    return build_service(
        CollectorConfig(database=tmp_path / "c.db", recent_hours=6), clock=lambda: now
    )


@pytest.fixture
def services(tmp_path: Path) -> Iterator[list[CollectorService]]:
    made: list[CollectorService] = []
    yield made
    for service in made:
        service.storage.close()


@pytest.mark.parametrize(
    ("after_median", "expected"),
    [(0.6, Verdict.FIRING), (0.3, Verdict.CLEAR), (0.31, Verdict.CLEAR)],
    ids=["doubled", "unchanged", "within-noise"],
)
def test_deploy_regression_compares_before_and_after(
    tmp_path, rules, services, after_median, expected
):
    deploy = T0 + 3600
    now = deploy + 300 + 1800 + 60
    service = service_at(tmp_path, now)
    services.append(service)
    feed(service, [(0, 0.3), (3600, after_median)], hours=(now - T0) / 3600)
    service.storage.record_event(Event(deploy, EventKind.DEPLOY, "llama", {"to": "v2"}))
    rule = rules.get("deploy-regression")
    assert rule is not None
    findings = [f for f in run_rule(service, rule, now) if METRIC in f.subject]
    assert [f.verdict for f in findings] == [expected]
    evidence = findings[0].evidence
    assert evidence["model"] == "llama"
    if expected is Verdict.FIRING:
        assert float(str(evidence["relative_change"])) > 0.5


def test_deploy_regression_without_data_after_the_deploy_is_unknown(tmp_path, rules, services):
    deploy = T0 + 3600
    now = deploy + 300 + 1800 + 60
    service = service_at(tmp_path, now)
    services.append(service)
    feed(service, [(0, 0.3)], hours=1.0)  # the data stops at the deploy
    service.storage.record_event(Event(deploy, EventKind.DEPLOY, "llama", {"to": "v2"}))
    rule = rules.get("deploy-regression")
    assert rule is not None
    findings = [f for f in run_rule(service, rule, now) if METRIC in f.subject]
    assert [f.verdict for f in findings] == [Verdict.UNKNOWN]


def test_no_deploy_no_finding(tmp_path, rules, services):
    now = T0 + 3 * 3600
    service = service_at(tmp_path, now)
    services.append(service)
    feed(service, [(0, 0.3)], hours=3.0)
    rule = rules.get("deploy-regression")
    assert rule is not None
    assert run_rule(service, rule, now) == []


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ([(0, 0.3), (5 * 3600, 0.6)], Verdict.FIRING),  # a recent step doubles the p95
        ([(0, 0.3)], Verdict.CLEAR),  # nothing changes
    ],
    ids=["step", "steady"],
)
def test_model_drift_flags_a_lasting_shift_against_history(
    tmp_path, rules, services, steps, expected
):
    now = T0 + 5.5 * 3600
    service = service_at(tmp_path, now)
    services.append(service)
    feed(service, steps, hours=5.5)
    rule = rules.get("model-latency-drift")
    assert rule is not None
    findings = [f for f in run_rule(service, rule, now) if METRIC in f.subject]
    assert [f.verdict for f in findings] == [expected]


def test_model_drift_with_a_gap_in_the_current_window_is_unknown(tmp_path, rules, services):
    now = T0 + 5.5 * 3600
    service = service_at(tmp_path, now)
    services.append(service)
    feed(service, [(0, 0.3)], hours=4.0)  # 1.5 h without data at the end
    rule = rules.get("model-latency-drift")
    assert rule is not None
    findings = [f for f in run_rule(service, rule, now) if METRIC in f.subject]
    assert findings
    assert all(f.verdict is Verdict.UNKNOWN for f in findings)
