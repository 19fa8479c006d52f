"""Spend per budget from the accounting rollups: the same rows ``gpuwarden report costs`` sums.

A team's spend is the cost (or allocated GPU-hours) of the accounting rows whose job belongs to
the team; a project's, of the rows whose job carries the ``project`` label. Unallocated time is
nobody's spend. Reads are grouped SQL sums (``Storage.rollups``), one per window and scope, so
a budget costs a query, not a scan in Python.

:class:`DailySpend` keeps the totals of the month's complete days: they are read once, and only
the day in progress is read again, so the forecast on every ``/metrics`` scrape does not re-sum
the month. A day's totals are taken as final once the day ended more than ``settle_seconds`` ago
(the accounting recomputes its last periods for a while).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuwarden.collector.budgets.calendar import DAY_SECONDS
from gpuwarden.collector.budgets.config import Budget, Scope, Unit
from gpuwarden.collector.storage.records import RollupDimension, RollupTotal

_DIMENSION: Mapping[Scope, RollupDimension] = {Scope.TEAM: "team", Scope.PROJECT: "project"}


class RollupReader(Protocol):
    """What spend reads: ``Storage.rollups`` (this collector's cluster)."""

    def rollups(
        self, *, since: float, until: float, by: Sequence[RollupDimension] = ()
    ) -> list[RollupTotal]:
        """Accounting totals over ``[since, until)`` grouped by ``by``."""
        ...


@dataclass(frozen=True, slots=True)
class Spend:
    """What a team or project used: cost in the price table's currency, allocated GPU-hours."""

    cost: float = 0.0
    gpu_hours: float = 0.0

    def __add__(self, other: Spend) -> Spend:
        return Spend(self.cost + other.cost, self.gpu_hours + other.gpu_hours)

    def amount(self, unit: Unit) -> float:
        """The spend in a budget's unit."""
        return self.cost if unit is Unit.COST else self.gpu_hours


NO_SPEND = Spend()
SpendByName = Mapping[str, Spend]
"""Team or project name → spend (a name with no rows is absent: zero)."""


def spend_of(totals: Sequence[RollupTotal], dimension: RollupDimension) -> dict[str, Spend]:
    """Rollup totals grouped by ``dimension`` as spend per name (rows naming none left out)."""
    out: dict[str, Spend] = {}
    for total in totals:
        name = total.group.get(dimension)
        if not name:
            continue
        out[name] = out.get(name, NO_SPEND) + Spend(
            total.cost or 0.0, total.gpu_seconds_allocated / 3600
        )
    return out


@dataclass(frozen=True, slots=True)
class WindowSpend:
    """Spend per scope and name over a window, whether the accounting wrote any row in it (none
    at all: the collector was not accounting, so the spend is unknown, not zero), and the
    seconds of the window the accounting covers (a window ending now misses the period in
    progress: a rate is spend over these seconds, never over the nominal window)."""

    by_scope: Mapping[Scope, SpendByName]
    accounted: bool
    seconds: float

    def of(self, budget: Budget) -> float:
        """A budget's spend in its unit."""
        return budget_spend(self.by_scope, budget)


def spend_in(
    reader: RollupReader, scopes: Sequence[Scope], since: float, until: float
) -> WindowSpend:
    """Spend of every scope in ``scopes`` over ``[since, until)``: one grouped query."""
    dims = tuple(_DIMENSION[s] for s in scopes)
    totals = reader.rollups(since=since, until=until, by=dims)
    return WindowSpend(
        {scope: spend_of(totals, _DIMENSION[scope]) for scope in scopes},
        bool(totals),
        until - since,
    )


def budget_spend(spends: Mapping[Scope, SpendByName], budget: Budget) -> float:
    """A budget's spend in its unit, from spend per scope and name."""
    return spends.get(budget.scope, {}).get(budget.name, NO_SPEND).amount(budget.unit)


class DailySpend:
    """Each day's spend of the month so far, per scope and name, complete days read once.

    A day with no accounting row at all (the collector was not running) is ``None``: unknown,
    not zero spend.
    """

    def __init__(self, reader: RollupReader, *, settle_seconds: float = 3600.0) -> None:
        self._reader = reader
        self._settle = settle_seconds
        self._done: dict[tuple[Scope, float], tuple[SpendByName | None]] = {}
        self._lock = threading.Lock()

    def days(
        self, scope: Scope, month_start: float, now: float
    ) -> tuple[list[SpendByName | None], float]:
        """The spend of each day from ``month_start`` to ``now`` (the last one in progress),
        and the length of the day in progress in seconds."""
        count = max(1, math.ceil((now - month_start) / DAY_SECONDS))
        dimension = _DIMENSION[scope]
        out: list[SpendByName | None] = []
        for i in range(count):
            start = month_start + i * DAY_SECONDS
            end = min(start + DAY_SECONDS, now)
            key = (scope, start)
            with self._lock:
                cached = self._done.get(key)
            if cached is None:
                totals = self._reader.rollups(since=start, until=end, by=(dimension,))
                cached = (spend_of(totals, dimension) if totals else None,)
                if end == start + DAY_SECONDS and now - end >= self._settle:
                    with self._lock:
                        self._done[key] = cached
            out.append(cached[0])
        with self._lock:  # forget past months
            for old in [k for k in self._done if k[1] < month_start]:
                del self._done[old]
        return out, now - (month_start + (count - 1) * DAY_SECONDS)


def _merged(parts: Sequence[WindowSpend]) -> WindowSpend:
    out: dict[Scope, dict[str, Spend]] = {}
    for part in parts:
        for scope, spends in part.by_scope.items():
            into = out.setdefault(scope, {})
            for name, spend in spends.items():
                into[name] = into.get(name, NO_SPEND) + spend
    return WindowSpend(out, any(p.accounted for p in parts), sum(p.seconds for p in parts))


class WindowSpendCache:
    """:func:`spend_in` over long windows without re-summing them on every detection cycle.

    A window is cut at whole hours: the hours inside it come from a cache once they ended more
    than ``settle_seconds`` ago (the accounting no longer rewrites them), the ragged edges and
    the unsettled hours are queried. A 3-day window then costs a few small queries a cycle
    instead of a sum over three days of rows. Hours older than ``keep_seconds`` are forgotten.
    """

    def __init__(
        self,
        reader: RollupReader,
        *,
        bin_seconds: float = 3600.0,
        settle_seconds: float = 3600.0,
        keep_seconds: float = 32 * DAY_SECONDS,
    ) -> None:
        self._reader = reader
        self._bin = bin_seconds
        self._settle = settle_seconds
        self._keep = keep_seconds
        self._bins: dict[tuple[tuple[Scope, ...], float], WindowSpend] = {}
        self._lock = threading.Lock()

    def spend_in(self, scopes: Sequence[Scope], since: float, until: float) -> WindowSpend:
        """What :func:`spend_in` answers, from cached hours where it can."""
        first = math.ceil(since / self._bin) * self._bin
        last = math.floor(until / self._bin) * self._bin
        if last <= first:
            return spend_in(self._reader, scopes, since, until)
        key = tuple(scopes)
        parts = [spend_in(self._reader, scopes, since, first)] if since < first else []
        start = first
        while start < last:
            parts.append(self._hour(key, start, until))
            start += self._bin
        if last < until:
            parts.append(spend_in(self._reader, scopes, last, until))
        with self._lock:
            for old in [k for k in self._bins if k[1] < until - self._keep]:
                del self._bins[old]
        return _merged(parts)

    def _hour(self, key: tuple[Scope, ...], start: float, now: float) -> WindowSpend:
        with self._lock:
            cached = self._bins.get((key, start))
        if cached is not None:
            return cached
        got = spend_in(self._reader, key, start, start + self._bin)
        if now - (start + self._bin) >= self._settle:
            with self._lock:
                self._bins[(key, start)] = got
        return got
