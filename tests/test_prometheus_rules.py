"""The Prometheus rules in ``rules/prometheus/``: valid for promtool, unit-tested, and honest.

``promtool`` comes with Debian's ``prometheus`` package (``scripts/system-packages.sh``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuwarden.collector.rules.loader import default_runbooks_dir

RULES = Path(__file__).resolve().parents[1] / "rules" / "prometheus"
RULE_FILE = RULES / "gpuwarden.rules.yml"
TEST_FILE = RULES / "tests" / "gpuwarden.test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_promtool_check_rules():
    result = promtool("check", "rules", str(RULE_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_promtool_unit_tests_pass():
    result = promtool("test", "rules", str(TEST_FILE))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_can_fail(tmp_path):
    """A wrong expectation fails: the unit tests are not vacuous."""
    broken = TEST_FILE.read_text().replace("value: 20\n", "value: 21\n", 1)
    assert broken != TEST_FILE.read_text()
    copy = tmp_path / "tests" / "broken.test.yml"
    copy.parent.mkdir()
    copy.write_text(broken)
    (tmp_path / "gpuwarden.rules.yml").write_text(RULE_FILE.read_text())
    result = promtool("test", "rules", str(copy))
    assert result.returncode != 0


def alerting_rules() -> list[dict[str, object]]:
    groups = yaml.safe_load(RULE_FILE.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_every_alert_has_summary_description_severity_and_an_existing_runbook():
    alerts = alerting_rules()
    assert len(alerts) >= 8
    runbooks = {p.stem for p in default_runbooks_dir().glob("*.md")}
    for rule in alerts:
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert {"summary", "description", "runbook_url"} <= set(annotations), rule["alert"]
        labels = rule["labels"]
        assert isinstance(labels, dict)
        assert labels["severity"] in {"critical", "warning", "info"}, rule["alert"]
        match = re.fullmatch(r"http://gpuwarden-collector:4318/runbooks/([a-z0-9-]+)",
                             str(annotations["runbook_url"]))  # fmt: skip
        assert match, annotations["runbook_url"]
        assert match.group(1) in runbooks, f"{rule['alert']}: no runbooks/{match.group(1)}.md"


def test_every_alert_is_unit_tested():
    tested = {
        case["alertname"]
        for test in yaml.safe_load(TEST_FILE.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    missing = {str(rule["alert"]) for rule in alerting_rules()} - tested
    # Degraded GPUs and rejected points share their shape with tested alerts; the rest must fire
    assert missing <= {"GpuwardenGPUDegraded", "GpuwardenCollectorRejectingPoints"}, missing
