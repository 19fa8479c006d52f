"""Slurm adapter: what ``squeue --json --all`` reports, as scheduler-neutral :class:`Job` objects.

The only boundary to Slurm is one ``squeue`` run per poll, through
:mod:`~gpuwarden.collector.jobs.slurm_cli` (an argument list, never a shell).
Two JSON dialects are read:

* Slurm 22.05 (``openapi/v0.0.38``): numbers are plain JSON numbers, ``0`` meaning "not set";
  ``job_state`` is one string, which names a state flag (``COMPLETING``, ``REQUEUED``, ...)
  instead of the base state while such a flag is set.
* Later releases (the ``data_parser`` plugins): numbers are ``{"set", "infinite", "number"}``
  objects and ``job_state`` is a list, the base state first and then its flags. Each field is
  read in either shape, whichever release mixes them (only 22.05 was run here).

GPUs come from ``gres_detail``, one string per allocated node in the order of the ``nodes``
hostlist (``gpu:a100:2(IDX:0-1)``). Pending and finished jobs have no ``gres_detail``; their
``gpus`` is the request (``tres_per_job``/``tres_per_node``/``tres_per_task``).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpuwarden.collector.jobs import JobSourceError
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.jobs.slurm_cli import RunStatus, SlurmCli, SlurmRunner

log = logging.getLogger(__name__)

SCHEDULER = "slurm"
SQUEUE_ARGS = ("squeue", "--json", "--all")
STDERR_TAIL_CHARS = 1000
MAX_HOSTLIST_HOSTS = 65536  # a hostlist expanding further than this is malformed, not a cluster

_BASE_STATES: Mapping[str, JobState] = MappingProxyType(
    {
        "PENDING": JobState.PENDING,
        "RUNNING": JobState.RUNNING,
        "SUSPENDED": JobState.SUSPENDED,
        "COMPLETED": JobState.COMPLETED,
        "CANCELLED": JobState.CANCELLED,
        "FAILED": JobState.FAILED,
        "TIMEOUT": JobState.FAILED,
        "NODE_FAIL": JobState.FAILED,
        "BOOT_FAIL": JobState.FAILED,
        "DEADLINE": JobState.FAILED,
        "OUT_OF_MEMORY": JobState.FAILED,
        "PREEMPTED": JobState.PREEMPTED,
    }
)
# What a flag means when it is all we are told (22.05 prints the flag instead of the base state).
_FLAG_STATES: Mapping[str, JobState] = MappingProxyType(
    {
        # Still holds (or is about to use) its allocation; the next poll shows the outcome.
        "COMPLETING": JobState.RUNNING,
        "CONFIGURING": JobState.RUNNING,
        "RESIZING": JobState.RUNNING,
        "SIGNALING": JobState.RUNNING,
        "STAGE_OUT": JobState.RUNNING,
        "STOPPED": JobState.SUSPENDED,
        "REQUEUED": JobState.REQUEUED,
        "REQUEUE_FED": JobState.REQUEUED,
        "REQUEUE_HOLD": JobState.REQUEUED,
        "SPECIAL_EXIT": JobState.REQUEUED,
        "RESV_DEL_HOLD": JobState.PENDING,
        "REVOKED": JobState.CANCELLED,
    }
)
_REQUEUE_FLAGS = frozenset(
    flag for flag, state in _FLAG_STATES.items() if state is JobState.REQUEUED
)
_ENDED = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED})
_NOT_STARTED = frozenset({JobState.PENDING, JobState.REQUEUED})

_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_NO_NODES = frozenset({"", "(null)", "None assigned"})
_HOSTLIST_PART = re.compile(r"(\[[^\[\]]*\])")
_GRES_ITEM = re.compile(r"(?P<spec>[^()]+?)(?:\((?P<kind>IDX|CNT):(?P<value>[^()]*)\))?")
_TRES_GRES_PREFIX = re.compile(r"gres[:/]")


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """GPUs one ``gres_detail`` entry gives a job on one node."""

    count: int
    indices: tuple[int, ...] = ()


def slurm_number(value: object) -> int | None:
    """Read a Slurm JSON number: plain (22.05), or ``{"set", "infinite", "number"}`` (later).

    Returns ``None`` for an unset or infinite number and for anything that is not a number.
    """
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def slurm_time(value: object) -> float | None:
    """Read a Slurm timestamp in Unix seconds; ``0`` and unset mean unknown (``None``)."""
    seconds = slurm_number(value)
    return float(seconds) if seconds else None


def state_names(value: object) -> tuple[str, ...]:
    """Return ``job_state`` as a tuple of names, whichever dialect printed it."""
    if isinstance(value, str):
        return (value.upper(),) if value else ()
    if isinstance(value, list):
        return tuple(name.upper() for name in value if isinstance(name, str) and name)
    return ()


def slurm_state(value: object) -> JobState:
    """Map ``job_state`` (a string or a list of base state and flags) to a :class:`JobState`."""
    names = state_names(value)
    if _REQUEUE_FLAGS.intersection(names):
        return JobState.REQUEUED
    for name in names:
        if name in _BASE_STATES:
            return _BASE_STATES[name]
    for name in names:
        if name in _FLAG_STATES:
            return _FLAG_STATES[name]
    return JobState.UNKNOWN


def _split_top_level(text: str, opening: str, closing: str) -> list[str]:
    """Split at commas that are not inside ``opening``/``closing`` brackets."""
    items: list[str] = []
    depth = 0
    start = 0
    for position, char in enumerate(text):
        if char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {closing!r} in {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:position])
            start = position + 1
    if depth != 0:
        raise ValueError(f"unbalanced {opening!r} in {text!r}")
    items.append(text[start:])
    return items


def _expand_ranges(body: str) -> list[str]:
    """Expand ``01-03,07`` to ``01 02 03 07``, keeping the zero padding of each lower bound."""
    values: list[str] = []
    for piece in body.split(","):
        low, dash, high = piece.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"bad range {piece!r}")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"descending range {piece!r}")
        if int(high) - int(low) >= MAX_HOSTLIST_HOSTS:
            raise ValueError(f"range {piece!r} is too large")
        values.extend(str(number).zfill(len(low)) for number in range(int(low), int(high) + 1))
    return values


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist: ``node[01-03,07],gpu-a[1-2]x[1-2]`` to host names, in order.

    An empty list (``""``, ``(null)``, ``None assigned``) expands to no hosts.

    Raises:
        ValueError: The text is not a hostlist.

    """
    text = text.strip()
    if text in _NO_NODES:
        return []
    hosts: list[str] = []
    for item in _split_top_level(text, "[", "]"):
        parts = _HOSTLIST_PART.split(item.strip())
        literals = parts[0::2]
        if not item.strip() or any(char in "[]," for part in literals for char in part):
            raise ValueError(f"bad hostlist {text!r}")
        choices = [
            [part] if index % 2 == 0 else _expand_ranges(part[1:-1])
            for index, part in enumerate(parts)
        ]
        hosts.extend("".join(combination) for combination in itertools.product(*choices))
        if len(hosts) > MAX_HOSTLIST_HOSTS:
            raise ValueError(f"hostlist {text[:80]!r} expands to too many hosts")
    return hosts


