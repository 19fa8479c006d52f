"""The budgets on the status page: each budget, spent so far, and the month-end forecast.

The same numbers as ``gpuwarden report budgets`` and the ``gpuwarden_budget_*`` families.
Rendered by ``templates/status_budgets.html``, included by ``status.html``.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwarden.collector.budgets.status import BudgetStatus, unit_label


def _amount(value: float | None) -> str:
    return "—" if value is None else f"{value:,.2f}"


def budgets_context(
    statuses: Sequence[BudgetStatus], currency: str, level: float
) -> dict[str, object]:
    """What the budgets section shows (no rows: no budget configured)."""
    return {
        "level": f"{level:.0%}",
        "rows": [
            {
                "budget": s.budget.key,
                "unit": unit_label(s.budget, currency),
                "amount": _amount(s.budget_amount),
                "mtd": _amount(s.mtd),
                "used": f"{s.used_ratio:.0%}",
                "forecast": _amount(s.forecast),
                "interval": (
                    "—"
                    if s.forecast_low is None or s.forecast_high is None
                    else f"{s.forecast_low:,.2f} – {s.forecast_high:,.2f}"
                ),
                "over": s.over,
            }
            for s in statuses
        ],
    }
