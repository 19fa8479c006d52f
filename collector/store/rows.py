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
is recomputed (the mean of its recent slots) before the head moves, before long reads and before
eviction, once per slot for a whole round of requests instead of once per request.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import cast

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.store.counters import (
    NO_TIME,
    counter_steps,
    decode_dt_ms,
    encode_dt,
    ns_to_ms,
    rates,
)
from gpuwarden.collector.store.ring import Floats, Ring, decode, encode, zeros
from gpuwarden.collector.store.types import (
    HOST_NAME,
    AttrValue,
    IngestCounts,
    Kind,
    SeriesInfo,
    SeriesKey,
)

AliasKey = tuple[str, AttrValue | None, tuple[tuple[str, AttrValue | None], ...]]
"""(metric, resource ``host.name``, point attribute items as sent: any order, may repeat keys)."""
FREE = np.iinfo(np.int64).max
"""``last_seen_ns`` of a free row: never stale."""
CARRY_LIMIT = 2.0**-20
"""A slot takes the debt only when it is this small against the slot's own value (so a slot is
within ~1e-6 of its own increase, and a counter at 0 stays exactly 0)."""
PENDING_LIMIT = 1 << 20
"""Queued long-ring updates beyond which they are applied at once."""


class SeriesTable:
    """Series identity, per-row state, the recent and long rings and the counters' arrays."""

    def __init__(self, *, n_slots: int, n_long_slots: int, capacity: int, max_rows: int) -> None:
        self.recent = Ring(n_slots=n_slots, rows=capacity)
        self.long = Ring(n_slots=n_long_slots, rows=capacity)
        counter_capacity = max(16, capacity // 8)
        self.dts = cast("npt.NDArray[np.uint16]", zeros((counter_capacity, n_slots), np.uint16))
        self.debt = np.zeros(counter_capacity, dtype=np.float64)
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
        self.evictions = 0
        """Bumped whenever rows are freed: row numbers cached outside the table go stale."""
        self._pending: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
        self._pending_size = 0

    # --- identity -----------------------------------------------------------------------------

    def resolve(
        self,
        alias: AliasKey,
        *,
        unit: str,
        counter: bool,
        time_ns: int,
        total: int,
        create: bool = True,
    ) -> int:
        """The row of the series ``alias`` names, created if new; -1 beyond the limit.

        Attribute items without a value are dropped and a repeated key keeps its last value, as
        ``otlp.attributes`` does. ``unit``, ``counter`` and ``time_ns`` describe the point that
        creates the series. ``total`` counts series held elsewhere (histograms) against
        ``max_rows``; with ``create`` false an unknown series is not created (-1: the sender's
        budget is spent).
        """
        metric, host, raw = alias
        strings = self.strings
        items = tuple(
            (sys.intern(k), strings.setdefault(v, v) if isinstance(v, str) else v) for k, v in raw
        )
        if isinstance(host, str):
            host = strings.setdefault(host, host)
        # The key shares the alias' item tuples: one (name, value) pair per series attribute.
        pairs: dict[str, tuple[str, AttrValue]] = {}
        for item in items:
            if item[1] is not None:
                pairs[item[0]] = cast("tuple[str, AttrValue]", item)
        if host is not None and HOST_NAME not in pairs:
            pairs[HOST_NAME] = (HOST_NAME, host)
        key: SeriesKey = (sys.intern(metric), tuple(sorted(pairs.values())))
        row = self.rows_by_key.get(key)
        if row is None:
            if not create or len(self.rows_by_key) + total >= self.max_rows:
                return -1
            row = self._create(key, unit, counter, time_ns)
            self.object_bytes[row] = _object_bytes(key, alias)
        if len(self.aliases) >= 4 * len(self.rows_by_key) + 1024:
            self.aliases.clear()  # senders with ever-changing attribute orders: it is a cache
        self.aliases[(key[0], host, items)] = row
        return row

    def info(self, key: SeriesKey, unit: str, kind: Kind) -> SeriesInfo:
        """A ``SeriesInfo`` sharing interned strings with the table."""
        return SeriesInfo(key=key, unit=sys.intern(unit), kind=kind)

    def _create(self, key: SeriesKey, unit: str, counter: bool, time_ns: int) -> int:
        row = self.free_rows.pop() if self.free_rows else self._next_row()
        kind = Kind.COUNTER if counter else Kind.GAUGE
        self.infos[row] = self.info(key, unit, kind)
        self.rows_by_key[key] = row
        self.metric_of_row[row] = self.metric_ids.setdefault(key[0], len(self.metric_ids))
        self.last_seen_ns[row] = time_ns
        if counter:
            crow = self._next_counter_row()
            self.counter_row[row] = crow
            self.debt[crow] = 0.0
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
        if row == self.dts.shape[0]:
            rows = row + max(16, row // 2)
            dts = cast("npt.NDArray[np.uint16]", zeros((rows, self.dts.shape[1]), np.uint16))
            dts[:row] = self.dts
            self.dts = dts
            self.debt = np.concatenate([self.debt, np.zeros(rows - row)])
        self.next_counter_row += 1
        return row

    # --- writes -------------------------------------------------------------------------------

    def advance(self, slot: int, ratio: int) -> int:
        """Move every ring's head up to ``slot`` (never back); return the recent head."""
        head = self.recent.head
        if head is None or slot > head:
            self.flush_long(ratio)
            self.recent.advance(slot, self.next_row)
            self.long.advance(slot // ratio, self.next_row)
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
        *,
        unique_rows: bool = False,
    ) -> IngestCounts:
        """Store one batch of resolved points (vectorised); return ``counts`` completed.

        ``unique_rows``: the caller knows no row repeats in the batch (skips the sorting that
        finds each cell's last point).
        """
        offered = rows.size
        slots = times_ns // step_ns
        head = self.advance(int(slots.max()), ratio)
        oldest = head - self.recent.n_slots + 1
        counter = self.counter_row[rows] >= 0
        out_of_order = resets = 0
        if not counter.any():
            held = slots >= oldest
            if not held.all():
                rows, slots, times_ns, values = (
                    rows[held],
                    slots[held],
                    times_ns[held],
                    values[held],
                )
            self._write_gauges(rows, slots, values, unique_rows)
            w_rows, w_slots, w_times = rows, slots, times_ns
        else:
            gauge = ~counter & (slots >= oldest)
            g_rows, g_slots = rows[gauge], slots[gauge]
            self._write_gauges(g_rows, g_slots, values[gauge], unique_rows)
            steps = counter_steps(
                rows[counter],
                times_ns[counter],
                values[counter],
                self.raw_time_ns,
                self.raw_value,
                unique_rows=unique_rows,
            )
            c_slots = steps.times_ns // step_ns
            held = c_slots >= oldest
            c_rows, c_slots, c_times = steps.rows[held], c_slots[held], steps.times_ns[held]
            self._write_counters(
                c_rows, c_slots, steps.increases[held], steps.dt_ns[held], unique_rows
            )
            w_rows = np.concatenate([g_rows, c_rows])
            w_slots = np.concatenate([g_slots, c_slots])
            w_times = np.concatenate([times_ns[gauge], c_times])
            out_of_order, resets = steps.out_of_order, steps.resets
        if unique_rows:
            self.last_seen_ns[w_rows] = np.maximum(self.last_seen_ns[w_rows], w_times)
        else:
            np.maximum.at(self.last_seen_ns, w_rows, w_times)
        self._pending.append((w_rows, w_slots))
        self._pending_size += w_rows.size
        if self._pending_size > PENDING_LIMIT:
            self.flush_long(ratio)
        return dataclasses.replace(
            counts,
            accepted=int(w_rows.size),
            rejected_old=offered - int(w_rows.size) - out_of_order,
            counter_out_of_order=out_of_order,
            counter_resets=resets,
        )

    def _write_gauges(
        self,
        rows: npt.NDArray[np.int64],
        slots: npt.NDArray[np.int64],
        values: npt.NDArray[np.float64],
        unique_rows: bool,
    ) -> None:
        n = self.recent.n_slots
        flat = rows * n + slots % n
        if unique_rows:
            self.recent.put_flat(flat, values)
            return
        # Fancy assignment with repeated indices leaves an unspecified winner; sort by cell
        # (stable, so arrival order breaks ties) and write each cell's last point once.
        order = np.argsort(flat, kind="stable")
        cells = flat[order]
        last = np.ones(cells.size, dtype=bool)
        last[:-1] = cells[:-1] != cells[1:]
        self.recent.put_flat(cells[last], values[order][last])

    def _write_counters(
        self,
        rows: npt.NDArray[np.int64],
        slots: npt.NDArray[np.int64],
        increases: npt.NDArray[np.float64],
        dt_ns: npt.NDArray[np.int64],
        unique_rows: bool,
    ) -> None:
        """Add increases to their slots (points sorted by row, then time; first points NaN)."""
        known = ~np.isnan(increases)
        if not known.all():
            rows, slots, increases, dt_ns = (
                rows[known],
                slots[known],
                increases[known],
                dt_ns[known],
            )
        if rows.size == 0:
            return
        if unique_rows:
            self._add_slots(rows, slots, increases, ns_to_ms(dt_ns))
            return
        # One group per (row, slot): its increases summed, its covered time too.
        new = np.ones(rows.size, dtype=bool)
        new[1:] = (rows[1:] != rows[:-1]) | (slots[1:] != slots[:-1])
        starts = np.flatnonzero(new)
        g_rows, g_slots = rows[starts], slots[starts]
        g_inc = np.add.reduceat(increases, starts)
        g_ms = ns_to_ms(np.add.reduceat(dt_ns, starts))
        # A series' slots must be written in time order: the debt of one goes to the next.
        row_start = np.ones(g_rows.size, dtype=bool)
        row_start[1:] = g_rows[1:] != g_rows[:-1]
        index = np.arange(g_rows.size)
        rank = index - np.maximum.accumulate(np.where(row_start, index, 0))
        for r in range(int(rank.max()) + 1):
            at = rank == r
            self._add_slots(g_rows[at], g_slots[at], g_inc[at], g_ms[at])

    def _add_slots(
        self,
        rows: npt.NDArray[np.int64],
        slots: npt.NDArray[np.int64],
        increases: npt.NDArray[np.float64],
        ms: npt.NDArray[np.int64],
    ) -> None:
        """Add one increase (and its covered ms) to one slot of each row (no row repeats)."""
        cols = slots % self.recent.n_slots
        crows = self.counter_row[rows]
        bits = self.recent.bits[rows, cols]
        fresh = bits == 0  # NaN: the slot's first increase
        if fresh.all():
            target = increases.copy()
        else:
            old = decode(bits).astype(np.float64)
            target = np.where(fresh, 0.0, old) + increases
            ms = ms + np.where(fresh, 0, decode_dt_ms(self.dts[crows, cols]))
        debt = self.debt[crows]
        with np.errstate(over="ignore", invalid="ignore"):
            # Carry the debt only where it is tiny next to the slot (a zero slot stays zero).
            carry = np.abs(debt) <= np.abs(target) * CARRY_LIMIT
            target += debt * carry
            stored = target.astype(np.float32)  # beyond float32's range: ±inf, no debt
            error = target - stored
        finite = np.isfinite(error)
        if not finite.all():
            error[~finite] = 0.0
        self.debt[crows] = np.where(carry, error, debt + error)
        self.recent.bits[rows, cols] = encode(stored)
        self.dts[crows, cols] = encode_dt(ms)

    def flush_long(self, ratio: int) -> None:
        """Recompute the long slots (means of their recent slots) of the queued writes."""
        if not self._pending:
            return
        rows = np.concatenate([p[0] for p in self._pending])
        slots = np.concatenate([p[1] for p in self._pending])
        self._pending.clear()
        self._pending_size = 0
        head = self.recent.head
        if head is None or rows.size == 0:
            return
        minutes = slots // ratio
        lo, hi = int(minutes.min()), int(minutes.max())
        # Usually one or two minutes: one row-gather of contiguous columns each.
        candidates = range(lo, hi + 1) if hi - lo < 64 else np.unique(minutes).tolist()
        for minute in candidates:
            if minute * ratio <= head - self.recent.n_slots:
                continue  # a long slot partly rolled out stays as computed
            chosen = rows[minutes == minute]
            if chosen.size:
                self._update_long(chosen, minute, head, ratio)

    def _update_long(self, rows: npt.NDArray[np.int64], minute: int, head: int, ratio: int) -> None:
        """Set long slot ``minute`` of ``rows`` (repeats allowed) to the mean of its slots."""
        mark = np.zeros(self.next_row, dtype=bool)
        mark[rows] = True
        rows = np.flatnonzero(mark)
        n = self.recent.n_slots
        first = minute * ratio % n  # a long slot's recent slots are adjacent columns
        block = decode(self.recent.bits[rows, first : first + ratio])
        crows = self.counter_row[rows]
        counter = crows >= 0
        if counter.any():
            codes = self.dts[crows[counter], first : first + ratio]
            block[counter] = rates(block[counter], codes)
        written = head - minute * ratio + 1
        if written < ratio:
            block[:, written:] = np.nan  # not written yet in this lap: the previous lap's data
        have = np.count_nonzero(~np.isnan(block), axis=1)
        means = np.full(rows.size, np.nan)
        with np.errstate(invalid="ignore"):  # inf - inf
            np.divide(np.nansum(block, axis=1, dtype=np.float64), have, out=means, where=have > 0)
        self.long.bits[rows, minute % self.long.n_slots] = encode(means)

    # --- reads and housekeeping ---------------------------------------------------------------

    def rates(self, rows: npt.NDArray[np.int64], slots: npt.NDArray[np.int64]) -> Floats:
        """Recent values at ``(rows, slots)`` (broadcast), counters as rates."""
        rows, slots = np.broadcast_arrays(rows, slots)
        cols = slots % self.recent.n_slots
        values = self.recent.get(rows, cols)
        crows = self.counter_row[rows]
        counter = crows >= 0
        if counter.any():
            values[counter] = rates(values[counter], self.dts[crows[counter], cols[counter]])
        return values

    def read_rates(self, rows: npt.NDArray[np.int64], first: int, count: int) -> Floats:
        """``Ring.read`` of the recent ring, counters' rows as rates."""
        values = self.recent.read(rows, first, count)
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
        values = self.recent.read(rows, first, count).astype(np.float64)
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

    def evict_before(self, cutoff_ns: int, ratio: int) -> int:
        """Free the rows of series whose newest point is older than ``cutoff_ns``."""
        rows = np.flatnonzero(self.last_seen_ns[: self.next_row] < cutoff_ns)
        if rows.size == 0:
            return 0
        self.flush_long(ratio)
        self.evictions += 1
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
        self.dts[counter_rows] = 0
        self.debt[counter_rows] = 0.0
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
            self.metric_of_row,
            self.counter_row,
            self.last_seen_ns,
            self.raw_time_ns,
            self.raw_value,
            self.object_bytes,
        )
        containers = (self.aliases, self.rows_by_key, self.infos, self.free_rows, self.strings)
        return (
            self.recent.nbytes
            + self.long.nbytes
            + sum(a.nbytes for a in arrays)
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