def parse_gres_detail(detail: str) -> NodeGpus:
    """Count the GPUs (and their indices) in one node's ``gres_detail`` string.

    Handles ``gpu:1(IDX:0)``, ``gpu:a100:2(IDX:0-1)``, ``gpu:4(IDX:0,2-3)``, ``gpu(CNT:2)``
    (allocated without device files, so no indices) and several GRES on one node
    (``gpu:1(IDX:0),nic:1(IDX:0)``). Shared GRES (``shard``, ``mps``) are not GPUs.

    Raises:
        ValueError: The text is not a GRES detail.

    """
    count = 0
    indices: list[int] = []
    for item in _split_top_level(detail.strip(), "(", ")"):
        match = _GRES_ITEM.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"bad gres_detail {detail!r}")
        fields = match["spec"].split(":")
        if fields[0] != "gpu":
            continue
        if match["kind"] == "CNT":
            if not match["value"].isdigit():
                raise ValueError(f"bad gres count in {detail!r}")
            count += int(match["value"])
            continue
        if len(fields) < 2 or not fields[-1].isdigit():
            raise ValueError(f"no gres count in {detail!r}")
        count += int(fields[-1])
        if match["kind"] == "IDX" and match["value"] not in ("", "N/A"):
            indices.extend(int(index) for index in _expand_ranges(match["value"]))
    return NodeGpus(count=count, indices=tuple(sorted(set(indices))))


