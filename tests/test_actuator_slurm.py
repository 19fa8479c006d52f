"""The Slurm actuator against the real single-node Slurm (and its argument checks without one)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from gpuwarden.collector.jobs.slurm_cli import SlurmResult
from gpuwarden.collector.remediate.actuators.base import ActionRequest, Outcome
from gpuwarden.collector.remediate.actuators.slurm import SlurmActuator
from tests.collector_server import free_port
from tests.slurm.cluster import SlurmCluster

TIMEOUT_SECONDS = 60.0
SCRIPT = "#!/bin/sh\nsleep 600\n"


def request(kind: str, target: str, *, dry_run: bool = False, **params: object) -> ActionRequest:
    return ActionRequest(kind, target, f"key-{kind}-{target}", dry_run, params)


class NoRunner:
    """Fails the test if the actuator runs anything."""

    def __call__(self, args: Sequence[str]) -> SlurmResult:
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
    before = actuator.probe(request("drain", node))
    assert before is not None
    assert before.outcome is Outcome.FAILED  # not drained: a crash before the call
    try:
        drained = actuator.execute(request("drain", node, reason="gpuwarden test: XID 79"))
        assert drained.outcome is Outcome.DONE, drained.detail
        assert slurm_cluster.node_state().startswith("drain")
        after = actuator.probe(request("drain", node))
        assert after is not None
        assert after.outcome is Outcome.ALREADY_DONE
        assert actuator.execute(request("drain", node)).outcome is Outcome.ALREADY_DONE
        reason = slurm_cluster.run(["scontrol", "show", "node", node]).stdout
        assert "gpuwarden test: XID 79" in reason
    finally:
        undone = actuator.rollback(request("drain", node), drained)
    assert undone.outcome is Outcome.DONE, undone.detail
    assert "drain" not in slurm_cluster.node_state()
    assert actuator.execute(request("drain", "no-such-node")).outcome is Outcome.NOT_FOUND


@pytest.mark.slurm
def test_requeuehold_holds_and_unrequeueable_or_finished_jobs_are_refused(
    slurm_cluster: SlurmCluster,
) -> None:
    actuator = SlurmActuator("gwtest", environ=slurm_cluster.env())
    held = slurm_cluster.sbatch(SCRIPT, "--job-name=gw-hold")
    pinned = slurm_cluster.sbatch(SCRIPT, "--job-name=gw-pinned", "--no-requeue")
    try:
        slurm_cluster.wait_for_state(held, {"RUNNING"}, TIMEOUT_SECONDS)
        slurm_cluster.wait_for_state(pinned, {"RUNNING"}, TIMEOUT_SECONDS)
        done = actuator.execute(request("requeue", f"slurm:gwtest:{held}", hold=True))
        assert done.outcome is Outcome.DONE, done.detail
        assert done.detail.startswith(f"requeuehold job {held}")
        slurm_cluster.wait_for_state(held, {"PENDING"}, TIMEOUT_SECONDS)
        shown = slurm_cluster.run(["scontrol", "show", "job", "-o", held]).stdout
        assert "Priority=0" in shown
        assert "Restarts=1" in shown
        refused = actuator.execute(request("requeue", f"slurm:gwtest:{pinned}"))
        assert refused.outcome is Outcome.REFUSED, refused.detail
        assert "presently disabled" in refused.detail
        assert slurm_cluster.job_state(pinned) == "RUNNING"
    finally:
        slurm_cluster.run(["scancel", held, pinned], check=False)
    finished = slurm_cluster.sbatch("#!/bin/sh\ntrue\n", "--job-name=gw-done")
    slurm_cluster.wait_for_state(finished, {"COMPLETED"}, TIMEOUT_SECONDS)
    again = actuator.execute(request("requeue", f"slurm:gwtest:{finished}"))
    assert again.outcome is Outcome.REFUSED  # a requeue would run a finished job again
    assert slurm_cluster.job_state(finished) == "COMPLETED"


@pytest.mark.slurm
def test_an_unreachable_controller_is_failed_not_not_found(
    slurm_cluster: SlurmCluster, tmp_path
) -> None:
    conf = tmp_path / "slurm.conf"
    text = slurm_cluster.conf_path.read_text()
    port = free_port()
    conf.write_text(
        "\n".join(
            f"SlurmctldPort={port}" if line.startswith("SlurmctldPort=") else line
            for line in text.splitlines()
        )
        + "\n"
    )
    environ = {**slurm_cluster.env(), "SLURM_CONF": str(conf)}
    # scontrol keeps retrying the connection for ~13 s; the actuator's timeout ends it first
    actuator = SlurmActuator("gwtest", environ=environ, timeout_seconds=2)
    result = actuator.execute(request("requeue", "slurm:gwtest:1"))
    assert result.outcome is Outcome.FAILED, result.detail
    assert "timed out" in result.detail
    assert actuator.execute(request("drain", slurm_cluster.hostname)).outcome is Outcome.FAILED


class Answers:
    """A fake ``scontrol``: answers each call with the next scripted (rc, stdout, stderr)."""

    def __init__(self, *answers: tuple[int, str, str]) -> None:
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str]) -> SlurmResult:
        self.calls.append(list(args))
        rc, out, err = self.answers.pop(0)
        return SlurmResult.exited(args, rc, out, err)


RUNNING = (0, "JobId=7 JobState=RUNNING Reason=None Restarts=0\n", "")


@pytest.mark.parametrize(
    ("stderr", "outcome"),
    [
        ("scontrol: error: Job is pending execution for job 7", Outcome.ALREADY_DONE),
        ("scontrol: error: Invalid job id specified for job 7", Outcome.NOT_FOUND),
        ("Requested operation is presently disabled for job 7", Outcome.REFUSED),
        ("Only batch jobs are accepted or processed for job 7", Outcome.REFUSED),
        ("Access/permission denied for job 7", Outcome.REFUSED),
        ("Unable to contact slurm controller (connect failure)", Outcome.FAILED),
    ],
)
def test_scontrol_requeue_answers_map_to_outcomes(stderr: str, outcome: Outcome) -> None:
    fake = Answers(RUNNING, (1, "", stderr))
    result = SlurmActuator("gwtest", runner=fake).execute(request("requeue", "slurm:gwtest:7"))
    assert result.outcome is outcome
    assert fake.calls == [["scontrol", "show", "job", "-o", "7"], ["scontrol", "requeue", "7"]]


def test_a_controller_error_on_show_is_failed_not_not_found() -> None:
    fake = Answers((1, "", "slurm_load_jobs error: Unable to contact slurm controller"))
    result = SlurmActuator("gwtest", runner=fake).execute(request("requeue", "slurm:gwtest:7"))
    assert result.outcome is Outcome.FAILED


def test_a_timed_out_call_is_failed() -> None:
    def slow(args: Sequence[str]) -> SlurmResult:
        return SlurmResult.timed_out(args, 30.0)

    result = SlurmActuator("gwtest", runner=slow).execute(request("drain", "n1"))
    assert result.outcome is Outcome.FAILED
    assert result.detail == "scontrol show node n1 timed out"


def test_a_missing_scontrol_raises_as_before(tmp_path: Path) -> None:
    # The remediator turns it into FAILED ("actuator raised FileNotFoundError").
    actuator = SlurmActuator("gwtest", environ={"PATH": str(tmp_path)})
    with pytest.raises(FileNotFoundError):
        actuator.execute(request("drain", "n1"))
