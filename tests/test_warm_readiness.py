"""Readiness after a warm start from the TSDB: histograms do not come back from it.

The TSDB gives back gauges and counters (``remote_write.warm_start``); model latencies arrive
as histograms, which are never written out, so a rule reading them counts its data from the
snapshot's histograms, or from the start, and its line says why.
"""

from __future__ import annotations

import pytest

from gpuwarden.collector.build import load_configured_rules
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import DETECTORS
from gpuwarden.collector.detect.readiness import HISTOGRAM_METRICS, Coverage, State, readiness
from gpuwarden.collector.remote_write.inverse import NOT_WRITTEN, default_names

H, D = 3600.0, 86400.0
NOW = 1_767_225_600.0


@pytest.fixture(scope="module")
def rules():
    return {rule.id: rule for rule in load_configured_rules(CollectorConfig()).rules}


def after_tsdb_warm_start(histograms_since: float | None) -> Coverage:
    """The store holds 3 h of gauges (read back from the TSDB); the collector started now."""
    return Coverage(
        NOW - 3 * H,
        long_seconds=14 * D,
        recent_seconds=6 * H,
        started_at=NOW,
        histograms_since=histograms_since,
    )


def test_the_histograms_readiness_knows_are_those_the_tsdb_never_holds():
    assert HISTOGRAM_METRICS == NOT_WRITTEN
    assert "gpuwarden.model.request.latency" in HISTOGRAM_METRICS
    written = {origin.metric for origin in default_names().values()}
    assert not HISTOGRAM_METRICS & written


def test_a_rule_on_gauges_is_ready_from_the_tsdb_a_rule_on_histograms_is_not(rules):
    gauges, histograms = rules["gpu-utilization-drop"], rules["latency-distribution-drift"]
    on_gauges, on_histograms = readiness(
        [gauges, histograms], (), DETECTORS, after_tsdb_warm_start(NOW), NOW
    )
    assert on_gauges.state is State.READY
    assert on_gauges.note is None
    assert on_histograms.state is State.WARMING_UP
    assert on_histograms.until == NOW + on_histograms.lookback_seconds
    assert on_histograms.note is not None
    assert "gpuwarden.model.request.latency" in on_histograms.note
    assert "not in the TSDB" in on_histograms.text()
    assert on_histograms.as_json()["note"] == on_histograms.note


def test_histograms_a_snapshot_restored_count_from_where_it_starts(rules):
    rule = rules["model-latency-drift"]  # 14 days of latency history
    held = NOW - 2 * H
    (got,) = readiness([rule], (), DETECTORS, after_tsdb_warm_start(held), NOW)
    assert got.state is State.WARMING_UP
    assert got.until == held + 14 * D
    (without,) = readiness([rule], (), DETECTORS, after_tsdb_warm_start(None), NOW)
    assert without.note is None  # no warm start from the TSDB: all data starts alike
    assert without.until == NOW - 3 * H + 14 * D
