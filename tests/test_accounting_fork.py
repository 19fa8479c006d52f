"""Accounting computed in a forked child (what the collector does) writes what it computes here.

Two real ``CollectorService``s on their own databases get the same agent rounds and the same
job; one computes accounting in the calling thread, the other in a child forked per run
(``CollectorService.fork_accounting``). Their stored rows must be the same, run after run,
including the rule that a recomputed period never replaces one that knew more (the stored rows
are read here and handed to the child). A stopped fork refuses to run (shutdown).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwarden.collector.detect.fork import CycleStoppedError
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.service import CollectorService
from tests.test_accounting_restart import GPUS, T0, Clock, by_scope, points, start

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")


def rows(service: CollectorService) -> dict[tuple[float, str], tuple[float, float, float]]:
    return by_scope(service.storage.accounting_rows(since=T0 - 3600, until=T0 + 86_400))


def test_a_forked_run_stores_the_rows_a_run_here_stores(tmp_path: Path) -> None:
    job = Job(
        key="slurm:c:1",
        scheduler="slurm",
        job_id="1",
        state=JobState.RUNNING,
        team="ml",
        gpus=GPUS,
        start_time=T0 - 600,
        allocations=(GpuAllocation("n1", (0,)),),  # one of the node's two GPUs: the other idles
    )
    clock = Clock(T0)
    here, forked = start(tmp_path / "here.db", clock), start(tmp_path / "forked.db", clock)
    forked.fork_accounting(timeout_seconds=120)
    for service in (here, forked):
        service.registry.put([job])
    written = {"here": 0, "forked": 0}
    for k in range(0, 15 * 60, 10):  # 15 minutes of rounds, accounting every minute
        clock.now = T0 + k
        for service in (here, forked):
            assert service.accept(points(clock.now), "agent") == 0
        if k % 60 == 0:
            written["here"] += here.run_accounting()
            written["forked"] += forked.run_accounting()
    assert written["forked"] == written["here"] > 0
    assert rows(forked) == rows(here)
    busy = sum(b for b, _, _ in rows(forked).values())
    assert busy > 0  # the forked run accounted real GPU time, not empty periods
    forked.stop_forks()
    with pytest.raises(CycleStoppedError):
        forked.run_accounting()
    for service in (here, forked):
        service.storage.close()
