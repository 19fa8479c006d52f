"""A Slurm job submission (from ``deploy/slurm/job_submit.lua``): what it asks for, the answer.

Pure: bytes in, a :class:`~gpuwarden.collector.policy.limits.LimitRequest` out. GPUs are
``tres_per_job``, else ``tres_per_node`` times the node count, else ``tres_per_task`` times the
task count; ``account`` is the team (the partition when none, as the Slurm job source counts);
``model=<name>`` in the comment is the model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import msgspec

from gpuwarden.collector.policy.admission import AdmissionError, Decision
from gpuwarden.collector.policy.limits import LimitRequest


class SlurmJobRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``job_desc`` fields ``deploy/slurm/job_submit.lua`` sends (Slurm 22.05 names)."""

    user: str | None = None
    account: str | None = None
    partition: str | None = None
    name: str | None = None
    comment: str | None = None
    tres_per_job: str | None = None
    tres_per_node: str | None = None
    tres_per_task: str | None = None
    min_nodes: int | None = None
    num_tasks: int | None = None
    cluster: str | None = None


_GPU_TRES = re.compile(r"(?:gres[:/])?gpu(?::[^:,]+)?:([0-9]+)(?=,|$)")
_COMMENT_MODEL = re.compile(r"(?:^|[\s,;])model=([A-Za-z0-9._/-]{1,128})")
_NO_VALUE: Final = 0xFFFFFFFE
"""Slurm's ``NO_VAL`` (0xfffffffe) for an unset count; 22.05 passes it through to Lua."""


def tres_gpus(tres: str | None) -> int | None:
    """The GPU count in a Slurm TRES string (``gres:gpu:2``, ``gres/gpu:a100:4``); ``None``
    when it names no GPUs."""
    if not tres:
        return None
    for item in tres.split(","):
        match = _GPU_TRES.fullmatch(item.strip())
        if match is not None:
            return int(match[1])
    return None


def _count(value: int | None) -> int:
    return 1 if value is None or value <= 0 or value >= _NO_VALUE else value


def slurm_request(job: SlurmJobRequest) -> LimitRequest:
    """What a Slurm submission asks for: GPUs per job, per node times nodes, or per task times
    tasks; the account is the team (the partition when none, as the Slurm job source counts);
    ``model=<name>`` in the comment is the model."""
    per_job = tres_gpus(job.tres_per_job)
    per_node = tres_gpus(job.tres_per_node)
    per_task = tres_gpus(job.tres_per_task)
    if per_job is not None:
        gpus = per_job
    elif per_node is not None:
        gpus = per_node * _count(job.min_nodes)
    elif per_task is not None:
        gpus = per_task * _count(job.num_tasks)
    else:
        gpus = 0
    model = _COMMENT_MODEL.search(job.comment or "")
    return LimitRequest(
        gpus=gpus,
        team=job.account or job.partition or None,
        job=job.name,
        model=model[1] if model else None,
        cluster=job.cluster,
    )


def parse_slurm(body: bytes) -> LimitRequest:
    """Decode the hook's JSON into what it asks for.

    Raises:
        AdmissionError: not JSON or not the hook's fields (one line naming the field).
    """
    try:
        job = msgspec.json.decode(body, type=SlurmJobRequest)
    except msgspec.DecodeError as exc:
        raise AdmissionError(f"not a Slurm job request: {exc}") from None
    return slurm_request(job)


def slurm_answer(decision: Decision) -> Mapping[str, object]:
    """The hook's answer: ``allowed`` and the ``message`` sbatch prints on a denial."""
    return {"allowed": decision.allowed, "message": decision.message}
