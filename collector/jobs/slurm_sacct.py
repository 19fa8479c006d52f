"""Slurm accounting: ``sacct --json`` as :class:`~gpuwarden.collector.jobs.runs.QueueRun` s.

``sacct`` needs ``AccountingStorageType=accounting_storage/slurmdbd``; it is the scheduler's own
record of every attempt of every job (``--duplicates``: a job requeued by a preemption has one
record ``PREEMPTED`` and one for its next attempt), with submit, eligible, start and end times,
account, partition, QOS and allocated TRES. GPUs are the allocated ``gres/gpu`` TRES (which
``AccountingStorageTRES=gres/gpu`` makes Slurm record), else the requested one.

Read in the 22.05 dialect (``openapi/dbv0.0.38``: plain numbers, ``0`` for "not set",
``state.current`` a string) and the later one (numbers as ``{"set", "infinite", "number"}``,
``state.current`` a list), like :mod:`~gpuwarden.collector.jobs.slurm`. The one boundary is
the Slurm CLI runner (:mod:`~gpuwarden.collector.jobs.slurm_cli`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from gpuwarden.collector.jobs import JobSourceError
from gpuwarden.collector.jobs.runs import QueueRun
from gpuwarden.collector.jobs.slurm import (
    SCHEDULER,
    job_entries,
    slurm_number,
    slurm_time,
    state_names,
)
from gpuwarden.collector.jobs.slurm_cli import RunStatus, SlurmCli, SlurmRunner

log = logging.getLogger(__name__)

SACCT_ARGS = ("sacct", "--json", "--allusers", "--duplicates", "--allocations")
PREEMPTED = "PREEMPTED"


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _object(entry: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``entry[key]`` when it is an object, else an empty one."""
    value = entry.get(key)
    return value if isinstance(value, Mapping) else {}


def _gpus(tres: object) -> int | None:
    """GPUs in a list of TRES objects (``{"type": "gres", "name": "gpu", "count": 2}``)."""
    if not isinstance(tres, list):
        return None
    found = None
    for item in tres:
        if not isinstance(item, Mapping) or item.get("type") != "gres":
            continue
        name = _text(item.get("name"))
        if name == "gpu" or name.startswith("gpu:"):
            found = (found or 0) + (slurm_number(item.get("count")) or 0)
    return found


def run_from_sacct(entry: Mapping[str, Any], *, cluster: str) -> QueueRun:
    """One element of ``sacct --json``'s ``jobs`` list as a :class:`QueueRun`.

    Raises:
        ValueError: The entry has no job id.

    """
    job_id = slurm_number(entry.get("job_id"))
    if job_id is None:
        raise ValueError("job without job_id")
    times, state, tres = (_object(entry, key) for key in ("time", "state", "tres"))
    names = state_names(state.get("current"))
    allocated = _gpus(tres.get("allocated"))
    requested = _gpus(tres.get("requested"))
    return QueueRun(
        key=f"{SCHEDULER}:{cluster}:{job_id}",
        team=_text(entry.get("account")) or None,
        queue=_text(entry.get("partition")) or None,
        gpus=allocated if allocated is not None else requested or 0,
        submit_time=slurm_time(times.get("submission")),
        eligible_time=slurm_time(times.get("eligible")),
        start_time=slurm_time(times.get("start")),
        end_time=slurm_time(times.get("end")),
        preempted=PREEMPTED in names,
        qos=_text(entry.get("qos")) or None,
        state=",".join(names),
    )


def parse_sacct_json(text: str, *, cluster: str) -> list[QueueRun]:
    """Parse ``sacct --json``; entries without a job id are logged and skipped.

    Raises:
        JobSourceError: Not JSON, no ``jobs`` list, or Slurm reported errors.

    """
    runs = []
    for entry in job_entries(text, "sacct"):
        try:
            runs.append(run_from_sacct(entry, cluster=cluster))
        except ValueError as error:
            log.warning("sacct: skipping a job entry: %s", error)
    return runs


def sacct_time(unix_seconds: float) -> str:
    """A time as ``sacct --starttime`` reads it: local time, ``YYYY-MM-DDTHH:MM:SS``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(unix_seconds))


class SlurmAccounting:
    """The attempts ``sacct`` recorded for one Slurm cluster in a window.

    Args:
        cluster: The cluster's name, used in job keys (``slurm:<cluster>:<id>``), as the job
            source's.
        env: Environment for ``sacct`` (``SLURM_CONF``, ``PATH``); ``None`` inherits ours.
        runner: Runs an argument list (a seam for tests); by default a ``SlurmCli``.
        timeout_seconds: How long the default runner lets ``sacct`` take.

    """

    def __init__(
        self,
        *,
        cluster: str,
        env: Mapping[str, str] | None = None,
        runner: SlurmRunner | None = None,
        timeout_seconds: float = 30,
    ) -> None:
        self.cluster = cluster
        self._runner = runner or SlurmCli(env=env, timeout_seconds=timeout_seconds)

    def runs(self, since: float, until: float) -> list[QueueRun]:
        """Every attempt that was pending, running or ended within ``[since, until]``.

        Raises:
            JobSourceError: ``sacct`` could not run, failed, timed out or printed bad JSON.

        """
        args = [*SACCT_ARGS, f"--starttime={sacct_time(since)}", f"--endtime={sacct_time(until)}"]
        result = self._runner(args)
        if result.status is RunStatus.TIMED_OUT:
            raise JobSourceError(f"sacct timed out after {result.timeout_seconds:g} s")
        if result.status is RunStatus.NOT_STARTED:
            raise JobSourceError(f"cannot run sacct: {result.error}")
        if result.returncode != 0:
            tail = result.stderr.strip()[-500:] or "(no stderr)"
            raise JobSourceError(f"sacct exited with status {result.returncode}: {tail}")
        return parse_sacct_json(result.stdout, cluster=self.cluster)
