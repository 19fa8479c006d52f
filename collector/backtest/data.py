"""Recorded telemetry for backtests: our trace CSV, the GenTD26 folder, and truth labels.

A :class:`Dataset` streams :class:`Reading` rows in time order (it never holds the points: two
passes over the file, the first only for the jobs' spans and the time range), so a replay's memory
is bounded by the collector's store, not by the file.

**Our CSV** (optionally gzip'd) is the agent's replay trace (``agent/sources/replay.py``) with two
optional columns for the collector's side::

    time_seconds,gpu_uuid,node,job,name,utilization_ratio,memory_used_bytes
    0,GPU-0,n1,train-1,NVIDIA H100 80GB HBM3,0.93,68719476736

``time_seconds`` and ``gpu_uuid`` come first, rows in non-decreasing time. ``node`` is the host
(default ``replay``); ``job`` the job holding the GPU at that row (empty: none; a job holds each GPU
from its first row to one cadence after its last; without the column every GPU is held by a job of
its own, ``<node>-<gpu_uuid>``, over all its rows); ``name`` the GPU model; ``index`` the GPU's
index on its node. Every other column is a GPU metric field of the agent's catalog (see
:data:`FIELD_METRICS`); an empty cell is "not measured". Times below 1e9 are offsets and are
shifted to :data:`RELATIVE_ORIGIN` (reports and labels use the file's own times).

**GenTD26** (``pod_gpu_duty_cycle_anon.csv.gz`` in a folder, read by
:mod:`gpuwarden.agent.traces`): each pod (``container_ip``) becomes
one GPU on its own node, held by one synthetic job from its first sample to one 57 s tick after its
last; the duty cycle (%) becomes ``hw.gpu.utilization`` (ratio).

**Labels**: ``subject,start,end[,rule]`` — truth windows in the data's time, the subject as the
incidents name it (``node/gpu_uuid`` for GPU rules); without ``rule`` it counts for every rule.
"""

from __future__ import annotations

import csv
import itertools
import math
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from gpuwarden.agent.catalog import CATALOG, Scope, Shape
from gpuwarden.agent.traces import (
    GENTD26_COLUMNS,
    GENTD26_DUTY_CYCLE_FILE,
    GENTD26_TICK_SECONDS,
    GenTD26HeaderError,
    TraceError,
    gentd26_cells,
    open_csv,
)
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState

RELATIVE_ORIGIN = 1_767_225_600.0
"""2026-01-01T00:00:00Z: where a trace whose times are offsets (below 1e9) starts."""
GENTD26_FILE = GENTD26_DUTY_CYCLE_FILE
GENTD26_MODEL = "unknown (GenTD26)"
"""The trace does not name its GPUs: they cost the price table's default."""
JOB_SCHEDULER = "api"
#: a ``job`` value's key prefix → the scheduler of the job source that makes such keys
KEY_PREFIXES = {"k8s": "kubernetes", "slurm": "slurm", JOB_SCHEDULER: JOB_SCHEDULER}
DEFAULT_NODE = "replay"
DEFAULT_MODEL = "replay"
_META_COLUMNS = ("node", "job", "name", "index")


@dataclass(frozen=True, slots=True)
class FieldMetric:
    """How the agent exports one GpuSample field (from its catalog)."""

    name: str
    unit: str
    kind: str
    monotonic: bool
    attributes: Mapping[str, str]


def _field_metrics() -> Mapping[str, FieldMetric]:
    kinds = {"gauge": ("gauge", False), "counter": ("sum", True), "updowncounter": ("sum", False)}
    out: dict[str, FieldMetric] = {}
    for row in CATALOG:
        if row.scope is Scope.GPU and row.shape is Shape.SCALAR:
            kind, monotonic = kinds[row.instrument.value]
            metric = FieldMetric(row.name, row.unit, kind, monotonic, row.attributes)
            out.setdefault(row.field, metric)
    return MappingProxyType(out)


FIELD_METRICS: Mapping[str, FieldMetric] = _field_metrics()
"""GpuSample field → its metric, for every scalar GPU field of the agent's catalog."""


