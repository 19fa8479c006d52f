"""The idle-GPU rule on the scripted known-truth fleet: exactly the idle allocated GPUs fire."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.incidents import IncidentTracker
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.remediate.approvals import SECRET_ENV
from gpuwarden.collector.remediate.policy import RemediationSettings
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.remediation_setup import create_remediation
from tests.detectors import make_rule, run_rule
from tests.test_accounting_scenario import T0, service  # noqa: F401 - the fixture
from tests.test_detect_waste import feed, gpu_points, job, make_service
from tests.test_remediator import FakeActuator, RecordingNotifier

WINDOW = 1800.0
IDLE = make_rule("idle_gpu", "idle-gpu", window_seconds=WINDOW, utilization_below=0.05)


def firing(svc, now: float) -> dict[str, dict[str, object]]:
    found = run_rule(svc, IDLE, now)
    assert sorted(f.subject for f in found) == ["slurm:c:1", "slurm:c:2", "slurm:c:3"]
    return {f.subject: dict(f.evidence) for f in found if f.verdict is Verdict.FIRING}


def test_idle_allocated_gpus_fire_with_their_cost(service):  # noqa: F811
    got = firing(service, T0 + 4200)  # window [40, 70) min: J1's GPU 2 is idle in all of it
    assert set(got) == {"slurm:c:1", "slurm:c:3"}
    assert got["slurm:c:1"]["gpu_ids"] == "a/GPU-a-2"  # one of the job's 4 GPUs
    assert (got["slurm:c:1"]["idle_gpus"], got["slurm:c:1"]["job_gpus"]) == (1, 4)
    assert got["slurm:c:1"]["idle_gpu_hours"] == 0.5
    assert got["slurm:c:1"]["wasted_usd"] == pytest.approx(2.00)  # H100 on-demand, 30 min
    assert got["slurm:c:3"]["gpu_ids"] == "b/GPU-b-5"
    assert got["slurm:c:3"]["team"] == "research"


def test_partly_idle_windows_do_not_fire(service):  # noqa: F811
    got = firing(service, T0 + 3000)  # GPU a/2 idle only since minute 40: half the window
    assert set(got) == {"slurm:c:3"}


def test_idle_findings_open_incidents(service):  # noqa: F811
    tracker = IncidentTracker(service.storage, open_after=1, clock=lambda: T0 + 4200)
    found = run_rule(service, IDLE, T0 + 4200)
    result = tracker.fold(found)
    assert sorted(i.evidence["gpu"] for i in result.opened) == ["GPU-a-2", "GPU-b-5"]


# --- issue 14: one incident per job, not per GPU -------------------------------------------------

WIDE_END = T0 + 2400


def wide_fleet(tmp_path: Path) -> CollectorService:
    """Job 7 holds 8 GPUs over two nodes (c/0-3, d/0-3), all idle; job 8 (d/4) is busy; c/4 is
    idle and held by no job."""
    svc = make_service(tmp_path, WIDE_END)
    svc.registry.put([
        Job(key="slurm:c:7", scheduler="slurm", job_id="7", state=JobState.RUNNING, team="ml",
            gpus=8, start_time=T0 - 60,
            allocations=(GpuAllocation("c", (0, 1, 2, 3)), GpuAllocation("d", (0, 1, 2, 3)))),
        job("slurm:c:8", "d", (4,), T0 - 60),
    ])  # fmt: skip

    def points(t: float) -> list[NumberPoint]:
        out = [p for node in "cd" for g in range(4) for p in gpu_points(node, g, t, 0.0)]
        return out + gpu_points("c", 4, t, 0.0) + gpu_points("d", 4, t, 0.9)

    feed(svc, np.arange(T0, WIDE_END, 10.0), points)
    return svc


def test_idle_gpus_of_one_job_are_one_finding_about_the_job(tmp_path: Path):
    found = run_rule(wide_fleet(tmp_path), IDLE, WIDE_END)
    assert {f.subject: f.verdict for f in found} == {
        "slurm:c:7": Verdict.FIRING, "slurm:c:8": Verdict.CLEAR,
    }  # fmt: skip
    ev = next(f.evidence for f in found if f.subject == "slurm:c:7")
    assert ev["job"] == "slurm:c:7"
    assert ev["idle_gpus"] == 8
    assert ev["job_gpus"] == 8
    assert ev["nodes"] == "c,d"
    assert ev["node"] is None  # two nodes: no single one
    assert ev["gpu_ids"] == ",".join(f"{n}/GPU-{n}-{g}" for n in "cd" for g in range(4))
    assert ev["idle_gpu_hours"] == pytest.approx(8 * 0.5)
    assert ev["wasted_usd"] == pytest.approx(8 * 0.5 * 4.00)


def test_a_job_with_idle_gpus_gets_one_incident_and_one_requeue_approval(tmp_path: Path):
    svc = wide_fleet(tmp_path)
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    idle_rule = rules.get("idle-gpu")
    assert idle_rule is not None
    idle_only = dataclasses.replace(rules, rules=(idle_rule,))
    engine = DetectionEngine(
        svc.detection_view, idle_only, storage=svc.storage, clock=lambda: WIDE_END
    )
    assert engine.run_cycle(now=WIDE_END).opened == 1
    (incident,) = svc.storage.incidents()
    assert incident.evidence["subject"] == "slurm:c:7"
    actuator, slack = FakeActuator(), RecordingNotifier("slack")
    remediation = create_remediation(
        svc.storage, idle_only.enabled(), RemediationSettings(), actuators=[actuator],
        notifiers={"slack": slack}, runbooks_dir=default_runbooks_dir(),
        environ={SECRET_ENV: "k" * 40}, alerting=AlertingSettings(), clock=lambda: WIDE_END,
    )  # fmt: skip
    remediation.remediator.tick()
    remediation.remediator.tick()  # a second pass adds nothing
    actions = svc.storage.actions()
    assert [(a.action, a.target, a.state) for a in actions] == [
        ("requeue", "slurm:c:7", "awaiting_approval")
    ]
    assert remediation.dispatcher is not None
    remediation.dispatcher.tick()
    asked = [alert.summary for alert, _ in slack.sent if "approval needed" in alert.summary]
    assert asked == ["approval needed: requeue slurm:c:7 (idle-gpu)"]
    assert actuator.calls == []  # nothing runs before a human approves
