"""Known spend curves for the budget tests: accounting rows written straight into a real
SQLite store, and a collector service over it with a fixed clock.

Kept apart from the test modules so the detection-contract scenarios can build the same curves.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from gpuwarden.collector.accounting.gpu_time import AccountingConfig
from gpuwarden.collector.budgets.config import Budget, Budgets, Scope, Unit
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import AccountingRow
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.store.window import WindowStore

MONTH_START = datetime(2026, 11, 1, tzinfo=UTC).timestamp()  # November: 30 days
MONTH_SECONDS = 30 * 86400.0
DAY = 86400.0
BUDGET = 30_000.0  # nlp's monthly budget (USD): an even rate of 1,000 a day
EVEN_RATE = BUDGET / MONTH_SECONDS  # USD per second
NLP = Budget(Scope.TEAM, "nlp", Unit.COST, BUDGET)


def minute_rows(
    team: str | None,
    start: float,
    end: float,
    usd_per_second: Callable[[float], float],
    *,
    period_seconds: float = 60.0,
    project: str | None = None,
    gpu: str = "GPU-a",
) -> list[AccountingRow]:
    """One accounting row per period of ``[start, end)``: one GPU held by the team's job
    (``team`` None: unallocated, no cost), costing ``usd_per_second(period start)``."""
    rows = []
    t = start
    while t < end:
        job = None if team is None else f"slurm:c:{team}"
        rows.append(
            AccountingRow(
                period_start=t,
                period_seconds=period_seconds,
                job_key=job,
                team=team,
                model=None,
                node="node-1",
                gpu_uuid=f"{gpu}-{team}",
                price_tier="on-demand",
                gpu_seconds_allocated=period_seconds if team else 0.0,
                gpu_seconds_busy=period_seconds if team else 0.0,
                gpu_seconds_idle=0.0,
                gpu_seconds_unknown=0.0 if team else period_seconds,
                energy_joules=300.0 * period_seconds,
                cost=usd_per_second(t) * period_seconds if team else 0.0,
                carbon_grams=300.0 * period_seconds / 3.6e6 * 400.0,
                currency="USD",
                project=project,
                gpu_model="NVIDIA H100 80GB HBM3",
            )
        )
        t += period_seconds
    return rows


def make_service(
    tmp: Path, now: float, budgets: Budgets | None = None
) -> tuple[CollectorService, Callable[[float], None]]:
    """A collector over a SQLite file with ``budgets`` (default: nlp's), its clock at ``now``;
    and a setter that moves the clock."""
    clock = [now]
    storage = SqliteStorage(tmp / "c.db", clock=lambda: clock[0])
    service = CollectorService(
        store=WindowStore(step_seconds=10, recent_seconds=3600, clock=lambda: clock[0]),
        storage=storage,
        registry=JobRegistry(storage),
        accounting=AccountingConfig(budgets=budgets or Budgets((NLP,))),
        clock=lambda: clock[0],
    )

    def move(t: float) -> None:
        clock[0] = t

    return service, move


SURGE_AT = MONTH_START + 19 * DAY + 10 * 3600  # Nov 20, 10:00 UTC
BASE_BURN, SURGE_BURN = 0.5, 20.0  # nlp's spend before and after, in even rates


def nlp_rate(t: float) -> float:
    """nlp spends half its even rate until the surge, then 20 times it."""
    return (SURGE_BURN if t >= SURGE_AT else BASE_BURN) * EVEN_RATE


def surge_rows(until: float) -> list[AccountingRow]:
    """Four days of nlp's curve before the surge and what follows until ``until``; another
    team (vision, no budget) spending 5x nlp's even rate all along, and unallocated time."""
    start = SURGE_AT - 4 * DAY
    return [
        *minute_rows("nlp", start, until, nlp_rate),
        *minute_rows("vision", start, until, lambda _t: 5 * EVEN_RATE),
        *minute_rows(None, start, until, lambda _t: 0.0),
    ]
