"""The series table's state and series identity: key -> row, row creation and growth.

:class:`~gpuwarden.collector.store.rows.SeriesTable` is this plus its writes (``rows_write``) and
reads; its module docstring describes the layout. Here: the arrays and dicts every part shares,
``resolve`` (the hot path's lookup of a series not in ``aliases`` yet), and the growth of the
per-row and per-counter arrays.
"""

from __future__ import annotations

import sys
from typing import cast

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.store.counters import NO_TIME
from gpuwarden.collector.store.ring import Ring, regrow, shared_rows
from gpuwarden.collector.store.types import HOST_NAME, AttrValue, Kind, SeriesInfo, SeriesKey

LONG_EVERY = None
"""``long_metrics`` meaning every metric has a long ring (the store's default)."""
RECENT_EVERY = None
"""``recent_metrics`` meaning every metric has a recent ring (the store's default)."""
LATEST_COUNTER = -2
"""``counter_row`` of a counter that keeps its latest rate only: no recent ring, so no row in the
counters' covered-time ring either (``counter_row >= 0`` still means "has one")."""

AliasKey = tuple[str, AttrValue | None, tuple[tuple[str, AttrValue | None], ...]]
"""(metric, resource ``host.name``, point attribute items as sent: any order, may repeat keys)."""
FREE = np.iinfo(np.int64).max
"""``last_seen_ns`` of a free row: never stale."""


