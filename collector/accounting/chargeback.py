"""The chargeback (showback) export: ``gpuwarden report costs --chargeback --format csv|json``.

One line per period and (cluster, team, project, job, model, GPU model, price tier), with
stable columns (:data:`COLUMNS`, documented in ``docs/chargeback.md``): a finance system can
load it without knowing gpuwarden. The numbers are the accounting rollups ``report costs`` sums,
so the lines add up to its totals: unallocated time is a line of its own (team
``(unallocated)``, no job, no cost), holding the idle capacity nobody held and its energy.

A period is the whole report window (``--period window``, the default) or each UTC calendar
day or month inside it (``day``, ``month``), cut to the window.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

from gpuwarden.collector.storage.clusters import ALL_CLUSTERS

if TYPE_CHECKING:
    from gpuwarden.collector.storage.base import Storage
    from gpuwarden.collector.storage.records import RollupDimension, RollupTotal

PERIODS = ("window", "day", "month")
UNALLOCATED = "(unallocated)"
COLUMNS = (
    "period",  # ISO 8601 start/end of the line's period (UTC)
    "cluster",
    "team",
    "project",
    "job",
    "model",
    "gpu_model",
    "price_tier",
    "gpu_hours",  # allocated (busy + idle): what is billed
    "idle_gpu_hours",
    "energy_kwh",
    "co2e_kg",
    "cost",
    "currency",
)
_BY: tuple[RollupDimension, ...] = (
    "cluster",
    "team",
    "project",
    "job_key",
    "model",
    "gpu_model",
    "price_tier",
)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def periods(since: float, until: float, period: str) -> Iterator[tuple[float, float]]:
    """The periods of ``[since, until)``: the window, or its UTC days or months (cut to it)."""
    if period not in PERIODS:
        raise ValueError(f"period must be one of {', '.join(PERIODS)}, not {period!r}")
    if period == "window":
        yield since, until
        return
    start = since
    while start < until:
        day = datetime.fromtimestamp(start, UTC)
        if period == "day":
            nxt = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() + 86400
        else:
            nxt = datetime(
                day.year + day.month // 12, day.month % 12 + 1, 1, tzinfo=UTC
            ).timestamp()
        end = min(nxt, until)
        yield start, end
        start = end


def _line(period: str, total: RollupTotal) -> dict[str, object]:
    group = total.group
    job = group["job_key"]

    def r(value: float | None, divisor: float = 1.0) -> float | None:
        return None if value is None else round(value / divisor, 6)

    return {
        "period": period,
        "cluster": group["cluster"],
        "team": UNALLOCATED if job is None else group["team"] or "",
        "project": group["project"] or "",
        "job": job or "",
        "model": group["model"] or "",
        "gpu_model": group["gpu_model"] or "",
        "price_tier": group["price_tier"] or "",
        "gpu_hours": r(total.gpu_seconds_allocated, 3600),
        "idle_gpu_hours": r(total.gpu_seconds_idle, 3600),
        "energy_kwh": r(total.energy_joules, 3.6e6),
        "co2e_kg": r(total.carbon_grams, 1000),
        "cost": r(total.cost),
        "currency": total.currency or "",
    }


def chargeback_lines(
    storage: Storage, *, since: float, until: float, period: str, cluster: str = ALL_CLUSTERS
) -> list[dict[str, object]]:
    """Every line of the export over ``[since, until)``, in :data:`COLUMNS` order."""
    out = []
    for start, end in periods(since, until, period):
        name = f"{_iso(start)}/{_iso(end)}"
        totals = storage.rollups(since=start, until=end, by=_BY, cluster=cluster)
        out += [_line(name, total) for total in totals]
    return out


def write_chargeback(lines: Sequence[dict[str, object]], fmt: str, out: TextIO) -> None:
    """The lines as CSV (a header of :data:`COLUMNS`, empty cells for missing values) or JSON
    (``{"columns": [...], "lines": [...]}``, missing values null)."""
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(COLUMNS)
        for line in lines:
            writer.writerow(["" if line[c] is None else line[c] for c in COLUMNS])
    elif fmt == "json":
        out.write(json.dumps({"columns": list(COLUMNS), "lines": list(lines)}, indent=2) + "\n")
    else:
        raise ValueError("the chargeback export goes with --format csv or json")
