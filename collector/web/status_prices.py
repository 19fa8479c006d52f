"""The effective price table on the status page: what every GPU-hour costs, in which currency.

The same table ``report costs --explain`` prints and ``/metrics`` exports as
``gpuwarden_price_per_gpu_hour``: the config's ``prices:`` section (or the built-in table), one
row per scope (the fleet, then each cluster's and each region's overrides) and GPU model, one
column per tier.
Rendered by ``templates/status_prices.html``, included by ``status.html``.
"""

from __future__ import annotations

from gpuwarden.collector.accounting.prices import TIERS, PriceTable
from gpuwarden.collector.accounting.report import PRICE_MATCHING, price_scope


def prices_context(table: PriceTable) -> dict[str, object]:
    """What the prices section shows: currency, source, how models match, and the rows."""
    cells: dict[tuple[str, str], dict[str, float]] = {}
    for row in table.rows():
        scope = price_scope(row)
        cells.setdefault((scope, row.gpu_model), {})[row.tier] = row.price_per_hour
    return {
        "currency": table.currency,
        "source": table.source,
        "matching": PRICE_MATCHING,
        "tiers": TIERS,
        "rows": [
            {"scope": scope, "model": model, "prices": [f"{tiers[t]:,.2f}" for t in TIERS]}
            for (scope, model), tiers in cells.items()
        ],
    }
