"""``gpuwarden report costs``: exact table, CSV and JSON totals; durations; the CLI entry."""

from __future__ import annotations

import argparse
import io
import json

import pytest

from gpuwarden.collector.accounting.report import (
    add_report_parser,
    parse_duration,
    parse_time,
    report_costs,
    run_report,
)
from gpuwarden.collector.storage.sqlite import SqliteStorage
from tests.test_collector_api import NOW, ROWS


@pytest.fixture
def storage():
    with SqliteStorage(":memory:", clock=lambda: NOW) as storage:
        storage.write_rollups(ROWS)
        yield storage


def report(storage, by="team", fmt="table", since_seconds=86400.0) -> str:
    out = io.StringIO()
    code = report_costs(storage, since_seconds=since_seconds, until=NOW, by=by, fmt=fmt, out=out)
    assert code == 0
    return out.getvalue()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("15m", 900.0), ("24h", 86400.0), ("7d", 604800.0), ("1.5h", 5400.0),
     ("2w", 1209600.0), (" 24H ", 86400.0)],
)  # fmt: skip
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "24", "-1h", "h", "1y", "1e3s", "24 hours"])
def test_parse_duration_needs_a_number_and_a_unit(text):
    with pytest.raises(ValueError, match=r"invalid duration .*: use a number and a unit"):
        parse_duration(text)


def test_parse_time():
    assert parse_time("now", NOW) == NOW
    assert parse_time("1700000000", NOW) == 1_700_000_000.0
    assert parse_time("2h", NOW) == NOW - 7200
    with pytest.raises(ValueError, match="invalid time 'soon'"):
        parse_time("soon", NOW)


TEAM_TABLE = """\
team           GPU-h  busy GPU-h  idle GPU-h  no-data GPU-h    kWh  cost EUR  kg CO2e
(unallocated)   0.50        0.00        0.50           0.00  0.20      0.00     0.08
nlp             0.50        0.50        0.00           0.00  0.50      2.00     0.20
vision          1.50        1.00        0.25           0.25  1.00*     5.00*    0.40*
-------------  -----  ----------  ----------  -------------  -----  --------  -------
TOTAL           2.50        1.50        0.75           0.25  1.70*     7.00*    0.68*
* partial: energy, cost or carbon missing for some accounting rows
"""


def test_table_by_team(storage):
    # Unallocated time is its own group; the row from 3 days ago is outside the window.
    assert report(storage) == TEAM_TABLE


def test_table_by_node_shows_missing_energy_as_a_dash(storage):
    assert (
        report(storage, by="node")
        == """\
node    GPU-h  busy GPU-h  idle GPU-h  no-data GPU-h    kWh  cost EUR  kg CO2e
node-a   2.00        1.25        0.75           0.00  1.70      6.00     0.68
node-b   0.50        0.25        0.00           0.25     -      1.00*       -
------  -----  ----------  ----------  -------------  -----  --------  -------
TOTAL    2.50        1.50        0.75           0.25  1.70*     7.00*    0.68*
* partial: energy, cost or carbon missing for some accounting rows
"""
    )


def test_table_by_model_over_a_week(storage):
    assert (
        report(storage, by="model", since_seconds=7 * 86400)
        == """\
model          GPU-h  busy GPU-h  idle GPU-h  no-data GPU-h    kWh  cost EUR  kg CO2e
(none)          1.00        0.00        1.00           0.00  0.28      4.00     0.10
(unallocated)   0.50        0.00        0.50           0.00  0.20      0.00     0.08
llama           0.50        0.50        0.00           0.00  0.50      2.00     0.20
resnet          1.50        1.00        0.25           0.25  1.00*     5.00*    0.40*
-------------  -----  ----------  ----------  -------------  -----  --------  -------
TOTAL           3.50        1.50        1.75           0.25  1.98*    11.00*    0.78*
* partial: energy, cost or carbon missing for some accounting rows
"""
    )


