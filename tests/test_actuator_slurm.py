"""The Slurm actuator against the real single-node Slurm (and its argument checks without one)."""

from __future__ import annotations

import subprocess

import pytest

from gpuwarden.collector.remediate.actuator import ActionRequest, Outcome
from gpuwarden.collector.remediate.slurm_actuator import SlurmActuator
from tests.slurm.cluster import SlurmCluster

TIMEOUT_SECONDS = 60.0
SCRIPT = "#!/bin/sh\nsleep 600\n"


def request(kind: str, target: str, *, dry_run: bool = False, **params: str) -> ActionRequest:
    return ActionRequest(kind, target, f"key-{kind}-{target}", dry_run, params)


class NoRunner:
    """Fails the test if the actuator runs anything."""

    def __call__(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        raise AssertionError(f"ran {args}")


@pytest.mark.parametrize(
    "target",
    ["", "all", "slurm:gwtest:", "slurm:gwtest:12;rm", "slurm:gwtest:1,2", "slurm:other:12",
     "slurm:gwtest:*", "node[1-4]", "n1,n2", "-n1", "a b"],
)  # fmt: skip
def test_bad_targets_are_refused_without_running_scontrol(target):
    actuator = SlurmActuator("gwtest", runner=NoRunner())
    kind = "requeue" if target.startswith("slurm:") or target in ("", "all") else "drain"
    result = actuator.execute(request(kind, target))
    assert result.outcome is Outcome.REFUSED
    assert not actuator.accepts(target) or kind == "requeue"


def test_a_drain_reason_cannot_smuggle_quotes_or_newlines():
    actuator = SlurmActuator("gwtest", runner=NoRunner())
    result = actuator.execute(request("drain", "n1", reason="x\nState=RESUME"))
    assert result.outcome is Outcome.REFUSED


@pytest.mark.slurm
def test_requeue_once_then_already_done_and_dry_run_changes_nothing(
    slurm_cluster: SlurmCluster,
) -> None:
    actuator = SlurmActuator("gwtest", environ=slurm_cluster.env())
    job_id = slurm_cluster.sbatch(SCRIPT, "--job-name=gw-requeue")
    target = f"slurm:gwtest:{job_id}"
    try:
        slurm_cluster.wait_for_state(job_id, {"RUNNING"}, TIMEOUT_SECONDS)
        dry = actuator.execute(request("requeue", target, dry_run=True))
        assert dry.outcome is Outcome.DRY_RUN
        assert "would be requeued (RUNNING)" in dry.detail
        assert slurm_cluster.job_state(job_id) == "RUNNING"
        never = actuator.probe(request("requeue", target))
        assert never is not None
        assert never.outcome is Outcome.FAILED  # running, no restart: never requeued
        done = actuator.execute(request("requeue", target))
        assert done.outcome is Outcome.DONE, done.detail
        # Slurm shows REQUEUED for a moment, then PENDING until the job may start again
        slurm_cluster.wait_for_state(job_id, {"PENDING"}, TIMEOUT_SECONDS)
        detail = slurm_cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout
        assert "Restarts=1" in detail
        # the same decision again (a retry, or a second incident): nothing more happens
        again = actuator.execute(request("requeue", target))
        assert again.outcome is Outcome.ALREADY_DONE
        probed = actuator.probe(request("requeue", target))
        assert probed is not None
        assert probed.outcome is Outcome.ALREADY_DONE
        detail = slurm_cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout
        assert "Restarts=1" in detail
    finally:
        slurm_cluster.run(["scancel", job_id], check=False)
    missing = actuator.execute(request("requeue", "slurm:gwtest:999999"))
    assert missing.outcome is Outcome.NOT_FOUND


@pytest.mark.slurm
def test_drain_and_resume_a_node(slurm_cluster: SlurmCluster) -> None:
    actuator = SlurmActuator("gwtest", environ=slurm_cluster.env())
    node = slurm_cluster.hostname
    dry = actuator.execute(request("drain", node, dry_run=True))
    assert dry.outcome is Outcome.DRY_RUN
    assert "drain" not in slurm_cluster.node_state()
    try:
        drained = actuator.execute(request("drain", node, reason="gpuwarden test: XID 79"))
        assert drained.outcome is Outcome.DONE, drained.detail
        assert slurm_cluster.node_state().startswith("drain")
        assert actuator.execute(request("drain", node)).outcome is Outcome.ALREADY_DONE
        reason = slurm_cluster.run(["scontrol", "show", "node", node]).stdout
        assert "gpuwarden test: XID 79" in reason
    finally:
        undone = actuator.rollback(request("drain", node), drained)
    assert undone.outcome is Outcome.DONE, undone.detail
    assert "drain" not in slurm_cluster.node_state()
    assert actuator.execute(request("drain", "no-such-node")).outcome is Outcome.NOT_FOUND
