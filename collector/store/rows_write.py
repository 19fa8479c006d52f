"""The series table's writes: points into the recent ring, long slots recomputed lazily.

See :mod:`~gpuwarden.collector.store.rows` for the counters' float32 error feedback (``debt``)
and the lazy long ring.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.store.counters import (
    CounterSteps,
    counter_steps,
    decode_dt_ms,
    encode_dt,
    ns_to_ms,
    rates,
)
from gpuwarden.collector.store.ring import decode, encode
from gpuwarden.collector.store.rows_identity import LATEST_COUNTER, RowIdentity
from gpuwarden.collector.store.types import IngestCounts

CARRY_LIMIT = 2.0**-20
"""A slot takes the debt only when it is this small against the slot's own value (so a slot is
within ~1e-6 of its own increase, and a counter at 0 stays exactly 0)."""
PENDING_LIMIT = 1 << 20
"""Queued long-ring updates beyond which they are applied at once."""
Ints = npt.NDArray[np.int64]


class RowWrites(RowIdentity):
    """Vectorised writes of resolved points, and the long ring's lazy update."""

    def advance(self, slot: int, ratio: int) -> int:
        """Move every ring's head up to ``slot`` (never back); return the recent head.

        The queued long-ring updates are applied first when the move starts a long slot: the
        long ring moves then, and only then can a long slot roll out of the recent ring (the
        recent window is a whole number of long slots). Within one long slot they wait, so a
        long slot is recomputed once for the rounds of requests it spans, not once per recent
        slot.
        """
        head = self.recent.head
        if head is None or slot > head:
            if head is None or slot // ratio != head // ratio:
                self.flush_long(ratio)
            self.recent.advance(slot, self.next_recent_row)
            self.long.advance(slot // ratio, self.next_long_row)
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
        latest_only = self.recent_row[rows] < 0
        latest: tuple[Ints, Ints, Ints, CounterSteps | None] | None = None
        if latest_only.any():
            latest = self._write_latest(
                rows[latest_only], times_ns[latest_only], values[latest_only], oldest, step_ns
            )
            ring = ~latest_only
            rows, slots, times_ns, values = rows[ring], slots[ring], times_ns[ring], values[ring]
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
            w_rows, w_slots, w_times, steps = self._write_mixed(
                rows, slots, times_ns, values, counter, oldest, step_ns, unique_rows
            )
            out_of_order, resets = steps.out_of_order, steps.resets
        self._queue_long(w_rows, w_slots)
        if latest is not None:
            l_rows, l_slots, l_times, l_steps = latest
            w_rows = np.concatenate([w_rows, l_rows])
            w_slots = np.concatenate([w_slots, l_slots])
            w_times = np.concatenate([w_times, l_times])
            if l_steps is not None:
                out_of_order += l_steps.out_of_order
                resets += l_steps.resets
        if unique_rows:
            self.last_seen_ns[w_rows] = np.maximum(self.last_seen_ns[w_rows], w_times)
        else:
            np.maximum.at(self.last_seen_ns, w_rows, w_times)
        if w_slots.size:
            oldest_written = int(w_slots.min())
            if self.first_slot is None or oldest_written < self.first_slot:
                self.first_slot = oldest_written
            if self.changed_from is None or oldest_written < self.changed_from:
                self.changed_from = oldest_written
        if self._pending_size > PENDING_LIMIT:
            self.flush_long(ratio)
        return dataclasses.replace(
            counts,
            accepted=int(w_rows.size),
            rejected_old=offered - int(w_rows.size) - out_of_order,
            counter_out_of_order=out_of_order,
            counter_resets=resets,
        )

    def _queue_long(self, rows: Ints, slots: Ints) -> None:
        """Queue the long-ring update of written (row, slot) pairs (``flush_long`` applies it)."""
        self._pending.append((rows, slots))
        self._pending_size += rows.size

    def _write_mixed(
        self,
        rows: Ints,
        slots: Ints,
        times_ns: Ints,
        values: npt.NDArray[np.float64],
        counter: npt.NDArray[np.bool_],
        oldest: int,
        step_ns: int,
        unique_rows: bool,
    ) -> tuple[Ints, Ints, Ints, CounterSteps]:
        """``write`` of a batch with counter points: each kind to its ring (``counter``: the
        points of counters); return the rows, slots and times written, and the counter steps."""
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
        self._write_counters(c_rows, c_slots, steps.increases[held], steps.dt_ns[held], unique_rows)
        w_rows = np.concatenate([g_rows, c_rows])
        w_slots = np.concatenate([g_slots, c_slots])
        w_times = np.concatenate([times_ns[gauge], c_times])
        return w_rows, w_slots, w_times, steps

    def _write_latest(
        self,
        rows: Ints,
        times_ns: Ints,
        values: npt.NDArray[np.float64],
        oldest: int,
        step_ns: int,
    ) -> tuple[Ints, Ints, Ints, CounterSteps | None]:
        """``write`` of the points of latest-only rows: each row's newest point (the last sent
        among equal times) becomes its latest value unless the row has a newer one; a counter's
        is the rate of its newest increase, as its ring slot would read. Points older than the
        recent window are rejected, as for rows with a ring. Return the rows, slots and times
        taken, and the counters' steps (None: no counter point)."""
        slots = times_ns // step_ns
        held = slots >= oldest
        if not held.all():
            rows, times_ns, values = rows[held], times_ns[held], values[held]
        counter = self.counter_row[rows] == LATEST_COUNTER
        steps = None
        if counter.any():
            steps = counter_steps(
                rows[counter], times_ns[counter], values[counter], self.raw_time_ns, self.raw_value
            )
            gauge = ~counter
            speed = rates(steps.increases, encode_dt(ns_to_ms(steps.dt_ns)))
            rows = np.concatenate([rows[gauge], steps.rows])
            times_ns = np.concatenate([times_ns[gauge], steps.times_ns])
            values = np.concatenate([values[gauge], speed.astype(np.float64)])
        order = np.lexsort((np.arange(rows.size), times_ns, rows))
        r, t, v = rows[order], times_ns[order], values[order]
        last = np.ones(r.size, dtype=bool)
        last[:-1] = r[:-1] != r[1:]
        r, t, v = r[last], t[last], v[last]
        newer = t >= self.last_seen_ns[r]
        self.latest_bits[r[newer]] = encode(v[newer])
        return rows, times_ns // step_ns, times_ns, steps

    def _write_gauges(
        self,
        rows: npt.NDArray[np.int64],
        slots: npt.NDArray[np.int64],
        values: npt.NDArray[np.float64],
        unique_rows: bool,
    ) -> None:
        n = self.recent.n_slots
        flat = self.recent_row[rows] * n + slots % n
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
        rrows = self.recent_row[rows]
        bits = self.recent.bits[rrows, cols]
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
        self.recent.bits[rrows, cols] = encode(stored)
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
                self.update_long(chosen, minute, head, ratio)

    def update_long(self, rows: npt.NDArray[np.int64], minute: int, head: int, ratio: int) -> None:
        """Set long slot ``minute`` of ``rows`` (repeats allowed) to the mean of its slots."""
        mark = np.zeros(self.next_row, dtype=bool)
        mark[rows] = True
        mark &= self.long_row[: self.next_row] >= 0  # only series that have a long row
        rows = np.flatnonzero(mark)
        if not rows.size:
            return
        n = self.recent.n_slots
        first = minute * ratio % n  # a long slot's recent slots are adjacent columns
        block = decode(self.recent.bits[self.recent_row[rows], first : first + ratio])
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
        self.long.bits[self.long_row[rows], minute % self.long.n_slots] = encode(means)
