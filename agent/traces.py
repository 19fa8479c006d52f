"""Reading recorded traces: CSV files (gzip'd or not) and the Alibaba GenTD26 per-pod files.

The one reader shared by the agent's replay source, the collector's backtest and the benches (the
collector may import the agent, never the other way round); standard library only, so the agent's
base install stays light.

**GenTD26** (``cluster-trace-v2026-GenAI``, see ``shared/data/alibaba_gentd26/README.md``): every
per-pod file has the columns ``value``, ``timestamp_anon`` (seconds) and ``container_ip`` (an MD5
that joins the files), in a file-dependent order. :func:`gentd26_cells` checks the header and the
width of each row and hands out the cells; what a value means (percent, bytes, milliseconds) and
how strictly it is checked is the caller's. :func:`gentd26_series` groups a file by pod.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

GENTD26_COLUMNS = ("value", "timestamp_anon", "container_ip")
GENTD26_DUTY_CYCLE_FILE = "pod_gpu_duty_cycle_anon.csv.gz"
"""GPU utilisation in percent, per pod."""
GENTD26_MEMORY_FILE = "pod_gpu_memory_used_bytes_anon.csv.gz"
"""GPU memory used in bytes, per pod."""
GENTD26_LATENCY_FILE = "pipeline_inference_data_anon.csv.gz"
"""End-to-end inference latency in milliseconds, per request."""
GENTD26_TICK_SECONDS = 57.0
"""The scrape interval of the per-pod GPU files."""

V = TypeVar("V")


class TraceError(ValueError):
    """A trace file that is not what it should be; the message names the file and line."""


class GenTD26HeaderError(TraceError):
    """The file's header is not GenTD26's three columns (``header`` holds what it was)."""

    def __init__(self, path: Path, header: Sequence[str]) -> None:
        self.header = list(header)
        super().__init__(
            f"{path}:1: expected the columns {', '.join(GENTD26_COLUMNS)}, got {self.header}"
        )


@contextmanager
def open_csv(path: Path) -> Iterator[Iterator[list[str]]]:
    """The rows of a CSV file, gunzipped when it starts with gzip's magic bytes (UTF-8).

    Raises:
        OSError, UnicodeDecodeError, csv.Error: as the file is opened and read.

    """
    with path.open("rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    with (
        gzip.open(path, "rb") if gzipped else path.open("rb") as binary,
        io.TextIOWrapper(binary, encoding="utf-8", newline="") as text,
    ):
        yield csv.reader(text)


def is_gentd26_header(header: Sequence[str]) -> bool:
    """Whether ``header`` is GenTD26's three columns, in any order."""
    return sorted(header) == sorted(GENTD26_COLUMNS)


@dataclass(frozen=True, slots=True)
class GenTD26Cells:
    """One row of a GenTD26 file, as text (``line`` counts the header as 1)."""

    line: int
    value: str
    timestamp: str
    pod: str


def gentd26_cells(path: Path) -> Iterator[GenTD26Cells]:
    """Every row of a GenTD26 per-pod file, in file order.

    Raises:
        GenTD26HeaderError: the header is not GenTD26's.
        TraceError: a row without exactly three cells.
        OSError, UnicodeDecodeError, csv.Error: as :func:`open_csv`.

    """
    with open_csv(path) as reader:
        header = next(reader, [])
        if not is_gentd26_header(header):
            raise GenTD26HeaderError(path, header)
        value_at, time_at, pod_at = (header.index(column) for column in GENTD26_COLUMNS)
        for line, row in enumerate(reader, start=2):
            if len(row) != len(GENTD26_COLUMNS):
                raise TraceError(f"{path}:{line}: {len(row)} cells, expected 3")
            yield GenTD26Cells(line, row[value_at], row[time_at], row[pod_at])


def gentd26_series(path: Path, convert: Callable[[str], V]) -> dict[str, list[tuple[float, V]]]:
    """A GenTD26 file grouped by pod: ``(timestamp, convert(value))`` in file order.

    Pods come in the order of their first row.

    Raises:
        TraceError: as :func:`gentd26_cells`, or a timestamp or value that does not convert
            (``<path>:<line>: <what convert said>``).

    """
    series: dict[str, list[tuple[float, V]]] = {}
    for cells in gentd26_cells(path):
        try:
            entry = (float(cells.timestamp), convert(cells.value))
        except ValueError as error:
            raise TraceError(f"{path}:{cells.line}: {error}") from None
        series.setdefault(cells.pod, []).append(entry)
    return series
