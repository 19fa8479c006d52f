"""``gpuwarden report costs``: GPU-hours, idle and no-data GPU-hours, energy, cost and carbon.

Reads the accounting rollups the collector wrote (``Storage.rollups``); never writes. Groups are
a team, job, model (deployment) or node. Time allocated to no job is its own group,
``(unallocated)``, so the idle capacity nobody holds is not charged to anyone; a job without a
team or model is ``(none)``. No-data GPU-hours (a GPU between its first and last sample without
a sample) are never billed to a job: they are in the ``(unallocated)`` line's no-data column
(and in their node's, by node), with the energy drawn meanwhile. Time before a node's first
sample or after its last is in no line at all.

Costs are in the price table's currency, which the collector keeps with every row: the table's
cost column is headed by it (``cost EUR``), JSON and CSV carry ``cost`` and ``currency``. Costs
in several currencies are not added: such a total's cost is empty and its currency lists them.
Energy, cost and carbon sum the rows that have them: a total with rows missing them is marked
partial (``*`` in the table, ``incomplete_rows`` elsewhere).

Several clusters (one collector each, sharing one database; ``storage.clusters``): the report
covers every cluster on the database unless ``--cluster`` names one, and when the lines come
from more than one cluster each line names its cluster (a ``cluster`` column first, a
``cluster`` key in JSON), so no two clusters' ``node-1`` or team ``nlp`` are added together;
the total is the organisation's. ``--db`` takes the SQLite file or a ``postgresql://`` URL.

Light on purpose: the CLI imports this module to build its parser, so the storage backend is
imported only when a report runs.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gpuwarden.collector.storage.clusters import ALL_CLUSTERS, check_scope

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from gpuwarden.collector.accounting.prices import PriceRow, PriceTable
    from gpuwarden.collector.storage.base import Storage
    from gpuwarden.collector.storage.records import RollupDimension, RollupTotal

EXIT_OK, EXIT_ERROR = 0, 1
UNALLOCATED_LABEL = "(unallocated)"
NONE_LABEL = "(none)"
BY_CHOICES = ("team", "job", "model", "node")
FORMATS = ("table", "csv", "json")
_DIMENSION: dict[str, RollupDimension] = {
    "team": "team",
    "job": "job_key",
    "model": "model",
    "node": "node",
}
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def parse_duration(text: str) -> float:
    """Seconds in ``"90s"``, ``"15m"``, ``"24h"``, ``"7d"`` or ``"2w"`` (the unit is required)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(
            f"invalid duration {text!r}: use a number and a unit (s, m, h, d, w), e.g. 90m, 24h, 7d"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_time(text: str, now: float) -> float:
    """A time: ``"now"``, Unix seconds (``"1700000000"``) or a duration ago (``"24h"``)."""
    value = text.strip().lower()
    if value == "now":
        return now
    if _NUMBER.fullmatch(value):
        return float(value)
    try:
        return now - parse_duration(value)
    except ValueError:
        raise ValueError(
            f"invalid time {text!r}: use 'now', Unix seconds, or a duration ago such as 24h"
        ) from None


@dataclass(frozen=True, slots=True)
class CostLine:
    """One group's totals in report units (hours, kWh, ``currency``, kilograms)."""

    group: str
    gpu_hours_allocated: float
    gpu_hours_busy: float
    gpu_hours_idle: float
    gpu_hours_unknown: float
    energy_kwh: float | None
    cost: float | None
    currency: str | None
    carbon_kg: float | None
    rows: int
    incomplete_rows: int
    cluster: str | None = None
    """The line's cluster when the report spans several (``None``: one cluster, or a total)."""


def _add(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else a + b


def _currencies(a: str | None, b: str | None) -> str | None:
    """The currencies of two totals, comma-separated and sorted when they differ."""
    found = {c for text in (a, b) if text for c in text.split(",")}
    return ",".join(sorted(found)) or None


def _scaled(value: float | None, divisor: float) -> float | None:
    return None if value is None else value / divisor


def cost_line(group: str, total: RollupTotal) -> CostLine:
    """One rollup total in report units."""
    return CostLine(
        group=group,
        gpu_hours_allocated=total.gpu_seconds_allocated / 3600,
        gpu_hours_busy=total.gpu_seconds_busy / 3600,
        gpu_hours_idle=total.gpu_seconds_idle / 3600,
        gpu_hours_unknown=total.gpu_seconds_unknown / 3600,
        energy_kwh=_scaled(total.energy_joules, 3.6e6),
        cost=total.cost,
        currency=total.currency,
        carbon_kg=_scaled(total.carbon_grams, 1000.0),
        rows=total.rows,
        incomplete_rows=total.rows_incomplete,
    )


def sum_lines(group: str, lines: Iterable[CostLine]) -> CostLine:
    """Lines summed under a new group name (energy, cost, carbon stay None if no line has them;
    costs in different currencies give no cost)."""
    out = CostLine(group, 0.0, 0.0, 0.0, 0.0, None, None, None, None, 0, 0)
    for line in lines:
        currency = _currencies(out.currency, line.currency)
        cost = _add(out.cost, line.cost)
        out = CostLine(
            group=group,
            gpu_hours_allocated=out.gpu_hours_allocated + line.gpu_hours_allocated,
            gpu_hours_busy=out.gpu_hours_busy + line.gpu_hours_busy,
            gpu_hours_idle=out.gpu_hours_idle + line.gpu_hours_idle,
            gpu_hours_unknown=out.gpu_hours_unknown + line.gpu_hours_unknown,
            energy_kwh=_add(out.energy_kwh, line.energy_kwh),
            cost=None if currency is not None and "," in currency else cost,
            currency=currency,
            carbon_kg=_add(out.carbon_kg, line.carbon_kg),
            rows=out.rows + line.rows,
            incomplete_rows=out.incomplete_rows + line.incomplete_rows,
        )
    return out


def cost_lines(
    storage: Storage, *, since: float, until: float, by: str, cluster: str = ALL_CLUSTERS
) -> list[CostLine]:
    """Totals per group of ``by`` (team, job, model or node), unallocated time apart, over
    ``cluster`` (default: every cluster on the database). Lines of several clusters are kept
    apart and name their cluster; lines of one cluster name none."""
    if by not in _DIMENSION:
        raise ValueError(f"by must be one of {', '.join(BY_CHOICES)}, not {by!r}")
    dimension = _DIMENSION[by]
    # Grouping by job too tells "no team" from "no job at all" (unallocated time).
    keys: tuple[RollupDimension, ...] = (
        ("cluster", dimension) if dimension in ("job_key", "node") else
        ("cluster", dimension, "job_key")
    )  # fmt: skip
    groups: dict[tuple[str, str], list[CostLine]] = {}
    for total in storage.rollups(since=since, until=until, by=keys, cluster=cluster):
        if dimension != "node" and total.group["job_key"] is None:
            label = UNALLOCATED_LABEL
        else:
            label = total.group[dimension] or NONE_LABEL
        name = str(total.group["cluster"])
        groups.setdefault((name, label), []).append(cost_line(label, total))
    several = len({name for name, _ in groups}) > 1
    return [
        replace(sum_lines(label, parts), cluster=name if several else None)
        for (name, label), parts in sorted(groups.items())
    ]


_COLUMNS = (  # CostLine field, table heading ({currency}: the costs' currency)
    ("gpu_hours_allocated", "GPU-h"),
    ("gpu_hours_busy", "busy GPU-h"),
    ("gpu_hours_idle", "idle GPU-h"),
    ("gpu_hours_unknown", "no-data GPU-h"),
    ("energy_kwh", "kWh"),
    ("cost", "cost{currency}"),
    ("carbon_kg", "kg CO2e"),
)


def _table(lines: Sequence[CostLine], by: str, out: TextIO) -> None:
    partial = any(line.incomplete_rows for line in lines)
    several = any(line.cluster is not None for line in lines)
    currency = lines[-1].currency or ""  # "": no cost, or rows from before it was recorded
    rows = [[by, *(heading.format(currency=f" {currency}".rstrip()) for _, heading in _COLUMNS)]]
    for line in lines:
        # A partial total is marked; the others keep the mark's column so the points align.
        mark = "*" if line.incomplete_rows else " " if partial else ""
        values = [getattr(line, f) for f, _ in _COLUMNS]
        rows.append([line.group, *("-" if v is None else f"{v:.2f}" for v in values[:4])])
        pad = " " if partial else ""
        rows[-1] += [f"-{pad}" if v is None else f"{v:.2f}{mark}" for v in values[4:]]
    if several:  # the cluster column first; the total's is empty
        rows = [[heading, *row] for heading, row in zip(
            ["cluster", *(line.cluster or "" for line in lines)], rows, strict=True
        )]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    names = 2 if several else 1  # the text columns, left-aligned; the numbers right-aligned
    for n, row in enumerate(rows):
        if n == len(rows) - 1:
            out.write("  ".join("-" * w for w in widths) + "\n")
        cells = [
            c.ljust(w) if i < names else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.write("  ".join(cells).rstrip() + "\n")
    if partial:
        out.write("* partial: energy, cost or carbon missing for some accounting rows\n")
    if "," in currency:
        out.write(f"costs in several currencies ({currency}) are not added up: narrow --since\n")


def line_record(line: CostLine) -> dict[str, object]:
    """A line as a JSON-ready dict, floats rounded to 6 decimals (no float noise in reports);
    ``cluster`` only when the line names one."""
    return {
        k: round(v, 6) if isinstance(v, float) else v
        for k, v in asdict(line).items()
        if k != "cluster" or v is not None
    }


PRICE_MATCHING = (
    "a GPU model matches every hw.model containing it, ignoring case, first match in this order; "
    "a cluster's rows override its region's, which override the fleet's; a tier not written "
    "costs on-demand"
)


def price_scope(price: PriceRow) -> str:
    """Where a price row applies: ``(fleet)``, ``cluster <name>`` or ``region <name>``."""
    if price.cluster:
        return f"cluster {price.cluster}"
    return f"region {price.region}" if price.region else "(fleet)"


def explain_prices(prices: PriceTable, out: TextIO) -> None:
    """The price table as a text block: currency, source, how models match, the rows."""
    from gpuwarden.collector.accounting.prices import TIERS

    out.write(f"prices per GPU-hour in {prices.currency}, from {prices.source}\n")
    out.write(f"({PRICE_MATCHING})\n")
    cells: dict[tuple[str, str], dict[str, float]] = {}
    for price in prices.rows():
        cells.setdefault((price_scope(price), price.gpu_model), {})[price.tier] = (
            price.price_per_hour
        )
    rows = [["scope", "gpu model", *TIERS]]
    rows += [[c, m, *(f"{tiers[t]:.2f}" for t in TIERS)] for (c, m), tiers in cells.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        left = [c.ljust(w) for c, w in zip(row[:2], widths, strict=False)]
        right = [c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True)]
        out.write("  ".join([*left, *right]).rstrip() + "\n")
    out.write("\n")


def prices_record(prices: PriceTable) -> dict[str, object]:
    """The price table as a JSON-ready dict."""
    return {
        "currency": prices.currency,
        "source": prices.source,
        "matching": PRICE_MATCHING,
        "rows": [asdict(row) for row in prices.rows()],
    }


def report_costs(
    storage: Storage,
    *,
    since_seconds: float,
    until: float,
    by: str,
    fmt: str,
    out: TextIO,
    prices: PriceTable | None = None,
    cluster: str = ALL_CLUSTERS,
    chargeback: str | None = None,
) -> int:
    """Print the cost report of ``[until - since_seconds, until)`` per group of ``cluster``
    (default: every cluster on the database); return 0.

    With ``prices``, the price table comes first (``--explain``): a text block before the table,
    a ``prices`` key in JSON (CSV has no room for it).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if prices is not None and fmt == "csv":
        raise ValueError("the price table (--explain) goes with --format table or json")
    since = until - since_seconds
    if chargeback is not None:  # the export: one line per period and chargeback key
        from gpuwarden.collector.accounting.chargeback import chargeback_lines, write_chargeback

        export = chargeback_lines(
            storage, since=since, until=until, period=chargeback, cluster=cluster
        )
        write_chargeback(export, fmt, out)
        return EXIT_OK
    lines = cost_lines(storage, since=since, until=until, by=by, cluster=cluster)
    total = sum_lines("TOTAL", lines)
    several = any(line.cluster is not None for line in lines)
    if fmt == "table":
        if prices is not None:
            explain_prices(prices, out)
        _table([*lines, total], by, out)
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        fields = [f for f in CostLine.__dataclass_fields__ if f not in ("group", "cluster")]
        header = ["cluster", "group", *fields] if several else ["group", *fields]
        writer.writerow([by if h == "group" else h for h in header])
        for line in [*lines, total]:
            record = line_record(line)
            writer.writerow(["" if record.get(h) is None else record[h] for h in header])
    else:
        doc = {
            "since": since,
            "until": until,
            "by": by,
            **({} if cluster == ALL_CLUSTERS else {"cluster": cluster}),
            "currency": total.currency,
            "groups": [line_record(line) for line in lines],
            "total": line_record(total),
        }
        if prices is not None:
            doc["prices"] = prices_record(prices)
        out.write(json.dumps(doc, indent=2) + "\n")
    return EXIT_OK


def _cluster_arg(text: str) -> str:
    try:
        return check_scope(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_report_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``report costs``, ``budgets`` and ``fairness`` to the CLI's subcommands."""
    report = subparsers.add_parser("report", help="print reports from the collector's database")
    kinds = report.add_subparsers(dest="report", required=True, metavar="REPORT")
    costs = kinds.add_parser(
        "costs",
        help="GPU-hours, idle and no-data GPU-hours, kWh, cost and carbon per team, job, model "
        "or node",
        description="Sum the collector's accounting over a window ending now (or --until).",
    )
    costs.add_argument(
        "--db",
        required=True,
        help="the collectors' database: the SQLite file, or a postgresql:// URL (password from "
        "PGPASSWORD or ~/.pgpass)",
    )
    costs.add_argument(
        "--cluster",
        type=_cluster_arg,
        default=ALL_CLUSTERS,
        help="only this cluster's accounting (default: every cluster on the database, each "
        "line naming its cluster when there are several)",
    )
    costs.add_argument(
        "--since", type=_duration_arg, default=86400.0, help="window length, e.g. 24h, 7d"
    )
    costs.add_argument("--until", default="now", help="window end: now, Unix seconds, or 2h (ago)")
    costs.add_argument("--by", choices=BY_CHOICES, default="team")
    costs.add_argument("--format", choices=FORMATS, default="table", dest="fmt")
    costs.add_argument(
        "--chargeback",
        action="store_true",
        help="the chargeback export (with --format csv or json): one line per period and "
        "team, project, job, model, GPU model and tier, stable columns (docs/chargeback.md)",
    )
    costs.add_argument(
        "--period",
        choices=("window", "day", "month"),
        default="window",
        help="the export's periods: the whole window, or each UTC day or month in it",
    )
    costs.add_argument(
        "--explain",
        action="store_true",
        help="print the price table used (currency, source, rows) before the report",
    )
    costs.add_argument(
        "--config",
        type=Path,
        help="the collector's config file, whose prices: --explain shows "
        "(default: the built-in table)",
    )
    from gpuwarden.collector.budgets.report import add_budgets_parser
    from gpuwarden.collector.fairness.report import add_fairness_parser

    add_budgets_parser(kinds)
    add_fairness_parser(kinds)


def run_report(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Run ``gpuwarden report costs``, ``budgets`` or ``fairness`` from parsed arguments; return
    the exit code."""
    if args.report == "fairness":  # reads sacct or the database (its own checks)
        from gpuwarden.collector.fairness.report import run_fairness

        return run_fairness(args, out=out)
    out = out if out is not None else sys.stdout
    if not _database_exists(args.db):
        return EXIT_ERROR
    if args.report == "budgets":
        from gpuwarden.collector.budgets.report import run_budgets

        return run_budgets(args, out=out, open_db=_open, now=time.time())
    return _run_costs(args, out)


def _database_exists(db: str) -> bool:
    """Whether ``--db`` names a PostgreSQL URL or an existing file (said on stderr if not:
    opening a missing SQLite file would create an empty database)."""
    from gpuwarden.collector.storage.urls import is_postgresql_url

    if is_postgresql_url(db) or Path(db).is_file():
        return True
    print(
        f"gpuwarden report: {db}: no such database; point --db at the collector's "
        "database file (the 'database' key of its config)",
        file=sys.stderr,
    )
    return False


def _run_costs(args: argparse.Namespace, out: TextIO) -> int:
    from gpuwarden.collector.storage.base import StorageError

    try:
        until = parse_time(args.until, time.time())
    except ValueError as exc:
        print(f"gpuwarden report: --until: {exc}", file=sys.stderr)
        return EXIT_ERROR
    prices = None
    if args.chargeback and (args.fmt == "table" or args.explain):
        print("gpuwarden report: --chargeback goes with --format csv or json", file=sys.stderr)
        return EXIT_ERROR
    if args.explain:
        from gpuwarden.collector.accounting.prices import PriceTable
        from gpuwarden.collector.config import ConfigError, load_collector_config

        if args.fmt == "csv":
            print("gpuwarden report: --explain goes with --format table or json", file=sys.stderr)
            return EXIT_ERROR
        try:
            prices = load_collector_config(args.config).prices if args.config else PriceTable()
        except ConfigError as exc:
            print(f"gpuwarden report: {exc}", file=sys.stderr)
            return EXIT_ERROR
    try:
        with _open(args.db) as storage:
            return report_costs(
                storage,
                since_seconds=args.since,
                until=until,
                by=args.by,
                fmt=args.fmt,
                out=out,
                prices=prices,
                cluster=args.cluster,
                chargeback=args.period if args.chargeback else None,
            )
    except StorageError as exc:
        print(f"gpuwarden report: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _open(db: str) -> AbstractContextManager[Storage]:
    """The store of ``--db``: PostgreSQL for a ``postgresql://`` URL, else the SQLite file."""
    from gpuwarden.collector.storage.urls import is_postgresql_url

    if is_postgresql_url(db):
        from gpuwarden.collector.storage.postgres import PostgresStorage

        return PostgresStorage(db)
    from gpuwarden.collector.storage.sqlite import SqliteStorage

    return SqliteStorage(db)
