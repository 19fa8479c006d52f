"""level_shift: screen every series, confirm candidates with statsmodels; table-driven on the
store, with gaps, directions, seasonality, fit reuse and the cap on new fits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.detect import level_shift
from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.detect.level_shift import ShiftScreen, screen_shifts
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.rules.model import ParamValue, Rule, Selector
from tests.detectors import run_rule
from tests.test_detect_waste import T0, feed, gauge, make_service, rule_for

F, C, U = Verdict.FIRING, Verdict.CLEAR, Verdict.UNKNOWN
METRIC = "hw.gpu.utilization"
STEP, SLOTS = 10, 720  # 2 h of 10 s samples: the baseline hour, then the window
SPLIT = SLOTS // 2
END = T0 + 4 * 3600
Shape = Callable[[np.random.Generator], np.ndarray]


def noise(rng: np.random.Generator, level: float = 0.8, sd: float = 0.03) -> np.ndarray:
    """AR(0.6) noise around ``level``: telemetry is autocorrelated."""
    eps = rng.normal(0, sd, SLOTS)
    x = np.empty(SLOTS)
    x[0] = eps[0]
    for t in range(1, SLOTS):
        x[t] = 0.6 * x[t - 1] + eps[t]
    return level + x


def shifted(by: float, at: int = SPLIT + 120, level: float = 0.8) -> Shape:
    def make(rng: np.random.Generator) -> np.ndarray:
        x = noise(rng, level)
        x[at:] += by
        return x

    return make


def with_nan(make: Shape, where: slice | np.ndarray) -> Shape:
    def out(rng: np.random.Generator) -> np.ndarray:
        x = make(rng)
        x[where] = np.nan
        return x

    return out


def dip(rng: np.random.Generator) -> np.ndarray:
    x = noise(rng)
    x[SPLIT + 100 : SPLIT + 118] -= 0.4  # three minutes, then back
    return x


def fell_then_rose(rng: np.random.Generator) -> np.ndarray:
    """Down for most of the window, then above the baseline for the last ten minutes: the level
    now is a rise, though the window's mean residual is negative."""
    x = noise(rng, level=0.6)
    x[SPLIT : SLOTS - 60] -= 0.3
    x[SLOTS - 60 :] += 0.25
    return x


def seasonal(by: float) -> Shape:
    def make(rng: np.random.Generator) -> np.ndarray:
        t = np.arange(SLOTS)
        x = noise(rng, level=0.6) + 0.2 * np.sin(2 * np.pi * t / 120)  # a 20 min cycle
        x[SPLIT + 120 :] += by
        return x

    return make


CASES: list[tuple[str, Shape, dict[str, ParamValue], Verdict]] = [
    ("steady", noise, {}, C),
    ("drop of 0.4", shifted(-0.4), {}, F),
    ("drop of 0.4, every 7th sample missing", with_nan(shifted(-0.4), np.s_[::7]), {}, F),
    ("rise of 0.2, direction decrease", shifted(0.2, level=0.5), {}, C),
    ("rise of 0.2, direction both", shifted(0.2, level=0.5), {"direction": "both"}, F),
    ("fell, then rose above the baseline, direction decrease", fell_then_rose, {}, C),
    ("drop of 0.08: significant, under min_change", shifted(-0.08), {}, C),
    ("drop of 0.08, min_change 0", shifted(-0.08), {"min_change": 0.0}, F),
    ("a 3-minute dip, recovered", dip, {}, C),
    ("fall to idle: the idle rules' finding", shifted(-0.8), {}, C),
    ("fall to idle, ignore_below off", shifted(-0.8), {"ignore_below": -1e12}, F),
    ("no data in the last 10 minutes", with_nan(shifted(-0.4), np.s_[-60:]), {}, U),
    ("baseline mostly missing", with_nan(noise, np.s_[: SPLIT - 100]), {}, U),
    ("seasonal, no shift, season given", seasonal(0.0), {"season_seconds": 1200.0}, C),
    ("seasonal, drop of 0.3, season given", seasonal(-0.3), {"season_seconds": 1200.0}, F),
]  # fmt: skip


def series_points(values: dict[str, np.ndarray]) -> Callable[[float], list[NumberPoint]]:
    start = END - STEP * SLOTS

    def points(t: float) -> list[NumberPoint]:
        i = round((t - start) / STEP)
        return [
            gauge(METRIC, node, t, float(v[i]), **{"hw.id": f"GPU-{node}"})
            for node, v in values.items()
            if np.isfinite(v[i])
        ]

    return points


def run(tmp_path: Path, values: dict[str, np.ndarray], rule: Rule, times: int = 1) -> list[Finding]:
    svc = make_service(tmp_path, END)
    feed(svc, END - STEP * np.arange(SLOTS, 0, -1) + 1, series_points(values))
    out: list[Finding] = []
    for _ in range(times):
        out = run_rule(svc, rule, END)
    return out


def default_rule(**parameters: ParamValue) -> Rule:
    rule = rule_for("level_shift", **parameters)
    return dataclasses.replace(rule, selector=Selector(metrics=(METRIC,)))


