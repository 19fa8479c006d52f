"""The detection cycle with the default rules, and a collector that refuses bad rules."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.storage.records import IncidentState
from tests.collector_server import free_port
from tests.test_accounting_scenario import T0, service  # noqa: F401 - the fixture


def test_default_rules_open_idle_incidents_on_the_scripted_fleet(service):  # noqa: F811
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    engine = DetectionEngine(
        service.detection_view, rules, storage=service.storage, clock=lambda: T0 + 4200
    )
    assert engine.not_implemented == ()  # every detector of the default rules runs
    result = engine.run_cycle(now=T0 + 4200)
    assert result.failed_rules == ()
    # GPU-a-2 idles while its job's 3 other GPUs work: its job is idle (an idle GPU among working
    # peers is idle-gpu's finding, not a straggler's); GPU-b-5 likewise. Nothing else is wrong.
    assert result.opened == 2
    incidents = service.storage.incidents(state=IncidentState.OPEN)
    found = sorted((i.rule_id, str(i.evidence["gpu"])) for i in incidents)
    assert found == [("idle-gpu", "GPU-a-2"), ("idle-gpu", "GPU-b-5")]
    # a later cycle over the same data updates rather than duplicates
    assert engine.run_cycle(now=T0 + 4200).opened == 0
    assert len(service.storage.incidents()) == 2


def run_collector(tmp: Path, extra: str) -> subprocess.Popen[str]:
    (tmp / "tokens").write_text("reader a tok-0123456789abcdef0123\n")
    bad = tmp / "rules"
    bad.mkdir()
    (bad / "bad.yaml").write_text(
        "rules:\n  - id: idle\n    detector: idle_gpu\n    severity: warning\n"
        "    owner: me\n    runbook: idle-gpu.md\n    parameters: {window_seconds: -5}\n"
    )
    (tmp / "c.yaml").write_text(
        f"port: {free_port()}\ntokens_file: {tmp / 'tokens'}\ndatabase: {tmp / 'c.db'}\n"
        f"rules: [{bad}]\n{extra}"
    )
    return subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "collector", "--config", str(tmp / "c.yaml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_collector_refuses_to_start_with_a_broken_rules_file(tmp_path):
    proc = run_collector(tmp_path, "")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "bad.yaml: rules[0] (idle).parameters.window_seconds" in err
    assert "skip_bad_rules" in err


def test_with_skip_bad_rules_it_starts_ready_and_lists_them_on_readyz(tmp_path):
    proc = run_collector(tmp_path, "skip_bad_rules: true\n")
    port = int(
        next(
            line
            for line in (tmp_path / "c.yaml").read_text().splitlines()
            if line.startswith("port:")
        ).split()[1]
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # the external process's readiness endpoint, polled until a deadline
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                    status, body = resp.status, json.loads(resp.read())
                break
            except urllib.error.HTTPError as exc:
                exc.close()
                raise AssertionError(
                    f"/readyz answered {exc.code} with only a rule skipped"
                ) from None
            except OSError:
                assert time.monotonic() < deadline, "collector did not start"
                time.sleep(0.1)
        assert status == 200
        assert any("bad.yaml: rules[0] (idle)" in p for p in body["skipped_rules"])
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "rule skipped: " in err
    assert "bad.yaml" in err
