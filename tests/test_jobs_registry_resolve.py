"""``JobRegistry.resolve``: a process's Slurm job id to the registry's key, through its index."""

from __future__ import annotations

from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.storage.sqlite import MEMORY, SqliteStorage


def slurm(cluster: str, ident: str, node: str) -> Job:
    return Job(
        key=f"slurm:{cluster}:{ident}",
        scheduler="slurm",
        job_id=ident,
        state=JobState.RUNNING,
        allocations=(GpuAllocation(node, (0,)),),
    )


def test_resolve_prefers_the_job_on_the_node_and_sees_jobs_put_later():
    storage = SqliteStorage(MEMORY)
    registry = JobRegistry(storage)
    registry.put([slurm("east", "7", "n1"), slurm("west", "7", "n2")])
    assert registry.resolve("slurm", "7", "n2") == "slurm:west:7"
    assert registry.resolve("slurm", "7", "n9") == "slurm:east:7"  # none on the node: the first
    assert registry.resolve("slurm", "8", "n1") == "slurm:8"  # unknown id
    registry.put([slurm("north", "8", "n1")])  # the index is rebuilt after a change
    assert registry.resolve("slurm", "8", "n1") == "slurm:north:8"
    assert registry.resolve("kubernetes", "uid-1", "n1") == "k8s:uid-1"
    storage.close()
