"""The window store's ingest of series whose rows the caller keeps: ``ingest_rows``.

A remote-write sender sends the same series every scrape. Its receiver maps each label set to a
series once and keeps the row the store gave it (with the generation of the store's rows it is
valid for: rows are freed by eviction), so a known series costs no lookup here at all, and the
points arrive as numpy columns (no object per point).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.store.rows_identity import AliasKey
from gpuwarden.collector.store.types import IngestCounts
from gpuwarden.collector.store.window_state import NS, WindowState


@dataclass(frozen=True, slots=True)
class RowSpec:
    """What a series needs to find or create its row: its alias (metric, resource ``host.name``,
    attribute items as sent), unit, and whether it is a counter (a monotonic sum)."""

    alias: AliasKey
    unit: str
    counter: bool


@dataclass(frozen=True, slots=True)
class RowBatch:
    """Points, as columns: each point's series (``specs[spec_of_point]``), the row the caller
    knows for it (``rows``: -1 for none; valid for ``generation`` of the store's rows), time
    and (finite) value. ``unique``: no two points of the same series."""

    specs: Sequence[RowSpec | None]
    spec_of_point: npt.NDArray[np.int64]
    rows: npt.NDArray[np.int64]
    generation: int
    times_ns: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    unique: bool = False


@dataclass(frozen=True, slots=True)
class RowsIngested:
    """What ``ingest_rows`` did: the points' counts, each point's row (-1: none), and the
    generation of the store's rows those rows are valid for."""

    counts: IngestCounts
    rows: npt.NDArray[np.int64]
    generation: int


class RowIngest(WindowState):
    """``ingest_rows`` (module docstring)."""

    def ingest_rows(self, batch: RowBatch, budget: int | None = None) -> RowsIngested:
        """Store ``batch``; return what became of its points and each point's row now.

        The same series and counts as ``ingest`` of the same points: a point without a row
        finds or creates its series' (within ``budget`` new series, in point order) unless it
        is too far in the future; points of a series refused by the budget or the series
        limit count as ``rejected_limit``.
        """
        with self._lock:
            table = self._table
            rows = batch.rows.copy()
            if batch.generation != table.evictions:  # rows were freed since: find them again
                rows.fill(-1)
            times_ns = batch.times_ns
            future = times_ns > int((self._clock() + self._max_future_seconds) * NS)
            created_before = table.created
            missing = np.flatnonzero((rows < 0) & ~future)
            if missing.size:
                histograms = len(self._histograms)
                specs, spec_of_point = batch.specs, batch.spec_of_point
                for i in missing.tolist():
                    spec = specs[spec_of_point[i]]
                    if spec is None:  # not the caller's to send: left out
                        continue
                    row = table.aliases.get(spec.alias)
                    if row is None:
                        create = budget is None or table.created - created_before < budget
                        row = table.resolve(
                            spec.alias,
                            unit=spec.unit,
                            counter=spec.counter,
                            time_ns=int(times_ns[i]),
                            total=histograms,
                            create=create,
                        )
                    rows[i] = row
            keep = (rows >= 0) & ~future
            counts = IngestCounts(
                rejected_future=int(np.count_nonzero(future)),
                rejected_limit=int(np.count_nonzero((rows < 0) & ~future)),
                new_series=table.created - created_before,
            )
            point_rows, values = rows, batch.values
            if not keep.all():
                point_rows, times_ns, values = rows[keep], times_ns[keep], values[keep]
            if point_rows.size:
                counts = table.write(
                    point_rows,
                    times_ns,
                    values,
                    self._step_ns,
                    self._ratio,
                    counts,
                    unique_rows=batch.unique,
                )
            return RowsIngested(counts, rows, table.evictions)
