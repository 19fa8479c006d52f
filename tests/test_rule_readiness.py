"""Per-rule readiness from the detectors' declared parameters (``detect.readiness``)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuwarden.collector.build import load_configured_rules
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import DETECTORS
from gpuwarden.collector.detect.readiness import (
    Coverage,
    RuleReadiness,
    State,
    lookback_seconds,
    readiness,
)
from gpuwarden.collector.rules.model import RuleProblem

H, D = 3600.0, 86400.0
NOW = 1_767_225_600.0


@pytest.fixture(scope="module")
def rules():
    return {rule.id: rule for rule in load_configured_rules(CollectorConfig()).rules}


@pytest.mark.parametrize(
    ("rule_id", "lookback"),
    [
        ("idle-gpu", 30 * 60),  # window_seconds
        ("gpu-utilization-drop", 2 * H),  # window 1 h + baseline 1 h before it
        ("model-latency-drift", 14 * D),  # history (the window is inside it)
        ("demand-forecast", 14 * D),  # history; the horizon is not data it needs
        ("latency-distribution-drift", 7 * D + H),  # reference before the window
        ("model-traffic-anomaly", 12 * H),  # history; recent_seconds is inside it
        ("forgotten-gpu", 24 * H),
        ("overprovisioned-inference", 24 * H),
    ],
)
def test_lookback_comes_from_the_declared_parameters(rules, rule_id, lookback):
    rule = rules[rule_id]
    assert lookback_seconds(DETECTORS[rule.detector].bind(rule)) == lookback


def test_the_longest_slo_window_counts(rules):
    rule = rules["slo-burn-slow"]
    params = DETECTORS[rule.detector].bind(rule)
    assert lookback_seconds(params) == max(params.long_windows_seconds)


def coverage(held_since: float | None, started_at: float = NOW) -> Coverage:
    return Coverage(held_since, long_seconds=14 * D, recent_seconds=6 * H, started_at=started_at)


@pytest.mark.parametrize(
    ("held_for", "rule_id", "state", "until_after_held"),
    [
        (H, "idle-gpu", State.READY, None),
        (H, "gpu-utilization-drop", State.WARMING_UP, 2 * H),
        (3 * H, "gpu-utilization-drop", State.READY, None),
        (20 * D, "model-latency-drift", State.READY, None),  # capped at the long window
        (14 * D - H, "model-latency-drift", State.WARMING_UP, 14 * D),
        (H, "job-preemption", State.READY, None),  # stored events, not the store
        (H, "prometheus-gpu-failed", State.READY, None),  # pushed
    ],
)
def test_state_against_the_held_data(rules, held_for, rule_id, state, until_after_held):
    held = NOW - held_for
    (got,) = readiness([rules[rule_id]], (), DETECTORS, coverage(held), NOW)
    assert got.state is state
    assert got.until == (None if until_after_held is None else held + until_after_held)


def test_a_reference_kept_in_memory_goes_back_one_recent_window_before_the_start(rules):
    rule = rules["latency-distribution-drift"]
    # the store (a snapshot) holds 20 days, but the tracker was rebuilt at start from 6 h
    (got,) = readiness([rule], (), DETECTORS, coverage(NOW - 20 * D, started_at=NOW - H), NOW)
    assert got.state is State.WARMING_UP
    assert got.until == NOW - H - 6 * H + 7 * D + H


def test_no_data_yet_is_warming_up_with_no_end_known(rules):
    (got,) = readiness([rules["idle-gpu"]], (), DETECTORS, coverage(None), NOW)
    assert got.state is State.WARMING_UP
    assert got.until is None
    assert got.text() == "warming up (no data yet)"


def test_skipped_rules_say_why(rules):
    disabled = dataclasses.replace(rules["idle-gpu"], enabled=False)
    unknown = dataclasses.replace(rules["idle-gpu"], id="x", detector="spike")
    problem = RuleProblem("rules/gpu.yaml", "detector", "unknown detector", 3, "bad-rule")
    got = readiness([disabled, unknown], [problem], DETECTORS, coverage(NOW - H), NOW)
    assert [(g.rule_id, g.state, g.reason) for g in got] == [
        ("idle-gpu", State.SKIPPED, "disabled"),
        ("x", State.SKIPPED, "no such detector here"),
        ("bad-rule", State.SKIPPED, f"did not load: {problem}"),
    ]
    assert got[0].text() == "skipped: disabled"


def test_the_json_form():
    r = RuleReadiness("r", "idle_gpu", State.WARMING_UP, 1800.0, until=NOW)
    assert r.as_json() == {
        "rule": "r",
        "detector": "idle_gpu",
        "state": "warming up",
        "text": "warming up until 2026-01-01 00:00 UTC",
        "lookback_seconds": 1800.0,
        "until": NOW,
    }
