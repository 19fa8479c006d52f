"""Budgets: the ``budgets:`` config section, UTC months, month-to-date spend equal to
``report costs``, and the month-end forecast (its interval's coverage, and on a known curve its
interval holding the true month end) on ``/metrics``, ``/status`` and ``report budgets``."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import pytest

from gpuwarden.cli import main
from gpuwarden.collector.accounting.report import report_costs
from gpuwarden.collector.budgets.calendar import month_bounds
from gpuwarden.collector.budgets.config import Budget, Budgets, Scope, Unit
from gpuwarden.collector.budgets.spend import DailySpend
from gpuwarden.collector.budgets.status import budget_statuses
from gpuwarden.collector.config import ConfigError, load_collector_config
from gpuwarden.collector.detect.numerics.month_end import LINEAR, RUN_RATE, forecast_month_end
from gpuwarden.collector.web.exposition import FleetMetrics
from gpuwarden.collector.web.status_page import status_context
from tests.budget_curves import DAY, MONTH_START, make_service, minute_rows

# --- config ---------------------------------------------------------------------------------


def load(tmp_path, text: str):
    path = tmp_path / "collector.yaml"
    path.write_text(text)
    return load_collector_config(path)


def test_budgets_load_frozen_and_typed_with_the_prices_currency(tmp_path):
    config = load(
        tmp_path,
        "prices: {currency: EUR, models: {H100: {on-demand: 3.0}}, default: {on-demand: 1.0}}\n"
        "budgets:\n"
        "  interval_level: 0.9\n"
        "  teams: {nlp: {cost: 20000}, vision: {gpu_hours: 5000}}\n"
        "  projects: {llama-ft: {cost: 4000}}\n",
    )
    budgets = config.budgets
    assert budgets.currency == "EUR"
    assert budgets.interval_level == 0.9
    assert budgets.items == (
        Budget(Scope.TEAM, "nlp", Unit.COST, 20000.0),
        Budget(Scope.TEAM, "vision", Unit.GPU_HOURS, 5000.0),
        Budget(Scope.PROJECT, "llama-ft", Unit.COST, 4000.0),
    )
    assert budgets.get("project:llama-ft") is budgets.items[2]
    with pytest.raises(AttributeError):
        budgets.items[0].amount = 1.0


def test_no_budgets_section_means_no_budgets(tmp_path):
    assert load(tmp_path, "step_seconds: 10\n").budgets.items == ()


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("teams: {nlp: {cost: 1, gpu_hours: 2}}", "budgets.teams.nlp: name exactly one of cost"),
        ("teams: {nlp: {}}", "budgets.teams.nlp: name exactly one of cost"),
        ("teams: {nlp: {cost: -5}}", "budgets.teams.nlp.cost"),
        ("teams: {nlp: {dollars: 5}}", "budgets.teams.nlp: unknown key 'dollars'"),
        ("interval_level: 1.5", "budgets.interval_level"),
        ("groups: {nlp: {cost: 5}}", "budgets: unknown key 'groups'"),
        ("projects: {'': {cost: 5}}", "budgets.projects"),
    ],
)
def test_each_mistake_is_one_line_naming_the_file_and_key(tmp_path, section, message):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"budgets: {{{section}}}\n")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(str(tmp_path / "collector.yaml"))
    assert message in text


# --- calendar -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("when", "start", "end"),
    [
        (datetime(2026, 12, 31, 23, 59, tzinfo=UTC), "2026-12-01", "2027-01-01"),
        (datetime(2028, 2, 29, 12, tzinfo=UTC), "2028-02-01", "2028-03-01"),
        (datetime(2026, 11, 1, 0, 0, tzinfo=UTC), "2026-11-01", "2026-12-01"),
    ],
)
def test_months_are_utc_calendar_months(when: datetime, start: str, end: str):
    def utc(day: str) -> float:
        return datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp()

    assert month_bounds(when.timestamp()) == (utc(start), utc(end))


# --- the forecast -------------------------------------------------------------------------


def test_the_80_percent_interval_holds_the_month_end_about_80_percent_of_the_time():
    """Calibration: 400 months of a noisy linear daily spend, forecast after 20 of 30 days."""
    rng = np.random.default_rng(7)
    inside = []
    for _ in range(400):
        level, slope = rng.uniform(200, 2000), rng.uniform(-10, 30)
        noise = rng.uniform(0.02, 0.2) * level
        days = level + slope * np.arange(30) + rng.normal(0, noise, 30)
        today = days[20] * 0.25  # six hours into day 21, spending evenly within the day
        month = forecast_month_end(days[:20].tolist(), float(today), 6 * 3600, 30, 0.8)
        assert month.method == LINEAR
        assert month.low is not None
        assert month.high is not None
        inside.append(month.low <= days.sum() <= month.high)
    assert 0.74 <= np.mean(inside) <= 0.86


def test_too_few_days_give_the_run_rate_and_no_interval():
    month = forecast_month_end([100.0, 120.0], 30.0, 6 * 3600, 30, 0.8)
    assert month.method == RUN_RATE
    assert (month.low, month.high) == (None, None)
    assert month.forecast == pytest.approx(250.0 / 2.25 * 30)


# --- a known curve: the collector's surfaces ------------------------------------------------

NOW = MONTH_START + 20 * DAY + 6 * 3600  # Nov 21, 06:00


def daily_nlp(day: int) -> float:
    """nlp's known daily spend: growing 12 a day around 600, with a fixed noise draw."""
    return 600.0 + 12.0 * day + float(np.random.default_rng(day).normal(0.0, 40.0))


def _flat(rate: float) -> Callable[[float], float]:
    return lambda _t: rate


