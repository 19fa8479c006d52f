"""``gpuwarden report budgets``: each budget, month-to-date spend and the month-end forecast.

Reads the budgets from the collector's config (``--config``, its ``budgets:`` and ``prices:``)
and the spend from its database (``--db``, read only): the same numbers as ``/metrics``
(``gpuwarden_budget_*``) and ``/status``. ``--at`` evaluates another moment (Unix seconds or a
duration ago), e.g. the end of last month.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gpuwarden.collector.budgets.config import Budgets
from gpuwarden.collector.budgets.spend import DailySpend, RollupReader

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    # numpy and statsmodels (the forecast) load only when a report runs: the CLI's parser is
    # built by an agent-only install too (tests/test_agent_install_alone.py)
    from gpuwarden.collector.budgets.status import BudgetStatus
    from gpuwarden.collector.storage.base import Storage
    from gpuwarden.collector.storage.records import RollupDimension, RollupTotal

FORMATS = ("table", "json")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def status_record(status: BudgetStatus, currency: str) -> dict[str, object]:
    """One budget's status as a JSON-ready dict (floats rounded to 6 decimals)."""
    from gpuwarden.collector.budgets.status import unit_label

    def r(value: float | None) -> float | None:
        return None if value is None else round(value, 6)

    budget = status.budget
    return {
        "budget": budget.key,
        "scope": budget.scope.value,
        "name": budget.name,
        "unit": unit_label(budget, currency),
        "month_start": status.month_start,
        "month_end": status.month_end,
        "budget_amount": r(status.budget_amount),
        "month_to_date": r(status.mtd),
        "used_ratio": r(status.used_ratio),
        "forecast": r(status.forecast),
        "forecast_low": r(status.forecast_low),
        "forecast_high": r(status.forecast_high),
        "interval_level": status.interval_level,
        "method": status.method,
        "over_budget": status.over,
    }


def _table(statuses: Sequence[BudgetStatus], budgets: Budgets, out: TextIO) -> None:
    from gpuwarden.collector.budgets.status import unit_label

    level = f"{budgets.interval_level:.0%}"
    rows = [
        ["budget", "unit", "budget", "spent", "used", "forecast", f"low {level}", f"high {level}"]
    ]
    rows.extend(
        [
            s.budget.key,
            unit_label(s.budget, budgets.currency),
            _num(s.budget_amount),
            _num(s.mtd),
            f"{s.used_ratio:.0%}",
            _num(s.forecast) + (" !" if s.over else ""),
            _num(s.forecast_low),
            _num(s.forecast_high),
        ]
        for s in statuses
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.write("  ".join(cells).rstrip() + "\n")
    if any(s.over for s in statuses):
        out.write("! the month-end forecast exceeds the budget\n")
    if any(s.forecast_low is None for s in statuses):
        out.write("- no interval until the month has 3 complete days (forecast: the run rate)\n")


def report_budgets(
    reader: RollupReader, budgets: Budgets, *, now: float, fmt: str, out: TextIO
) -> int:
    """Print every budget's status at ``now``; return 0 (1 when no budget is configured)."""
    from gpuwarden.collector.budgets.status import budget_statuses

    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    statuses = budget_statuses(budgets, DailySpend(reader), now)
    if fmt == "json":
        doc = {
            "at": now,
            "currency": budgets.currency,
            "interval_level": budgets.interval_level,
            "budgets": [status_record(s, budgets.currency) for s in statuses],
        }
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        _table(statuses, budgets, out)
    return 0


@dataclass(frozen=True, slots=True)
class ClusterRollups:
    """A storage's rollups of one cluster (the config's), as spend reads them."""

    storage: Storage
    cluster: str

    def rollups(
        self, *, since: float, until: float, by: Sequence[RollupDimension] = ()
    ) -> list[RollupTotal]:
        """The cluster's accounting totals over ``[since, until)`` grouped by ``by``."""
        return self.storage.rollups(since=since, until=until, by=by, cluster=self.cluster)


def add_budgets_parser(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``report budgets`` to ``gpuwarden report``'s kinds."""
    cmd = kinds.add_parser(
        "budgets",
        help="each team's and project's monthly budget, spend so far and month-end forecast",
        description="Budgets from the collector's config, spend from its database.",
    )
    cmd.add_argument("--db", required=True, help="the SQLite file or a postgresql:// URL")
    cmd.add_argument(
        "--config", type=Path, required=True, help="the collector's config (budgets:, prices:)"
    )
    cmd.add_argument("--at", default="now", help="when: now, Unix seconds, or 2h (ago)")
    cmd.add_argument("--format", choices=FORMATS, default="table", dest="fmt")


def run_budgets(
    args: argparse.Namespace,
    *,
    out: TextIO,
    open_db: Callable[[str], AbstractContextManager[Storage]],
    now: float,
) -> int:
    """Run ``gpuwarden report budgets`` from parsed arguments; return the exit code."""
    from gpuwarden.collector.accounting.report import parse_time
    from gpuwarden.collector.config import ConfigError, load_collector_config
    from gpuwarden.collector.storage.base import StorageError

    try:
        config = load_collector_config(args.config)
        at = parse_time(args.at, now)
    except (ConfigError, ValueError) as exc:
        print(f"gpuwarden report: {exc}", file=sys.stderr)
        return 1
    if not config.budgets.items:
        print(f"gpuwarden report: {args.config}: no budgets: section", file=sys.stderr)
        return 1
    try:
        with open_db(args.db) as storage:
            reader = ClusterRollups(storage, config.cluster)
            return report_budgets(reader, config.budgets, now=at, fmt=args.fmt, out=out)
    except StorageError as exc:
        print(f"gpuwarden report: {exc}", file=sys.stderr)
        return 1
