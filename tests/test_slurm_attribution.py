"""Attribution against a real Slurm job on a private single-node cluster with fake GPU GRES."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.agent.attribution import Attributor, read_environ
from gpuwarden.agent.model import JobRef
from tests.slurm.cluster import SlurmCluster

PROC = Path("/proc")
TIMEOUT_SECONDS = 30.0

pytestmark = pytest.mark.slurm


def test_batch_job_processes_are_attributed_to_the_job(slurm_cluster: SlurmCluster) -> None:
    job_id = slurm_cluster.sbatch(
        "#!/bin/sh\nsleep 300\necho finished\n", "--gres=gpu:1", "--job-name=gw-attr"
    )
    try:
        slurm_cluster.wait_for_state(job_id, {"RUNNING"}, TIMEOUT_SECONDS)
        # The batch shell and its sleep; proctrack/linuxproc puts them in no cgroup of their own.
        pids = slurm_cluster.wait_for_pids(job_id, 2, TIMEOUT_SECONDS)
        assert len(pids) == 2
        attributor = Attributor(PROC)
        for pid in pids:
            assert attributor.job_for_pid(pid) == JobRef(
                scheduler="slurm", job_id=job_id, source="environ"
            )
            environ = read_environ(PROC, pid)
            assert environ is not None
            # Slurm bound the fake GPU: the GRES is real, not just accounted.
            assert environ["CUDA_VISIBLE_DEVICES"] == "0"
            assert environ["SLURM_JOB_GPUS"] == "0"
        detail = slurm_cluster.run(["scontrol", "show", "job", "-d", job_id]).stdout
        assert "GRES=gpu:1(IDX:0)" in detail
    finally:
        slurm_cluster.run(["scancel", job_id])
    assert slurm_cluster.wait_for_state(job_id, {"CANCELLED"}, TIMEOUT_SECONDS) == "CANCELLED"
    slurm_cluster.wait_for_exit(pids, TIMEOUT_SECONDS)
    for pid in pids:
        assert attributor.job_for_pid(pid) is None
