"""What a request asks for: pod GPUs as the scheduler counts them, Slurm TRES strings, usage."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.policy.admission import AdmissionError, usage_of
from gpuwarden.collector.policy.review import _PodSpec as PodSpec
from gpuwarden.collector.policy.review import pod_gpus, quantity
from gpuwarden.collector.policy.slurm_job import SlurmJobRequest, slurm_request, tres_gpus


def container(name: str, gpus: int | None, *, sidecar: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    if gpus is not None:
        out["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


@pytest.mark.parametrize(
    ("init", "app", "expected"),
    [
        ([], [container("a", 2), container("b", 1)], 3),  # app containers add up
        ([container("i", 5)], [container("a", 1)], 5),  # an init container alone: its max
        ([container("i", 1)], [container("a", 2)], 2),
        # a sidecar runs beside everything after it
        ([container("s", 1, sidecar=True)], [container("a", 2)], 3),
        ([container("s", 1, sidecar=True), container("i", 4)], [container("a", 2)], 5),
        ([container("i", 4), container("s", 1, sidecar=True)], [container("a", 2)], 4),
        ([], [container("a", None)], 0),
    ],
)
def test_pod_gpus_as_the_scheduler_counts_them(init, app, expected):
    spec = msgspec.convert({"containers": app, "initContainers": init}, PodSpec)
    assert pod_gpus(spec) == expected


def test_requests_count_when_no_limit_names_the_gpu():
    spec = msgspec.convert(
        {"containers": [{"name": "a", "resources": {"requests": {"nvidia.com/gpu": 3}}}]}, PodSpec
    )
    assert pod_gpus(spec) == 3


@pytest.mark.parametrize(
    ("text", "expected"), [("2", 2), (" 8 ", 8), ("1k", 1000), ("1Ki", 1024), (4, 4)]
)
def test_quantities(text, expected):
    assert quantity(text, "q") == expected


@pytest.mark.parametrize("text", ["500m", "1.5", "-1", "", "two", -2])
def test_fractional_or_odd_quantities_are_refused(text):
    with pytest.raises(AdmissionError, match=r"^q: "):
        quantity(text, "q")


@pytest.mark.parametrize(
    ("tres", "expected"),
    [
        ("gres:gpu:2", 2),  # 22.05's job_desc
        ("gres/gpu:4", 4),  # 23.02 and later
        ("gres:gpu:a100:3", 3),
        ("gpu:1", 1),
        ("gres:nic:1,gres:gpu:2", 2),
        ("gres:nic:1", None),
        ("", None),
        (None, None),
    ],
)
def test_slurm_tres_strings(tres, expected):
    assert tres_gpus(tres) == expected


def test_a_slurm_request_counts_per_job_then_per_node_then_per_task():
    per_node = SlurmJobRequest(account="physics", tres_per_node="gres:gpu:2", min_nodes=3)
    assert slurm_request(per_node).gpus == 6
    unset = SlurmJobRequest(tres_per_node="gres:gpu:2", min_nodes=0xFFFFFFFE, partition="debug")
    assert (slurm_request(unset).gpus, slurm_request(unset).team) == (2, "debug")
    per_task = SlurmJobRequest(tres_per_task="gres:gpu:1", num_tasks=4, comment="model=llama-70b")
    asked = slurm_request(per_task)
    assert (asked.gpus, asked.model) == (4, "llama-70b")
    per_job = SlurmJobRequest(tres_per_job="gres:gpu:5", tres_per_node="gres:gpu:1")
    assert slurm_request(per_job).gpus == 5


def test_usage_counts_jobs_admitted_and_not_ended():
    def job(key: str, state: JobState, team: str | None, gpus: int, model: str | None) -> Job:
        return Job(key=key, scheduler="api", job_id=key, state=state, team=team, gpus=gpus,
                   model=model)  # fmt: skip

    usage = usage_of(
        [
            job("a", JobState.RUNNING, "ml", 4, "llama"),
            job("b", JobState.PENDING, "ml", 2, None),
            job("c", JobState.SUSPENDED, "ml", 1, "llama"),
            job("d", JobState.COMPLETED, "ml", 8, "llama"),
            job("e", JobState.FAILED, "vision", 8, None),
            job("f", JobState.RUNNING, None, 3, "llama"),
        ]
    )
    assert dict(usage.gpus_by_team) == {"ml": 7}
    assert dict(usage.gpus_by_model) == {"llama": 8}
