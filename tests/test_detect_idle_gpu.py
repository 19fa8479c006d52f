"""The idle-GPU rule on the scripted known-truth fleet: exactly the idle allocated GPUs fire."""

from __future__ import annotations

import pytest

from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.incidents import IncidentTracker
from tests.detectors import make_rule, run_rule
from tests.test_accounting_scenario import T0, service  # noqa: F401 - the fixture

WINDOW = 1800.0
IDLE = make_rule("idle_gpu", "idle-gpu", window_seconds=WINDOW, utilization_below=0.05)


def firing(svc, now: float) -> dict[str, dict[str, object]]:
    found = run_rule(svc, IDLE, now)
    assert len(found) == 16
    return {f.subject: dict(f.evidence) for f in found if f.verdict is Verdict.FIRING}


def test_idle_allocated_gpus_fire_with_their_cost(service):  # noqa: F811
    got = firing(service, T0 + 4200)  # window [40, 70) min: J1's GPU 2 is idle in all of it
    assert set(got) == {"a/GPU-a-2", "b/GPU-b-5"}
    assert got["a/GPU-a-2"]["job"] == "slurm:c:1"
    assert got["a/GPU-a-2"]["idle_gpu_hours"] == 0.5
    assert got["a/GPU-a-2"]["wasted_usd"] == pytest.approx(2.00)  # H100 on-demand, 30 min
    assert got["b/GPU-b-5"]["team"] == "research"


def test_partly_idle_windows_do_not_fire(service):  # noqa: F811
    got = firing(service, T0 + 3000)  # GPU a/2 idle only since minute 40: half the window
    assert set(got) == {"b/GPU-b-5"}


def test_idle_findings_open_incidents(service):  # noqa: F811
    tracker = IncidentTracker(service.storage, open_after=1, clock=lambda: T0 + 4200)
    found = run_rule(service, IDLE, T0 + 4200)
    result = tracker.fold(found)
    assert sorted(i.evidence["gpu"] for i in result.opened) == ["GPU-a-2", "GPU-b-5"]
