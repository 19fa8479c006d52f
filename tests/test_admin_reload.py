"""Admin reloads: ``POST /v1/admin/reload`` swaps the tokens and the rules read again from the
configuration (an old token is refused afterwards, a new one accepted; new rules reach the
detection engine, the remediator and the dispatcher); parts that do not load keep the old
state and answer 400 with one line each; SIGHUP does the same in a real ``gpuwarden collector``
process."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from gpuwarden.collector.build import load_configured_rules
from gpuwarden.collector.config import load_collector_config
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.rules.loader import default_runbooks_dir
from gpuwarden.collector.storage.records import Incident
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.remediation_setup import Remediation, create_remediation
from tests.collector_server import free_port
from tests.test_collector_api import fleet

ADMIN = "admin-token-0123456789abcdef"
OLD_READER = "reader-token-old-0123456789"
NEW_READER = "reader-token-new-0123456789"

IDLE = """version: 1
rules:
  - id: idle-gpu
    detector: idle_gpu
    severity: warning
    owner: ml-platform
    runbook: idle-gpu.md
    actions:
      - kind: requeue
        mode: approve
    routes: ["slack:#gpu-waste"]
"""
ORPHANED = """version: 1
rules:
  - id: orphaned-gpu-memory
    detector: orphaned_memory
    severity: warning
    owner: gpu-infra
    runbook: orphaned-gpu-memory.md
    routes: ["slack:#gpu-infra"]
"""
BROKEN = """version: 1
rules:
  - id: broken
    detector: no_such_detector
    severity: warning
    owner: gpu-infra
    runbook: idle-gpu.md
