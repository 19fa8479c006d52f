"""Replay a recorded GPU trace (CSV, optionally gzip'd) as a GpuSource.

Two formats, told apart by the header:

**gpuwarden trace** (written by :func:`write_trace`)::

    time_seconds,gpu_uuid,name,utilization_ratio,memory_used_bytes,power_watts
    0,GPU-0a1b...,NVIDIA H100 80GB HBM3,0.93,68719476736,612.5
    0,GPU-9f8e...,NVIDIA H100 80GB HBM3,0.0,0,65.1

``time_seconds`` (any origin) and ``gpu_uuid`` come first; ``name`` is optional (the first
non-empty value per GPU wins); every other column is a numeric :class:`~agent.model.GpuSample`
field (:data:`REPLAY_FIELDS`: ratios, bytes, watts, joules, ...). Integer fields must hold
integers. An empty cell is "not available" and replays as None.

**Alibaba GenTD26 duty cycle** (``value,timestamp_anon,container_ip``, value in percent; read by
:mod:`gpuwarden.agent.traces`): each
``container_ip`` becomes one GPU, most data points first (``max_gpus`` keeps the first N). Its
uuid is the ip hash itself (an MD5 in the published trace) shaped as a GPU uuid. Memory used comes
from ``pod_gpu_memory_used_bytes_anon.csv.gz`` in the same folder when present.

Timing: trace time 0 is the first timestamp; at clock time ``t`` a GPU shows its last row at or
before ``first + (t - t0) * speed`` where ``t0`` is the clock at construction (step
interpolation). Before a GPU's first row, or when that row is older than ``stale_after_seconds``,
its readings are None. With ``loop`` the trace restarts one typical interval after its last
timestamp; without it the last rows stay. Rows are loaded on first use, fully, into ``array``
columns sorted by time.
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import gzip
import hashlib
import itertools
import math
import re
import statistics
import typing
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.agent.model import GpuSample
from gpuwarden.agent.traces import (
    GENTD26_COLUMNS,
    GENTD26_MEMORY_FILE,
    gentd26_series,
    is_gentd26_header,
    open_csv,
)

#: Numeric GpuSample fields a gpuwarden trace may carry, with their Python type.
REPLAY_FIELDS: Mapping[str, type[int] | type[float]] = {
    name: float if hint == float | None else int
    for name, hint in typing.get_type_hints(GpuSample).items()
    if hint in (float | None, int | None)
}
ALIBABA_MEMORY_FILE = GENTD26_MEMORY_FILE
#: Columns of the backtest's CSV (docs/backtest.md) that describe the fleet, not one node's GPUs.
BACKTEST_COLUMNS: tuple[str, ...] = ("node", "job", "index")
_INT_MISSING = -(2**63)
_HEX32 = re.compile(r"[0-9a-f]{32}")


@dataclass(slots=True)
class _Series:
    """Rows of one GPU from one file: times and one column per field."""

    times: array[float]
    columns: dict[str, array[float] | array[int]]

    @classmethod
    def build(
        cls, rows: list[tuple[float, tuple[float | int, ...]]], names: Sequence[str]
    ) -> _Series:
        rows.sort(key=lambda row: row[0])  # stable: a later duplicate time wins
        columns: dict[str, array[float] | array[int]] = {}
        for position, name in enumerate(names):
            values = (row[1][position] for row in rows)
            if REPLAY_FIELDS[name] is int:
                columns[name] = array("q", (int(v) for v in values))
            else:
                columns[name] = array("d", (float(v) for v in values))
        return cls(array("d", (row[0] for row in rows)), columns)

    def at(
        self, trace_seconds: float, stale_after_seconds: float | None
    ) -> dict[str, float | int | None]:
        row = bisect.bisect_right(self.times, trace_seconds) - 1
        stale = (
            stale_after_seconds is not None
            and trace_seconds - self.times[max(row, 0)] > stale_after_seconds
        )
        if row < 0 or stale:
            return dict.fromkeys(self.columns)
        values: dict[str, float | int | None] = {}
        for name, column in self.columns.items():
            value = column[row]
            missing = value == _INT_MISSING if column.typecode == "q" else math.isnan(value)
            values[name] = None if missing else value
        return values


@dataclass(slots=True)
class _Gpu:
    uuid: str
    name: str
    series: list[_Series]


class ReplaySource:
    """A :class:`~agent.model.GpuSource` that replays a recorded trace (see the module docstring).

    Args:
        path: the CSV (or gzip'd CSV) file.
        clock: returns seconds; read once at construction (trace time 0).
        speed: trace seconds per clock second.
        loop: restart after the end instead of holding the last rows.
        max_gpus: replay at most this many GPUs (``None``: all).
        stale_after_seconds: a row older than this (trace seconds) replays as None.
        gpu_name: the name of GPUs the trace does not name.

    Raises:
        ValueError: for an unknown header (at construction) or a bad value (at first sample),
            naming the file and line.

    """

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], float],
        speed: float = 1.0,
        loop: bool = True,
        max_gpus: int | None = None,
        stale_after_seconds: float | None = None,
        gpu_name: str = "replay",
    ) -> None:
        if not speed > 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self._path = path
        self._clock = clock
        self._speed = speed
        self._loop = loop
        self._max_gpus = max_gpus
        self._stale_after_seconds = stale_after_seconds
        self._gpu_name = gpu_name
        with open_csv(path) as reader:
            header = next(reader, [])
        self._alibaba = is_gentd26_header(header)
        self._fields = () if self._alibaba else _trace_fields(header, path)
        self._start_clock_seconds = clock()
        self._gpus: list[_Gpu] | None = None
        self._first_seconds = 0.0
        self._period_seconds = 0.0

    def sample(self) -> list[GpuSample]:
        """One sample of every GPU of the trace at the clock's current time."""
        gpus = self._load()
        offset = (self._clock() - self._start_clock_seconds) * self._speed
        if self._loop and self._period_seconds > 0:
            offset %= self._period_seconds
        trace_seconds = self._first_seconds + offset
        samples = []
        for index, gpu in enumerate(gpus):
            values: dict[str, Any] = {}  # REPLAY_FIELDS names, checked against the header
            for series in gpu.series:
                values.update(series.at(trace_seconds, self._stale_after_seconds))
            base = GpuSample(uuid=gpu.uuid, index=index, name=gpu.name)
            samples.append(dataclasses.replace(base, **values))
        return samples

    @property
    def duration_seconds(self) -> float:
        """Trace seconds from the first row to one typical interval after the last (loads)."""
        self._load()
        return self._period_seconds

    def close(self) -> None:
        """Drop the loaded rows (a later sample loads them again)."""
        self._gpus = None

    def _load(self) -> list[_Gpu]:
        if self._gpus is None:
            gpus = self._load_alibaba() if self._alibaba else self._load_trace()
            times = [series.times for gpu in gpus for series in gpu.series if series.times]
            self._first_seconds = min((t[0] for t in times), default=0.0)
            last_seconds = max((t[-1] for t in times), default=0.0)
            # Loop one typical interval after the last row, so the last row shows for a step.
            densest = max(times, key=len, default=array("d"))
            steps = [b - a for a, b in itertools.pairwise(densest) if b > a]
            step = statistics.median(steps) if steps else 0.0
            self._period_seconds = last_seconds - self._first_seconds + step
            self._gpus = gpus
        return self._gpus

    def _load_trace(self) -> list[_Gpu]:
        path, fields = self._path, self._fields
        numeric = [name for name in fields if name != "name"]
        parsers = [
            (p, _PARSERS[REPLAY_FIELDS[name]]) for p, name in enumerate(fields, 2) if name != "name"
        ]
        name_cell = fields.index("name") + 2 if "name" in fields else None
        rows: dict[str, list[tuple[float, tuple[float | int, ...]]]] = {}
        names: dict[str, str] = {}
        with open_csv(path) as reader:
            next(reader)
            for line, row in enumerate(reader, start=2):
                if len(row) != len(fields) + 2:
                    raise ValueError(
                        f"{path}:{line}: {len(row)} cells, the header has {len(fields) + 2}"
                    )
                if not row[1]:
                    raise ValueError(f"{path}:{line}: empty gpu_uuid")
                time_seconds = _float(row[0], path, line, "time_seconds")
                if math.isnan(time_seconds):
                    raise ValueError(f"{path}:{line}: time_seconds: empty")
                values = tuple(parse(row[p], path, line, fields[p - 2]) for p, parse in parsers)
                rows.setdefault(row[1], []).append((time_seconds, values))
                if name_cell is not None and row[name_cell]:
                    names.setdefault(row[1], row[name_cell])
        uuids = list(rows)[: self._max_gpus]
        return [
            _Gpu(u, names.get(u, self._gpu_name), [_Series.build(rows[u], numeric)]) for u in uuids
        ]

    def _load_alibaba(self) -> list[_Gpu]:
        duty = gentd26_series(self._path, _percent_row)
        memory_path = self._path.parent / ALIBABA_MEMORY_FILE
        memory = gentd26_series(memory_path, _bytes_row) if memory_path.exists() else {}
        gpus = []
        for ip in sorted(duty, key=lambda ip: (-len(duty[ip]), ip))[: self._max_gpus]:
            series = [_Series.build(duty[ip], ["utilization_ratio"])]
            if ip in memory:
                series.append(_Series.build(memory[ip], ["memory_used_bytes"]))
            digest = (
                ip
                if _HEX32.fullmatch(ip)
                else hashlib.md5(ip.encode(), usedforsecurity=False).hexdigest()
            )
            uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:]}"
            gpus.append(_Gpu(uuid, self._gpu_name, series))
        return gpus


