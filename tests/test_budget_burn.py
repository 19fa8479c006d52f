"""Budget burn alerts on a known spend curve (issue 18, Done-when 2): the fast rule fires at the
minute the burn-rate arithmetic says, not before, and before the slow one; both open incidents
through the detection engine (in a forked cycle, as the collector runs it).

The curve (``tests/budget_curves.py``): nlp spends half its even rate (budget / month) for four
days, then 20 times it from Nov 20 10:00; vision (no budget) spends 5x all along. The expected
first firing minute of each pair is solved in closed form here, not by the detector's code: a
window of length W, τ seconds after the surge, holds ``base (W - τ) + surge τ`` of spend, so it
burns faster than k once ``τ > (k - base) W / (surge - base)``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gpuwarden.collector.detect.catalog import DETECTORS
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.rules.model import RuleSet
from gpuwarden.collector.storage.records import IncidentState
from tests.budget_curves import BASE_BURN, SURGE_AT, SURGE_BURN, make_service, surge_rows
from tests.contract_scenarios import shipped_rule

MINUTE = 60.0
LAST_MINUTE = 190  # both rules' pairs are decided by then (slow: minute 111)


def first_minute(long_s: float, short_s: float, rate: float) -> int:
    """The first whole minute after the surge at which both windows burn faster than ``rate``."""

    def crossing(window: float) -> float:
        return (rate - BASE_BURN) * window / (SURGE_BURN - BASE_BURN)

    return math.floor(max(crossing(long_s), crossing(short_s)) / MINUTE) + 1


def expected(rule_id: str) -> int:
    params = DETECTORS["budget_burn"].bind(shipped_rule(rule_id))
    return min(
        first_minute(lw, sw, r)
        for lw, sw, r in zip(
            params.long_windows_seconds,
            params.short_windows_seconds,
            params.burn_rates,
            strict=True,
        )
    )


@pytest.fixture(scope="module")
def surge(tmp_path_factory: pytest.TempPathFactory):
    tmp: Path = tmp_path_factory.mktemp("surge")
    end = SURGE_AT + (LAST_MINUTE + 1) * MINUTE
    service, move = make_service(tmp, end)
    service.storage.write_rollups(surge_rows(end))
    return service, move


def first_firing(service, rule_id: str) -> int | None:
    """Minutes after the surge of the rule's first firing, from 30 minutes before it."""
    rule = shipped_rule(rule_id)
    detector = DETECTORS["budget_burn"]
    for minute in range(-30, LAST_MINUTE + 1):
        found = detector.detect(service.detection_view, rule, SURGE_AT + minute * MINUTE)
        assert [f.subject for f in found] == ["team:nlp"]  # vision has no budget
        if found[0].verdict is Verdict.FIRING:
            return minute
    return None


def test_the_fast_rule_fires_at_the_predicted_minute_and_before_the_slow_one(surge):
    service, _ = surge
    fast, slow = (
        first_firing(service, "budget-burn-fast"),
        first_firing(service, "budget-burn-slow"),
    )
    assert (fast, slow) == (expected("budget-burn-fast"), expected("budget-burn-slow"))
    assert fast is not None
    assert slow is not None
    assert 0 < fast < slow


def test_a_firing_finding_names_the_budget_and_its_burn(surge):
    service, _ = surge
    now = SURGE_AT + 60 * MINUTE
    (finding,) = DETECTORS["budget_burn"].detect(
        service.detection_view, shipped_rule("budget-burn-fast"), now
    )
    ev = finding.evidence
    assert finding.verdict is Verdict.FIRING
    assert finding.facts.team == "nlp"
    assert ev["budget"] == "team:nlp"
    assert ev["unit"] == "USD"
    assert ev["budget_amount"] == 30_000
    assert ev["burn_rate_5m"] == pytest.approx(SURGE_BURN)
    assert ev["burn_rate_1h"] == pytest.approx(SURGE_BURN)  # the last hour is all surge
    # 6h: 5 h at half the even rate and 1 h at 20 times it
    assert ev["burn_rate_6h"] == pytest.approx((5 * BASE_BURN + SURGE_BURN) / 6)


def test_no_accounting_in_a_window_is_unknown_not_clear(tmp_path):
    service, _ = make_service(tmp_path, SURGE_AT)
    (finding,) = DETECTORS["budget_burn"].detect(
        service.detection_view, shipped_rule("budget-burn-fast"), SURGE_AT
    )
    assert finding.verdict is Verdict.UNKNOWN


@pytest.mark.parametrize("fork", [False, True], ids=["in-process", "forked"])
def test_the_engine_opens_both_incidents_through_the_normal_path(tmp_path, fork):
    end = SURGE_AT + 120 * MINUTE  # after both first firings
    service, _ = make_service(tmp_path, end)
    service.storage.write_rollups(surge_rows(end))
    rules = RuleSet((shipped_rule("budget-burn-fast"), shipped_rule("budget-burn-slow")))
    engine = DetectionEngine(
        service.detection_view, rules, storage=service.storage, clock=lambda: end, fork=fork
    )
    try:
        result = engine.run_cycle(end)
    finally:
        engine.stop()
    assert (result.firing, result.failed_rules) == (2, ())
    opened = service.storage.incidents(state=IncidentState.OPEN)
    assert sorted(i.rule_id for i in opened) == ["budget-burn-fast", "budget-burn-slow"]
    assert {i.evidence["budget"] for i in opened} == {"team:nlp"}


def test_windows_stop_at_the_last_period_the_accounting_wrote(tmp_path):
    """The period in progress is not written yet: a 5-minute window read as 5 minutes would
    burn 16x, not 20x (one period of five missing), and a 15x burn would never page."""
    now = SURGE_AT + 60 * MINUTE
    service, _ = make_service(tmp_path, now)
    written = now - MINUTE  # the accounting wrote up to the last complete period
    service.storage.write_rollups(surge_rows(written))
    service.fleet.accounted_until = written
    rule = shipped_rule("budget-burn-fast")
    (finding,) = DETECTORS["budget_burn"].detect(service.detection_view, rule, now)
    assert finding.evidence["burn_rate_5m"] == pytest.approx(SURGE_BURN)
    assert finding.verdict is Verdict.FIRING
    # with less than half of a window written, the window is unknown
    service.fleet.accounted_until = now - 4 * MINUTE
    (finding,) = DETECTORS["budget_burn"].detect(service.detection_view, rule, now)
    assert finding.evidence["burn_rate_5m"] is None