def test_empty_window(storage):
    assert (
        report(storage, by="job", since_seconds=60)
        == """\
job    GPU-h  busy GPU-h  idle GPU-h  no-data GPU-h  kWh  cost  kg CO2e
-----  -----  ----------  ----------  -------------  ---  ----  -------
TOTAL   0.00        0.00        0.00           0.00    -     -        -
"""
    )


def test_csv_by_job(storage):
    assert report(storage, by="job", fmt="csv") == (
        "job,gpu_hours_allocated,gpu_hours_busy,gpu_hours_idle,gpu_hours_unknown,"
        "energy_kwh,cost,currency,carbon_kg,rows,incomplete_rows\n"
        "(unallocated),0.5,0.0,0.5,0.0,0.2,0.0,EUR,0.08,1,0\n"
        "api:infer-2,0.5,0.5,0.0,0.0,0.5,2.0,EUR,0.2,1,0\n"
        "api:train-1,1.5,1.0,0.25,0.25,1.0,5.0,EUR,0.4,2,1\n"
        "TOTAL,2.5,1.5,0.75,0.25,1.7,7.0,EUR,0.68,4,1\n"
    )


def test_json_by_team(storage):
    fields = ("gpu_hours_allocated", "gpu_hours_busy", "gpu_hours_idle", "gpu_hours_unknown",
              "energy_kwh", "cost", "carbon_kg", "rows", "incomplete_rows")  # fmt: skip

    def line(group: str, *values: float) -> dict[str, object]:
        return {"group": group, "currency": "EUR", **dict(zip(fields, values, strict=True))}

    assert json.loads(report(storage, fmt="json")) == {
        "since": NOW - 86400,
        "until": NOW,
        "by": "team",
        "currency": "EUR",
        "groups": [
            line("(unallocated)", 0.5, 0.0, 0.5, 0.0, 0.2, 0.0, 0.08, 1, 0),
            line("nlp", 0.5, 0.5, 0.0, 0.0, 0.5, 2.0, 0.2, 1, 0),
            line("vision", 1.5, 1.0, 0.25, 0.25, 1.0, 5.0, 0.4, 2, 1),
        ],
        "total": line("TOTAL", 2.5, 1.5, 0.75, 0.25, 1.7, 7.0, 0.68, 4, 1),
    }


def test_unknown_group_or_format(storage):
    with pytest.raises(ValueError, match="by must be one of team, job, model, node"):
        report(storage, by="colour")
    with pytest.raises(ValueError, match="format must be one of table, csv, json"):
        report(storage, fmt="xml")


def cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuwarden")
    add_report_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_reads_the_database_file(tmp_path):
    path = tmp_path / "collector.db"
    with SqliteStorage(path) as storage:
        storage.write_rollups(ROWS)
    out = io.StringIO()
    args = cli("report", "costs", "--db", str(path), "--until", str(int(NOW)))
    assert (args.since, args.by, args.fmt) == (86400.0, "team", "table")
    assert run_report(args, out=out) == 0
    assert out.getvalue() == TEAM_TABLE


def test_cli_refuses_a_missing_database_without_creating_it(tmp_path, capsys):
    path = tmp_path / "nope.db"
    assert run_report(cli("report", "costs", "--db", str(path))) == 1
    assert capsys.readouterr().err == (
        f"gpuwarden report: {path}: no such database; point --db at the collector's database "
        "file (the 'database' key of its config)\n"
    )
    assert not path.exists()


def test_cli_rejects_bad_windows(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli("report", "costs", "--db", "x.db", "--since", "yesterday")
    assert exc.value.code == 2
    assert "argument --since: invalid duration 'yesterday'" in capsys.readouterr().err
    path = tmp_path / "collector.db"
    SqliteStorage(path).close()
    assert run_report(cli("report", "costs", "--db", str(path), "--until", "later")) == 1
    assert capsys.readouterr().err.startswith("gpuwarden report: --until: invalid time 'later'")