def gpus_in_tres(tres: str) -> int:
    """Count GPUs in a TRES request: ``gres:gpu:2`` (22.05), ``gres/gpu:a100:2``, ``gres/gpu=2``."""
    count = 0
    for item in tres.split(","):
        prefix = _TRES_GRES_PREFIX.match(item.strip())
        if prefix is None:
            continue
        fields = re.split(r"[:=]", item.strip()[prefix.end() :])
        if fields[0] != "gpu":
            continue
        count += int(fields[-1]) if len(fields) > 1 and fields[-1].isdigit() else 1
    return count


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _requested_gpus(entry: Mapping[str, Any]) -> int:
    per_job = gpus_in_tres(_text(entry.get("tres_per_job")))
    per_node = gpus_in_tres(_text(entry.get("tres_per_node")))
    per_task = gpus_in_tres(_text(entry.get("tres_per_task")))
    nodes = slurm_number(entry.get("node_count")) or 1
    tasks = slurm_number(entry.get("tasks")) or 1
    return per_job + per_node * nodes + per_task * tasks


def _allocated_gpus(entry: Mapping[str, Any]) -> tuple[int, tuple[GpuAllocation, ...]]:
    """GPUs held now, from ``gres_detail`` (one entry per node, in hostlist order)."""
    details = entry.get("gres_detail") or []
    if not isinstance(details, list) or not details:
        return 0, ()
    nodes = expand_hostlist(_text(entry.get("nodes")))
    if len(details) != len(nodes):
        raise ValueError(f"{len(details)} gres_detail entries for {len(nodes)} nodes")
    count = 0
    allocations = []
    for node, detail in zip(nodes, details, strict=True):
        gpus = parse_gres_detail(_text(detail))
        count += gpus.count
        if gpus.count:
            allocations.append(GpuAllocation(node=node, indices=gpus.indices))
    return count, tuple(allocations)


def _labels(entry: Mapping[str, Any]) -> Mapping[str, str]:
    labels = {
        "partition": _text(entry.get("partition")),
        "qos": _text(entry.get("qos")),
        "reason": _text(entry.get("state_reason")),
        "slurm_state": ",".join(state_names(entry.get("job_state"))),
    }
    return MappingProxyType(
        {key: value for key, value in labels.items() if value not in ("", "None")}
    )


def job_from_squeue(entry: Mapping[str, Any], *, cluster: str) -> Job:
    """Build a :class:`Job` from one element of ``squeue --json``'s ``jobs`` list.

    Raises:
        ValueError: The entry has no job id.

    """
    job_id = slurm_number(entry.get("job_id"))
    if job_id is None:
        raise ValueError("job without job_id")
    state = slurm_state(entry.get("job_state"))
    try:
        gpus, allocations = _allocated_gpus(entry)
    except ValueError as error:
        log.warning("slurm job %s: cannot read its GPU allocation: %s", job_id, error)
        gpus, allocations = 0, ()
    # A pending job's start_time is the backfill scheduler's estimate and a running job's
    # end_time its time limit: neither has happened, so neither is reported.
    started = state not in _NOT_STARTED
    return Job(
        key=f"{SCHEDULER}:{cluster}:{job_id}",
        scheduler=SCHEDULER,
        job_id=str(job_id),
        state=state,
        name=_text(entry.get("name")) or None,
        owner=_text(entry.get("user_name")) or None,
        team=_text(entry.get("account")) or _text(entry.get("partition")) or None,
        gpus=gpus or _requested_gpus(entry),
        allocations=allocations,
        submit_time=slurm_time(entry.get("submit_time")),
        eligible_time=slurm_time(entry.get("eligible_time")),
        start_time=slurm_time(entry.get("start_time")) if started else None,
        end_time=slurm_time(entry.get("end_time")) if state in _ENDED else None,
        priority=slurm_number(entry.get("priority")),
        restarts=slurm_number(entry.get("restart_cnt")) or 0,
        labels=_labels(entry),
    )


