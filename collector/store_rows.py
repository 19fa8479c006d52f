"""The store's series table: identity → row, per-row state, and the rings rows index.

A row is a series id. ``rows_by_key`` maps the canonical key (metric, sorted attribute items incl.
``host.name``) to it; ``aliases`` caches the key as points arrive (metric, host, attribute items in
the sender's order), so the hot path builds one tuple and does one lookup, and sorting happens
only the first time a sender's ordering is seen. Rows of evicted series are NaN-filled and reused
from a free list; the arrays double when full, up to ``max_rows``. A series' kind (gauge or
counter) is fixed by its first point.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.otlp import NumberPoint
from gpuwarden.collector.store_counters import NO_TIME, counter_steps
from gpuwarden.collector.store_ring import Ring
from gpuwarden.collector.store_types import (
    HOST_NAME,
    AttrItems,
    AttrValue,
    IngestCounts,
    Kind,
    SeriesInfo,
    SeriesKey,
)

AliasKey = tuple[str, AttrValue | None, AttrItems]
FREE = np.iinfo(np.int64).max
"""``last_seen_ns`` of a free row: never stale."""


class SeriesTable:
    """Series identity, per-row state and the recent, long and increase rings."""

    def __init__(self, *, n_slots: int, n_long_slots: int, capacity: int, max_rows: int) -> None:
        self.recent = Ring(n_slots=n_slots, rows=capacity, dtype=np.float32)
        self.long = Ring(n_slots=n_long_slots, rows=capacity, dtype=np.float32)
        # Counter rows are a separate, smaller space: only counters pay for float64 increases.
        self.increases = Ring(n_slots=n_slots, rows=max(16, capacity // 8), dtype=np.float64)
        self.max_rows = max_rows
        self.aliases: dict[AliasKey, int] = {}
        # Attribute values repeat across series (a GPU's UUID in each of its 40 series): keep one.
        self.strings: dict[str, str] = {}
        self.rows_by_key: dict[SeriesKey, int] = {}
        self.infos: list[SeriesInfo | None] = [None] * capacity
        self.metric_ids: dict[str, int] = {}
        self.metric_of_row = np.full(capacity, -1, dtype=np.int32)
        self.counter_row = np.full(capacity, -1, dtype=np.int64)
        self.last_seen_ns = np.full(capacity, FREE, dtype=np.int64)
        self.raw_time_ns = np.full(capacity, NO_TIME, dtype=np.int64)
        self.raw_value = np.full(capacity, np.nan, dtype=np.float64)
        self.object_bytes = np.zeros(capacity, dtype=np.int32)
        self.free_rows: list[int] = []
        self.next_row = 0
        self.free_counter_rows: list[int] = []
        self.next_counter_row = 0
        self.created = 0

    # --- identity -----------------------------------------------------------------------------

    def resolve(
        self, alias: AliasKey, point: NumberPoint, *, total: int, create: bool = True
    ) -> int:
        """The row of the series ``alias`` names, created if new; -1 beyond the limit.

        ``total`` counts series held elsewhere (histograms) against ``max_rows``; with
        ``create`` false an unknown series is not created (-1: the sender's budget is spent).
        """
        metric, host, items = alias
        strings = self.strings
        items = tuple(
            (sys.intern(k), strings.setdefault(v, v) if isinstance(v, str) else v) for k, v in items
        )
        if isinstance(host, str):
            host = strings.setdefault(host, host)
        pairs = list(items)
        if host is not None and all(k != HOST_NAME for k, _ in pairs):
            pairs.append((HOST_NAME, host))
        key: SeriesKey = (sys.intern(metric), tuple(sorted(pairs)))
        row = self.rows_by_key.get(key)
        if row is None:
            if not create or len(self.rows_by_key) + total >= self.max_rows:
                return -1
            row = self._create(key, point)
            self.object_bytes[row] = _object_bytes(key, alias)
        if len(self.aliases) >= 4 * len(self.rows_by_key) + 1024:
            self.aliases.clear()  # senders with ever-changing attribute orders: it is a cache
        self.aliases[(key[0], host, items)] = row
        return row

    def info(self, key: SeriesKey, unit: str, kind: Kind) -> SeriesInfo:
        """A ``SeriesInfo`` sharing interned strings with the table."""
        return SeriesInfo(key=key, unit=sys.intern(unit), kind=kind)

    def _create(self, key: SeriesKey, point: NumberPoint) -> int:
        row = self.free_rows.pop() if self.free_rows else self._next_row()
        kind = Kind.COUNTER if point.kind == "sum" and point.monotonic else Kind.GAUGE
        self.infos[row] = self.info(key, point.unit, kind)
        self.rows_by_key[key] = row
        self.metric_of_row[row] = self.metric_ids.setdefault(key[0], len(self.metric_ids))
        self.last_seen_ns[row] = point.time_unix_nano
        if kind is Kind.COUNTER:
            self.counter_row[row] = self._next_counter_row()
        self.created += 1
        return row

    def _next_row(self) -> int:
        row = self.next_row
        if row == self.recent.rows:
            self._grow(min(2 * row, self.max_rows))
        self.next_row += 1
        return row

    def _grow(self, capacity: int) -> None:
        self.recent.grow(capacity)
        self.long.grow(capacity)
        extra = capacity - len(self.infos)
        self.infos.extend([None] * extra)
        self.metric_of_row = np.concatenate([self.metric_of_row, np.full(extra, -1, np.int32)])
        self.counter_row = np.concatenate([self.counter_row, np.full(extra, -1, np.int64)])
        self.last_seen_ns = np.concatenate([self.last_seen_ns, np.full(extra, FREE, np.int64)])
        self.raw_time_ns = np.concatenate([self.raw_time_ns, np.full(extra, NO_TIME, np.int64)])
        self.raw_value = np.concatenate([self.raw_value, np.full(extra, np.nan)])
        self.object_bytes = np.concatenate([self.object_bytes, np.zeros(extra, np.int32)])

    def _next_counter_row(self) -> int:
        if self.free_counter_rows:
            return self.free_counter_rows.pop()
        row = self.next_counter_row
        if row == self.increases.rows:
            self.increases.grow(2 * row)
        self.next_counter_row += 1
        return row

    # --- writes -------------------------------------------------------------------------------

    def advance(self, slot: int, ratio: int) -> int:
        """Move every ring's head up to ``slot`` (never back); return the recent head."""
        head = self.recent.head
        if head is None or slot > head:
            self.recent.advance(slot)
            self.increases.advance(slot)
            self.long.advance(slot // ratio)
            return slot
        return head

    def write(
        self,
        rows: npt.NDArray[np.int64],
        times_ns: npt.NDArray[np.int64],
        values: npt.NDArray[np.float64],
        step_ns: int,
        ratio: int,
        counts: IngestCounts,
    ) -> IngestCounts:
        """Store one batch of resolved points (vectorised); return ``counts`` completed."""
        slots = times_ns // step_ns
        head = self.advance(int(slots.max()), ratio)
        oldest = head - self.recent.n_slots + 1
        counter = self.counter_row[rows] >= 0
        gauge = ~counter & (slots >= oldest)
        written = [(rows[gauge], slots[gauge], times_ns[gauge])]
        self._write_gauges(rows[gauge], slots[gauge], values[gauge])
        out_of_order = resets = 0
        if counter.any():
            steps = counter_steps(
                rows[counter], times_ns[counter], values[counter], self.raw_time_ns, self.raw_value
            )
            c_slots = steps.times_ns // step_ns
            held = c_slots >= oldest
            self._write_counters(
                steps.rows[held],
                c_slots[held],
                steps.rates_per_second[held],
                steps.increases[held],
            )
            written.append((steps.rows[held], c_slots[held], steps.times_ns[held]))
            out_of_order, resets = steps.out_of_order, steps.resets
        w_rows = np.concatenate([w[0] for w in written])
        w_slots = np.concatenate([w[1] for w in written])
        np.maximum.at(self.last_seen_ns, w_rows, np.concatenate([w[2] for w in written]))
        self._update_long(w_rows, w_slots, head, ratio)
        return dataclasses.replace(
            counts,
            accepted=int(w_rows.size),
            rejected_old=rows.size - int(w_rows.size) - out_of_order,
            counter_out_of_order=out_of_order,
            counter_resets=resets,
        )

    def _write_gauges(
        self,
        rows: npt.NDArray[np.int64],
        slots: npt.NDArray[np.int64],
        values: npt.NDArray[np.float64],
    ) -> None:
        # Fancy assignment with repeated indices leaves an unspecified winner; sort by cell
        # (stable, so arrival order breaks ties) and write each cell's last point once.
        n = self.recent.n_slots
        flat = rows * n + slots % n
        order = np.argsort(flat, kind="stable")
        cells = flat[order]
        last = np.ones(cells.size, dtype=bool)
        last[:-1] = cells[:-1] != cells[1:]
        self.recent.values.reshape(-1)[cells[last]] = values[order][last]

    def _write_counters(
        self,
        rows: npt.NDArray[np.int64],
        slots: npt.NDArray[np.int64],
        rates: npt.NDArray[np.float64],
        increases: npt.NDArray[np.float64],
    ) -> None:
        # Points arrive sorted by (row, time): a slot's rate is its newest point's.
        cols = slots % self.recent.n_slots
        last = np.ones(rows.size, dtype=bool)
        last[:-1] = (rows[:-1] != rows[1:]) | (slots[:-1] != slots[1:])
        self.recent.values[rows[last], cols[last]] = rates[last]
        # A slot's increase is the sum of its points' deltas; first points have none.
        known = ~np.isnan(increases)
        counter_rows, cols = self.counter_row[rows[known]], cols[known]
        cells = self.increases.values
        fresh = np.isnan(cells[counter_rows, cols])
        cells[counter_rows[fresh], cols[fresh]] = 0.0
        np.add.at(cells, (counter_rows, cols), increases[known])

    def _update_long(
        self, rows: npt.NDArray[np.int64], slots: npt.NDArray[np.int64], head: int, ratio: int
    ) -> None:
        """Recompute the long slots (means of their recent slots) the written cells fall in."""
        n, n_long = self.recent.n_slots, self.long.n_slots
        minutes = slots // ratio
        _, index = np.unique(rows * n_long + minutes % n_long, return_index=True)
        rows, minutes = rows[index], minutes[index]
        whole = minutes * ratio > head - n  # a long slot partly rolled out stays as computed
        rows, minutes = rows[whole], minutes[whole]
        if rows.size == 0:
            return
        cols = minutes[:, None] * ratio + np.arange(ratio)
        block = self.recent.values[rows[:, None], cols % n]
        block[cols > head] = np.nan  # not written yet in this lap: the previous lap's data
        have = (~np.isnan(block)).sum(axis=1)
        means = np.full(rows.size, np.nan, dtype=np.float32)
        np.divide(np.nansum(block, axis=1), have, out=means, where=have > 0)
        self.long.values[rows, minutes % n_long] = means

    # --- reads and housekeeping ---------------------------------------------------------------

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

    def evict_before(self, cutoff_ns: int) -> int:
        """Free the rows of series whose newest point is older than ``cutoff_ns``."""
        rows = np.flatnonzero(self.last_seen_ns[: self.next_row] < cutoff_ns)
        if rows.size == 0:
            return 0
        gone = rows.tolist()
        for row in gone:
            info = self.infos[row]
            if info is not None:
                del self.rows_by_key[info.key]
            self.infos[row] = None
        self.recent.clear_rows(rows)
        self.long.clear_rows(rows)
        counter_rows = self.counter_row[rows]
        counter_rows = counter_rows[counter_rows >= 0]
        self.increases.clear_rows(counter_rows)
        self.free_counter_rows.extend(counter_rows.tolist())
        self.counter_row[rows] = -1
        self.metric_of_row[rows] = -1
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

    def memory_bytes(self) -> int:
        """Arrays' ``nbytes``, containers' sizes and the per-series objects' estimated sizes."""
        arrays = (
            self.recent.values,
            self.long.values,
            self.increases.values,
            self.metric_of_row,
            self.counter_row,
            self.last_seen_ns,
            self.raw_time_ns,
            self.raw_value,
            self.object_bytes,
        )
        containers = (self.aliases, self.rows_by_key, self.infos, self.free_rows, self.strings)
        return (
            sum(a.nbytes for a in arrays)
            + sum(sys.getsizeof(c) for c in containers)
            + sum(sys.getsizeof(s) for s in self.strings)
            + int(self.object_bytes.sum())
        )


def _object_bytes(key: SeriesKey, alias: AliasKey) -> int:
    """Bytes of one series' own Python objects; strings are shared and counted apart."""
    numbers = [v for _, v in key[1] if not isinstance(v, str)]
    own = [key, key[1], alias, alias[2], *key[1], *numbers]
    info = 56  # SeriesInfo with three slots
    return info + sum(sys.getsizeof(o) for o in own)
