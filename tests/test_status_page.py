"""The status page on the scripted fleet: through aiohttp, and rendered by headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.remediate.policy import RemediationSettings
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import Incident
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.remediation_setup import create_remediation
from gpuwarden.collector.web.status_charts import P_VALUE, UTILIZATION, incident_axes
from gpuwarden.collector.web.status_page import incident_view
from gpuwarden.collector.web.status_svg import Axis, Series, Threshold, date, line_chart
from tests.collector_server import CollectorThread
from tests.test_accounting_scenario import END, HOURS, T0, service  # noqa: F401 - the fixture

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def detected(service: CollectorService) -> CollectorService:  # noqa: F811
    """Accounting, one detection cycle and one remediation pass (dry-run, no actuators)."""
    service.recompute_periods = HOURS * 60
    service.run_accounting(now=END)
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    DetectionEngine(
        service.detection_view, rules, storage=service.storage, clock=lambda: T0 + 4200
    ).run_cycle(now=T0 + 4200)
    remediation = create_remediation(
        service.storage,
        rules.enabled(),
        RemediationSettings(),
        actuators=[],
        notifiers={},
        runbooks_dir=default_runbooks_dir(),
        environ={},
        clock=lambda: T0 + 4200,
    )
    remediation.remediator.tick()
    return service


async def test_status_page_shows_fleet_incidents_waste_actions_and_audit(
    aiohttp_client,
    service,  # noqa: F811
):
    detected(service)
    client = await aiohttp_client(
        create_app(CollectorConfig(allow_unauthenticated=True), service=service, background=False)
    )
    resp = await client.get("/status")
    assert resp.status == 200
    assert resp.headers["Content-Security-Policy"].startswith("default-src 'none'")
    page = await resp.text()
    assert "<script" not in page
    # 16 GPUs on two nodes; two open incidents (the idle jobs), each with a chart of its evidence
    assert re.search(r'<div class="value">16</div><div class="label">GPUs reporting', page)
    assert page.count('class="incident"') == 2
    assert page.count('<svg class="chart"') == 3  # the fleet chart and one per incident
    assert "idle-gpu" in page
    # the fleet chart: one legend entry per node, the axis in %, the times as dates
    fleet = page[page.index('id="fleet"') : page.index('id="incidents"')]
    legend = fleet[fleet.index('<g class="legend">') : fleet.index("</svg>")]
    nodes = re.findall(r'class="tick">([^<]*)</text>', legend)
    assert nodes == sorted(service.nodes)
    assert 'class="unit">%</text>' in fleet
    assert re.search(r'class="tick">\d{4}-\d\d-\d\d \d\d:\d\d UTC</text>', fleet)
    assert "training-straggler" not in page  # an idle GPU among working peers is not slow
    # the waste leaderboard names the idle jobs and their idle cost, in the table's currency
    waste = page[page.index('id="waste"') : page.index('id="actions"')]
    assert "slurm:c:3" in waste
    assert re.search(r'<td class="num">[\d,.]+ USD</td>', waste)
    assert "$" not in waste
    # the effective price table: one row per GPU model it lists, a column per tier
    prices = page[page.index('id="prices"') :]
    assert "Prices per GPU-hour (USD)" in prices
    table = service.accounting.prices
    assert prices.count('class="price"') == len(table.rows()) // 3
    assert "<td>(fleet)</td><td>h100</td>" in prices
    # actions: the idle-gpu requeue waits for approval (the rule's mode), logged in the audit
    actions = page[page.index('id="actions"') : page.index('id="audit"')]
    assert actions.count('class="action"') >= 2
    assert "requeue" in actions
    audit = page[page.index('id="audit"') :]
    assert "requeue" in audit


async def test_incident_page_and_errors(aiohttp_client, service):  # noqa: F811
    detected(service)
    client = await aiohttp_client(
        create_app(CollectorConfig(allow_unauthenticated=True), service=service, background=False)
    )
    incident = service.storage.incidents()[0]
    resp = await client.get(f"/status/incidents/{incident.incident_id}")
    assert resp.status == 200
    page = await resp.text()
    assert '<svg class="chart"' in page
    assert incident.rule_id in page
    assert (await client.get("/status/incidents/999999")).status == 404
    assert (await client.get("/status/incidents/abc")).status == 400


def test_charts_escape_labels_and_say_when_empty():
    svg = line_chart(
        [Series("<script>alert(1)</script>", [(0.0, 1.0), (60.0, float("nan")), (120.0, 2.0)])],
        title='a "title" & <b>',
        thresholds=[Threshold(1.5, "<i>limit</i>", Axis())],
    )
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg
    assert "&quot;title&quot; &amp; &lt;b&gt;" in svg
    assert "<i>" not in svg
    assert svg.count("<circle") == 2  # a gap splits the line: two single points
    empty = line_chart([Series("x", [])], title="nothing")
    assert "no data in this window" in empty


def _texts(svg: str, cls: str) -> list[str]:
    return re.findall(rf'class="{cls}">([^<]*)</text>', svg)


def _legend(svg: str) -> list[str]:
    block = svg[svg.index('<g class="legend">') :]
    return re.findall(r"<text[^>]*>([^<]*)</text>", block)


T = 1_764_000_000.0  # 2025-11-24 16:00 UTC


def test_a_threshold_in_another_unit_gets_its_own_axis():
    """A deploy's p-value is not drawn on the latency axis: it has a right axis of its own."""
    latency = [(T + 60 * i, 0.3 + 0.6 * i / 10) for i in range(11)]  # 0.3 .. 0.9 s
    svg = line_chart(
        [Series("p99 latency", latency)],
        title="deploy-regression",
        axis=Axis("s"),
        thresholds=[Threshold(0.01, "p-value below", P_VALUE)],
    )
    ticks = _texts(svg, "tick")
    # the left axis spans the latencies only (0.3 .. 0.9 s), not down to the p-value
    assert ticks[:3] == ["0.3", "0.6", "0.9"]
    assert _texts(svg, "unit") == ["s", "p-value"]  # one unit per axis
    legend = _legend(svg)
    assert legend[0] == "p99 latency"
    assert legend[1] == "p-value below: 0.01 p-value (right axis)"


