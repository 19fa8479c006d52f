"""Runbooks: every rule has one, every one renders with an incident's facts, errors are clear,
the sandbox holds, and the HTML page escapes what comes from the incident."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest

from gpuwarden.collector.alerts.runbooks import (
    Links,
    RunbookError,
    RunbookRenderer,
    markdown_to_html,
    runbook_context,
)
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import Rule, Selector, Severity
from gpuwarden.collector.storage.base import ActionRecord
from gpuwarden.collector.storage.records import Incident, ModelDeployment

LINKS = Links(base_url="http://collector:4318", dashboard_base_url="http://grafana:3000")
RULES = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())

#: Evidence as each detector reports it (keys from the detectors; values made up).
SAMPLE_EVIDENCE: dict[str, dict[str, object]] = {
    "idle_gpu": {
        "job": "slurm:a100:4242",
        "team": "vision",
        "node": "gpu-07",
        "nodes": "gpu-07",
        "gpu": "GPU-5d1c,GPU-9e02",
        "gpu_ids": "gpu-07/GPU-5d1c,gpu-07/GPU-9e02",
        "idle_gpus": 2,
        "job_gpus": 8,
        "window_minutes": 30.0,
        "mean_utilization_ratio": 0.012,
        "idle_gpu_hours": 0.5,
        "wasted_usd": 1.23,
        "price_tier": "on-demand",
    },
    "hardware_fault": {"node": "gpu-07", "gpu": "GPU-5d1c", "reasons": "XID 79 x1"},
    "metric_anomaly": {
        "metric": "gpuwarden.model.requests",
        "model": "llm-large",
        "value": 0.2,
        "score": 0.71,
        "threshold": 0.5328,
        "known_minutes": 720,
        "baseline_median": 42.0,
        "at": 1_800_000_540.0,
    },
    "input_bound": {
        "job": "slurm:a100:4242",
        "node": "gpu-07",
        "mean_gpu_utilization_ratio": 0.46,
        "reasons": "oscillating utilisation",
        "stall_share": 0.5,
        "stall_level": 0.02,
        "busy_level": 0.9,
        "mean_stall_seconds": 20.0,
        "regime_separation": 29.3,
    },
    "level_shift": {
        "metric": "hw.gpu.utilization",
        "node": "gpu-07",
        "gpu": "GPU-5d1c",
        "job": "slurm:a100:4242",
        "level": 0.41,
        "baseline_level": 0.93,
        "change": -0.52,
        "gpus": 8,
        "gpus_shifted": 8,
        "traffic_ratio": None,
        "p_value": 1e-9,
        "score": 14.2,
    },
    "alertmanager": {
        "node": "gpu-07",
        "gpu": "0",
        "alertname": "GpuwardenGPUFailed",
        "source": "alertmanager",
        "alert_fingerprint": "1751935677e36f4d",
        "labels": {"alertname": "GpuwardenGPUFailed", "node": "gpu-07", "gpu": "0"},
    },
}
DEFAULT_EVIDENCE = {
    "job": "slurm:a100:4242",
    "node": "gpu-07",
    "gpu": "GPU-5d1c",
    "model": "llm-large",
    "metric": "gpuwarden.model.request.latency",
    "score": 5.2,
}


def sample_incident(rule: Rule) -> Incident:
    evidence = SAMPLE_EVIDENCE.get(rule.detector, DEFAULT_EVIDENCE)
    return Incident(
        fingerprint=f"fp-{rule.id}",
        rule_id=rule.id,
        severity=str(rule.severity),
        first_seen=1_800_000_000.0,
        last_seen=1_800_000_600.0,
        evidence={"subject": "gpu-07/GPU-5d1c", "summary": f"{rule.id} fired", **evidence},
        incident_id=17,
    )


JOB = Job(
    key="slurm:a100:4242",
    scheduler="slurm",
    job_id="4242",
    state=JobState.RUNNING,
    name="train-resnet",
    owner="ada",
    team="vision",
    gpus=4,
    allocations=(GpuAllocation("gpu-07", (0, 1, 2, 3)),),
    price_tier="on-demand",
)
MODEL = ModelDeployment("llm-large", "v7", 4, fallback_model="llm-small")


@pytest.fixture(scope="module")
def renderer() -> RunbookRenderer:
    return RunbookRenderer(default_runbooks_dir())


def test_every_default_rule_names_an_existing_runbook() -> None:
    assert RULES.rules
    for rule in RULES.rules:
        assert (default_runbooks_dir() / rule.runbook).is_file(), rule.id


@pytest.mark.parametrize("rule", RULES.rules, ids=lambda r: r.id)
def test_every_runbook_renders_for_a_sample_incident(renderer: RunbookRenderer, rule: Rule) -> None:
    action = ActionRecord(
        17, "k", rule.actions[0].kind, "slurm:a100:4242", "auto", True, "dry_run", 1.0, 1.0
    )
    context = runbook_context(
        rule, LINKS, incident=sample_incident(rule), job=JOB, model=MODEL, actions=[action]
    )
    text = renderer.markdown(rule.runbook, context)
    for section in ("What it means", "Confirm", "What automation does", "Manual steps",
                    "Rollback", "Escalation"):  # fmt: skip
        assert section in text, f"{rule.runbook}: no '{section}' section"
    assert "{{" not in text
    assert "{%" not in text
    assert "Incident 17" in text
    assert f"{action.action} on `slurm:a100:4242`" in text  # actions taken or proposed
    assert "http://collector:4318/runbooks/" + rule.id in text
    assert "http://grafana:3000/d/gpuwarden-fleet?var-job=slurm%3Aa100%3A4242" in text
    assert "ada" in text  # the owner
    html = renderer.html(rule.runbook, context, title=rule.id)
    assert html.startswith("<!doctype html>")
    assert "<h2>Confirm</h2>" in html


@pytest.mark.parametrize("rule", RULES.rules, ids=lambda r: r.id)
def test_every_runbook_renders_without_an_incident(renderer: RunbookRenderer, rule: Rule) -> None:
    text = renderer.markdown(rule.runbook, runbook_context(rule, LINKS))
    # budget rules' subject is the budget (team:nlp): no job, node, model or GPU
    assert any(f"<{fact}>" in text for fact in ("job", "node", "model", "GPU", "subject"))


def test_every_runbook_file_renders(renderer: RunbookRenderer) -> None:
    files = sorted(
        p.name for p in default_runbooks_dir().glob("*.md") if not p.name.startswith("_")
    )
    assert len(files) >= len(RULES.rules)
    for name in files:
        assert renderer.markdown(name, runbook_context(None, LINKS)).strip(), name


def test_the_idle_runbook_carries_the_incident_figures(renderer: RunbookRenderer) -> None:
    rule = RULES.get("idle-gpu")
    assert rule is not None
    incident = sample_incident(rule)
    text = renderer.markdown(rule.runbook, runbook_context(rule, LINKS, incident=incident))
    assert "Job `slurm:a100:4242`" in text
    assert "30 minutes ($1.23 of GPU time wasted" in text
    assert "left 2 of its 8 GPUs idle (gpu-07/GPU-5d1c,gpu-07/GPU-9e02)" in text
    assert "- mean_utilization_ratio: 0.012" in text
    assert "requeue (mode approve): what the rule does" in text  # proposed by the rule


def test_renderer_check_finds_no_problem_in_the_default_runbooks(renderer: RunbookRenderer) -> None:
    assert renderer.check(RULES.rules, LINKS) == []


def rule_for(runbook: str) -> Rule:
    return Rule(
        id="r1",
        detector="idle_gpu",
        selector=Selector(),
        parameters=MappingProxyType({}),
        severity=Severity.INFO,
        owner="me",
        runbook=runbook,
    )


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ("# t\n\nok\n{% if %}\n", r"broken\.md:4: syntax error"),
        ("# t\n\n{{ job.nmae }}\n", r"broken\.md:3: error: .*nmae"),
        ("# t\n{{ nothing_like_this }}\n", r"broken\.md:2: error: .*nothing_like_this"),
        ("{{ job.__class__ }}", r"broken\.md:1: unsafe access"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", r"broken\.md:1: unsafe access"),
        ("{{ rule.actions.__len__.__self__ }}", r"broken\.md:1: (unsafe access|error)"),
        ("{{ 1 / 0 }}", r"broken\.md:1: error: division by zero"),
    ],
)
def test_template_errors_name_the_file_and_line(tmp_path: Path, template: str, words: str) -> None:
    (tmp_path / "broken.md").write_text(template)
    renderer = RunbookRenderer(tmp_path)
    with pytest.raises(RunbookError, match=words):
        renderer.markdown("broken.md", runbook_context(rule_for("broken.md"), LINKS))
    assert renderer.check([rule_for("broken.md")], LINKS)[0].startswith("rule r1: ")


def test_a_missing_runbook_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RunbookError, match=r"gone\.md: no such runbook"):
        RunbookRenderer(tmp_path).markdown("gone.md", {})


def test_the_html_page_escapes_incident_facts(tmp_path: Path) -> None:
    (tmp_path / "r.md").write_text("# {{ incident.summary }}\n\n- [x]({{ evidence.url }})\n")
    rule = rule_for("r.md")
    incident = Incident(
        fingerprint="fp",
        rule_id="r1",
        severity="info",
        first_seen=0.0,
        last_seen=0.0,
        evidence={"summary": "<script>alert(1)</script>", "url": "javascript:alert(1)"},
        incident_id=1,
    )
    page = RunbookRenderer(tmp_path).html(
        "r.md", runbook_context(rule, LINKS, incident=incident), title="<b>t</b>"
    )
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert 'href="javascript' not in page
    assert "&lt;b&gt;t&lt;/b&gt;" in page


def test_markdown_to_html_covers_what_runbooks_use() -> None:
    html = markdown_to_html(
        "# T\n\nSome **bold** and `code` <i>.\n\n- one\n  more\n- two\n\n1. first\n\n"
        "| a | b |\n|---|---|\n| 1 | 2 |\n\n```\nx < y\n```\n[link](https://example.org/x)\n"
    )
    assert "<h1>T</h1>" in html
    assert "<p>Some <strong>bold</strong> and <code>code</code> &lt;i&gt;.</p>" in html
    assert "<ul>\n<li>one more</li>\n<li>two</li>\n</ul>" in html
    assert "<ol>\n<li>first</li>\n</ol>" in html
    assert "<tr><td>a</td><td>b</td></tr>\n<tr><td>1</td><td>2</td></tr>" in html
    assert "<pre><code>x &lt; y</code></pre>" in html
    assert '<a href="https://example.org/x">link</a>' in html


def test_the_input_bound_runbook_describes_the_stalls_from_the_regimes(
    renderer: RunbookRenderer,
) -> None:
    rule = next(r for r in RULES.rules if r.detector == "input_bound")
    with_regimes = renderer.markdown(
        rule.runbook, runbook_context(rule, LINKS, incident=sample_incident(rule), job=JOB)
    )
    stalls = "stalled 0.5 of the\ntime (at 0.02, against 0.9 busy), for\n20 s per stall"
    assert stalls in with_regimes
    plain = renderer.markdown(rule.runbook, runbook_context(rule, LINKS))
    assert "stalled unknown of the" in plain