class RowIdentity:
    """The table's state, and the rows of series: found, created, grown (see ``SeriesTable``)."""

    def __init__(
        self,
        *,
        n_slots: int,
        n_long_slots: int,
        capacity: int,
        max_rows: int,
        long_metrics: frozenset[str] | None = LONG_EVERY,
        recent_metrics: frozenset[str] | None = RECENT_EVERY,
    ) -> None:
        self._recent_tier(n_slots, capacity, recent_metrics, max_rows)
        self.long_metrics = long_metrics
        """Metrics whose series have a long ring row (None: every metric)."""
        long_capacity = capacity if long_metrics is None else max(16, capacity // 8)
        self.long = Ring(n_slots=n_long_slots, rows=long_capacity)
        self.long_row = np.full(capacity, -1, dtype=np.int64)
        """Each row's row in the long ring (-1: its metric has none)."""
        self.free_long_rows: list[int] = []
        self.next_long_row = 0
        counter_capacity = max(16, capacity // 8)
        self.dts = cast(
            "npt.NDArray[np.uint16]",
            shared_rows(counter_capacity, n_slots, np.uint16, max(counter_capacity, max_rows)),
        )
        self.debt = np.zeros(counter_capacity, dtype=np.float64)
        self.max_rows = max_rows
        self.aliases: dict[AliasKey, int] = {}
        # Attribute values repeat across series (a GPU's UUID in each of its 40 series): keep one.
        self.strings: dict[str, str] = {}
        self.rows_by_key: dict[SeriesKey, int] = {}
        self.infos: list[SeriesInfo | None] = [None] * capacity
        self.metric_ids: dict[str, int] = {}
        self.metric_of_row = np.full(capacity, -1, dtype=np.int32)
        # Each row's ``host.name`` as an index into ``host_names``: last-seen per node, vectorised.
        self.host_ids: dict[str, int] = {}
        self.host_names: list[str] = []
        self.host_of_row = np.full(capacity, -1, dtype=np.int32)
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
        self.retired: set[int] = set()
        """Hashes of evicted series' keys: a node's series that come back are known, not new,
        and a sender's spent budget of new series never refuses them."""
        self.first_slot: int | None = None
        """The oldest recent slot any number point was written to: how far back data goes."""
        self.changed_from: int | None = None
        """The oldest recent slot written since the last full snapshot began (None: none):
        late points land before the head, and a snapshot of the changes must take them."""
        self.evictions = 0
        """Bumped whenever rows are freed: row numbers cached outside the table go stale."""
        self._pending: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []
        self._pending_size = 0

    def _recent_tier(
        self, n_slots: int, capacity: int, recent_metrics: frozenset[str] | None, max_rows: int
    ) -> None:
        """The recent ring and the latest values of the series that keep no ring."""
        self.recent_metrics = recent_metrics
        """Metrics whose series have a recent ring row (None: every metric); the others keep
        their latest value only (``latest_bits``)."""
        recent_capacity = capacity if recent_metrics is None else max(16, capacity // 2)
        # shared, so a forked detection child never makes ingest copy its pages (``ring``)
        self.recent = Ring(
            n_slots=n_slots, rows=recent_capacity, max_rows=max(recent_capacity, max_rows)
        )
        self.recent_row = np.full(capacity, -1, dtype=np.int64)
        """Each row's row in the recent ring (-1: its metric keeps its latest value only)."""
        self.free_recent_rows: list[int] = []
        self.next_recent_row = 0
        self.latest_bits = np.zeros(capacity, dtype=np.uint32)
        """The latest value of each latest-only row (``ring.encode``d: 0 is NaN); a counter's
        is the rate of its newest point (its increase over the time since the one before)."""

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
        ``max_rows``; with ``create`` false a new series is not created (-1: the sender's budget
        is spent), but a series the table held before (evicted, in ``retired``) still is.
        """
        metric, host, raw = alias
        strings = self.strings
        intern = sys.intern
        kept: list[tuple[str, AttrValue | None]] = []
        # The key shares the alias' item tuples: one (name, value) pair per series attribute.
        pairs: dict[str, tuple[str, AttrValue]] = {}
        for name, value in raw:
            item = (
                intern(name),
                strings.setdefault(value, value) if isinstance(value, str) else value,
            )
            kept.append(item)
            if value is not None:
                pairs[item[0]] = cast("tuple[str, AttrValue]", item)
        items = tuple(kept)
        if isinstance(host, str):
            host = strings.setdefault(host, host)
        own_host = pairs.get(HOST_NAME)
        if own_host is not None:
            node: AttrValue | None = own_host[1]
        else:
            node = host
            if host is not None:
                pairs[HOST_NAME] = (HOST_NAME, host)
        key: SeriesKey = (intern(metric), tuple(sorted(pairs.values())))
        row = self.rows_by_key.get(key)
        if row is None:
            if len(self.rows_by_key) + total >= self.max_rows:
                return -1
            if not create and hash(key) not in self.retired:
                return -1
            row = self._create(key, unit, counter, time_ns, node)
            self.object_bytes[row] = _object_bytes(key, items)
        if len(self.aliases) >= 4 * len(self.rows_by_key) + 1024:
            self.aliases.clear()  # senders with ever-changing attribute orders: it is a cache
        self.aliases[(key[0], host, items)] = row
        return row

    def info(self, key: SeriesKey, unit: str, kind: Kind) -> SeriesInfo:
        """A ``SeriesInfo`` sharing interned strings with the table."""
        return SeriesInfo(key=key, unit=sys.intern(unit), kind=kind)

    def _create(
        self, key: SeriesKey, unit: str, counter: bool, time_ns: int, node: AttrValue | None
    ) -> int:
        row = self.free_rows.pop() if self.free_rows else self._next_row()
        kind = Kind.COUNTER if counter else Kind.GAUGE
        self.infos[row] = self.info(key, unit, kind)
        self.rows_by_key[key] = row
        self.metric_of_row[row] = self.metric_ids.setdefault(key[0], len(self.metric_ids))
        self.host_of_row[row] = self.host_index(node)
        self.last_seen_ns[row] = time_ns
        if not self.keeps_recent(key[0]):  # its latest value only: no ring rows at all
            self.latest_bits[row] = 0
            if counter:
                self.counter_row[row] = LATEST_COUNTER
            self.created += 1
            return row
        self.recent_row[row] = self.allocate_recent_row()
        if counter:
            self.give_counter_row(row)
        if self.keeps_long(key[0]):
            self.long_row[row] = self.allocate_long_row()
        self.created += 1
        return row

    def give_counter_row(self, row: int) -> None:
        """A row of the counters' arrays (covered times, debt) for counter ``row``."""
        crow = self._next_counter_row()
        self.counter_row[row] = crow
        self.debt[crow] = 0.0

    def keeps_long(self, metric: str) -> bool:
        """Whether ``metric``'s series have a long ring row."""
        return self.long_metrics is None or metric in self.long_metrics

    def keeps_recent(self, metric: str) -> bool:
        """Whether ``metric``'s series have a recent ring row (else their latest value only)."""
        return self.recent_metrics is None or metric in self.recent_metrics

    def host_index(self, host: AttrValue | None) -> int:
        """The index of ``host`` (a key's ``host.name``) in ``host_names`` (-1: none)."""
        if not isinstance(host, str):
            return -1
        found = self.host_ids.get(host)
        if found is None:
            found = self.host_ids[host] = len(self.host_names)
            self.host_names.append(host)
        return found

    def _next_row(self) -> int:
        row = self.next_row
        if row == len(self.infos):
            self._grow(min(2 * row, self.max_rows))
        self.next_row += 1
        return row

    def _grow(self, capacity: int) -> None:
        extra = capacity - len(self.infos)
        self.recent_row = np.concatenate([self.recent_row, np.full(extra, -1, np.int64)])
        self.latest_bits = np.concatenate([self.latest_bits, np.zeros(extra, np.uint32)])
        self.long_row = np.concatenate([self.long_row, np.full(extra, -1, np.int64)])
        self.infos.extend([None] * extra)
        self.metric_of_row = np.concatenate([self.metric_of_row, np.full(extra, -1, np.int32)])
        self.host_of_row = np.concatenate([self.host_of_row, np.full(extra, -1, np.int32)])
        self.counter_row = np.concatenate([self.counter_row, np.full(extra, -1, np.int64)])
        self.last_seen_ns = np.concatenate([self.last_seen_ns, np.full(extra, FREE, np.int64)])
        self.raw_time_ns = np.concatenate([self.raw_time_ns, np.full(extra, NO_TIME, np.int64)])
        self.raw_value = np.concatenate([self.raw_value, np.full(extra, np.nan)])
        self.object_bytes = np.concatenate([self.object_bytes, np.zeros(extra, np.int32)])

    def allocate_recent_row(self) -> int:
        """A free recent ring row (NaN-filled), the ring doubled when full."""
        if self.free_recent_rows:
            return self.free_recent_rows.pop()
        row = self.next_recent_row
        if row == self.recent.rows:
            self.recent.grow(min(max(1, 2 * row), self.max_rows))
        self.next_recent_row += 1
        return row

    def allocate_long_row(self) -> int:
        """A free long ring row (NaN-filled), the ring grown by half when full."""
        if self.free_long_rows:
            return self.free_long_rows.pop()
        row = self.next_long_row
        if row == self.long.rows:
            self.long.grow(min(row + max(16, row // 2), self.max_rows))
        self.next_long_row += 1
        return row

    def _next_counter_row(self) -> int:
        if self.free_counter_rows:
            return self.free_counter_rows.pop()
        row = self.next_counter_row
        if row == self.dts.shape[0]:
            rows = row + max(16, row // 2)
            self.dts = cast("npt.NDArray[np.uint16]", regrow(self.dts, rows))
            self.debt = np.concatenate([self.debt, np.zeros(rows - row)])
        self.next_counter_row += 1
        return row


_TUPLE = sys.getsizeof(())
_TUPLE_ITEM = sys.getsizeof((0,)) - _TUPLE
_SERIES_INFO = 56  # SeriesInfo with three slots


def _object_bytes(key: SeriesKey, items: tuple[tuple[str, AttrValue | None], ...]) -> int:
    """Bytes of one series' own Python objects (``sys.getsizeof`` of each, by its tuple sizes):
    the ``SeriesInfo``, the key, its items and their pairs, the alias and its items; strings are
    shared and counted apart."""
    pairs = key[1]
    tuples = 4 * _TUPLE + _TUPLE_ITEM * (2 + len(pairs) + 3 + len(items))
    tuples += len(pairs) * (_TUPLE + 2 * _TUPLE_ITEM)
    numbers = sum(sys.getsizeof(v) for _, v in pairs if not isinstance(v, str))
    return _SERIES_INFO + tuples + numbers
