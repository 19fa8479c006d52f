"""The Grafana dashboards in ``dashboards/``: current schema, variables, and honest queries.

Whether every panel query returns data is checked against a real Prometheus scraping the demo
fleet (``tests/test_dashboards_e2e.py``); this file checks the JSON itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

DASHBOARDS = Path(__file__).resolve().parents[1] / "dashboards"
RULES = Path(__file__).resolve().parents[1] / "rules" / "prometheus" / "gpuwarden.rules.yml"
FILES = sorted(DASHBOARDS.glob("*.json"))
NAMES = re.compile(r"\b(gpuwarden(?:_[a-z0-9]+)+|gpuwarden:[a-z0-9_:]+)\b")
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def expressions(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(board) for t in p["targets"]]
    exprs += [a["expr"] for a in board["annotations"]["list"] if "expr" in a]
    exprs += [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_the_four_views_exist():
    assert {load(p)["uid"] for p in FILES} == {
        "gpuwarden-fleet",
        "gpuwarden-jobs-cost",
        "gpuwarden-models",
        "gpuwarden-remediation",
    }


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_schema_datasource_variable_and_panels(path: Path):
    board = load(path)
    assert board["schemaVersion"] >= 39
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "cluster" in variables
    for name, variable in variables.items():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}", name
            assert variable["includeAll"], name
            assert variable["allValue"] == ".*", name
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        assert panel.get("description"), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval", "__range"}
            assert used <= set(variables), (panel["title"], used - set(variables))
            assert 'cluster=~"$cluster"' in target["expr"], panel["title"]


def test_every_metric_named_is_exposed_or_recorded():
    """Names must come from the collector's exposition source or our recording rules."""
    source = "\n".join(
        p.read_text() for p in (Path(__file__).resolve().parents[1] / "collector").rglob("*.py")
    )
    exposed = set(re.findall(r'"(gpuwarden_[a-z0-9_]+)"', source))
    exposed |= {f"gpuwarden_gpu_{key}" for key in re.findall(r'GpuReading\("([a-z_]+)"', source)}
    exposed |= {
        f"gpuwarden_collector_{name}" for name in re.findall(r'\("([a-z_]+)", "[A-Z]', source)
    }
    groups = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    for path in FILES:
        for expr in expressions(load(path)):
            for name in NAMES.findall(expr):
                base = name
                for suffix in SUFFIXES:
                    base = base.removesuffix(suffix)
                assert name in recorded or base in exposed, (path.name, name)
