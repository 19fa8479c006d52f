"""Prices are configuration: the ``prices:`` section, its table, and a collector charging by it."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.collector.accounting.gpu_time import totals
from gpuwarden.collector.accounting.prices import BUILTIN_SOURCE, PriceTable
from gpuwarden.collector.accounting.report import add_report_parser, run_report
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import ConfigError, load_collector_config
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.store.types import AttrValue
from gpuwarden.collector.web.status_prices import prices_context

H100 = "NVIDIA H100 80GB HBM3"
H100_NVL = "NVIDIA H100 NVL"
EUR_PRICES = """\
prices:
  currency: EUR
  models:
    H100 NVL: {on-demand: 4.40, spot: 1.80}
    h100: {on-demand: 3.70, spot: 1.50, reserved: 2.40}
  default: {on-demand: 1.80, spot: 0.70, reserved: 1.20}
  clusters:
    onprem:
      default: {on-demand: 0.90}
"""


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "collector.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# --- the table ---------------------------------------------------------------------------------


def test_without_the_section_todays_table_applies(tmp_path):
    prices = load_collector_config(config_file(tmp_path, "port: 4318\n")).prices
    assert prices == PriceTable()
    assert prices.source == BUILTIN_SOURCE
    assert (prices.currency, prices.price(H100, "on-demand"), prices.price(H100, "spot")) == (
        "USD",
        4.00,
        1.60,
    )
    assert prices.price("NVIDIA A100-SXM4-80GB", "reserved") == 1.60
    assert prices.price("NVIDIA L40S", "on-demand") == 0.80  # "l4" is a substring of "L40S"
    assert prices.price("AMD MI300X", "spot") == 0.80  # the default
    assert prices.price(H100, "preemptible") == 4.00  # an unknown tier costs on-demand


@pytest.mark.parametrize(
    ("model", "tier", "cluster", "price"),
    [
        (H100, "on-demand", None, 3.70),
        (H100, "spot", None, 1.50),
        ("nvidia h100 80gb hbm3", "reserved", None, 2.40),  # case does not matter
        (H100_NVL, "spot", None, 1.80),  # the first key that matches: "H100 NVL"
        (H100_NVL, "reserved", None, 4.40),  # a tier not written costs on-demand
        ("NVIDIA L4", "spot", None, 0.70),  # not listed: the default
        (H100, "spot", "onprem", 0.90),  # the cluster's default before the fleet's models
        (H100, "spot", "cloud", 1.50),  # a cluster without overrides: the fleet's table
        (H100, "spot", "", 1.50),
    ],
)
def test_lookup_order(tmp_path, model, tier, cluster, price):
    prices = load_collector_config(config_file(tmp_path, EUR_PRICES)).prices
    assert prices.price(model, tier, cluster) == pytest.approx(price)


REGIONS = """\
  regions:                      # the agents' cloud.region
    eu-north-1:
      models: {H100: {on-demand: 3.20, spot: 1.20}}
    us-east-1:
      default: {on-demand: 2.00}