class DataError(ValueError):
    """Bad input: the message names the file and line (or key)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One GPU's measurements at one time (data time plus the dataset's offset)."""

    time_seconds: float
    node: str
    gpu_uuid: str
    model: str
    index: int
    values: Mapping[str, float]
    """GpuSample field → value; fields not measured are absent."""


@dataclass(frozen=True, slots=True)
class Dataset:
    """A recorded trace ready to replay: its jobs, time range, and a fresh stream of readings."""

    path: Path | str
    """The file or folder, or the URL of a Prometheus."""
    kind: str
    jobs: tuple[Job, ...]
    gpus: int
    start_seconds: float
    end_seconds: float
    cadence_seconds: float
    offset_seconds: float
    """Added to the file's times (reports subtract it again)."""
    readings: Callable[[], Iterator[Reading]]
    batches: Callable[[], Iterator[tuple[float, list[NumberPoint]]]] | None = None
    """Points already in the agent's shape, by time (a Prometheus window translated by
    ``prom_map``); when set, the replay reads these instead of ``readings``."""


@dataclass(frozen=True, slots=True)
class Label:
    """A truth window: ``subject`` had the problem over ``[start, end]`` (data time)."""

    subject: str
    start_seconds: float
    end_seconds: float
    rule_id: str | None = None


def load_dataset(path: Path, *, pods: int | None = None) -> Dataset:
    """Our CSV file, or a GenTD26 folder (``pods`` keeps the N pods with most samples).

    Raises:
        DataError: naming the file and line or key.

    """
    if pods is not None and pods <= 0:
        raise DataError(f"--pods: must be positive, got {pods}")
    if path.is_dir():
        if not (path / GENTD26_FILE).is_file():
            raise DataError(f"{path}: a folder without {GENTD26_FILE} (the GenTD26 layout)")
        return _gentd26(path / GENTD26_FILE, pods)
    if not path.is_file():
        raise DataError(f"{path}: no such file or folder")
    if pods is not None:
        raise DataError(f"--pods: only for a GenTD26 folder, not {path}")
    return _trace(path)


@contextmanager
def _rows(path: Path) -> Iterator[Iterator[list[str]]]:
    try:
        with open_csv(path) as reader:
            yield reader
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None


def _number(cell: str, path: Path, line: int, column: str) -> float:
    try:
        value = float(cell)
    except ValueError:
        raise DataError(f"{path}:{line}: {column}: {cell!r} is not a number") from None
    if not math.isfinite(value):
        raise DataError(f"{path}:{line}: {column}: {cell!r} is not a finite number")
    return value


# --- our CSV ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where each column of a trace file is."""

    meta: Mapping[str, int]
    fields: tuple[tuple[int, str], ...]
    width: int


def _layout(header: Sequence[str], path: Path) -> _Layout:
    if list(header[:2]) != ["time_seconds", "gpu_uuid"]:
        raise DataError(
            f"{path}:1: header must start with 'time_seconds,gpu_uuid', got {','.join(header)!r}"
        )
    meta: dict[str, int] = {}
    fields: list[tuple[int, str]] = []
    for position, name in enumerate(header[2:], start=2):
        if name in header[:position]:
            raise DataError(f"{path}:1: column {name!r} appears twice")
        if name in _META_COLUMNS:
            meta[name] = position
        elif name in FIELD_METRICS:
            fields.append((position, name))
        else:
            known = ", ".join([*_META_COLUMNS, *sorted(FIELD_METRICS)])
            raise DataError(f"{path}:1: unknown column {name!r}; expected one of {known}")
    if not fields:
        raise DataError(f"{path}:1: no metric column (e.g. utilization_ratio)")
    return _Layout(MappingProxyType(meta), tuple(fields), len(header))


