"""Which job owns a process: a Slurm job or a Kubernetes pod, learned from ``/proc``.

The cgroup path is the authority (Slurm's cgroup plugins and the kubelet put every task there
before it runs); ``SLURM_JOB_ID`` in the environment is the fallback for Slurm set up without
cgroups (``proctrack/linuxproc``). Nothing here raises for a process that vanished or cannot be
read: it simply has no job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from gpuwarden.agent.model import JobRef, ProcessSample

CGROUP_LIMIT_BYTES = 64 * 1024
ENVIRON_LIMIT_BYTES = 256 * 1024
STAT_LIMIT_BYTES = 4 * 1024
DEFAULT_MAX_CACHE_ENTRIES = 4096

# /proc/<pid>/stat field 22 (1-based), counted after the ")" that closes the command name.
_STAT_STARTTIME_INDEX = 22 - 3

# Slurm cgroup v1: /slurm/uid_<uid>/job_<id>/..., or /slurm_<node>/... with multiple slurmd.
_SLURM_V1_ROOT = re.compile(r"slurm(?:_.+)?")
_SLURM_UID = re.compile(r"uid_\d+")
# Slurm cgroup v2: /system.slice/slurmstepd.scope/job_<id>/..., or <node>_slurmstepd.scope.
_SLURM_V2_SCOPE = re.compile(r"(?:.+_)?slurmstepd\.scope")
_SLURM_JOB = re.compile(r"job_(\d+)")
_SLURM_JOB_ID_VALUE = re.compile(r"\d+")

# A pod UID: a UUID (dashes, or underscores under the systemd driver) or, for static pods,
# the 32-hex config hash.
_UID = r"[0-9a-fA-F]{8}(?:[-_]?[0-9a-fA-F]{4}){3}[-_]?[0-9a-fA-F]{12}"
# cgroupfs driver: /kubepods[/burstable|/besteffort]/pod<uid>/<container id>.
_POD_CGROUPFS = re.compile(rf"pod({_UID})")
# systemd driver: kubepods[-burstable|-besteffort]-pod<uid>.slice, also under kubelet-*.
_POD_SYSTEMD = re.compile(rf"(?:.+-)?kubepods(?:-burstable|-besteffort)?-pod({_UID})\.slice")
# The container: a bare id (cgroupfs) or <runtime>-<id>.scope (systemd driver).
_CONTAINER = re.compile(
    r"(?:(?:cri-containerd|containerd|docker|crio|cri-o)-)?([0-9a-fA-F]{64})(?:\.scope)?"
)


def _cgroup_paths(text: str) -> list[list[str]]:
    """Split ``/proc/<pid>/cgroup`` (``id:controllers:path`` per line) into path components."""
    paths = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3:
            paths.append([part for part in fields[2].split("/") if part])
    return paths


def _slurm_job(parts: Sequence[str]) -> str | None:
    for index, part in enumerate(parts):
        after = parts[index + 1 : index + 3]
        if _SLURM_V1_ROOT.fullmatch(part) and len(after) == 2 and _SLURM_UID.fullmatch(after[0]):
            job = _SLURM_JOB.fullmatch(after[1])
        elif _SLURM_V2_SCOPE.fullmatch(part) and after:
            job = _SLURM_JOB.fullmatch(after[0])
        else:
            continue
        if job is not None:
            return job.group(1)
    return None


def _kubernetes_pod(parts: Sequence[str]) -> tuple[str, str | None] | None:
    for index, part in enumerate(parts):
        pod = _POD_SYSTEMD.fullmatch(part)
        if pod is None and "kubepods" in parts[:index]:
            pod = _POD_CGROUPFS.fullmatch(part)
        if pod is None:
            continue
        uid = pod.group(1).replace("_", "-").lower()
        following = parts[index + 1] if index + 1 < len(parts) else ""
        container = _CONTAINER.fullmatch(following)
        return uid, container.group(1).lower() if container else None
    return None


def parse_cgroup(text: str) -> JobRef | None:
    """Return the job named by the contents of a ``/proc/<pid>/cgroup`` file, if any.

    A Slurm job wins over a Kubernetes pod: Slurm run inside a pod nests its job cgroups under
    the pod's, and the job is the finer answer.
    """
    paths = _cgroup_paths(text)
    for parts in paths:
        job_id = _slurm_job(parts)
        if job_id is not None:
            return JobRef(scheduler="slurm", job_id=job_id, source="cgroup")
    for parts in paths:
        pod = _kubernetes_pod(parts)
        if pod is not None:
            return JobRef(
                scheduler="kubernetes", pod_uid=pod[0], container_id=pod[1], source="cgroup"
            )
    return None


def parse_environ(data: bytes) -> dict[str, str]:
    """Decode a NUL-separated ``/proc/<pid>/environ``; entries without ``=`` are dropped."""
    environ = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key:
            environ[key.decode(errors="replace")] = value.decode(errors="replace")
    return environ


def environ_job(environ: Mapping[str, str]) -> JobRef | None:
    """Return the Slurm job named by ``SLURM_JOB_ID`` (or the older ``SLURM_JOBID``)."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if job_id is None or not _SLURM_JOB_ID_VALUE.fullmatch(job_id):
        return None
    return JobRef(scheduler="slurm", job_id=job_id, source="environ")