"""


@pytest.mark.parametrize(
    ("model", "tier", "cluster", "region", "price"),
    [
        (H100, "spot", None, "eu-north-1", 1.20),  # the region's models before the fleet's
        (H100, "spot", "onprem", "eu-north-1", 0.90),  # the cluster's before the region's
        ("NVIDIA L4", "spot", None, "eu-north-1", 0.70),  # no region default: the fleet's
        (H100, "spot", None, "us-east-1", 2.00),  # the region's default: spot not written
        (H100, "spot", None, "ap-south-1", 1.50),  # a region without overrides: the fleet's
    ],
)
def test_regions_sit_between_clusters_and_the_fleet(tmp_path, model, tier, cluster, region, price):
    prices = load_collector_config(config_file(tmp_path, EUR_PRICES + REGIONS)).prices
    assert prices.price(model, tier, cluster, region) == pytest.approx(price)
    rows = {(r.cluster, r.region, r.gpu_model, r.tier): r.price_per_hour for r in prices.rows()}
    assert rows["", "eu-north-1", "H100", "reserved"] == 3.20
    assert rows["", "us-east-1", "(default)", "spot"] == 2.00


def test_a_region_is_validated_like_a_cluster(tmp_path):
    text = "prices: {regions: {eu: {models: {H100: {on-demand: 1}, H100 NVL: {on-demand: 2}}}}}"
    path = config_file(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as exc:
        load_collector_config(path)
    assert str(exc.value).startswith(f"{path}: prices.regions.eu")
    assert "'H100 NVL' can never match" in str(exc.value)


def test_a_cluster_model_beats_the_cluster_default_and_keys_left_out_stay_built_in(tmp_path):
    text = (
        "prices:\n  clusters:\n    lab:\n      models: {A100: {on-demand: 1.10}}\n"
        "      default: {on-demand: 0.50}\n"
    )
    path = config_file(tmp_path, text)
    prices = load_collector_config(path).prices
    assert prices.source == str(path)
    assert prices.price("NVIDIA A100 80GB PCIe", "spot", "lab") == 1.10
    assert prices.price(H100, "spot", "lab") == 0.50
    assert prices.price(H100, "spot") == 1.60  # models and default left out: built-in (USD)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "prices: {models: {H100: {on-demand: -1}}}",
            "prices.models.H100.on-demand: expected a price per GPU-hour >= 0, got -1",
        ),
        (
            "prices: {default: {on-demand: 1, preemptible: 0.5}}",
            "prices.default: unknown key 'preemptible' (known: on-demand, reserved, spot)",
        ),
        (
            "prices: {models: {H100: {on-demand: 1, sport: 0.5}}}",
            "prices.models.H100: unknown key 'sport'; did you mean 'spot'?",
        ),
        (
            "prices: {currency: usd}",
            "prices.currency: expected an ISO 4217 currency code such as USD, EUR, got 'usd'",
        ),
        (
            "prices: {currency: EURO}",
            "prices.currency: expected an ISO 4217 currency code such as USD, EUR, got 'EURO'",
        ),
        (
            "prices: {currency: EUR, default: {on-demand: 1}}",
            "prices.models: required with currency EUR (the built-in prices are US dollars)",
        ),
        (
            "prices: {currency: EUR, models: {H100: {on-demand: 1}}}",
            "prices.default: required with currency EUR (the built-in prices are US dollars)",
        ),
        (
            "prices: {models: {H100: {spot: 1}}}",
            "prices.models.H100.on-demand: required",
        ),
        (
            "prices: {models: {H100: {on-demand: 1}, H100 NVL: {on-demand: 2}}}",
            "prices.models: 'H100 NVL' can never match: 'H100' comes first",
        ),
        (
            "prices: {clusters: {lab: {models: "
            "{a100: {on-demand: 1}, A100 80GB: {on-demand: 2}}}}}",
            "prices.clusters.lab.models: 'A100 80GB' can never match: 'a100' comes first",
        ),
        (
            "prices: {clusters: {lab: {defualt: {on-demand: 1}}}}",
            "prices.clusters.lab: unknown key 'defualt'; did you mean 'default'?",
        ),
        ("prices: {region: eu}", "prices: unknown key 'region'"),
        ("prices: [1, 2]", "prices: expected a mapping, got [1, 2]"),
    ],
)
def test_bad_sections_name_the_file_and_key(tmp_path, text, message):
    path = config_file(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as exc:
        load_collector_config(path)
    assert str(exc.value).startswith(f"{path}: {message}")


def test_rows_list_the_table_as_written(tmp_path):
    prices = load_collector_config(config_file(tmp_path, EUR_PRICES)).prices
    rows = [(r.cluster, r.gpu_model, r.tier, r.price_per_hour) for r in prices.rows()]
    assert rows == [
        ("", "H100 NVL", "on-demand", 4.40),
        ("", "H100 NVL", "spot", 1.80),
        ("", "H100 NVL", "reserved", 4.40),
        ("", "h100", "on-demand", 3.70),
        ("", "h100", "spot", 1.50),
        ("", "h100", "reserved", 2.40),
        ("", "(default)", "on-demand", 1.80),
        ("", "(default)", "spot", 0.70),
        ("", "(default)", "reserved", 1.20),
        ("onprem", "(default)", "on-demand", 0.90),
        ("onprem", "(default)", "spot", 0.90),
        ("onprem", "(default)", "reserved", 0.90),
    ]


# --- a collector charging by the configured table ------------------------------------------------

T0 = 1_767_225_600.0  # aligned to the hour
STEP = 10
END = T0 + 3600


def points() -> list[list[NumberPoint]]:
    """One hour of two nodes with one H100 each: ``cloud-1`` (cluster cloud), ``lab-1``
    (cluster onprem), every GPU busy."""
    rounds = []
    for k in range(3600 // STEP):
        ns = int((T0 + k * STEP) * 1e9)
        batch = []
        for node, cluster in (("cloud-1", "cloud"), ("lab-1", "onprem")):
            resource: dict[str, AttrValue] = {"host.name": node, "gpuwarden.cluster": cluster}
            gpu: dict[str, AttrValue] = {"hw.id": f"GPU-{node}"}
            info = {**gpu, "hw.model": H100, "gpuwarden.gpu.index": 0}
            batch += [
                NumberPoint(resource, "hw.gpu.utilization", "1", "gauge", False, gpu, ns, 0.9),
                NumberPoint(resource, "gpuwarden.gpu.info", "1", "gauge", False, info, ns, 1.0),
            ]
        rounds.append(batch)
    return rounds


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CollectorService]:
    text = EUR_PRICES + f"database: {tmp_path / 'c.db'}\n"
    svc = build_service(load_collector_config(config_file(tmp_path, text)), clock=lambda: END)
    svc.registry.put(
        [
            Job(
                key=f"slurm:c:{n}",
                scheduler="slurm",
                job_id=str(n),
                state=JobState.COMPLETED,
                team=team,
                gpus=1,
                start_time=T0,
                end_time=END,
                price_tier="spot",
                allocations=(GpuAllocation(node, (0,)),),
            )
            for n, node, team in ((1, "cloud-1", "ml"), (2, "lab-1", "research"))
        ]
    )
    for batch in points():
        assert svc.accept(batch, "agents") == 0
    yield svc
    svc.storage.close()


def test_jobs_are_charged_at_the_configured_price_of_their_cluster(service):
    got = {t.group: t for t in totals(service.usage(T0, END))}
    assert got["slurm:c:1"].gpu_hours_allocated == pytest.approx(1.0)
    assert got["slurm:c:1"].cost == pytest.approx(1.50)  # EUR: h100 spot
    assert got["slurm:c:2"].cost == pytest.approx(0.90)  # EUR: onprem's default
    clusters = {g.node: g.cluster for g in service.detection_view.gpus()}
    assert clusters == {"cloud-1": "cloud", "lab-1": "onprem"}
    view = service.detection_view
    assert view.price(H100, "spot", "onprem") == pytest.approx(0.90)
    assert view.price(H100, "spot") == pytest.approx(1.50)


def cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuwarden")
    add_report_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_rollups_and_report_costs_explain(service, tmp_path):
    service.recompute_periods = 60
    assert service.run_accounting(now=END) > 0
    db = str(tmp_path / "c.db")
    path = str(tmp_path / "collector.yaml")
    until = str(int(END))
    out = io.StringIO()
    args = cli("report", "costs", "--db", db, "--until", until, "--explain", "--config", path)
    assert run_report(args, out=out) == 0
    text = out.getvalue()
    head, _, report = text.partition("\n\n")
    assert head.splitlines() == [
        f"prices per GPU-hour in EUR, from {path}",
        "(a GPU model matches every hw.model containing it, ignoring case, first match in this "
        "order; a cluster's rows override its region's, which override the fleet's; a tier not "
        "written costs on-demand)",
        "scope           gpu model  on-demand  spot  reserved",
        "(fleet)         H100 NVL        4.40  1.80      4.40",
        "(fleet)         h100            3.70  1.50      2.40",
        "(fleet)         (default)       1.80  0.70      1.20",
        "cluster onprem  (default)       0.90  0.90      0.90",
    ]
    assert report.splitlines()[0].split()[-5:] == ["kWh", "cost", "EUR", "kg", "CO2e"]
    teams = {line.split()[0]: line.split() for line in report.splitlines()[1:]}
    # these GPUs send no energy counter: energy is missing (a partial total), never 0
    assert teams["ml"][5:7] == ["-", "1.50*"]
    assert teams["research"][6] == "0.90*"
    out = io.StringIO()
    args = cli("report", "costs", "--db", db, "--until", until, "--explain", "--format", "json")
    assert run_report(args, out=out) == 0
    doc = json.loads(out.getvalue())
    assert doc["total"]["cost"] == pytest.approx(2.40)
    assert doc["currency"] == "EUR"  # the costs' currency, kept with the rows
    assert doc["prices"]["source"] == BUILTIN_SOURCE  # no --config: the built-in table
    assert doc["prices"]["currency"] == "USD"
    assert {
        "cluster": "",
        "gpu_model": "h100",
        "tier": "spot",
        "price_per_hour": 1.6,
        "region": "",
    } in doc["prices"]["rows"]


def test_explain_refuses_csv_and_a_bad_config(service, tmp_path, capsys):
    db = str(tmp_path / "c.db")
    args = cli("report", "costs", "--db", db, "--explain", "--format", "csv")
    assert run_report(args) == 1
    assert "--explain goes with --format table or json" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("prices: {currency: usd}\n", encoding="utf-8")
    assert run_report(cli("report", "costs", "--db", db, "--explain", "--config", str(bad))) == 1
    assert capsys.readouterr().err == (
        f"gpuwarden report: {bad}: prices.currency: expected an ISO 4217 currency code such as "
        "USD, EUR, got 'usd'\n"
    )


def test_the_status_page_section_shows_the_effective_table(tmp_path):
    prices = load_collector_config(config_file(tmp_path, EUR_PRICES)).prices
    got = prices_context(prices)
    assert (got["currency"], got["tiers"]) == ("EUR", ("on-demand", "spot", "reserved"))
    assert got["rows"] == [
        {"scope": "(fleet)", "model": "H100 NVL", "prices": ["4.40", "1.80", "4.40"]},
        {"scope": "(fleet)", "model": "h100", "prices": ["3.70", "1.50", "2.40"]},
        {"scope": "(fleet)", "model": "(default)", "prices": ["1.80", "0.70", "1.20"]},
        {"scope": "cluster onprem", "model": "(default)", "prices": ["0.90", "0.90", "0.90"]},
    ]
