"""How the labelled evaluation reports planned jobs to the registry over time (bench/truth)."""

from __future__ import annotations

from bench.truth.model import T0, Gpu, PlannedJob
from bench.truth.runner import job_at
from gpuwarden.collector.jobs.model import GpuAllocation, JobState

PLANNED = PlannedJob(
    "slurm:eval:7", (Gpu("a", 0), Gpu("a", 1), Gpu("b", 3)), T0, T0 + 600,
    JobState.PREEMPTED, tier="spot",
)  # fmt: skip


def test_a_job_runs_until_its_end_then_reports_its_final_state():
    running = job_at(PLANNED, T0 + 599)
    assert (running.state, running.end_time, running.job_id) == (JobState.RUNNING, None, "7")
    assert running.allocations == (GpuAllocation("a", (0, 1)), GpuAllocation("b", (3,)))
    ended = job_at(PLANNED, T0 + 600)
    assert (ended.state, ended.end_time, ended.price_tier) == (JobState.PREEMPTED, T0 + 600, "spot")


def test_a_job_without_an_end_keeps_running():
    open_ended = PlannedJob("slurm:eval:8", (Gpu("a", 0),), T0)
    assert job_at(open_ended, T0 + 86400).state is JobState.RUNNING