def _describe_errors(errors: list[Any]) -> str:
    """Summarise squeue's ``errors`` objects: ``description (source: error)``."""
    described = []
    for error in errors[:3]:
        if not isinstance(error, Mapping):
            described.append(str(error))
            continue
        detail = ": ".join(str(error[key]) for key in ("source", "error") if error.get(key))
        text = str(error.get("description") or "")
        described.append(f"{text} ({detail})" if text and detail else text or detail)
    return "; ".join(described)


def job_entries(text: str, program: str) -> list[Mapping[str, Any]]:
    """The job objects of a Slurm ``--json`` document (``squeue``, ``sacct``); an entry that is
    not an object is logged and skipped.

    Raises:
        JobSourceError: Not JSON, no ``jobs`` list, or Slurm reported errors.

    """
    try:
        document = json.loads(text)
    except ValueError as error:
        raise JobSourceError(f"{program} printed no valid JSON: {error}") from error
    if not isinstance(document, Mapping) or not isinstance(document.get("jobs"), list):
        raise JobSourceError(f"{program} JSON has no 'jobs' list")
    # 22.05 exits 0 with no jobs and an ``errors`` entry when slurmctld cannot be reached:
    # an empty list then would read as "every job ended".
    errors = document.get("errors")
    if isinstance(errors, list) and errors:
        raise JobSourceError(f"{program} reported errors: {_describe_errors(errors)}")
    entries = []
    for entry in document["jobs"]:
        if isinstance(entry, Mapping):
            entries.append(entry)
        else:
            log.warning("%s: skipping a job entry that is not an object", program)
    return entries


def parse_squeue_json(text: str, *, cluster: str) -> list[Job]:
    """Parse the output of ``squeue --json``; entries without a job id are logged and skipped.

    Raises:
        JobSourceError: Not JSON, no ``jobs`` list, or Slurm reported errors.

    """
    jobs = []
    for entry in job_entries(text, "squeue"):
        try:
            jobs.append(job_from_squeue(entry, cluster=cluster))
        except ValueError as error:
            log.warning("squeue: skipping a job entry: %s", error)
    return jobs


def _tail(stream: str) -> str:
    """The last whole lines of ``stream``, at most ``STDERR_TAIL_CHARS`` characters."""
    text = stream.strip()
    if len(text) > STDERR_TAIL_CHARS:
        text = text[-STDERR_TAIL_CHARS:]
        text = text.partition("\n")[2] or text
    return text or "(no stderr)"


class SlurmJobSource:
    """The jobs of one Slurm cluster, from ``squeue --json --all`` (Slurm 22.05 or later).

    Args:
        cluster: The cluster's name, used in job keys (``slurm:<cluster>:<id>``).
        env: Environment for ``squeue`` (``SLURM_CONF``, ``PATH``); ``None`` inherits ours.
        runner: Runs an argument list (a seam for tests); by default a
            :class:`~gpuwarden.collector.jobs.slurm_cli.SlurmCli` with ``env`` and
            ``timeout_seconds``.
        timeout_seconds: How long the default runner lets ``squeue`` take.

    """

    def __init__(
        self,
        *,
        cluster: str,
        env: Mapping[str, str] | None = None,
        runner: SlurmRunner | None = None,
        timeout_seconds: float = 10,
    ) -> None:
        if not _CLUSTER_NAME.fullmatch(cluster):
            raise ValueError(f"bad Slurm cluster name {cluster!r}")
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        self.cluster = cluster
        self.timeout_seconds = timeout_seconds
        self._runner = runner or SlurmCli(env=env, timeout_seconds=timeout_seconds)

    def jobs(self, now: float) -> list[Job]:
        """Every job ``squeue`` knows: pending, running, and ended within ``MinJobAge``.

        Raises:
            JobSourceError: ``squeue`` could not run, failed, timed out or printed bad JSON.

        """
        result = self._runner(list(SQUEUE_ARGS))
        if result.status is RunStatus.TIMED_OUT:
            msg = f"squeue timed out after {result.timeout_seconds:g} s: {_tail(result.stderr)}"
            raise JobSourceError(msg)
        if result.status is RunStatus.NOT_STARTED:
            raise JobSourceError(f"cannot run squeue: {result.error}")
        if result.returncode != 0:
            msg = f"squeue exited with status {result.returncode}: {_tail(result.stderr)}"
            raise JobSourceError(msg)
        return parse_squeue_json(result.stdout, cluster=self.cluster)
