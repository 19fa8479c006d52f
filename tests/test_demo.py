"""The demo end to end, scraped by a real Prometheus (Debian ``prometheus``).

One run for the module: Prometheus scrapes the demo's collector every second (with our
recording rules loaded) while the demo runs. Then: the report has detections and actions,
``gpuwarden report costs`` matches the scenario, and every dashboard panel query returns data.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.collector_server import free_port
from tests.prometheus_server import PrometheusServer, prometheus_binary

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
RULES = ROOT / "rules" / "prometheus" / "gpuwarden.rules.yml"
DURATION = 100


@dataclass(frozen=True)
class DemoRun:
    out: str
    err: str
    db: Path
    prometheus: PrometheusServer | None
    start: float
    end: float


def run_demo(db: Path, port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", "--log-level", "WARNING", "demo",
         "--duration", str(DURATION), "--speed", "60", "--db", str(db), "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=DURATION + 120,
        check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    port = free_port()
    start = time.time()
    if prometheus_binary() is None:
        proc = run_demo(db, port)
        assert proc.returncode == 0, proc.stderr[-3000:]
        yield DemoRun(proc.stdout, proc.stderr, db, None, start, time.time())
        return
    targets = {"gpuwarden-collector": f"127.0.0.1:{port}"}
    with PrometheusServer(targets, rule_files=[RULES], labels={"cluster": "demo"}) as prom:
        proc = run_demo(db, port)
        assert proc.returncode == 0, proc.stderr[-3000:]
        time.sleep(3)  # the last rule evaluations
        yield DemoRun(proc.stdout, proc.stderr, db, prom, start, time.time())


def test_the_demo_ends_without_a_traceback(demo):
    """Shutdown is orderly: detection stops before the store closes (issue 14)."""
    assert "Traceback" not in demo.err, demo.err[-3000:]
    assert "the store is closed" not in demo.err


def test_the_report_has_waste_detections_and_actions(demo):
    out = demo.out
    assert "gpuwarden demo report" in out
    waste = re.search(r"total\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", out)
    assert waste is not None
    assert float(waste.group(2)) > 0  # idle GPU-hours found
    for rule in ("idle-gpu", "slo-burn-fast", "gpu-hardware-fault", "job-preemption"):
        assert re.search(rf"#\d+\s+\w+\s+{rule}\s", out), rule
    # the idle notebook was approved through the signed link and requeued for real, once
    assert "operator: approved through the signed link -> HTTP 200" in out
    assert "requeued for real on the simulated scheduler: slurm:demo:102" in out
    assert re.search(r"requeue\s+slurm:demo:102\s+approve\s+verified", out)
    # the slow deploy burned the SLO: scaling had no room (escalated), so traffic moved to the
    # smaller model; once the incident resolved and the settle time passed, it was restored
    assert re.search(r"scale_up\s+llama-70b\s+auto\s+escalated", out)
    assert "router: 50% of llama-70b traffic now goes to llama-8b" in out
    assert re.search(r"degrade\s+llama-70b\s+approve\s+restored", out)
    assert "router: all llama-70b traffic is back on llama-70b" in out
    assert "status page: http://127.0.0.1:" in out
    assert "metrics:     http://127.0.0.1:" in out


def test_report_costs_on_the_demo_fleet_matches_the_scenario(demo):
    report = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "report", "costs", "--db", str(demo.db),
         "--since", "1h", "--by", "job", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )  # fmt: skip
    groups = {g["group"]: g for g in json.loads(report.stdout)["groups"]}
    # jobs 101 (on-demand), 104 (reserved) and 105 (on-demand) hold 8 H100s for the whole run
    full = {key: groups[f"slurm:demo:{key}"] for key in ("101", "104", "105")}
    hours = full["101"]["gpu_hours_allocated"]
    assert hours > 0
    for group in full.values():
        assert group["gpu_hours_allocated"] == pytest.approx(hours, rel=0.02)
    assert full["101"]["cost"] == pytest.approx(hours * 4.00, rel=0.02)
    assert full["104"]["cost"] == pytest.approx(hours * 2.60, rel=0.02)
    # the notebook (requeued) and the spot job (preempted) held their 4 GPUs for less
    notebook, spot = groups["slurm:demo:102"], groups["slurm:demo:103"]
    assert 0 < notebook["gpu_hours_allocated"] < hours / 2
    assert 0 < spot["gpu_hours_allocated"] < hours / 2
    assert spot["cost"] == pytest.approx(spot["gpu_hours_allocated"] * 1.60, rel=0.02)
    # the notebook idled, training worked
    assert notebook["gpu_hours_busy"] == 0
    assert notebook["gpu_hours_idle"] > 0
    assert full["105"]["gpu_hours_busy"] > 0


def _substituted(expr: str) -> str:
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "10m")
    return re.sub(r"\$\w+", ".*", expr)


def _label_values(definition: str) -> str:
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", definition)
    assert match, definition
    return f"count by ({match.group(2)}) ({_substituted(match.group(1))})"


def _queries() -> list[tuple[str, str, str]]:
    found = []
    for path in DASHBOARDS:
        board: dict[str, Any] = json.loads(path.read_text())
        found += [
            (path.stem, panel["title"], _substituted(target["expr"]))
            for panel in board["panels"]
            for target in panel.get("targets", [])
        ]
        found += [
            (path.stem, f"annotation {note['name']}", _substituted(note["expr"]))
            for note in board["annotations"]["list"]
            if "expr" in note
        ]
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                label = _label_values(variable["definition"])
                found.append((path.stem, f"variable {variable['name']}", label))
    return found


def test_every_dashboard_query_returns_data_from_prometheus(demo):
    if demo.prometheus is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    empty = []
    queries = _queries()
    assert len(queries) > 60
    for board, title, expr in queries:
        result = demo.prometheus.query_range(expr, demo.start, demo.end, 5)
        if not result:
            empty.append(f"{board} / {title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_every_metric_the_dashboards_and_rules_name_is_exposed(demo):
    if demo.prometheus is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    text = "\n".join(p.read_text() for p in DASHBOARDS) + RULES.read_text()
    names = set(re.findall(r"\b(gpuwarden(?:_[a-z0-9]+)+|gpuwarden:[a-z0-9_:]+)\b", text))
    missing = [
        name
        for name in sorted(names)
        if not demo.prometheus.query_range(f'count({{__name__="{name}"}})', demo.start, demo.end, 5)
    ]
    assert not missing, missing