"""


def tokens(reader: str) -> str:
    return f"admin root {ADMIN}\nreader grafana {reader}\n"


def write_config(tmp: Path, *, port: int | None = None) -> Path:
    (tmp / "rules").mkdir()
    (tmp / "rules" / "idle.yaml").write_text(IDLE)
    (tmp / "tokens").write_text(tokens(OLD_READER))
    config = tmp / "collector.yaml"
    config.write_text(
        f"tokens_file: {tmp / 'tokens'}\nrules: [{tmp / 'rules'}]\n"
        f"database: {tmp / 'collector.db'}\n" + (f"port: {port}\n" if port else "")
    )
    return config


@dataclass
class Running:
    app: web.Application
    detection: DetectionEngine
    remediation: Remediation


@pytest.fixture
def running(tmp_path: Path) -> Running:
    path = write_config(tmp_path)
    config = load_collector_config(path)
    rules = load_configured_rules(config)
    service = fleet()
    detection = DetectionEngine(service.detection_view, rules, storage=service.storage)
    remediation = create_remediation(
        service.storage,
        rules.enabled(),
        config.remediation,
        actuators=[],
        notifiers={},
        runbooks_dir=default_runbooks_dir(),
        environ={},
        alerting=config.alerting,
    )
    app = create_app(
        config,
        service=service,
        background=False,
        detection=detection,
        remediation=remediation,
        reload_source=lambda: load_collector_config(path),
    )
    return Running(app, detection, remediation)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_reload_swaps_the_tokens_old_refused_new_accepted(
    aiohttp_client, running, tmp_path
):
    client = await aiohttp_client(running.app)
    assert (await client.get("/v1/silences", headers=bearer(OLD_READER))).status == 200
    (tmp_path / "tokens").write_text(tokens(NEW_READER))
    assert (await client.get("/v1/silences", headers=bearer(NEW_READER))).status == 401
    refused = await client.post("/v1/admin/reload", headers=bearer(OLD_READER))
    assert refused.status == 403  # a reader may not reload
    resp = await client.post("/v1/admin/reload", headers=bearer(ADMIN))
    assert resp.status == 200
    assert await resp.json() == {
        "reloaded": ["tokens", "rules"],
        "kept": {},
        "tokens": 2,
        "rules": 1,
    }
    assert (await client.get("/v1/silences", headers=bearer(OLD_READER))).status == 401
    assert (await client.get("/v1/silences", headers=bearer(NEW_READER))).status == 200
    storage = running.remediation.storage
    (entry,) = [e for e in storage.audit() if e.action == "reload"]
    assert (entry.actor, entry.result, entry.reason) == ("root", "ok", "POST /v1/admin/reload")


async def test_a_reload_swaps_the_rules_everywhere(aiohttp_client, running, tmp_path):
    client = await aiohttp_client(running.app)
    assert [r.id for r in running.detection.rules] == ["idle-gpu"]
    (tmp_path / "rules" / "orphaned.yaml").write_text(ORPHANED)
    resp = await client.post("/v1/admin/reload", headers=bearer(ADMIN))
    assert (resp.status, (await resp.json())["rules"]) == (200, 2)
    expected = ["idle-gpu", "orphaned-gpu-memory"]
    assert sorted(r.id for r in running.detection.rules) == expected
    assert sorted(running.remediation.rules) == expected
    dispatcher = running.remediation.dispatcher
    assert dispatcher is not None
    incident = Incident("f", "orphaned-gpu-memory", "warning", 1.0, 1.0, incident_id=1)
    assert dispatcher.routes(incident) == ("slack:#gpu-infra",)
    page = await client.get("/runbooks/orphaned-gpu-memory", headers=bearer(NEW_READER))
    assert page.status == 401  # still the old reader token in the file
    page = await client.get("/runbooks/orphaned-gpu-memory", headers=bearer(OLD_READER))
    assert page.status == 200


async def test_rules_that_do_not_load_keep_the_old_ones(aiohttp_client, running, tmp_path, caplog):
    client = await aiohttp_client(running.app)
    (tmp_path / "rules" / "orphaned.yaml").write_text(ORPHANED)
    (tmp_path / "rules" / "zz-broken.yaml").write_text(BROKEN)
    with caplog.at_level(logging.ERROR, logger="gpuwarden.collector.web.reload"):
        resp = await client.post("/v1/admin/reload", headers=bearer(ADMIN))
    assert resp.status == 400
    body = await resp.json()
    assert body["reloaded"] == ["tokens"]
    (problem,) = body["kept"]["rules"]
    assert "zz-broken.yaml" in problem
    assert "no_such_detector" in problem
    assert [r.getMessage() for r in caplog.records] == [f"reload by root: rules kept: {problem}"]
    assert [r.id for r in running.detection.rules] == ["idle-gpu"]
    assert sorted(running.remediation.rules) == ["idle-gpu"]
    (entry,) = [e for e in running.remediation.storage.audit() if e.action == "reload"]
    assert entry.result == "partial"


async def test_a_tokens_file_that_does_not_load_keeps_the_old_tokens(
    aiohttp_client, running, tmp_path
):
    client = await aiohttp_client(running.app)
    (tmp_path / "tokens").write_text(f"grafana {NEW_READER}\n")  # the old two-column format
    (tmp_path / "rules" / "orphaned.yaml").write_text(ORPHANED)
    resp = await client.post("/v1/admin/reload", headers=bearer(ADMIN))
    assert resp.status == 400
    body = await resp.json()
    assert body["reloaded"] == []
    (problem,) = body["kept"]["config"]
    assert "two columns is the old '<name> <token>' format" in problem
    assert NEW_READER not in problem  # never the secret
    assert (await client.get("/v1/silences", headers=bearer(OLD_READER))).status == 200
    assert [r.id for r in running.detection.rules] == ["idle-gpu"]


async def test_a_tokens_file_without_tokens_would_lock_everyone_out_and_is_kept(
    aiohttp_client, running, tmp_path
):
    client = await aiohttp_client(running.app)
    (tmp_path / "tokens").write_text("# every token revoked by mistake\n")
    resp = await client.post("/v1/admin/reload", headers=bearer(ADMIN))
    body = await resp.json()
    assert (resp.status, body["reloaded"]) == (400, ["rules"])
    assert body["kept"]["tokens"] == [
        "the configuration names no token (every caller would be refused); keeping the 2 in force"
    ]
    assert (await client.get("/v1/silences", headers=bearer(OLD_READER))).status == 200


# --- SIGHUP in a real collector process ---------------------------------------------------------

WATCHDOG_SECONDS = 180.0


def status(port: int, token: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/silences", headers=bearer(token))
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_sighup_reloads_tokens_and_rules_in_a_running_collector(tmp_path):
    port = free_port()
    config = write_config(tmp_path, port=port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "collector", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # a watchdog, not a deadline under test: a hung collector ends the reads below
    watchdog = threading.Timer(WATCHDOG_SECONDS, proc.kill)
    watchdog.start()

    def wait_for_line(text: str) -> str:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"collector exited before logging {text!r}: {''.join(seen)[-2000:]}")

    try:
        wait_for_line(f"Running on http://127.0.0.1:{port}")
        assert status(port, OLD_READER) == 200
        (tmp_path / "tokens").write_text(tokens(NEW_READER))
        (tmp_path / "rules" / "orphaned.yaml").write_text(ORPHANED)
        os.kill(proc.pid, signal.SIGHUP)
        wait_for_line("reload by SIGHUP: reloaded tokens, rules")
        assert (status(port, OLD_READER), status(port, NEW_READER)) == (401, 200)
        (tmp_path / "rules" / "zz-broken.yaml").write_text(BROKEN)
        os.kill(proc.pid, signal.SIGHUP)
        line = wait_for_line("reload by SIGHUP: rules kept:")
        assert "zz-broken.yaml" in line
        assert status(port, NEW_READER) == 200
        assert proc.poll() is None
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.terminate()
            proc.wait(20)
        if proc.stderr is not None:
            proc.stderr.close()
