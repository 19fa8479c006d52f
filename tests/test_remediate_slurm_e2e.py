"""Remediation on the real Slurm: an idle-GPU incident on a running batch job.

Dry run → an audit row "would requeue"; auto → requeued exactly once (``Restarts=1``); a second
trigger inside the cooldown does nothing; a collector that dies after writing its intent and
is restarted on the same database never requeues a second time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwarden.collector.remediate.actuators.slurm import SlurmActuator
from gpuwarden.collector.remediate.remediator import ActionState
from gpuwarden.collector.storage.records import IncidentState
from gpuwarden.collector.storage.sqlite import SqliteStorage
from tests.slurm.cluster import SlurmCluster
from tests.storage_backends import Backend
from tests.test_remediator import FakeClock, World, open_incident

pytestmark = pytest.mark.slurm
TIMEOUT_SECONDS = 60.0


def restarts(cluster: SlurmCluster, job_id: str) -> str:
    detail = cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout
    return next(f for f in detail.split() if f.startswith("Restarts="))


def world_on(path: Path, clock: FakeClock) -> World:
    from tests.test_remediator import FakeActuator, RecordingNotifier

    return World(
        storage=SqliteStorage(path, clock=clock),
        clock=clock,
        actuator=FakeActuator(),
        pager=RecordingNotifier(),
        slack=RecordingNotifier(),
        backend=Backend("sqlite", str(path)),
    )


def test_dry_run_then_exactly_one_requeue_and_nothing_inside_the_cooldown(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    job_id = slurm_cluster.sbatch("#!/bin/sh\nsleep 600\n", "--job-name=gw-idle")
    target = f"slurm:gwtest:{job_id}"
    slurm = SlurmActuator("gwtest", environ=slurm_cluster.env())
    world = world_on(tmp_path / "c.db", FakeClock())
    try:
        slurm_cluster.wait_for_state(job_id, {"RUNNING"}, TIMEOUT_SECONDS)
        first = open_incident(world.storage, world.clock, job=target)
        world.remediator(actuator=slurm).tick()  # the default: a dry run
        (entry,) = world.storage.audit()
        assert entry.dry_run
        assert entry.result == "dry_run"
        assert entry.reason.startswith(f"would requeue {target}")
        assert restarts(slurm_cluster, job_id) == "Restarts=0"

        live = world.remediator(actuator=slurm, dry_run=False)
        for _ in range(3):
            live.tick()
            world.clock.now += 10
        assert restarts(slurm_cluster, job_id) == "Restarts=1"
        # the incident resolves, the job idles again inside the cooldown: nothing more
        world.storage.update_incident(replace(first, state=IncidentState.RESOLVED))
        second = replace(first, fingerprint=first.fingerprint + "-again", incident_id=None)
        assert world.storage.open_incident(second) is not None
        for _ in range(3):
            live.tick()
            world.clock.now += 10
        assert restarts(slurm_cluster, job_id) == "Restarts=1"
        states = sorted(a.state for a in world.storage.actions())
        assert ActionState.VERIFYING in states or ActionState.VERIFIED in states
    finally:
        slurm_cluster.run(["scancel", job_id], check=False)
        world.storage.close()


CRASHING = textwrap.dedent(
    """
    import os, signal, sys
    from gpuwarden.collector.remediate.actuators.slurm import SlurmActuator
    from gpuwarden.collector.storage.sqlite import SqliteStorage
    from tests.storage_backends import Backend
    from tests.test_remediator import FakeClock, World, FakeActuator, RecordingNotifier

    class DiesBeforeActing(SlurmActuator):
        def execute(self, request):
            if not request.dry_run:
                os.kill(os.getpid(), signal.SIGKILL)  # kill -9 between decision and execution
            return super().execute(request)

    path, cluster_env = sys.argv[1], dict(os.environ)
    clock = FakeClock()
    storage = SqliteStorage(path, clock=clock)
    world = World(storage, clock, FakeActuator(), RecordingNotifier(), RecordingNotifier(),
                  Backend("sqlite", path))
    world.remediator(actuator=DiesBeforeActing("gwtest", environ=cluster_env), dry_run=False).tick()
    """
)


def test_kill_9_between_decision_and_execution_still_requeues_exactly_once(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    job_id = slurm_cluster.sbatch("#!/bin/sh\nsleep 600\n", "--job-name=gw-crash")
    target = f"slurm:gwtest:{job_id}"
    path = tmp_path / "c.db"
    clock = FakeClock()
    try:
        slurm_cluster.wait_for_state(job_id, {"RUNNING"}, TIMEOUT_SECONDS)
        with SqliteStorage(path, clock=clock) as storage:
            open_incident(storage, clock, job=target)
        env = {**slurm_cluster.env(), "PYTHONPATH": os.getcwd()}
        crashed = subprocess.run(
            [sys.executable, "-c", CRASHING, str(path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        assert restarts(slurm_cluster, job_id) == "Restarts=0"  # it died before acting
        # the restarted collector finds the intent; it asks Slurm instead of guessing
        world = world_on(path, clock)
        slurm = SlurmActuator("gwtest", environ=slurm_cluster.env())
        restarted = world.remediator(actuator=slurm, dry_run=False)
        (row,) = world.storage.actions()
        assert row.state == ActionState.EXECUTING
        world.clock.now += restarted.config.stale_execution_seconds + 1
        for _ in range(3):
            restarted.tick()
            world.clock.now += 10
        # the probe saw the job running with no restart: the requeue never happened, so it runs
        # now, once; more passes change nothing
        assert restarts(slurm_cluster, job_id) == "Restarts=1"
        (row,) = world.storage.actions()
        assert row.state in (ActionState.VERIFYING, ActionState.VERIFIED)
        assert [e.result for e in world.storage.audit()].count("intent") == 2
        world.storage.close()
    finally:
        slurm_cluster.run(["scancel", job_id], check=False)