def _trace_fields(header: Sequence[str], path: Path) -> tuple[str, ...]:
    if list(header[:2]) != ["time_seconds", "gpu_uuid"]:
        raise ValueError(
            f"{path}:1: unknown header {','.join(header)!r}; expected "
            f"'time_seconds,gpu_uuid,<GpuSample field>,...' or {','.join(GENTD26_COLUMNS)!r}"
        )
    fields = tuple(header[2:])
    backtest_only = [name for name in fields if name in BACKTEST_COLUMNS]
    if backtest_only:
        raise ValueError(
            f"{path}:1: column {backtest_only[0]!r} belongs to backtest traces "
            "(docs/backtest.md); the agent replays one node's GPUs: drop the "
            f"{', '.join(BACKTEST_COLUMNS)} columns, or run 'gpuwarden backtest --data {path}'"
        )
    for name in fields:
        if name != "name" and name not in REPLAY_FIELDS:
            raise ValueError(
                f"{path}:1: unknown column {name!r}; expected one of {', '.join(REPLAY_FIELDS)}"
            )
    if len(set(fields)) != len(fields):
        raise ValueError(f"{path}:1: a column appears twice")
    return fields


def _float(cell: str, path: Path, line: int, column: str) -> float:
    if not cell:
        return math.nan
    try:
        return float(cell)
    except ValueError:
        raise ValueError(f"{path}:{line}: {column}: {cell!r} is not a number") from None