@pytest.fixture
def curve(tmp_path):
    """The whole month's rows are stored; everything reads only what is before NOW."""
    service, _ = make_service(tmp_path, NOW)
    rows = []
    for day in range(30):
        start = MONTH_START + day * DAY
        rate = daily_nlp(day) / DAY
        rows += minute_rows("nlp", start, start + DAY, _flat(rate), period_seconds=3600)
        rows += minute_rows("vision", start, start + DAY, lambda _t: 0.01, period_seconds=3600)
    service.storage.write_rollups(rows)
    truth = sum(daily_nlp(day) for day in range(30))
    return service, truth


def test_the_month_end_interval_holds_the_truth_and_mtd_equals_report_costs(curve):
    service, truth = curve
    (status,) = budget_statuses(service.accounting.budgets, DailySpend(service.storage), NOW)
    assert status.forecast_low is not None
    assert status.forecast_high is not None
    assert status.forecast_low <= truth <= status.forecast_high
    assert status.forecast_low < status.forecast < status.forecast_high
    out = io.StringIO()
    report_costs(
        service.storage, since_seconds=NOW - MONTH_START, until=NOW, by="team", fmt="json", out=out
    )
    groups = {g["group"]: g for g in json.loads(out.getvalue())["groups"]}
    assert status.mtd == pytest.approx(groups["nlp"]["cost"], abs=1e-6)


def test_metrics_and_status_show_the_same_budget_numbers(curve):
    service, _ = curve
    (status,) = budget_statuses(service.accounting.budgets, DailySpend(service.storage), NOW)
    families = {f.name: f for f in FleetMetrics(service, clock=lambda: NOW).collect()}
    want = {
        "gpuwarden_budget_amount": status.budget_amount,
        "gpuwarden_budget_month_to_date": status.mtd,
        "gpuwarden_budget_forecast": status.forecast,
        "gpuwarden_budget_forecast_low": status.forecast_low,
        "gpuwarden_budget_forecast_high": status.forecast_high,
    }
    for name, value in want.items():
        (sample,) = families[name].samples
        assert sample.labels == {
            "budget": "team:nlp",
            "scope": "team",
            "name": "nlp",
            "unit": "USD",
        }
        assert sample.value == pytest.approx(value)
    assert families["gpuwarden_budget_forecast_interval_level"].samples[0].value == 0.8
    budgets = status_context(service, NOW)["budgets"]
    assert isinstance(budgets, dict)
    (row,) = budgets["rows"]
    assert (row["budget"], row["mtd"]) == ("team:nlp", f"{status.mtd:,.2f}")


def test_report_budgets_prints_the_same_numbers(curve, tmp_path, capsys):
    service, truth = curve
    config = tmp_path / "collector.yaml"
    config.write_text("budgets: {teams: {nlp: {cost: 30000}}}\n")
    db = str(tmp_path / "c.db")
    args = ["report", "budgets", "--db", db, "--config", str(config), "--at", str(NOW)]
    assert main([*args, "--format", "json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)["budgets"]
    (status,) = budget_statuses(service.accounting.budgets, DailySpend(service.storage), NOW)
    assert record["month_to_date"] == pytest.approx(status.mtd)
    assert record["forecast_low"] <= truth <= record["forecast_high"]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[1].split()[:2] == ["team:nlp", "USD"]


def test_report_budgets_without_a_budgets_section_says_so(tmp_path, capsys):
    _service, _ = make_service(tmp_path, NOW, Budgets())
    config = tmp_path / "collector.yaml"
    config.write_text("step_seconds: 10\n")
    code = main(["report", "budgets", "--db", str(tmp_path / "c.db"), "--config", str(config)])
    assert code == 1
    assert "no budgets: section" in capsys.readouterr().err


def test_days_without_any_accounting_are_unknown_not_zero_spend():
    """A collector installed on the 21st: the 20 days before it are left out of the fit."""
    month = forecast_month_end([None] * 20, 50.0, 12 * 3600, 30, 0.8)
    assert month.method == RUN_RATE
    assert month.forecast == pytest.approx(50.0 + 100.0 * 9.5)  # 100 a day over 9.5 days left
    steady = [None] * 10 + [100.0, 104.0, 97.0, 101.0, 98.0, 103.0, 99.0, 100.0, 102.0, 96.0]
    month = forecast_month_end(steady, 50.0, 12 * 3600, 30, 0.8)
    assert month.method == LINEAR
    assert month.low is not None
    assert month.high is not None
    assert month.low < sum(v for v in steady if v) + 50.0 + 100.0 * 9.5 < month.high


def test_a_project_budget_spends_what_the_jobs_labelled_with_it_spend(tmp_path):
    budget = Budget(Scope.PROJECT, "llama-ft", Unit.GPU_HOURS, 100.0)
    service, _ = make_service(tmp_path, NOW, Budgets((budget,)))
    day = MONTH_START + 3 * DAY
    rows = minute_rows("nlp", day, day + 3600, _flat(0.001), project="llama-ft")
    rows += minute_rows("vision", day, day + 7200, _flat(0.001), gpu="GPU-b")
    rows += minute_rows("nlp", day, day + 1800, _flat(0.001), gpu="GPU-c")  # no project
    service.storage.write_rollups(rows)
    (status,) = budget_statuses(service.accounting.budgets, DailySpend(service.storage), NOW)
    assert status.mtd == pytest.approx(1.0)  # one GPU for one hour
    assert status.currency is None  # a GPU-hours budget


def test_the_status_page_section_renders_the_budget_row(curve):
    from gpuwarden.collector.web.status_page import environment

    service, _ = curve
    context = status_context(service, NOW)
    html = environment().get_template("status_budgets.html").render(budgets=context["budgets"])
    assert '<section id="budgets">' in html
    assert '<td>team:nlp</td><td>USD</td><td class="num">30,000.00</td>' in html
