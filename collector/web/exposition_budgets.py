"""Budget families for ``/metrics``: each budget, its month-to-date spend and month-end forecast.

One series per configured budget, labelled ``budget`` (``team:nlp``), ``scope`` (team or
project), ``name`` and ``unit`` (the prices' currency, or ``GPU-h``). The forecast interval's
bounds are absent while the month has too few complete days for one (unknown, never 0);
``gpuwarden_budget_forecast_interval_level`` says which interval they are.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from gpuwarden.collector.budgets.status import BudgetStatus, unit_label

LABELS = ("budget", "scope", "name", "unit")
_FAMILIES = (  # BudgetStatus field, family, what it is
    ("budget_amount", "gpuwarden_budget_amount", "The budget of the calendar month (UTC)."),
    ("mtd", "gpuwarden_budget_month_to_date", "Spend this calendar month so far."),
    ("forecast", "gpuwarden_budget_forecast", "Forecast spend at the month's end."),
    (
        "forecast_low",
        "gpuwarden_budget_forecast_low",
        "Lower bound of the month-end forecast's interval (absent with too few complete days).",
    ),
    (
        "forecast_high",
        "gpuwarden_budget_forecast_high",
        "Upper bound of the month-end forecast's interval (absent with too few complete days).",
    ),
)


def budget_families(statuses: Sequence[BudgetStatus], currency: str, level: float) -> list[Metric]:
    """The ``gpuwarden_budget_*`` families of ``statuses``."""
    families = [
        (
            attr,
            GaugeMetricFamily(name, f"{what} By budget; unit: currency or GPU-h.", labels=LABELS),
        )
        for attr, name, what in _FAMILIES
    ]
    for status in statuses:
        budget = status.budget
        labels = [budget.key, budget.scope.value, budget.name, unit_label(budget, currency)]
        for attr, family in families:
            value = getattr(status, attr)
            if value is not None:
                family.add_metric(labels, float(value))
    level_family = GaugeMetricFamily(
        "gpuwarden_budget_forecast_interval_level",
        "Level of the month-end forecast's interval (budgets.interval_level).",
        value=level,
    )
    return [*(family for _, family in families), level_family]