def test_a_threshold_in_the_series_unit_shares_its_axis_and_ratios_show_in_percent():
    util = [(T + 60 * i, 0.5 + 0.04 * i) for i in range(11)]  # 50 % .. 90 %
    svg = line_chart(
        [Series("gpu-node-a", util, "#2f6fb0"), Series("gpu-node-b", util, "#c2410c")],
        title="utilisation",
        axis=UTILIZATION,
        thresholds=[Threshold(0.05, "idle below", UTILIZATION)],
    )
    ticks = _texts(svg, "tick")
    assert ticks[:3] == ["5", "48", "90"]  # the 5 % threshold is on this axis: it stretches it
    assert _texts(svg, "unit") == ["%"]
    assert _legend(svg) == ["gpu-node-a", "gpu-node-b", "idle below: 5 %"]
    assert svg.count('class="threshold"') == 1


def test_chart_times_are_utc_dates_not_unix_seconds():
    points = [(T, 1.0), (T + 3 * 3600, 2.0)]
    svg = line_chart([Series("x", points)], title="dates")
    dates = [t for t in _texts(svg, "tick") if ":" in t]
    assert dates == [f"{date(T)} UTC", date(T + 1.5 * 3600), date(T + 3 * 3600)]
    assert dates[0].startswith(time.strftime("%Y-%m-%d", time.gmtime(T)))
    assert str(int(T)) not in svg


def test_incident_units_come_from_the_evidence():
    deploy = {
        "metric": "vllm:e2e_request_latency_seconds",
        "test": "mannwhitney",
        "threshold": 0.01,
    }
    axis, marks = incident_axes(deploy)
    assert axis.unit == "s"
    assert [(m.value, m.axis) for m in marks] == [(0.01, P_VALUE)]
    idle = {"threshold_ratio": 0.05, "mean_utilization_ratio": 0.01}
    assert incident_axes(idle) == (UTILIZATION, [Threshold(0.05, "idle below", UTILIZATION)])
    util_axis, _ = incident_axes({"metric": "hw.gpu.utilization", "p_value": 0.001})
    assert util_axis == UTILIZATION  # the catalog's unit "1": a ratio, shown in %


def test_incident_facts_show_times_as_dates():
    incident = Incident(
        fingerprint="f",
        rule_id="deploy-regression",
        severity="critical",
        first_seen=T,
        last_seen=T + 60,
        evidence={
            "subject": "llama-70b",
            "metric": "vllm:e2e_request_latency_seconds",
            "deploy_time": T - 600,
            "threshold": 0.01,
            "test": "mannwhitney",
            "points": [[T - 600 + 60 * i, 0.4 + 0.05 * i] for i in range(10)],
        },
        incident_id=7,
    )
    view = incident_view(incident)
    assert dict(view.facts)["deploy_time"] == time.strftime(
        "%Y-%m-%d %H:%M:%S", time.gmtime(T - 600)
    )
    assert "(right axis)" in view.chart


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_headless_chromium_renders_incidents_actions_and_charts(service, tmp_path):  # noqa: F811
    detected(service)
    server = CollectorThread(service=service, unauthenticated=True)  # a browser sends no token
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/status"
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
        ]
        assert CHROMIUM is not None
        dom = subprocess.run(
            [CHROMIUM, *flags, "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        shot = Path(os.environ.get("GPUWARDEN_SCREENSHOT", tmp_path / "status.png"))
        subprocess.run(
            [CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1280,2400", url],
            capture_output=True,
            timeout=120,
            check=True,
        )
    finally:
        server.stop()
    # what the browser built from the page
    assert dom.count('class="incident"') == 2
    assert dom.count("<polyline") >= 4
    assert dom.count('class="action"') >= 2
    assert "Waste leaderboard" in dom
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG")
    assert len(png) > 20_000  # a rendered page, not a blank one
