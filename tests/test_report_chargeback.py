"""The chargeback export (``report costs --chargeback --format csv|json``): stable columns, the
project from the job's label, the GPU model, per-region carbon, and totals equal to
``report costs``' totals. Accounting runs for real on test_accounting_scenario's script (two
nodes x 8 GPUs for 2 h, three jobs) through the store and the service."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest

from gpuwarden.cli import main
from gpuwarden.collector.accounting.chargeback import COLUMNS, UNALLOCATED, periods
from gpuwarden.collector.accounting.report import report_costs
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.service import CollectorService
from tests.budget_curves import minute_rows
from tests.storage_backends import Backend, backend  # noqa: F401 - a fixture
from tests.test_accounting_scenario import END, HOURS, JOBS, MODEL, STEP, T0, scripted_points

REGION, REGION_G_PER_KWH, FLEET_G_PER_KWH = "eu-north-1", 30.0, 400.0


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chargeback") / "c.db"


@pytest.fixture(scope="module")
def service(database: Path) -> CollectorService:
    config = CollectorConfig(
        database=database,
        recent_hours=6,
        grid_intensity_grams_per_kwh=FLEET_G_PER_KWH,
        grid_intensity_regions={REGION: REGION_G_PER_KWH},
    )
    svc = build_service(config, clock=lambda: END + STEP)
    jobs = []
    for key, (tier, gpus, start, end) in JOBS.items():
        nodes: dict[str, list[int]] = {}
        for node, gpu in gpus:
            nodes.setdefault(node, []).append(gpu)
        jobs.append(
            Job(
                key=key,
                scheduler="slurm",
                job_id=key.rsplit(":", 1)[1],
                state=JobState.COMPLETED,
                team="ml" if key != "slurm:c:3" else "research",
                gpus=len(gpus),
                start_time=start,
                end_time=end,
                price_tier=tier,
                allocations=tuple(GpuAllocation(n, tuple(g)) for n, g in nodes.items()),
                labels={"project": "llama-ft"} if key == "slurm:c:1" else {},
            )
        )
    svc.registry.put(jobs)
    for batch in scripted_points():  # node b is in a region with a cleaner grid
        located = [
            dataclasses.replace(p, resource={**p.resource, "cloud.region": REGION})
            if p.resource["host.name"] == "b"
            else p
            for p in batch
        ]
        assert svc.accept(located, "agents") == 0
    svc.recompute_periods = HOURS * 60
    assert svc.run_accounting(now=END) > 0
    return svc


def export(service: CollectorService, fmt: str, period: str = "window") -> str:
    out = io.StringIO()
    report_costs(
        service.storage,
        since_seconds=END - T0,
        until=END,
        by="team",
        fmt=fmt,
        out=out,
        chargeback=period,
    )
    return out.getvalue()


def costs_total(service: CollectorService) -> dict[str, float]:
    out = io.StringIO()
    report_costs(service.storage, since_seconds=END - T0, until=END, by="team", fmt="json", out=out)
    total: dict[str, float] = json.loads(out.getvalue())["total"]
    return total


@pytest.mark.parametrize("period", ["window", "day", "month"])
def test_the_csv_totals_equal_report_costs_totals(service, period):
    rows = list(csv.DictReader(io.StringIO(export(service, "csv", period))))
    total = costs_total(service)
    for column, field in (
        ("gpu_hours", "gpu_hours_allocated"),
        ("idle_gpu_hours", "gpu_hours_idle"),
        ("energy_kwh", "energy_kwh"),
        ("co2e_kg", "carbon_kg"),
        ("cost", "cost"),
    ):
        assert sum(float(r[column]) for r in rows) == pytest.approx(total[field], abs=1e-4), column
    assert {r["currency"] for r in rows} == {"USD"}


def test_the_columns_are_the_documented_ones(service):
    header = export(service, "csv").splitlines()[0].split(",")
    assert tuple(header) == COLUMNS
    docs = (Path(__file__).parent.parent / "docs" / "chargeback.md").read_text(encoding="utf-8")
    for column in COLUMNS:
        assert f"| `{column}` |" in docs, column


def test_lines_carry_project_gpu_model_tier_and_the_regions_carbon(service):
    doc = json.loads(export(service, "json"))
    assert doc["columns"] == list(COLUMNS)
    lines = {(ln["job"], ln["team"]): ln for ln in doc["lines"] if ln["job"]}
    one = lines["slurm:c:1", "ml"]
    assert (one["project"], one["gpu_model"], one["price_tier"]) == ("llama-ft", MODEL, "on-demand")
    assert one["gpu_hours"] == pytest.approx(4 * HOURS, rel=0.01)
    assert one["period"] == "2026-01-01T00:00:00Z/2026-01-01T02:00:00Z"
    three = lines["slurm:c:3", "research"]  # all on node b: the region's grid
    assert three["project"] == ""
    assert three["co2e_kg"] == pytest.approx(three["energy_kwh"] * REGION_G_PER_KWH / 1000)
    assert one["co2e_kg"] == pytest.approx(one["energy_kwh"] * FLEET_G_PER_KWH / 1000)
    # job 2 ran on both nodes: one line per chargeback key, the GPUs of a and b added
    two = lines["slurm:c:2", "ml"]
    assert two["price_tier"] == "spot"
    assert (
        FLEET_G_PER_KWH * 0.99 * two["energy_kwh"] / 1000
        > two["co2e_kg"]
        > REGION_G_PER_KWH * 1.01 * two["energy_kwh"] / 1000
    )
    unallocated = [ln for ln in doc["lines"] if not ln["job"]]
    assert {ln["team"] for ln in unallocated} == {UNALLOCATED}
    assert all(ln["cost"] == 0 for ln in unallocated)


def test_periods_are_utc_days_or_months_cut_to_the_window():
    day = 86400.0
    since = T0 - 3600  # 2025-12-31 23:00
    assert list(periods(since, T0 + 2 * day, "day")) == [
        (since, T0),
        (T0, T0 + day),
        (T0 + day, T0 + 2 * day),
    ]
    assert list(periods(since, T0 + 2 * day, "month")) == [(since, T0), (T0, T0 + 2 * day)]


def test_the_cli_exports_and_refuses_a_table(service, database, capsys):
    assert service.storage.rollups(since=T0, until=END)  # the accounting is written
    args = ["report", "costs", "--db", str(database), "--since", "2h", "--until", str(END)]
    args.append("--chargeback")
    assert main([*args, "--format", "csv", "--period", "day"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == ",".join(COLUMNS)
    assert main(args) == 1
    assert "--chargeback goes with --format csv or json" in capsys.readouterr().err


def test_project_and_gpu_model_are_kept_on_both_backends(backend: Backend):  # noqa: F811
    """Migration 10's columns: written, read back and grouped by, on SQLite and PostgreSQL."""
    rows = [
        *minute_rows("nlp", T0, T0 + 600, lambda _t: 0.001, project="llama-ft"),
        *minute_rows("vision", T0, T0 + 300, lambda _t: 0.001, gpu="GPU-b"),
    ]
    with backend.open(lambda: END) as store:
        store.write_rollups(rows)
        back = store.accounting_rows(since=T0, until=END)
        assert {(r.team, r.project, r.gpu_model) for r in back} == {
            ("nlp", "llama-ft", "NVIDIA H100 80GB HBM3"),
            ("vision", None, "NVIDIA H100 80GB HBM3"),
        }
        by = store.rollups(since=T0, until=END, by=("project", "gpu_model"))
        hours = {(t.group["project"], t.group["gpu_model"]): t.gpu_seconds_allocated for t in by}
        assert hours == {
            (None, "NVIDIA H100 80GB HBM3"): 300.0,
            ("llama-ft", "NVIDIA H100 80GB HBM3"): 600.0,
        }
