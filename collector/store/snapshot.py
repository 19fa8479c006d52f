"""The window store on disk: a snapshot written periodically and at shutdown, read at start.

Without it a restart starts blind: the rings live in anonymous memory, so every rule whose window
or history is longer than the downtime is blind for that long (issue 16: 14 days for
``model_drift``). A snapshot holds what the store needs to go on where it stopped: the series
table (each series' key, unit and kind), the recent and long rings over the slots they hold,
the counters' covered times, rounding debt, last raw values and times, each series' newest
point, and the histograms with their raw state. The long ring holds the rows of the series that
have one (``long_series``, indexes into the series; a snapshot without it, from before
``long_metrics``, has a long row for every series); at read, long rows of metrics this store
keeps no long ring of are dropped. Likewise the recent ring holds the rows of the series that
have one (``recent_series``; absent: every series), and the latest-only series' values are in
``latest_series`` and ``latest_value``; at read, a series gets what this store keeps of its
metric (a recent row or its latest value), the rest is dropped.

Format: one ``.npz`` (a zip of ``.npy`` arrays, read with ``allow_pickle=False``; no pickled
objects), the series keys and parameters as JSON text in byte arrays. The big ring arrays are
streamed in chunks of rows, each copied under the store's lock and released between chunks, so
ingest waits for one chunk at a time and no full copy of the store is made. The file is written
to a temporary name in the same folder, flushed to disk (``fsync``) and renamed over the old
one, so a crash leaves the old snapshot or the new one, never half of one.

Reading: a snapshot of another store shape (step, retention), an unknown format, or a file that
does not parse is logged and ignored (the store starts empty, as without a snapshot). Slots the
retention no longer covers at restart are dropped; the heads move to now, so the time between
the snapshot and the restart reads as missing (NaN), never interpolated. Points the agents
resend for that time (their spools) land in it as usual.

The changes (``changes_path``): at shutdown, writing the whole store would take minutes for a
large fleet, so only the slots written since the last full snapshot (late points of agents'
spools included: the table tracks the oldest slot written since, ``changed_from``), with the raw
state and the histograms, go to ``<snapshot>.changes``, in the same layout, naming the full
snapshot they complete (its time). Read after it at start, and only if they name it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.store import snapshot_arrays as arrays
from gpuwarden.collector.store.histograms import HistogramSeries
from gpuwarden.collector.store.ring import decode, encode
from gpuwarden.collector.store.rows import SeriesTable
from gpuwarden.collector.store.snapshot_arrays import SnapshotError
from gpuwarden.collector.store.types import Kind, SeriesKey
from gpuwarden.collector.store.window_state import WindowState

log = logging.getLogger(__name__)

FORMAT = 1
"""The snapshot layout's version; another version is ignored at read."""
CHUNK_BYTES = 8 << 20
"""Bytes of ring rows copied per hold of the store's lock (a 14-day long ring row is 80 KB:
about 100 rows), so ingest waits milliseconds, not the whole copy."""


@dataclass(frozen=True, slots=True)
class SnapshotStats:
    """What one written snapshot holds and cost."""

    path: Path
    series: int
    histograms: int
    size_bytes: int
    write_seconds: float
    changes_only: bool = False
    """Only what changed since the last full snapshot (``changes_path``), not the whole store."""


@dataclass(frozen=True, slots=True)
class Restored:
    """What a read snapshot gave the store."""

    series: int
    histograms: int
    written_at: float
    """The snapshot's time (the store's clock when it was written)."""
    held_since: float | None
    """Start of the oldest slot restored (None: nothing the retention still covers)."""


def _shape(state: WindowState) -> dict[str, int]:
    return {
        "step_seconds": state.step_seconds,
        "recent_seconds": state.recent_seconds,
        "long_step_seconds": state.long_step_seconds,
        "long_seconds": state.long_seconds,
    }


@dataclass(frozen=True, slots=True)
class _Base:
    """The full snapshot on disk that a snapshot of the changes completes."""

    written_at: float
    recent_head: int
    long_head: int