def _read_bounded(path: Path, limit_bytes: int, separator: bytes) -> bytes | None:
    """Read at most ``limit_bytes``; past the limit keep only whole ``separator`` records."""
    try:
        with path.open("rb") as file:
            data = file.read(limit_bytes + 1)
    except OSError:  # gone (ENOENT, ESRCH), not ours (EACCES), or not a file
        return None
    if len(data) > limit_bytes:
        data = data[:limit_bytes].rpartition(separator)[0]
    return data


def read_environ(proc_root: Path, pid: int) -> dict[str, str] | None:
    """Return the initial environment of ``pid``, or ``None`` if it cannot be read."""
    data = _read_bounded(proc_root / str(pid) / "environ", ENVIRON_LIMIT_BYTES, b"\0")
    return None if data is None else parse_environ(data)


def read_start_time(proc_root: Path, pid: int) -> int | None:
    """Return the start time of ``pid`` in clock ticks since boot (``stat`` field 22)."""
    data = _read_bounded(proc_root / str(pid) / "stat", STAT_LIMIT_BYTES, b"\n")
    if data is None:
        return None
    # The command name (field 2) may hold spaces and parentheses; it ends at the last ")".
    fields = data.rpartition(b")")[2].split()
    try:
        return int(fields[_STAT_STARTTIME_INDEX])
    except (IndexError, ValueError):
        return None


class Attributor:
    """Map process ids to the job that owns them, caching one answer per process lifetime.

    Args:
        proc_root: The ``/proc`` tree to read (a recorded tree in tests).
        max_cache_entries: Hard bound on cached answers when ``job_for_pid`` is called without
            ``attribute`` pruning the cache; the oldest entry goes first.

    """

    def __init__(
        self, proc_root: Path = Path("/proc"), *, max_cache_entries: int = DEFAULT_MAX_CACHE_ENTRIES
    ) -> None:
        if max_cache_entries < 1:
            msg = f"max_cache_entries must be at least 1, got {max_cache_entries}"
            raise ValueError(msg)
        self._proc_root = proc_root
        self._max_cache_entries = max_cache_entries
        # pid -> (start time, answer); the start time tells a reused pid from the old process.
        self._cache: dict[int, tuple[int, JobRef | None]] = {}

    def job_for_pid(self, pid: int) -> JobRef | None:
        """Return the job owning ``pid``, or ``None`` if it has none, ended or is unreadable."""
        if pid <= 0:
            return None
        start_time = read_start_time(self._proc_root, pid)
        if start_time is None:
            self._cache.pop(pid, None)
            return None
        cached = self._cache.get(pid)
        if cached is not None and cached[0] == start_time:
            return cached[1]
        job = self._read_job(pid)
        # If the pid was reused while we read, the files may describe either process.
        if read_start_time(self._proc_root, pid) != start_time:
            self._cache.pop(pid, None)
            return None
        self._remember(pid, start_time, job)
        return job

    def attribute(self, processes: Sequence[ProcessSample]) -> tuple[ProcessSample, ...]:
        """Return copies of ``processes`` with ``job`` filled where the owner is known.

        A job a sample already carries is kept when ``/proc`` names none. Cached answers for pids
        absent from this call are dropped, so the cache holds at most one round's processes:
        pass a whole round (every GPU's processes) in one call. A pid listed several times (one
        process on several GPUs) is looked up once; a sample whose job is already right is
        returned as it is.
        """
        jobs: dict[int, JobRef | None] = {}
        attributed = []
        for process in processes:
            pid = process.pid
            if pid not in jobs:
                jobs[pid] = self.job_for_pid(pid)
            job = jobs[pid] or process.job
            attributed.append(process if job == process.job else replace(process, job=job))
        for pid in [pid for pid in self._cache if pid not in jobs]:
            del self._cache[pid]
        return tuple(attributed)

    def _read_job(self, pid: int) -> JobRef | None:
        cgroup = _read_bounded(self._proc_root / str(pid) / "cgroup", CGROUP_LIMIT_BYTES, b"\n")
        if cgroup is not None:
            job = parse_cgroup(cgroup.decode(errors="replace"))
            if job is not None:
                return job
        environ = read_environ(self._proc_root, pid)
        return None if environ is None else environ_job(environ)

    def _remember(self, pid: int, start_time: int, job: JobRef | None) -> None:
        self._cache.pop(pid, None)
        while len(self._cache) >= self._max_cache_entries:
            del self._cache[next(iter(self._cache))]
        self._cache[pid] = (start_time, job)
