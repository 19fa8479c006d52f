"""Scheduling attempts (:class:`QueueRun`): when a job was queued, became eligible, started and
ended, and whether it was preempted — what fairness is computed from.

A job requeued after a preemption has several attempts; ``sacct --duplicates`` lists each
(:mod:`~gpuwarden.collector.jobs.slurm_sacct`). The job registry holds one current record per
job (``squeue``, Kubernetes pods, the API), which :func:`run_from_job` turns into its latest
attempt: an earlier attempt of a requeued job is not known there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuwarden.collector.jobs.model import Job, JobState

#: Pod labels naming the Kueue LocalQueue a pod was submitted to (the queue of a Kueue job).
KUEUE_QUEUE_LABELS = ("kueue.x-k8s.io/queue-name",)


@dataclass(frozen=True, slots=True)
class QueueRun:
    """One scheduling attempt of one job. Times are Unix seconds, ``None`` when not (yet) known.

    ``eligible_time`` is when the scheduler could first have started it (after its begin time,
    dependencies and holds); ``None`` where the scheduler does not say (Kubernetes).
    ``queue`` is the Slurm partition, the Kueue LocalQueue, or the pod's namespace.
    """

    key: str
    team: str | None
    queue: str | None
    gpus: int
    submit_time: float | None
    eligible_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    preempted: bool = False
    qos: str | None = None
    state: str = ""

    @property
    def queued_time(self) -> float | None:
        """When the wait counts from: eligible, else submitted."""
        return self.eligible_time if self.eligible_time is not None else self.submit_time


def job_queue(job: Job) -> str | None:
    """The queue of a registry job: its partition (Slurm), Kueue LocalQueue or namespace (pods)."""
    if job.scheduler == "slurm":
        return job.labels.get("partition")
    if job.scheduler == "kubernetes":
        for label in KUEUE_QUEUE_LABELS:
            if job.labels.get(label):
                return job.labels[label]
        namespace, slash, _ = job.job_id.partition("/")
        return namespace if slash else None
    return job.labels.get("queue")


def run_from_job(job: Job) -> QueueRun:
    """The latest attempt of a registry job (``squeue`` or a pod: one record per job)."""
    return QueueRun(
        key=job.key,
        team=job.team,
        queue=job_queue(job),
        gpus=job.gpus,
        submit_time=job.submit_time,
        eligible_time=job.eligible_time,
        start_time=job.start_time,
        end_time=job.end_time,
        preempted=job.state is JobState.PREEMPTED,
        qos=job.labels.get("qos"),
        state=str(job.state),
    )


def runs_from_jobs(jobs: Iterable[Job], *, since: float) -> list[QueueRun]:
    """The latest attempts of the registry jobs that had not ended before ``since`` (the rest
    can count in no window starting then; the registry remembers every job since start)."""
    return [run_from_job(job) for job in jobs if job.end_time is None or job.end_time >= since]
