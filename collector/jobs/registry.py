"""The job registry: one merged view of jobs from scheduler adapters and the HTTP API.

Adapters are polled (their calls block, so the service runs them in a thread); a failing poll
keeps the adapter's last good list, so a Slurm controller restart does not make every job look
finished. Jobs are persisted on change so accounting and incidents survive a restart.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuwarden.collector.jobs import JobSourceError
from gpuwarden.collector.jobs.kueue_workloads import KueueWorkload
from gpuwarden.collector.jobs.model import Job, JobSource
from gpuwarden.collector.storage.base import Storage

log = logging.getLogger(__name__)


class WorkloadReader(Protocol):
    """What lists Kueue Workloads
    (:class:`~gpuwarden.collector.jobs.kueue_workloads.KueueWorkloadReader`)."""

    def workloads(self) -> list[KueueWorkload]:
        """Every Workload; raises ``JobSourceError`` when the API fails."""
        ...


@dataclass(frozen=True, slots=True)
class PollResult:
    """What one poll of every adapter did."""

    jobs: int
    changed: int
    failed_sources: tuple[str, ...]


class JobRegistry:
    """Jobs by key, from adapters (``sources``) and the API; persisted to ``storage``.

    With a ``workload_reader`` (the Kubernetes source's cluster), each poll also lists Kueue's
    Workloads, kept in memory only (fairness reads them, ``fairness.kueue``): a failing list keeps
    the last good one, logged once per distinct error.
    """

    def __init__(
        self,
        storage: Storage,
        sources: Sequence[tuple[str, JobSource]] = (),
        *,
        workload_reader: WorkloadReader | None = None,
    ) -> None:
        self._storage = storage
        self._sources = list(sources)
        self._workload_reader = workload_reader
        self._workloads: list[KueueWorkload] = []
        self._workload_error: str | None = None
        self._by_source: dict[str, dict[str, Job]] = {}
        self._api: dict[str, Job] = {
            job.key: job for job in storage.jobs() if job.scheduler == "api"
        }
        self._known: dict[str, Job] = {job.key: job for job in storage.jobs()}
        self._slurm_ids: dict[str, list[Job]] | None = None  # ``resolve``'s index, made lazily
        self._lock = threading.Lock()

    def poll(self, now: float) -> PollResult:
        """Ask every adapter for its jobs; keep the last good list of those that fail."""
        failed = []
        for name, source in self._sources:
            try:
                jobs = source.jobs(now)
            except JobSourceError as exc:
                log.warning("job source %s failed (keeping its last good list): %s", name, exc)
                failed.append(name)
                continue
            with self._lock:
                self._by_source[name] = {job.key: job for job in jobs}
        reader = self._workload_reader
        if reader is not None and not self._poll_workloads(reader):
            failed.append("kueue")
        changed = self._persist(self.jobs())
        return PollResult(len(self.jobs()), changed, tuple(failed))

    def _poll_workloads(self, reader: WorkloadReader) -> bool:
        """List the Workloads; on failure keep the last good list (logged once per error)."""
        try:
            workloads = reader.workloads()
        except JobSourceError as exc:
            if str(exc) != self._workload_error:
                log.warning("Kueue Workloads failed (keeping the last good list): %s", exc)
            self._workload_error = str(exc)
            return False
        if self._workload_error is not None:
            log.info("Kueue Workloads listed again")
            self._workload_error = None
        with self._lock:
            self._workloads = workloads
        return True

    def kueue_workloads(self) -> list[KueueWorkload]:
        """The last good list of Kueue Workloads (empty: no reader, or Kueue not installed)."""
        with self._lock:
            return list(self._workloads)

    def put(self, jobs: Iterable[Job]) -> int:
        """Register or update jobs announced over the API; return how many changed."""
        jobs = list(jobs)
        with self._lock:
            for job in jobs:
                self._api[job.key] = job
        return self._persist(jobs)

    def _persist(self, jobs: Sequence[Job]) -> int:
        with self._lock:
            changed = [job for job in jobs if self._known.get(job.key) != job]
            for job in changed:
                self._known[job.key] = job
            if changed:
                self._slurm_ids = None
        if changed:
            self._storage.upsert_jobs(changed)
        return len(changed)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the registry's lock: no other thread changes or reads it meanwhile (to fork a
        process that reads it, ``detect.fork``)."""
        with self._lock:
            yield

    def jobs(self) -> list[Job]:
        """Current jobs: adapters' latest lists, then API jobs, by key (adapters win)."""
        with self._lock:
            merged = dict(self._api)
            for jobs in self._by_source.values():
                merged.update(jobs)
            return list(merged.values())

    def known(self) -> list[Job]:
        """Every job seen since start, including ones the schedulers no longer list."""
        with self._lock:
            return list(self._known.values())

    def get(self, key: str) -> Job | None:
        """A job by key, current or remembered."""
        with self._lock:
            return self._known.get(key)

    def resolve(self, scheduler: str, ident: str, node: str) -> str:
        """The registry key for a job the agent attributed a process to.

        Kubernetes pods are keyed by pod UID. A Slurm job id is unique per cluster: prefer a
        known Slurm job with that id that runs on ``node``, then any with that id.
        """
        if scheduler == "kubernetes":
            if "/" in ident:  # ``namespace/name`` (dcgm-exporter's labels), never a pod UID
                return self._pod_by_name(ident, node) or f"k8s:{ident}"
            return f"k8s:{ident}"
        with self._lock:  # an index by Slurm job id: detection resolves every process series
            if self._slurm_ids is None:
                self._slurm_ids = {}
                for job in self._known.values():
                    if job.scheduler == "slurm":
                        self._slurm_ids.setdefault(job.job_id, []).append(job)
            candidates = list(self._slurm_ids.get(ident, ()))
        for job in candidates:
            if any(alloc.node == node for alloc in job.allocations):
                return job.key
        if candidates:
            return candidates[0].key
        return f"{scheduler}:{ident}"

    def _pod_by_name(self, name: str, node: str) -> str | None:
        """The key of the Kubernetes job whose id is ``namespace/name``: the one on ``node``
        first, then the latest started (a pod name is reused by the pod that replaces it)."""
        pods = [j for j in self.known() if j.scheduler == "kubernetes" and j.job_id == name]
        pods.sort(
            key=lambda j: (any(a.node == node for a in j.allocations), j.start_time or 0.0),
            reverse=True,
        )
        return pods[0].key if pods else None
