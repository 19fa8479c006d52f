"""Jobs and model deployments that workloads announce in their own OTLP resource attributes.

A training script or model server that exports OTLP can say who it is: ``job.id`` (with
``gpuwarden.job.scheduler``, default ``api``), ``k8s.pod.uid``, ``service.name`` and
``service.version``, ``gpuwarden.model.name`` / ``gpuwarden.model.version``, ``gpuwarden.team``.
The collector turns a new resource into a job and/or a model deployment once, not per request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.storage.records import ModelDeployment

#: Resource attribute names this module reads.
JOB_ID = "job.id"
JOB_SCHEDULER = "gpuwarden.job.scheduler"
POD_UID = "k8s.pod.uid"
MODEL_NAME = "gpuwarden.model.name"
MODEL_VERSION = "gpuwarden.model.version"
TEAM = "gpuwarden.team"
AGENT_VERSION = "gpuwarden.agent.version"

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
Resource = Mapping[str, str | int | float | bool]


@dataclass(frozen=True, slots=True)
class Announcement:
    """What one workload resource declares."""

    job: Job | None
    model: ModelDeployment | None


def _text(resource: Resource, key: str) -> str | None:
    value = resource.get(key)
    if value is None:
        return None
    text = str(value)
    return text if _SAFE.match(text) else None


def announcement(resource: Resource, now: float) -> Announcement | None:
    """The job and model a workload's resource declares; ``None`` for agents and the rest.

    Values must look like identifiers (letters, digits and ``._:/@+-``, at most 128 characters):
    anything else is ignored rather than stored.
    """
    if AGENT_VERSION in resource:
        return None  # our own agents describe nodes, not workloads
    host = _text(resource, "host.name")
    model_name = _text(resource, MODEL_NAME)
    version = _text(resource, MODEL_VERSION) or _text(resource, "service.version") or "unknown"
    team = _text(resource, TEAM)
    job = None
    pod = _text(resource, POD_UID)
    job_id = _text(resource, JOB_ID)
    if pod is not None or job_id is not None:
        scheduler = "kubernetes" if pod is not None else (_text(resource, JOB_SCHEDULER) or "api")
        ident = pod if pod is not None else str(job_id)
        key = f"k8s:{ident}" if pod is not None else f"{scheduler}:{ident}"
        job = Job(
            key=key,
            scheduler=scheduler,
            job_id=ident,
            state=JobState.RUNNING,
            name=_text(resource, "service.name"),
            team=team,
            model=model_name,
            allocations=(GpuAllocation(host),) if host else (),
            start_time=now,
        )
    model = None
    if model_name is not None:
        model = ModelDeployment(name=model_name, version=version, replicas=1)
    if job is None and model is None:
        return None
    return Announcement(job, model)