def _parse(path: Path, layout: _Layout, offset: float) -> Iterator[tuple[int, Reading, str]]:
    """Each row as (line, reading, job), checked; times must not go backwards."""
    meta = layout.meta
    last = -math.inf
    with _rows(path) as reader:
        next(reader, None)
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != layout.width:
                raise DataError(f"{path}:{line}: {len(row)} cells, the header has {layout.width}")
            t = _number(row[0], path, line, "time_seconds")
            if t < last:
                raise DataError(f"{path}:{line}: time_seconds {row[0]} goes back in time")
            last = t
            if not row[1]:
                raise DataError(f"{path}:{line}: gpu_uuid: empty")
            index = 0
            if "index" in meta and row[meta["index"]]:
                cell = row[meta["index"]]
                if not cell.isdigit():
                    raise DataError(f"{path}:{line}: index: {cell!r} is not a GPU index")
                index = int(cell)
            values = {
                name: _number(row[p], path, line, name) for p, name in layout.fields if row[p]
            }
            reading = Reading(
                time_seconds=t + offset,
                node=(row[meta["node"]] if "node" in meta else "") or DEFAULT_NODE,
                gpu_uuid=row[1],
                model=(row[meta["name"]] if "name" in meta else "") or DEFAULT_MODEL,
                index=index,
                values=values,
            )
            job = row[meta["job"]] if "job" in meta else f"{reading.node}-{reading.gpu_uuid}"
            yield line, reading, job


def _trace(path: Path) -> Dataset:
    with _rows(path) as reader:
        header = next(reader, None)
    if header is None:
        raise DataError(f"{path}:1: empty file (expected a header)")
    layout = _layout(header, path)
    first = None
    with _rows(path) as reader:
        next(reader, None)
        for line, row in enumerate(reader, start=2):
            if row:
                first = _number(row[0], path, line, "time_seconds")
                break
    if first is None:
        raise DataError(f"{path}:2: no data rows")
    offset = RELATIVE_ORIGIN if first < 1e9 else 0.0
    spans: dict[tuple[str, str, str], list[float]] = {}
    gpus: dict[tuple[str, str], int] = {}
    times: list[float] = []
    end = first + offset
    for _, reading, job in _parse(path, layout, offset):
        t = reading.time_seconds
        end = t
        gpus.setdefault((reading.node, reading.gpu_uuid), reading.index)
        # the first 10,000 distinct times are enough for the cadence; memory stays bounded
        if (not times or t != times[-1]) and len(times) < 10_000:
            times.append(t)
        if job:
            span = spans.setdefault((job, reading.node, reading.gpu_uuid), [t, t])
            span[1] = t
    steps = [b - a for a, b in itertools.pairwise(times) if b > a]
    cadence = statistics.median(steps) if steps else 60.0
    jobs = _jobs(spans, gpus, cadence)

    def readings() -> Iterator[Reading]:
        return (reading for _, reading, _ in _parse(path, layout, offset))

    return Dataset(
        path=path,
        kind="csv",
        jobs=jobs,
        gpus=len(gpus),
        start_seconds=first + offset,
        end_seconds=end + cadence,
        cadence_seconds=cadence,
        offset_seconds=offset,
        readings=readings,
    )


def job_identity(name: str) -> tuple[str, str, str]:
    """(key, scheduler, id) of a trace's ``job`` value: a key the collector's job sources make
    (``k8s:<namespace>/<pod>``, ``slurm:<cluster>:<id>``, ``api:<name>``) is kept as it is, so a
    trace recorded from a real fleet names its jobs as the live collector does; any other value
    is an API job's name (``api:<value>``)."""
    prefix, sep, rest = name.partition(":")
    if sep and rest and prefix in KEY_PREFIXES:
        return name, KEY_PREFIXES[prefix], rest
    return f"{JOB_SCHEDULER}:{name}", JOB_SCHEDULER, name


def _jobs(
    spans: Mapping[tuple[str, str, str], Sequence[float]],
    gpus: Mapping[tuple[str, str], int],
    cadence: float,
) -> tuple[Job, ...]:
    """One job per name, holding each GPU from its first row to one cadence after its last."""
    allocations: dict[str, list[tuple[str, str, float, float]]] = {}
    for (job, node, uuid), (start, end) in spans.items():
        allocations.setdefault(job, []).append((node, uuid, start, end + cadence))
    out = []
    for name, held in sorted(allocations.items()):
        nodes = sorted({node for node, *_ in held})
        key, scheduler, job_id = job_identity(name)
        out.append(
            Job(
                key=key,
                scheduler=scheduler,
                job_id=job_id,
                state=JobState.COMPLETED,
                name=name,
                team="backtest",
                gpus=len(held),
                start_time=min(s for *_, s, _ in held),
                end_time=max(e for *_, e in held),
                allocations=tuple(
                    GpuAllocation(
                        node,
                        tuple(gpus[node, u] for n, u, *_ in held if n == node),
                        tuple(u for n, u, *_ in held if n == node),
                    )
                    for node in nodes
                ),
            )
        )
    return tuple(out)


