"""Each budget's month so far: the budget, month-to-date spend and the month-end forecast.

What ``/metrics``, ``/status`` and ``gpuwarden report budgets`` show, computed once here. The
forecast is :func:`~gpuwarden.collector.detect.numerics.month_end.forecast_month_end` on the
month's daily spend (:class:`~.spend.DailySpend`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.collector.budgets.calendar import DAY_SECONDS, month_bounds
from gpuwarden.collector.budgets.config import Budget, Budgets, Scope, Unit
from gpuwarden.collector.budgets.spend import NO_SPEND, DailySpend, SpendByName
from gpuwarden.collector.detect.numerics.month_end import forecast_month_end


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """One budget at ``now``: amounts in its unit (``currency`` for cost budgets, else None)."""

    budget: Budget
    currency: str | None
    month_start: float
    month_end: float
    budget_amount: float
    mtd: float
    forecast: float
    forecast_low: float | None
    forecast_high: float | None
    interval_level: float
    method: str

    @property
    def used_ratio(self) -> float:
        """Month-to-date spend over the budget."""
        return self.mtd / self.budget_amount

    @property
    def over(self) -> bool:
        """Whether the month-end forecast exceeds the budget."""
        return self.forecast > self.budget_amount


def unit_label(budget: Budget, currency: str) -> str:
    """The unit a budget's amounts are in: the currency, or ``GPU-h``."""
    return currency if budget.unit is Unit.COST else "GPU-h"


def budget_statuses(budgets: Budgets, daily: DailySpend, now: float) -> list[BudgetStatus]:
    """The status of every budget at ``now`` (the UTC month holding it)."""
    start, end = month_bounds(now)
    days_in_month = round((end - start) / DAY_SECONDS)
    by_scope: dict[Scope, tuple[list[SpendByName | None], float]] = {}
    for scope in {b.scope for b in budgets.items}:
        by_scope[scope] = daily.days(scope, start, now)
    out = []
    for budget in budgets.items:
        days, today_seconds = by_scope[budget.scope]
        amounts = [
            None if d is None else d.get(budget.name, NO_SPEND).amount(budget.unit) for d in days
        ]
        month = forecast_month_end(
            amounts[:-1], amounts[-1] or 0.0, today_seconds, days_in_month, budgets.interval_level
        )
        out.append(
            BudgetStatus(
                budget=budget,
                currency=budgets.currency if budget.unit is Unit.COST else None,
                month_start=start,
                month_end=end,
                budget_amount=budget.amount,
                mtd=sum(a for a in amounts if a is not None),
                forecast=month.forecast,
                forecast_low=month.low,
                forecast_high=month.high,
                interval_level=month.level,
                method=month.method,
            )
        )
    return out
