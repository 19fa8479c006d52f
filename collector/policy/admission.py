"""Admission: is a job, pod or scale-up allowed by the ``limit`` policies? The shared part.

Pure: data in, a :class:`Decision` out; no clock, store or network. The requests come from
``policy.review`` (a Kubernetes ``AdmissionReview``) and ``policy.slurm_job`` (the Slurm
``job_submit.lua`` hook); the web routes (``web.admission``) take the fleet's usage from the job
registry (:func:`usage_of`) and answer what :func:`decide` says.

The team and model limits count what each team and model holds *or waits for*: the jobs in
:data:`HOLDING_STATES`, so a burst of submissions cannot slip under a team limit while the first
ones still queue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Final

import msgspec

from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.policy.limits import Breach, LimitRequest, Usage, check_limits
from gpuwarden.collector.policy.model import Policy

GPU_RESOURCE: Final = "nvidia.com/gpu"
HOLDING_STATES: Final = frozenset(
    {JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED, JobState.REQUEUED}
)
"""Jobs in these states count against team and model limits: admitted and not ended (a queued
job will hold its GPUs, and counting it stops a burst of submissions slipping through)."""


class AdmissionError(ValueError):
    """A review or request that is not what the API server (or the Slurm hook) sends: a 400."""


_Label = Annotated[str, msgspec.Meta(min_length=1, max_length=317)]  # prefix/name: 253 + 1 + 63
_MIB = 1024 * 1024


class AdmissionSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``admission:``: which labels name a request's team, model and job kind, the GPU
    resource counted, and the largest AdmissionReview read (``docs/admission.md``).

    The defaults are the Kubernetes job source's, so admission counts a pod as the registry
    will once it runs.
    """

    team_label: _Label = "team"
    #: a namespace label naming the team of objects without ``team_label`` (read from the
    #: Kubernetes API, ``kubernetes_*``: RBAC ``get namespaces``); unset: the namespace's name
    team_namespace_label: _Label | None = None
    namespace_cache_seconds: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    model_label: _Label = "gpuwarden.io/model"
    job_kind_label: _Label = "gpuwarden.io/job-kind"
    gpu_resource: _Label = GPU_RESOURCE
    #: an AdmissionReview carries the object (and on UPDATE the old one): etcd's 1.5 MiB
    #: object limit twice, with room; larger is a 413
    max_review_bytes: Annotated[int, msgspec.Meta(gt=0)] = 4 * _MIB


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict on one request: allowed, or denied by ``breaches`` with ``message``."""

    allowed: bool
    message: str
    request: LimitRequest | None = None
    breaches: tuple[Breach, ...] = ()


def usage_of(jobs: Iterable[Job]) -> Usage:
    """GPUs per team and per model of the jobs admitted and not ended (:data:`HOLDING_STATES`)."""
    by_team: Counter[str] = Counter()
    by_model: Counter[str] = Counter()
    for job in jobs:
        if job.state not in HOLDING_STATES or job.gpus <= 0:
            continue
        if job.team is not None:
            by_team[job.team] += job.gpus
        if job.model is not None:
            by_model[job.model] += job.gpus
    return Usage(dict(by_team), dict(by_model))


def decide(policies: Sequence[Policy], request: LimitRequest | None, usage: Usage) -> Decision:
    """Allowed unless ``request`` breaches a ``limit`` policy; the message names each breach."""
    if request is None:
        return Decision(True, "nothing to judge (not a create of a Pod, Job or Workload)")
    if request.gpus <= 0:
        return Decision(True, "no GPUs requested", request)
    breaches = tuple(check_limits(policies, request, usage))
    if not breaches:
        return Decision(True, f"{request.gpus} GPUs within every limit policy", request)
    reasons = "; ".join(breach.reason for breach in breaches)
    return Decision(False, f"gpuwarden: denied: {reasons}", request, breaches)