# --- GenTD26 ------------------------------------------------------------------------------------


def _gentd26_rows(path: Path) -> Iterator[tuple[int, float, float, str]]:
    """(line, time, duty cycle %, pod) of every row, checked."""
    try:
        last = -math.inf
        for cells in gentd26_cells(path):
            line = cells.line
            t = _number(cells.timestamp, path, line, "timestamp_anon")
            if t < last:
                raise DataError(f"{path}:{line}: timestamp_anon goes back in time")
            last = t
            value = _number(cells.value, path, line, "value")
            if not 0.0 <= value <= 100.0:
                raise DataError(f"{path}:{line}: value: {cells.value} is not a percentage")
            yield line, t, value, cells.pod
    except GenTD26HeaderError:
        raise DataError(f"{path}:1: expected the columns {','.join(GENTD26_COLUMNS)}") from None
    except TraceError as exc:
        raise DataError(str(exc)) from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from None


def _pod_node(ip: str) -> tuple[str, str]:
    return f"pod-{ip[:8]}", f"GPU-{ip[:12]}"


def _gentd26(path: Path, pods: int | None) -> Dataset:
    counts: dict[str, int] = {}
    spans: dict[str, list[float]] = {}
    for _, t, _, ip in _gentd26_rows(path):
        counts[ip] = counts.get(ip, 0) + 1
        spans.setdefault(ip, [t, t])[1] = t
    if not counts:
        raise DataError(f"{path}:2: no data rows")
    chosen = sorted(counts, key=lambda ip: (-counts[ip], ip))[:pods]
    keep = frozenset(chosen)
    tick = GENTD26_TICK_SECONDS
    jobs = tuple(
        Job(
            key=f"{JOB_SCHEDULER}:{_pod_node(ip)[0]}",
            scheduler=JOB_SCHEDULER,
            job_id=_pod_node(ip)[0],
            state=JobState.COMPLETED,
            name=_pod_node(ip)[0],
            team="gentd26",
            gpus=1,
            start_time=spans[ip][0],
            end_time=spans[ip][1] + tick,
            allocations=(GpuAllocation(_pod_node(ip)[0], (0,), (_pod_node(ip)[1],)),),
        )
        for ip in chosen
    )

    def readings() -> Iterator[Reading]:
        for _, t, value, ip in _gentd26_rows(path):
            if ip in keep:
                node, uuid = _pod_node(ip)
                yield Reading(t, node, uuid, GENTD26_MODEL, 0, {"utilization_ratio": value / 100.0})

    return Dataset(
        path=path.parent,
        kind="gentd26",
        jobs=jobs,
        gpus=len(chosen),
        start_seconds=min(spans[ip][0] for ip in chosen),
        end_seconds=max(spans[ip][1] for ip in chosen) + tick,
        cadence_seconds=tick,
        offset_seconds=0.0,
        readings=readings,
    )


# --- labels -------------------------------------------------------------------------------------


def load_labels(path: Path) -> tuple[Label, ...]:
    """Truth windows from ``subject,start,end[,rule]`` (a header row is required).

    Raises:
        DataError: naming the file and line.

    """
    if not path.is_file():
        raise DataError(f"{path}: no such labels file")
    labels = []
    with _rows(path) as reader:
        header = next(reader, [])
        if header[:3] != ["subject", "start", "end"] or header[3:] not in ([], ["rule"]):
            raise DataError(f"{path}:1: header must be 'subject,start,end' or '...,rule'")
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise DataError(f"{path}:{line}: {len(row)} cells, the header has {len(header)}")
            if not row[0]:
                raise DataError(f"{path}:{line}: subject: empty")
            start = _number(row[1], path, line, "start")
            end = _number(row[2], path, line, "end")
            if end < start:
                raise DataError(f"{path}:{line}: end {row[2]} is before start {row[1]}")
            rule = row[3] if len(row) > 3 and row[3] else None
            labels.append(Label(row[0], start, end, rule))
    return tuple(labels)