@pytest.mark.parametrize(("name", "make", "params", "want"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_verdicts(tmp_path: Path, name, make, params, want, seed):
    values = np.clip(make(np.random.default_rng(seed)), 0.0, 1.0)
    (finding,) = run(tmp_path, {"gpu-07": values}, default_rule(**params))
    ev = dict(finding.evidence)
    assert finding.verdict is want, (name, finding.summary, ev)
    assert ev["node"] == "gpu-07"
    assert ev["gpu"] == "GPU-gpu-07"
    assert ev["metric"] == METRIC
    if want is F:
        assert isinstance(ev["p_value"], float)
        assert 0 < ev["p_value"] < 0.01
        assert isinstance(ev["score"], float)
        assert ev["score"] > 1.0
        assert "over the baseline" in finding.summary
        assert finding.points  # baseline and window to plot
    else:
        assert finding.points == ()  # only a firing finding's points are kept with an incident
    if want is U:
        assert "too little data" in finding.summary


def test_a_kept_fit_is_reused_and_gives_the_same_verdict(tmp_path: Path):
    rng = np.random.default_rng(3)
    values = {"a": shifted(-0.4)(rng), "b": noise(rng)}
    svc = make_service(tmp_path, END)
    feed(svc, END - STEP * np.arange(SLOTS, 0, -1) + 1, series_points(values))
    rule = default_rule()
    first = {str(f.evidence["node"]): f for f in run_rule(svc, rule, END)}
    again = {str(f.evidence["node"]): f for f in run_rule(svc, rule, END)}
    assert first["a"].verdict is again["a"].verdict is F
    assert first["a"].evidence["reused_fit"] is False
    assert again["a"].evidence["reused_fit"] is True
    assert again["a"].evidence["score"] == pytest.approx(first["a"].evidence["score"], rel=1e-6)
    assert first["b"].verdict is again["b"].verdict is C
    assert first["b"].evidence["candidate"] is False


def test_new_fits_are_capped_per_cycle_strongest_first(tmp_path: Path):
    rng = np.random.default_rng(4)
    values = {"big": shifted(-0.6)(rng), "small": shifted(-0.3)(rng)}
    svc = make_service(tmp_path, END)
    feed(svc, END - STEP * np.arange(SLOTS, 0, -1) + 1, series_points(values))
    rule = default_rule(max_fits=1)
    first = {str(f.evidence["node"]): f for f in run_rule(svc, rule, END)}
    assert first["big"].verdict is F
    assert first["small"].verdict is U
    assert "max_fits=1" in first["small"].summary
    # The next cycle reuses the kept fit and fits the one that waited.
    second = {str(f.evidence["node"]): f for f in run_rule(svc, rule, END)}
    assert second["big"].verdict is second["small"].verdict is F


def test_selector_picks_the_series(tmp_path: Path):
    rng = np.random.default_rng(5)
    values = {"a1": shifted(-0.4)(rng), "a2": noise(rng), "b1": shifted(-0.4)(rng)}
    rule = dataclasses.replace(default_rule(), selector=Selector(metrics=(METRIC,), nodes=("a*",)))
    found = {str(f.evidence["node"]): f.verdict for f in run(tmp_path, values, rule)}
    assert found == {"a1": F, "a2": C}


def test_screen_blocks_agree_with_one_row_at_a_time():
    rng = np.random.default_rng(6)
    rows = level_shift.BLOCK_ROWS + 3
    data = rng.normal(0.5, 0.05, (rows, SLOTS))
    data[::50, SPLIT + 60 :] -= 0.4
    data[rng.random(data.shape) < 0.01] = np.nan
    params = ShiftScreen()
    whole = screen_shifts(data[:, :SPLIT], data[:, SPLIT:], params)
    assert whole.candidate[::50].all()
    assert whole.candidate.sum() < 2 * len(data[::50])
    for i in (0, 1, level_shift.BLOCK_ROWS - 1, level_shift.BLOCK_ROWS, rows - 1):
        one = screen_shifts(data[i : i + 1, :SPLIT], data[i : i + 1, SPLIT:], params)
        assert one.candidate[0] == whole.candidate[i]
        np.testing.assert_allclose(one.shift_z[0], whole.shift_z[i])
    empty = screen_shifts(np.zeros((0, SPLIT)), np.zeros((0, SPLIT)), params)
    assert empty.candidate.shape == (0,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"hold_slots": 0}, "must be > 0"),
        ({"min_change": -1.0}, "min_change"),
        ({"direction": "up"}, "direction"),
    ],
)
def test_screen_parameters_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShiftScreen(**kwargs)


def test_refits_over_the_budget_reuse_their_fit_and_spread_over_cycles(tmp_path: Path):
    rng = np.random.default_rng(7)
    values = {f"g{i}": shifted(-0.5)(rng) for i in range(3)}
    svc = make_service(tmp_path, END)
    feed(svc, END - STEP * np.arange(SLOTS, 0, -1) + 1, series_points(values))
    rule = default_rule(max_fits=1)
    fitted, verdicts = [], []
    for _ in range(level_shift.REFIT_EVERY + 8):
        before = svc.detection_view.cache(level_shift.new_fit_cache).fitted
        verdicts.append([f.verdict for f in run_rule(svc, rule, END)])
        fitted.append(svc.detection_view.cache(level_shift.new_fit_cache).fitted - before)
    assert max(fitted) == 1  # never more fits than the budget in one cycle
    assert verdicts[0].count(U) == 2  # the first cycle fits one new series, two wait
    assert all(v == [F, F, F] for v in verdicts[2:])  # once fitted, never UNKNOWN again
    assert sum(fitted) == 3 + 3  # each series fitted, then refitted once its fit was due