def _int(cell: str, path: Path, line: int, column: str) -> int:
    if not cell:
        return _INT_MISSING
    try:
        return int(cell)
    except ValueError:
        raise ValueError(f"{path}:{line}: {column}: {cell!r} is not an integer") from None


_PARSERS: Mapping[type, Callable[[str, Path, int, str], float | int]] = {float: _float, int: _int}


def _percent_row(cell: str) -> tuple[float | int, ...]:
    return (_percent(cell),)


def _bytes_row(cell: str) -> tuple[float | int, ...]:
    return (int(float(cell)),)


def _percent(cell: str) -> float:
    # The memory file has the same columns: refuse it rather than replay bytes as a duty cycle.
    value = float(cell)
    if not 0.0 <= value <= 100.0:
        raise ValueError(f"duty cycle {cell!r} is not a percentage")
    return value / 100.0


def write_trace(
    path: Path, rounds: Iterable[tuple[float, Iterable[GpuSample]]], fields: Sequence[str]
) -> int:
    """Write samples in the gpuwarden trace format (gzip'd when ``path`` ends in ``.gz``).

    Args:
        path: the file to write.
        rounds: ``(time_seconds, samples)`` per sample round.
        fields: the :data:`REPLAY_FIELDS` to record (``name`` is always written).

    Returns:
        The number of rows written.

    """
    unknown = [name for name in fields if name not in REPLAY_FIELDS]
    if unknown:
        raise ValueError(
            f"unknown fields {unknown}; expected a subset of {', '.join(REPLAY_FIELDS)}"
        )
    opener = gzip.open if path.suffix == ".gz" else open
    written = 0
    with opener(path, "wt", encoding="utf-8", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["time_seconds", "gpu_uuid", "name", *fields])
        for time_seconds, samples in rounds:
            for sample in samples:
                values = (getattr(sample, name) for name in fields)
                writer.writerow(
                    [
                        repr(time_seconds),
                        sample.uuid,
                        sample.name,
                        *("" if v is None else repr(v) for v in values),
                    ]
                )
                written += 1
    return written