def changes_path(path: Path) -> Path:
    """Where the snapshot of the changes since the full snapshot ``path`` is written."""
    return path.with_name(f"{path.name}.changes")


class Snapshots(WindowState):
    """``write_snapshot`` and ``read_snapshot`` of the whole store (see the module)."""

    _snapshot_base: _Base | None = None
    """The full snapshot this store wrote or read last (None: none)."""
    _written_base: _Base | None = None

    def write_snapshot(
        self, path: Path, *, chunk_bytes: int = CHUNK_BYTES, changes_only: bool = False
    ) -> SnapshotStats:
        """Write the store to ``path`` atomically (temporary file, fsync, rename), copying
        about ``chunk_bytes`` of ring rows per hold of the lock.

        ``changes_only`` (the snapshot at shutdown): when this store wrote or read the full
        snapshot at ``path``, write only the slots changed since then, to ``changes_path(path)``
        (seconds of data instead of days; ``read_snapshot`` applies it on the full one). Without
        such a base, the whole store is written as usual. A full snapshot deletes the changes.
        """
        started = time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)
        base = self._snapshot_base if changes_only and path.exists() else None
        target = path if base is None else changes_path(path)
        changed_from = self._table.changed_from
        self._written_base = None
        try:
            series, histograms = self._write_file(target, chunk_bytes, base)
        except BaseException:
            if base is None:  # the changes since the old full snapshot still count
                with self._lock:
                    now = self._table.changed_from
                    self._table.changed_from = arrays.earliest(changed_from, now)
            raise
        if base is None:
            self._snapshot_base = self._written_base
            changes_path(path).unlink(missing_ok=True)  # it completed the snapshot replaced
        return SnapshotStats(
            path=target,
            series=series,
            histograms=histograms,
            size_bytes=target.stat().st_size,
            write_seconds=time.monotonic() - started,
            changes_only=base is not None,
        )

    def _write_file(self, path: Path, chunk_bytes: int, base: _Base | None) -> tuple[int, int]:
        # One fixed name: a temporary left by a crash mid-write is overwritten by the next write,
        # not left to pile up. Owner-only, like the telemetry it holds.
        temporary = path.with_name(f".{path.name}.tmp")
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(descriptor, 0o600)  # a leftover temporary keeps its mode otherwise
            with os.fdopen(descriptor, "wb") as file:
                with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
                    series, histograms = self._write_archive(archive, chunk_bytes, base)
                file.flush()
                os.fsync(file.fileno())
            temporary.replace(path)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power cut
        finally:
            os.close(directory)
        return series, histograms

    def _write_archive(
        self, archive: zipfile.ZipFile, chunk_bytes: int, base: _Base | None
    ) -> tuple[int, int]:
        table = self._table
        with self._lock:
            table.flush_long(self._ratio)
            changed_from = table.changed_from
            if base is None:  # what is written from now on goes in the next changes
                table.changed_from = None
            rows = np.array(
                [r for r in range(table.next_row) if table.infos[r] is not None], dtype=np.int64
            )
            infos = [table.infos[r] for r in rows.tolist()]
            recent_head, long_head = table.recent.head, table.long.head
            evictions = table.evictions
            written_at = self._clock()
            meta = {
                "format": FORMAT,
                **_shape(self),
                "written_at": written_at,
                "recent_head": recent_head,
                "long_head": long_head,
                "first_slot": table.first_slot,
                "base": None if base is None else base.written_at,
            }
            # the slots written: from the oldest data to the heads as they are now (a head that
            # moves on while the chunks are copied adds slots the next snapshot takes)
            recent = arrays.held(table.recent, table.first_slot)
            long = arrays.held(
                table.long, None if table.first_slot is None else table.first_slot // self._ratio
            )
            histogram_slots = recent  # histograms are few: always whole
            if base is not None:  # from the base's heads, or the oldest slot written since
                since = base.recent_head if changed_from is None else changed_from
                since = min(since, base.recent_head)
                recent = arrays.after(recent, since)
                long = arrays.after(long, min(base.long_head, since // self._ratio))
            elif recent_head is not None and long_head is not None:
                self._written_base = _Base(written_at, recent_head, long_head)
        meta["recent_first"], meta["long_first"] = recent[0], long[0]
        meta["histogram_first"] = histogram_slots[0]
        counters, longs, recents, latests = _tiers(table, rows)
        arrays.put(archive, "meta", arrays.text(meta))
        arrays.put(
            archive,
            "series",
            arrays.text(
                [[i.key[0], i.key[1], i.unit, str(i.kind)] for i in infos if i is not None]
            ),
        )
        for name, indexes in (
            ("counters", counters),
            ("long_series", longs),
            ("recent_series", recents),
            ("latest_series", latests),
        ):
            arrays.put(archive, name, indexes)
        for name, (first, count), chosen, kind in (
            ("recent", recent, rows[recents], np.float32),
            ("long", long, rows[longs], np.float32),
            ("counter_dt", recent, rows[counters], np.uint16),
        ):
            with arrays.put_rows(archive, name, kind, (chosen.size, count)) as member:
                chunk = max(1, chunk_bytes // max(1, count * 4))
                for start in range(0, chosen.size, chunk):
                    part = chosen[start : start + chunk]
                    with self._lock:
                        if table.evictions != evictions:
                            raise SnapshotError("series evicted while writing; next time")
                        table.flush_long(self._ratio)
                        block = arrays.ring_block(table, name, part, first, count)
                    member.write(block.tobytes())
        with self._lock:
            if table.evictions != evictions:
                raise SnapshotError("series evicted while writing; next time")
            # the raw state last: an increase between a chunk and here is lost (as in a gap),
            # never counted twice after the restart
            arrays.put(archive, "last_seen_ns", table.last_seen_ns[rows])
            arrays.put(archive, "raw_time_ns", table.raw_time_ns[rows])
            arrays.put(archive, "raw_value", table.raw_value[rows])
            arrays.put(archive, "debt", table.debt[table.counter_row[rows[counters]]])
            arrays.put(archive, "latest_value", decode(table.latest_bits[rows[latests]]))
            histograms = self._write_histograms(archive, histogram_slots)
        return len(infos), histograms

    def _write_histograms(self, archive: zipfile.ZipFile, recent: tuple[int, int]) -> int:
        """The histograms (under the lock: few and small)."""
        first, count = recent
        described, rings, counts = [], [], []
        for series in self._histograms.values():
            info = series.info
            has_counts = series.last_counts is not None
            described.append(
                [
                    info.key[0],
                    info.key[1],
                    info.unit,
                    list(series.bounds),
                    series.last_sum,
                    series.last_time_ns,
                    series.last_seen_ns,
                    has_counts,
                ]
            )
            rows = np.arange(series.ring.rows, dtype=np.int64)
            rings.append(series.ring.read(rows, first, count))
            if series.last_counts is not None:
                counts.append(series.last_counts)
        arrays.put(archive, "histograms", arrays.text(described))
        arrays.put(
            archive,
            "histogram_rings",
            np.concatenate(rings) if rings else np.zeros((0, count), dtype=np.float32),
        )
        arrays.put(archive, "histogram_counts", np.concatenate(counts) if counts else np.zeros(0))
        return len(described)

    def read_snapshot(self, path: Path, *, chunk_bytes: int = CHUNK_BYTES) -> Restored | None:
        """Fill an empty store from ``path``, then from the changes written after it (if they
        complete this very snapshot); None (logged) when there is none or it is unusable. A
        changes file that does not read is logged and left out: the full snapshot stays."""
        if not path.exists():
            return None
        with self._lock:
            if self._series_count():
                log.warning("snapshot %s not read: the store already holds series", path)
                return None
        restored = self._read_file(path, chunk_bytes, None)
        if restored is None:
            self._empty_again()
            return None
        changes = changes_path(path)
        if changes.exists():
            completed = self._read_file(changes, chunk_bytes, restored.written_at)
            if completed is not None:
                return completed
        return restored

    def _read_file(self, path: Path, chunk_bytes: int, base: float | None) -> Restored | None:
        try:
            with zipfile.ZipFile(path) as archive:
                return self._read_archive(archive, chunk_bytes, base)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
            log.warning("snapshot %s ignored: cannot read it: %s", path, exc)
        except SnapshotError as exc:
            log.warning("snapshot %s ignored: %s", path, exc)
        return None

    def _empty_again(self) -> None:
        """Back to an empty store (a snapshot that failed half-way)."""
        with self._lock:
            table = self._table
            self._table = SeriesTable(
                n_slots=table.recent.n_slots,
                n_long_slots=table.long.n_slots,
                capacity=1024,
                max_rows=table.max_rows,
                long_metrics=table.long_metrics,
                recent_metrics=table.recent_metrics,
            )
            self._histograms.clear()
            self._shapes.clear()
            self._shape_bytes = 0

    def _read_archive(
        self, archive: zipfile.ZipFile, chunk_bytes: int, base: float | None
    ) -> Restored:
        """Read a full snapshot (``base`` None) into the empty store, or the changes written
        after the full snapshot of time ``base`` into the store that snapshot filled."""

        def small(name: str) -> npt.NDArray[Any]:
            with archive.open(name + ".npy") as member:
                return np.lib.format.read_array(member, allow_pickle=False)

        meta = arrays.untext(small("meta"))
        if meta.get("format") != FORMAT:
            raise SnapshotError(f"format {meta.get('format')!r}, this collector reads {FORMAT}")
        theirs = {k: meta.get(k) for k in _shape(self)}
        if theirs != _shape(self):
            raise SnapshotError(f"another store shape: {theirs}, this store is {_shape(self)}")
        if meta.get("base") != base:
            raise SnapshotError(f"changes of the snapshot of {meta.get('base')}, not of {base}")
        series = arrays.untext(small("series"))
        counters = small("counters")
        # which series have long rows (absent, from before long_metrics: every series)
        names = archive.namelist()
        longs = small("long_series") if "long_series.npy" in names else None
        # which series have recent rows (absent, from before recent_metrics: every series)
        recents = small("recent_series") if "recent_series.npy" in names else None
        if meta["recent_head"] is None:  # an empty store's snapshot
            return Restored(0, 0, float(meta["written_at"]), None)
        with self._lock:
            table = self._table
            now_slot = int(self._clock() // self.step_seconds)
            recent_head = max(int(meta["recent_head"]), now_slot, table.recent.head or 0)
            table.recent.head = recent_head
            table.long.head = recent_head // self._ratio
            rows = np.array(
                [
                    self._restored_row(metric, items, unit, kind)
                    for metric, items, unit, kind in series
                ],
                dtype=np.int64,
            )
            first_slot = meta["first_slot"]
            oldest = recent_head - table.long.n_slots * self._ratio + 1
            if first_slot is not None and table.first_slot is not None:  # changes on a base
                first_slot = min(int(first_slot), table.first_slot)
            table.first_slot = None if first_slot is None else max(int(first_slot), oldest)
            for name, first, chosen in (
                ("recent", meta["recent_first"], rows if recents is None else rows[recents]),
                ("long", meta["long_first"], rows if longs is None else rows[longs]),
                ("counter_dt", meta["recent_first"], rows[counters]),
            ):
                done = 0
                for block in arrays.rows_of(archive, name, chunk_bytes):
                    part = chosen[done : done + block.shape[0]]
                    done += block.shape[0]
                    arrays.put_ring_block(table, name, part, int(first), block)
                if done != chosen.size:
                    raise SnapshotError(f"{name}: {done} rows for {chosen.size} series")
            table.last_seen_ns[rows] = small("last_seen_ns")
            table.raw_time_ns[rows] = small("raw_time_ns")
            table.raw_value[rows] = small("raw_value")
            _put_debt_and_latest(table, rows, counters, small, names)
            histograms = self._read_histograms(
                arrays.untext(small("histograms")),
                small("histogram_rings"),
                small("histogram_counts"),
                int(meta.get("histogram_first", meta["recent_first"])),
            )
            held = None if table.first_slot is None else float(table.first_slot * self.step_seconds)
            if base is None:  # the full snapshot on disk: the next changes complete it
                self._snapshot_base = _Base(
                    float(meta["written_at"]), int(meta["recent_head"]), int(meta["long_head"])
                )
            else:  # the next changes must hold these again, late slots included
                table.changed_from = arrays.earliest(table.changed_from, int(meta["recent_first"]))
            series_count = self._series_count() - len(self._histograms)
        return Restored(
            series=series_count,
            histograms=histograms,
            written_at=float(meta["written_at"]),
            held_since=held,
        )

    def _restored_row(self, metric: str, items: list[list[Any]], unit: str, kind: str) -> int:
        pairs = tuple((str(k), v) for k, v in items)
        row = self._table.resolve(
            (metric, None, pairs),
            unit=unit,
            counter=Kind(kind) is Kind.COUNTER,
            time_ns=0,
            total=len(self._histograms),
        )
        if row < 0:
            raise SnapshotError("more series than this store's max_series")
        return row

    def _read_histograms(
        self,
        described: list[list[Any]],
        rings: npt.NDArray[np.float32],
        counts: npt.NDArray[np.float64],
        first: int,
    ) -> int:
        at_ring = at_counts = 0
        head = self._table.recent.head
        for metric, items, unit, bounds, last_sum, last_time, last_seen, has_counts in described:
            key: SeriesKey = (metric, tuple((str(k), v) for k, v in items))
            info = self._table.info(key, unit, Kind.HISTOGRAM)
            series = HistogramSeries(
                info, tuple(float(b) for b in bounds), self._table.recent.n_slots
            )
            series.ring.head = head
            n = series.ring.rows
            block = rings[at_ring : at_ring + n]
            if block.shape[0] != n:
                raise SnapshotError("histogram rings shorter than their buckets")
            arrays.put_block(series.ring, np.arange(n, dtype=np.int64), first, encode(block))
            at_ring += n
            if has_counts:
                series.last_counts = np.array(counts[at_counts : at_counts + len(bounds) + 1])
                at_counts += len(bounds) + 1
            series.last_sum = float(last_sum)
            series.last_time_ns, series.last_seen_ns = int(last_time), int(last_seen)
            self._histograms[key] = series
        return len(described)


def _tiers(table: SeriesTable, rows: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], ...]:
    """Indexes into ``rows`` of the counters with a ring, the series with a long row, with a
    recent row, and with their latest value only."""
    recent = table.recent_row[rows] >= 0
    return (
        np.flatnonzero(table.counter_row[rows] >= 0),
        np.flatnonzero(table.long_row[rows] >= 0),
        np.flatnonzero(recent),
        np.flatnonzero(~recent),
    )


def _put_debt_and_latest(
    table: SeriesTable,
    rows: npt.NDArray[np.int64],
    counters: npt.NDArray[np.int64],
    small: Callable[[str], npt.NDArray[Any]],
    names: list[str],
) -> None:
    """The counters' debts and the latest-only series' values, for the series this store keeps
    that way (a counter latest-only here has no debt; a series with a ring here keeps its
    ring's values, not the latest value)."""
    crows = table.counter_row[rows[counters]]
    kept = crows >= 0
    table.debt[crows[kept]] = small("debt")[kept]
    if "latest_series.npy" in names:  # absent: a snapshot from before recent_metrics
        latest = rows[small("latest_series")]
        only = table.recent_row[latest] < 0
        table.latest_bits[latest[only]] = encode(small("latest_value")[only])
