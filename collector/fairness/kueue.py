"""Scheduling attempts of Kueue-managed jobs from their Workloads, in place of their pods.

For a job with a Workload (:mod:`~gpuwarden.collector.jobs.kueue_workloads`):

- the wait runs from the Workload's creation to its admission (the ``Admitted`` condition); a
  Workload not admitted yet is pending, with its wait so far; its queue is the LocalQueue;
- it holds its GPUs (its pod sets' requests) from admission to ``Finished`` (Kueue reserves the
  quota at admission, whether or not the pods have started yet);
- an eviction (``Evicted`` / ``Preempted`` true) ends the attempt as preempted; the Workload,
  requeued by Kueue, waits again from its ``Requeued`` condition (a second attempt), not
  during a requeue backoff nor when deactivated;
- a Workload whose pod sets ask for no GPU is not a job here (as a pod that asks for none);
- its pods are the same job: a pod whose controller (``Job/<name>``, or the pod itself with
  Kueue's pod integration) owns a Workload in the same namespace is left out, so it is never
  counted twice. The pods give the Workload its team when they carry one.

Jobs without a Workload keep their pod timings
(:func:`~gpuwarden.collector.jobs.runs.run_from_job`).
Pods whose Workload is owned further up (a JobSet owning Jobs owning pods) are not matched: the
collector does not read the Jobs in between.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gpuwarden.collector.jobs.kueue_workloads import KueueWorkload
from gpuwarden.collector.jobs.model import Job
from gpuwarden.collector.jobs.runs import QueueRun, run_from_job

KUBERNETES = "kubernetes"


def _pod_keys(job: Job) -> set[tuple[str, str]]:
    """``(namespace, "Kind/name")`` a pod may be matched by: its owner, and itself."""
    namespace, _, name = job.job_id.partition("/")
    keys = {(namespace, f"Pod/{name}")}
    if job.owner:
        keys.add((namespace, job.owner))
    return keys


def workload_runs(workload: KueueWorkload, *, team: str | None) -> list[QueueRun]:
    """The attempts one Workload stands for (see the module docstring)."""
    base = QueueRun(
        key=workload.key,
        team=team,
        queue=workload.queue,
        gpus=workload.gpus,
        submit_time=workload.created_time,
    )
    evicted, admitted = workload.evicted_time, workload.admitted_time
    if evicted is not None:
        holding = admitted is not None and admitted <= evicted  # Kueue still releasing the quota
        runs = [
            replace(
                base,
                key=f"{workload.key}#evicted",
                start_time=admitted if holding else None,
                end_time=evicted,
                preempted=True,
                state=f"evicted: {workload.eviction_reason}",
            )
        ]
        requeued = workload.requeued_time
        if not holding and workload.active and workload.finished_time is None and requeued:
            runs.append(replace(base, eligible_time=requeued, state="pending"))
        return runs
    if not workload.active and admitted is None:
        return []  # deactivated before its admission: not queued
    if workload.finished_time is not None:
        state = "finished"
    else:
        state = "admitted" if admitted is not None else "pending"
    return [replace(base, start_time=admitted, end_time=workload.finished_time, state=state)]


def runs_with_workloads(
    jobs: Iterable[Job],
    workloads: Iterable[KueueWorkload],
    *,
    since: float,
    team_label: str = "team",
) -> list[QueueRun]:
    """Attempts of the registry jobs and the Workloads, each job once (see the module docstring).

    Like :func:`~gpuwarden.collector.jobs.runs.runs_from_jobs`, what ended before ``since`` is
    left out.
    """
    by_owner: dict[tuple[str, str], KueueWorkload] = {}
    listed = [w for w in workloads if w.gpus > 0]  # like pods: only jobs that ask for GPUs
    for workload in listed:
        for kind, name in workload.owners:
            by_owner.setdefault((workload.namespace, f"{kind}/{name}"), workload)
    teams: dict[str, str] = {}
    runs: list[QueueRun] = []
    for job in jobs:
        if job.scheduler == KUBERNETES:
            owning = next((by_owner[k] for k in _pod_keys(job) if k in by_owner), None)
            if owning is not None:
                if job.team:
                    teams.setdefault(owning.uid, job.team)
                continue
        if job.end_time is None or job.end_time >= since:
            runs.append(run_from_job(job))
    for workload in listed:
        team = teams.get(workload.uid) or workload.labels.get(team_label) or workload.namespace
        runs.extend(
            r
            for r in workload_runs(workload, team=team)
            if r.end_time is None or r.end_time >= since
        )
    return runs
