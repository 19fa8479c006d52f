"""``gpuwarden agent --record trace.csv``: each round's GPU readings, as a replayable trace.

The file is the gpuwarden trace format (``agent/sources/replay.py``, ``docs/backtest.md``):
``time_seconds,gpu_uuid,name`` then one column per scalar GPU field of the agent's catalog
(:data:`RECORD_FIELDS`), one row per GPU and round, Unix seconds, an empty cell where the GPU
did not measure the field. Both readers take it as it is: ``gpuwarden backtest --data`` and the
agent's ``--source replay``. No ``node`` or ``job`` column: the agent's replay replays one node
and refuses them; the backtest then names the node ``replay`` and gives each GPU a job of its
own (nor ``index``, for the same reason). Gzip'd when the name ends in
``.gz``. Each round is flushed, so a killed agent leaves every finished round on disk.
"""

from __future__ import annotations

import csv
import gzip
from pathlib import Path
from types import TracebackType
from typing import TextIO

from gpuwarden.agent.catalog import CATALOG, Scope, Shape
from gpuwarden.agent.model import Snapshot
from gpuwarden.agent.sources.replay import REPLAY_FIELDS


def _record_fields() -> tuple[str, ...]:
    out: list[str] = []
    for row in CATALOG:
        scalar_gpu = row.scope is Scope.GPU and row.shape is Shape.SCALAR
        if scalar_gpu and row.field in REPLAY_FIELDS and row.field not in out:
            out.append(row.field)
    return tuple(out)


RECORD_FIELDS: tuple[str, ...] = _record_fields()
"""The GpuSample fields recorded: the catalog's scalar GPU fields (what the backtest replays)
that the replay source reads back."""
HEADER: tuple[str, ...] = ("time_seconds", "gpu_uuid", "name", *RECORD_FIELDS)


class TraceRecorder:
    """Appends each round's GPUs to a trace file (created, or truncated, on open)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = 0
        self._file: TextIO = (
            gzip.open(path, "wt", encoding="utf-8", newline="")  # noqa: SIM115 (closed by close())
            if path.suffix == ".gz"
            else path.open("w", encoding="utf-8", newline="")
        )
        self._writer = csv.writer(self._file)
        self._writer.writerow(HEADER)
        self._file.flush()

    def record(self, snapshot: Snapshot) -> None:
        """Write one round: one row per GPU at the round's time."""
        t = repr(snapshot.time_unix_nano / 1e9)
        for gpu in snapshot.gpus:
            values = (getattr(gpu, name) for name in RECORD_FIELDS)
            self._writer.writerow(
                [t, gpu.uuid, gpu.name, *("" if v is None else repr(v) for v in values)]
            )
            self.rows += 1
        self._file.flush()

    def close(self) -> None:
        """Flush and close the file."""
        self._file.close()

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
