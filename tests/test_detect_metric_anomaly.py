"""metric_anomaly: the NAB-scored scorer on store series, table-driven, with gaps and limits."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.metric_anomaly import fold_change
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.rules.model import Selector
from tests.detectors import run_rule
from tests.test_detect_waste import T0, feed, gauge, make_service, rule_for

F, C, U = Verdict.FIRING, Verdict.CLEAR, Verdict.UNKNOWN
METRIC = "hw.gpu.power.usage"
HOURS = 10


def background(minutes: int, seed: int) -> np.ndarray:
    """A noisy daily-like cycle (one period per 90 min) around 300 W."""
    rng = np.random.default_rng(seed)
    t = np.arange(minutes)
    return 300 + 40 * np.sin(2 * np.pi * t / 90) + rng.normal(0, 4, minutes)


def drop(values: np.ndarray, last: int) -> np.ndarray:
    out = values.copy()
    out[-last:] = 30.0  # the GPU fell off the bus or its job died
    return out


def spike(values: np.ndarray, last: int) -> np.ndarray:
    out = values.copy()
    out[-last:] += 400.0
    return out


def gap(values: np.ndarray, last: int) -> np.ndarray:
    out = values.copy()
    out[-last:] = np.nan
    return out


CASES = [
    ("steady", lambda v: v, HOURS, C),
    ("drop in the newest minutes", lambda v: drop(v, 2), HOURS, F),
    ("spike in the newest minutes", lambda v: spike(v, 1), HOURS, F),
    ("an old drop, since recovered", lambda v: np.r_[v[:300], drop(v[300:330], 30), v[330:]],
     HOURS, C),
    ("gap over the newest window", lambda v: gap(v, 5), HOURS, U),
    ("too little history", lambda v: v, 4, U),
]  # fmt: skip


@pytest.mark.parametrize(("name", "shape", "hours", "want"), CASES, ids=[c[0] for c in CASES])
def test_verdicts(tmp_path: Path, name, shape, hours, want):
    end = T0 + HOURS * 3600
    svc = make_service(tmp_path, end, recent_hours=12)
    minutes = hours * 60
    values = shape(background(minutes, seed=3))
    times = end - 60 * np.arange(minutes, 0, -1) + 1  # one point per minute, ending now

    def points(t: float) -> list[NumberPoint]:
        i = round((t - times[0]) / 60)
        v = values[i]
        return (
            []
            if not np.isfinite(v)
            else [gauge(METRIC, "gpu-07", t, float(v), **{"hw.id": "GPU-7"})]
        )

    feed(svc, times, points)
    rule = rule_for("metric_anomaly")
    rule = dataclasses.replace(rule, selector=Selector(metrics=(METRIC,)))
    (finding,) = run_rule(svc, rule, end)
    assert finding.verdict is want, (name, finding.summary, dict(finding.evidence))
    assert finding.evidence["node"] == "gpu-07"
    assert finding.evidence["gpu"] == "GPU-7"
    if want is F:
        score, threshold = finding.evidence["score"], rule.parameters["score_above"]
        assert isinstance(score, float)
        assert isinstance(threshold, float)
        assert score >= threshold
        assert "threshold" in finding.summary
        assert finding.points  # something to plot


def test_selector_and_max_series_bound_the_work(tmp_path: Path, caplog):
    end = T0 + HOURS * 3600
    svc = make_service(tmp_path, end, recent_hours=12)
    minutes = HOURS * 60
    times = end - 60 * np.arange(minutes, 0, -1) + 1
    series = {node: background(minutes, seed=i) for i, node in enumerate(("a1", "a2", "b1"))}

    def points(t: float) -> list[NumberPoint]:
        i = round((t - times[0]) / 60)
        return [gauge(METRIC, node, t, float(v[i]), **{"hw.id": f"GPU-{node}"})
                for node, v in series.items()]  # fmt: skip

    feed(svc, times, points)
    base = dataclasses.replace(rule_for("metric_anomaly"), selector=Selector(metrics=(METRIC,)))
    only_a = dataclasses.replace(base, selector=Selector(metrics=(METRIC,), nodes=("a*",)))
    assert sorted(str(f.evidence["node"]) for f in run_rule(svc, only_a, end)) == [
        "a1",
        "a2",
    ]
    capped = dataclasses.replace(base, parameters={**base.parameters, "max_series": 2})
    assert len(run_rule(svc, capped, end)) == 2
    assert "max_series=2" in caplog.text


def burst(values: np.ndarray, last: int, factor: float) -> np.ndarray:
    out = values.copy()
    out[-last:] *= factor
    return out


FOLD_CASES = [
    # (name, shape, min_fold_change, want): the scorer fires on all three shapes; the fold gate
    # keeps what at least halves or doubles against the hour before
    ("a burst of a fifth, no gate", lambda v: burst(v, 2, 1.25), 1.0, F),
    ("a burst of a fifth, gated", lambda v: burst(v, 2, 1.25), 2.0, C),
    ("a collapse, gated", lambda v: drop(v, 2), 2.0, F),
    ("a surge to 2.5x, gated", lambda v: burst(v, 2, 2.5), 2.0, F),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "shape", "fold", "want"), FOLD_CASES, ids=[c[0] for c in FOLD_CASES]
)
def test_min_fold_change(tmp_path: Path, name, shape, fold, want):
    end = T0 + HOURS * 3600
    svc = make_service(tmp_path, end, recent_hours=12)
    minutes = HOURS * 60
    values = shape(background(minutes, seed=3))
    times = end - 60 * np.arange(minutes, 0, -1) + 1

    def points(t: float) -> list[NumberPoint]:
        return [gauge(METRIC, "gpu-07", t, float(values[round((t - times[0]) / 60)]))]

    feed(svc, times, points)
    rule = rule_for("metric_anomaly", min_fold_change=fold)
    rule = dataclasses.replace(rule, selector=Selector(metrics=(METRIC,)))
    (finding,) = run_rule(svc, rule, end)
    assert finding.verdict is want, (name, finding.summary, dict(finding.evidence))
    if fold > 1.0:
        assert isinstance(finding.evidence["hour_before_median"], float)
        assert 250 < finding.evidence["hour_before_median"] < 350
    if want is F and fold > 1.0:
        assert finding.evidence["fold_change"] >= fold
        assert "the hour before" in finding.summary


@pytest.mark.parametrize(
    ("value", "baseline", "want"),
    [(10.0, 5.0, 2.0), (5.0, 10.0, 2.0), (0.0, 0.0, 1.0), (0.0, 3.0, math.inf),
     (3.0, 0.0, math.inf), (math.nan, 3.0, math.nan), (-1.0, 3.0, math.nan)],
)  # fmt: skip
def test_fold_change(value, baseline, want):
    got = fold_change(value, baseline)
    assert (math.isnan(got) and math.isnan(want)) or got == want
