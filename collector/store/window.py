"""WindowStore: every series' recent history in numpy ring buffers, read as series x time matrices.

Layout (see ``store_ring``): one float32 array per resolution, ``capacity x n_slots``, rows are
series and columns a ring over time with one time axis shared by all series. The recent ring holds
``recent_seconds`` at ``step_seconds`` (default 6 h at 10 s, 2160 slots); the long ring holds
``long_seconds`` at ``long_step_seconds`` (default 14 d at 1 min, 20160 slots), each long slot the
mean of its recent slots, recomputed (lazily, before the head moves or the long ring is read)
whenever one of them is written, so late points and duplicates leave it right. Missing data is
NaN, never 0; the rings are stored so that untouched (calloc'd) memory reads as NaN, so a large
pre-sized store costs nothing until written. Rows are series ids: a dict maps the series key to
its row, rows of stale series go to a free list, the arrays double when full.

Only the metrics something reads over a time range keep a recent ring (``recent_metrics``,
default every metric; the long ones always do); the others keep their newest value per series
(``latest`` reads it; ``matrix`` and the increases raise ``LatestOnlyError``): most of a GPU's
series are read by nothing but ``/metrics`` and ``/status``.

Gauges (and non-monotonic sums) are stored as sent; the last write to a slot wins. Monotonic
cumulative sums are counters (``store_counters``): a counter's row of the recent ring holds each
slot's increase (the sum of the deltas of the raw points in it, a reset counting its new value)
as float32, its rounding carried forward so sums stay exact (``store_rows``), plus a small
``uint16`` ring of the time each slot's increase covers. Counters read as per-second rates
(increase / covered time) in ``matrix`` and ``latest``, and the long ring keeps their per-minute
mean rate; ``increase()`` and ``increase_matrix()`` give the increases, for energy accounting.
Histograms live in ``store_histograms``.

Freshness: every series keeps the time of its newest point (``last_seen_of``, per node
``last_seen_by_host``). One whose newest point is older than ``staleness_seconds`` is stale: its
value now is unknown, so ``latest`` reads it as NaN (its time stays), and the detectors' view
(``store.fresh.FreshReads``) hides it from reads that end now; its history stays readable until
``evict_stale`` drops it, much later.

Points older than the recent window, too far in the future (a wrong agent clock would otherwise
roll the whole window over), non-finite, or beyond ``max_series`` are counted and dropped.
Everything runs under one lock: the receiver ingests on the event loop, detectors read from a
worker thread.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator

import numpy as np

from gpuwarden.collector.store.rows_identity import FREE, LATEST_COUNTER
from gpuwarden.collector.store.snapshot import Snapshots
from gpuwarden.collector.store.window_payload import (
    SHAPE_BYTES,
    SHAPE_BYTES_PER_SERIES,
    SHAPE_SENDERS,
    PayloadIngest,
    RequestIngest,
)
from gpuwarden.collector.store.window_reads import WindowReads
from gpuwarden.collector.store.window_rows import RowIngest
from gpuwarden.collector.store.window_state import NS

__all__ = [
    "NS",
    "SHAPE_BYTES",
    "SHAPE_BYTES_PER_SERIES",
    "SHAPE_SENDERS",
    "RequestIngest",
    "WindowStore",
]


class WindowStore(PayloadIngest, RowIngest, WindowReads, Snapshots):
    """Recent and downsampled long windows of every series, in fixed-step numpy rings.

    Its parts are mixin bases, one concept per module, sharing ``WindowState`` (the parameters,
    the lock, the series table, histograms and shapes): ``PointIngest`` and ``PayloadIngest``
    write, ``WindowReads`` reads, ``Snapshots`` writes and reads the store on disk
    (``store.snapshot``); housekeeping is here.
    """

    def evict_stale(self, now: float | None = None) -> int:
        """Drop series without a point for ``stale_after_seconds``; return how many."""
        with self._lock:
            cutoff_ns = int(
                ((self._clock() if now is None else now) - self._stale_after_seconds) * NS
            )
            stale = [k for k, h in self._histograms.items() if h.last_seen_ns < cutoff_ns]
            for key in stale:
                del self._histograms[key]
            evicted = self._table.evict_before(cutoff_ns, self._ratio)
            if evicted:  # shapes hold rows, some now free
                self._shapes.clear()
                self._shape_bytes = 0
            return evicted + len(stale)

    def keep_long(self, metrics: Iterable[str]) -> int:
        """Give ``metrics`` a long ring from now on (rules loaded later read them long); return
        how many held series got a long row.

        Their long slots over the recent window are computed from the recent ring at once, so a
        metric added here has the recent window's history at long resolution, as after a start;
        the older part is missing (NaN). No-op for a store that keeps every metric long. A
        latest-only metric gets its recent ring first (``keep_recent``).
        """
        self.keep_recent(metrics)
        with self._lock:
            table = self._table
            kept = table.long_metrics
            if kept is None or not (new := frozenset(metrics) - kept):
                return 0
            table.flush_long(self._ratio)
            table.long_metrics = kept | new
            ids = [table.metric_ids[m] for m in new if m in table.metric_ids]
            used = table.metric_of_row[: table.next_row]
            rows = np.flatnonzero(np.isin(used, ids) & (table.long_row[: table.next_row] < 0))
            for row in rows.tolist():
                table.long_row[row] = table.allocate_long_row()
            head = table.recent.head
            if rows.size and head is not None:
                first = (head - table.recent.n_slots) // self._ratio + 1
                for minute in range(first, head // self._ratio + 1):
                    table.update_long(rows, minute, head, self._ratio)
            return int(rows.size)

    def keep_recent(self, metrics: Iterable[str]) -> int:
        """Give latest-only ``metrics`` a recent ring from now on (rules loaded later read them
        over time); return how many held series got a recent row.

        Their history starts now: a gauge's latest value goes into its newest slot (if the
        window still holds it), a counter's next point is its first increase in the ring. No-op
        for a store that keeps every metric's recent ring.
        """
        with self._lock:
            table = self._table
            kept = table.recent_metrics
            if kept is None or not (new := frozenset(metrics) - kept):
                return 0
            table.recent_metrics = kept | new
            ids = [table.metric_ids[m] for m in new if m in table.metric_ids]
            used = table.metric_of_row[: table.next_row]
            rows = np.flatnonzero(np.isin(used, ids) & (table.recent_row[: table.next_row] < 0))
            rows = rows[table.last_seen_ns[rows] != FREE]
            for row in rows.tolist():
                table.recent_row[row] = table.allocate_recent_row()
                if table.counter_row[row] == LATEST_COUNTER:
                    table.give_counter_row(row)
            gauges = rows[table.counter_row[rows] < 0]
            slots = table.last_seen_ns[gauges] // self._step_ns
            held = table.recent.held(slots)
            n = table.recent.n_slots
            flat = table.recent_row[gauges[held]] * n + slots[held] % n
            table.recent.bits.reshape(-1)[flat] = table.latest_bits[gauges[held]]
            table.latest_bits[rows] = 0
            return int(rows.size)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the store's lock: no other thread reads or writes it meanwhile (to fork a
        process that reads the store, ``detect.fork``: the child's copy of the lock is free)."""
        with self._lock:
            yield

    def held_since(self) -> float | None:
        """Start of the oldest data the store holds (None: none yet).

        The oldest slot ever written, unless the long ring has rolled past it since: how far
        back a rule's window or history can be covered (``detect.readiness``).
        """
        with self._lock:
            first = self._table.first_slot
            long_head = self._table.long.head
            if first is None or long_head is None:
                return None
            oldest_long = (long_head - self._table.long.n_slots + 1) * self.long_step_seconds
            return float(max(first * self.step_seconds, oldest_long))

    def series_count(self) -> int:
        """Series held (number and histogram)."""
        with self._lock:
            return self._series_count()

    def knows_nodes(self, hosts: Iterable[str]) -> bool:
        """Whether the store has had number series of every node in ``hosts`` (since it
        started, or in the snapshot it was restored from)."""
        with self._lock:
            known = self._table.host_ids
            return all(host in known for host in hosts)

    def metric_names(self) -> set[str]:
        """Every metric name with at least one series held."""
        with self._lock:
            return {key[0] for key in self._table.rows_by_key} | {
                key[0] for key in self._histograms
            }

    def memory_bytes(self) -> int:
        """Bytes held: every array's ``nbytes`` plus an estimate of per-series Python objects."""
        with self._lock:
            hist = sum(h.ring.nbytes + sys.getsizeof(h) for h in self._histograms.values())
            return self._table.memory_bytes() + hist + self._shape_bytes
