"""The demo's budget: a tiny monthly budget on the vision team, which its pretraining job burns.

The vision team's job holds eight on-demand H100s for the whole run: about 32 USD an hour of
wall time against a budget of 50 USD a month, a burn rate in the hundreds. The collector's
``budget-burn-fast`` and ``budget-burn-slow`` rules (their windows compressed like every rule's)
page on it within seconds, through the same incident and notification path as every alert; the
report ends with the budget's month to date and forecast (``report budgets``' numbers).
"""

from __future__ import annotations

import msgspec

from gpuwarden.collector.budgets.config import Budget, Budgets, Scope, Unit
from gpuwarden.collector.budgets.spend import DailySpend
from gpuwarden.collector.budgets.status import budget_statuses, unit_label
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.service import CollectorService

TEAM, MONTHLY_USD = "vision", 50.0


def with_budget(config: CollectorConfig) -> CollectorConfig:
    """The demo collector's config with the vision team's tiny budget."""
    budget = Budget(Scope.TEAM, TEAM, Unit.COST, MONTHLY_USD)
    return msgspec.structs.replace(
        config, budgets=Budgets((budget,), currency=config.prices.currency)
    )


def print_budgets(service: CollectorService, now: float) -> None:
    """The report's budget lines: each budget, spent this month, and the month-end forecast."""
    budgets = service.accounting.budgets
    print("\nbudgets this month (wall-clock accounting; gpuwarden report budgets)")
    for status in budget_statuses(budgets, DailySpend(service.storage), now):
        unit = unit_label(status.budget, budgets.currency)
        print(
            f"  {status.budget.key:<14} budget {status.budget_amount:>8.2f} {unit}  "
            f"spent {status.mtd:>8.2f} ({status.used_ratio:.0%})  "
            f"month-end forecast {status.forecast:>10.2f}"
        )
