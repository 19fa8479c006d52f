"""The ``budgets:`` section of the collector config: what each team or project may spend a month.

::

    budgets:
      interval_level: 0.8        # the month-end forecast's interval (default 80 %)
      teams:                     # team (the job's team) -> one budget per calendar month (UTC)
        nlp: {cost: 20000}       # in the price table's currency (prices.currency)
        vision: {gpu_hours: 5000}
      projects:                  # project (the job's ``project`` label) -> a budget
        llama-ft: {cost: 4000}

Each entry names exactly one limit: ``cost`` (money, in the currency of ``prices:``) or
``gpu_hours`` (allocated GPU-hours, busy + idle: what ``report costs`` bills). The month is the
calendar month in UTC. Spend is the accounting's (:mod:`.spend`): the same numbers as
``gpuwarden report costs`` over the month so far.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated

import msgspec

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Amount = Annotated[float, msgspec.Meta(gt=0)]
Level = Annotated[float, msgspec.Meta(gt=0, lt=1)]
DEFAULT_INTERVAL_LEVEL = 0.8


class Scope(StrEnum):
    """What a budget covers: one team's jobs, or one project's."""

    TEAM = "team"
    PROJECT = "project"


class Unit(StrEnum):
    """What a budget counts: money in the price table's currency, or allocated GPU-hours."""

    COST = "cost"
    GPU_HOURS = "gpu_hours"


@dataclass(frozen=True, slots=True)
class Budget:
    """One team's or project's limit per calendar month (UTC)."""

    scope: Scope
    name: str
    unit: Unit
    amount: float

    @property
    def key(self) -> str:
        """``team:nlp`` or ``project:llama-ft``: the budget's label on /metrics and incidents."""
        return f"{self.scope}:{self.name}"


@dataclass(frozen=True, slots=True)
class Budgets:
    """Every budget, with the forecast interval's level and the currency costs are in."""

    items: tuple[Budget, ...] = ()
    interval_level: float = DEFAULT_INTERVAL_LEVEL
    currency: str = "USD"

    def get(self, key: str) -> Budget | None:
        """The budget of a key (``team:nlp``), if configured."""
        return next((b for b in self.items if b.key == key), None)


class LimitSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One entry as written: exactly one of ``cost`` and ``gpu_hours``."""

    cost: Amount | None = None
    gpu_hours: Amount | None = None

    def __post_init__(self) -> None:
        if (self.cost is None) == (self.gpu_hours is None):
            raise ValueError("name exactly one of cost (in the prices' currency) and gpu_hours")

    def unit(self) -> tuple[Unit, float]:
        """The unit and amount written."""
        if self.cost is not None:
            return Unit.COST, self.cost
        assert self.gpu_hours is not None  # noqa: S101 - __post_init__ checked it
        return Unit.GPU_HOURS, self.gpu_hours


class BudgetsSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``budgets:`` section as written (see the module)."""

    interval_level: Level = DEFAULT_INTERVAL_LEVEL
    teams: Mapping[Name, LimitSection] = msgspec.field(default_factory=lambda: MappingProxyType({}))
    projects: Mapping[Name, LimitSection] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )

    def budgets(self, currency: str) -> Budgets:
        """The budgets held, costs in ``currency`` (the price table's)."""
        items = [
            Budget(scope, name, *limit.unit())
            for scope, written in ((Scope.TEAM, self.teams), (Scope.PROJECT, self.projects))
            for name, limit in sorted(written.items())
        ]
        return Budgets(tuple(items), self.interval_level, currency)
