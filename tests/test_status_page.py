"""The status page on the scripted fleet: through aiohttp, and rendered by headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.remediate.policy import RemediationSettings
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.remediation_setup import create_remediation
from gpuwarden.collector.web.status_svg import Series, line_chart
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
    client = await aiohttp_client(create_app(CollectorConfig(), service=service, background=False))
    resp = await client.get("/status")
    assert resp.status == 200
    assert resp.headers["Content-Security-Policy"].startswith("default-src 'none'")
    page = await resp.text()
    assert "<script" not in page
    # 16 GPUs on two nodes; four open incidents, each with a chart of its evidence
    assert re.search(r'<div class="value">16</div><div class="label">GPUs reporting', page)
    assert page.count('class="incident"') == 4
    assert page.count('<svg class="chart"') == 5  # the fleet chart and one per incident
    assert "idle-gpu" in page
    assert "training-straggler" in page
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
    client = await aiohttp_client(create_app(CollectorConfig(), service=service, background=False))
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
        threshold=1.5,
    )
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg
    assert "&quot;title&quot; &amp; &lt;b&gt;" in svg
    assert svg.count("<circle") == 2  # a gap splits the line: two single points
    empty = line_chart([Series("x", [])], title="nothing")
    assert "no data in this window" in empty


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_headless_chromium_renders_incidents_actions_and_charts(service, tmp_path):  # noqa: F811
    detected(service)
    server = CollectorThread(service=service)
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
    assert dom.count('class="incident"') == 4
    assert dom.count("<polyline") >= 4
    assert dom.count('class="action"') >= 2
    assert "Waste leaderboard" in dom
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG")
    assert len(png) > 20_000  # a rendered page, not a blank one
