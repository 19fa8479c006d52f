"""Which jobs serve a model and which train: detectors whose verdict only makes sense for one
kind (stragglers and data-loader stalls are training's) ask here.

The job record has no kind field; what the collector knows is this:

- a job label ``gpuwarden.io/workload`` (``training`` or ``serving``; a Kubernetes pod label
  arrives in :attr:`Job.labels` as is) says it outright and wins;
- otherwise a job serves when the model it names (``Job.model``: the pod label
  ``gpuwarden.io/model``, a workload's ``gpuwarden.model.name``) is a model deployment the
  collector knows (:meth:`DetectionContext.deployments`): that is how ``overprovisioned_inference``
  finds a deployment's replicas too;
- every other job counts as training (batch jobs on a GPU scheduler mostly are; a model named by
  a job with no deployment of that name is a model being trained).
"""

from __future__ import annotations

import enum
from collections.abc import Collection

from gpuwarden.collector.jobs.model import Job

WORKLOAD_LABEL = "gpuwarden.io/workload"


class JobKind(enum.StrEnum):
    """What a job does with its GPUs."""

    TRAINING = "training"
    SERVING = "serving"


def job_kind(job: Job | None, served_models: Collection[str]) -> JobKind:
    """The kind of ``job``; ``served_models`` are the names of the known model deployments.

    A job the collector no longer knows (``None``) counts as training, the default kind.
    """
    if job is None:
        return JobKind.TRAINING
    label = job.labels.get(WORKLOAD_LABEL, "").strip().lower()
    if label in ("serving", "inference"):
        return JobKind.SERVING
    if label == "training":
        return JobKind.TRAINING
    return JobKind.SERVING if job.model and job.model in served_models else JobKind.TRAINING
