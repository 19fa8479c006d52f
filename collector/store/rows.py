"""The store's series table: identity → row, per-row state, and the rings rows index.

A row is a series id. ``rows_by_key`` maps the canonical key (metric, sorted attribute items incl.
``host.name``) to it; ``aliases`` caches the key as points arrive (metric, host, attribute items in
the sender's order), so the hot path builds one tuple and does one lookup, and sorting happens
only the first time a sender's ordering is seen. Rows of evicted series are NaN-filled and reused
from a free list; the arrays double when full, up to ``max_rows``. A series' kind (gauge or
counter) is fixed by its first point.

Counters have a second index, ``counter_row``, into the few arrays only counters need: per slot
the time its increase covers (``uint16``, see ``store_counters``), and per series the rounding
``debt`` of its float32 increases (below). Those arrays grow by half when full.

A counter slot's increase is stored as float32 with error feedback: the rounding error of each
write is carried into the series' next slot (kept for a later one while it would move that slot
by more than ``CARRY_LIMIT``: a zero slot stays exactly zero), so the stored slots plus ``debt``
always add up to the exact (float64) sum of every increase stored. A sum over slots is therefore
off by at most the debt left when the slot before the range was written (about half a float32 ulp
of one slot's increase, not a sum of one per slot), and exact when the range also covers the
series' newest slot and starts before its first: reads add the debt to the newest slot.

The long ring is updated lazily: written (row, slot) pairs queue up, and each long slot they touch
is recomputed (the mean of its recent slots) before the head starts a new long slot, before long
reads and before eviction: once per long slot for all the requests it spans, instead of once per
request or recent slot.

Only the series of ``long_metrics`` (default: every metric) have a long ring row: ``long_row``
maps a row to it (-1: none), like ``counter_row``. A 14-day long row is 80 KB against the recent
row's 8.4 KB, so the series nothing reads at long resolution (most of a GPU's) keep none; the
long ring grows by half when full and its rows of evicted series are reused.

Likewise only the series of ``recent_metrics`` (default: every metric) have a recent ring row
(``recent_row``, -1: none): the others keep their latest value (``latest_bits``; a counter's, the
rate of its newest step, its raw state in ``raw_time_ns``/``raw_value`` and ``counter_row`` at
``LATEST_COUNTER``, without a covered-time row). Nothing reads them over a time range, and a
range read of one raises ``LatestOnlyError``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.store.counters import NO_TIME, rates
from gpuwarden.collector.store.ring import Floats, decode
from gpuwarden.collector.store.rows_identity import FREE, AliasKey
from gpuwarden.collector.store.rows_write import CARRY_LIMIT, PENDING_LIMIT, RowWrites
from gpuwarden.collector.store.types import SeriesInfo

__all__ = ["CARRY_LIMIT", "FREE", "PENDING_LIMIT", "AliasKey", "SeriesTable"]


class SeriesTable(RowWrites):
    """Series identity, per-row state, the recent and long rings and the counters' arrays.

    The state and ``resolve`` are ``RowIdentity``'s, the writes ``RowWrites``'s (mixin bases in
    their own modules, so each part stays one concept); the reads and eviction are here.
    """

    def rates(self, rows: npt.NDArray[np.int64], slots: npt.NDArray[np.int64]) -> Floats:
        """Recent values at ``(rows, slots)`` (broadcast), counters as rates; a latest-only
        row gives its latest value, whatever the slot (callers ask for its newest)."""
        rows, slots = np.broadcast_arrays(rows, slots)
        cols = slots % self.recent.n_slots
        rrows = self.recent_row[rows]
        ring = rrows >= 0
        if ring.all():
            values = self.recent.get(rrows, cols)
        else:
            values = decode(self.latest_bits[rows])
            values[ring] = self.recent.get(rrows[ring], cols[ring])
        crows = self.counter_row[rows]
        counter = crows >= 0
        if counter.any():
            values[counter] = rates(values[counter], self.dts[crows[counter], cols[counter]])
        return values

    def read_rates(self, rows: npt.NDArray[np.int64], first: int, count: int) -> Floats:
        """``Ring.read`` of the recent ring, counters' rows as rates (rows with a ring only)."""
        values = self.recent.read(self.recent_row[rows], first, count)
        crows = self.counter_row[rows]
        counter = np.flatnonzero(crows >= 0)
        if counter.size and count:
            cols = np.arange(first, first + count) % self.recent.n_slots
            codes = self.dts[crows[counter][:, None], cols]
            values[counter] = rates(values[counter], codes)
        return values

    def read_increases(
        self, rows: npt.NDArray[np.int64], first: int, count: int, step_ns: int
    ) -> npt.NDArray[np.float64]:
        """Counter rows' increases over slots ``[first, first + count)``, float64.

        Each row's newest slot gets the row's debt, so sums reaching it are exact.
        """
        values = self.recent.read(self.recent_row[rows], first, count).astype(np.float64)
        if rows.size and count:
            newest = self.last_seen_ns[rows] // step_ns - first
            inside = (newest >= 0) & (newest < count) & self.recent.held(newest + first)
            at = np.flatnonzero(inside)
            values[at, newest[at]] += self.debt[self.counter_row[rows[at]]]
        return values

    def select(
        self, metric: str, selector: Mapping[str, str] | None
    ) -> tuple[npt.NDArray[np.int64], tuple[SeriesInfo, ...]]:
        """Rows and infos of ``metric``'s series matching ``selector``, in row order."""
        mid = self.metric_ids.get(metric)
        if mid is None:
            return (np.zeros(0, dtype=np.int64), ())
        rows = np.flatnonzero(self.metric_of_row[: self.next_row] == mid)
        infos = [(row, self.infos[row]) for row in rows.tolist()]
        chosen = [(row, info) for row, info in infos if info is not None and info.matches(selector)]
        return (
            np.array([row for row, _ in chosen], dtype=np.int64),
            tuple(info for _, info in chosen),
        )

    def last_seen_by_host(self) -> dict[str, int]:
        """Host name → the newest point (ns) of any of its number series."""
        used = self.host_of_row[: self.next_row]
        seen = self.last_seen_ns[: self.next_row]
        held = (used >= 0) & (seen != FREE)
        newest = np.full(len(self.host_names), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(newest, used[held], seen[held])
        floor = np.iinfo(np.int64).min
        return {
            name: int(t)
            for name, t in zip(self.host_names, newest.tolist(), strict=True)
            if t != floor
        }

    def evict_before(self, cutoff_ns: int, ratio: int) -> int:
        """Free the rows of series whose newest point is older than ``cutoff_ns``."""
        rows = np.flatnonzero(self.last_seen_ns[: self.next_row] < cutoff_ns)
        if rows.size == 0:
            return 0
        self.flush_long(ratio)
        self.evictions += 1
        gone = rows.tolist()
        if len(self.retired) + len(gone) > self.max_rows:
            self.retired.clear()  # a memory of names, bounded like the table
        for row in gone:
            info = self.infos[row]
            if info is not None:
                del self.rows_by_key[info.key]
                self.retired.add(hash(info.key))
            self.infos[row] = None
        recent_rows = self.recent_row[rows]
        recent_rows = recent_rows[recent_rows >= 0]
        self.recent.clear_rows(recent_rows)
        self.free_recent_rows.extend(recent_rows.tolist())
        self.recent_row[rows] = -1
        self.latest_bits[rows] = 0
        long_rows = self.long_row[rows]
        long_rows = long_rows[long_rows >= 0]
        self.long.clear_rows(long_rows)
        self.free_long_rows.extend(long_rows.tolist())
        self.long_row[rows] = -1
        counter_rows = self.counter_row[rows]
        counter_rows = counter_rows[counter_rows >= 0]
        self.dts[counter_rows] = 0
        self.debt[counter_rows] = 0.0
        self.free_counter_rows.extend(counter_rows.tolist())
        self.counter_row[rows] = -1
        self.metric_of_row[rows] = -1
        self.host_of_row[rows] = -1
        self.last_seen_ns[rows] = FREE
        self.raw_time_ns[rows] = NO_TIME
        self.raw_value[rows] = np.nan
        self.object_bytes[rows] = 0
        dropped = set(gone)
        self.aliases = {alias: row for alias, row in self.aliases.items() if row not in dropped}
        live = {v for key in self.rows_by_key for _, v in key[1] if isinstance(v, str)}
        live.update(host for _, host, _ in self.aliases if isinstance(host, str))
        self.strings = {v: v for v in live}
        self.free_rows.extend(gone)
        return len(gone)

    def ring_bytes(self) -> dict[str, int]:
        """Bytes of the big arrays: recent ring, long ring, counters' covered-time ring."""
        return {
            "recent": self.recent.nbytes,
            "long": self.long.nbytes,
            "counter_dt": int(self.dts.nbytes),
        }

    def memory_bytes(self) -> int:
        """Arrays' ``nbytes``, containers' sizes and the per-series objects' estimated sizes."""
        arrays = (
            self.dts,
            self.debt,
            self.recent_row,
            self.latest_bits,
            self.metric_of_row,
            self.host_of_row,
            self.long_row,
            self.counter_row,
            self.last_seen_ns,
            self.raw_time_ns,
            self.raw_value,
            self.object_bytes,
        )
        containers = (
            self.aliases,
            self.rows_by_key,
            self.infos,
            self.free_rows,
            self.strings,
            self.retired,
        )
        return (
            self.recent.nbytes
            + self.long.nbytes
            + sum(a.nbytes for a in arrays)
            + sum(sys.getsizeof(c) for c in containers)
            + sum(sys.getsizeof(s) for s in self.strings)
            + int(self.object_bytes.sum())
        )
