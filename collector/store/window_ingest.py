"""The window store's ingest of decoded points: ``NumberPoint``s, columns, histogram points.

The per-point loops are the store's hot path: plain Python, one dict lookup per point (the
series table's ``aliases``), then one vectorised ``SeriesTable.write`` per batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.otlp_columns import NumberColumns
from gpuwarden.collector.store.histograms import HistogramSeries
from gpuwarden.collector.store.ring import encode
from gpuwarden.collector.store.types import (
    HOST_NAME,
    AttrValue,
    IngestCounts,
    Kind,
    SeriesBlock,
    series_key,
)
from gpuwarden.collector.store.window_state import NS, WindowState


class PointIngest(WindowState):
    """``ingest`` (points), ``ingest_histogram``, and the columns' ingest under the payload's."""

    def ingest(
        self, points: Iterable[NumberPoint], *, new_series_budget: int | None = None
    ) -> IngestCounts:
        """Store gauge and sum points; return what became of them.

        ``new_series_budget`` caps the series this call may create (a per-sender limit kept by
        the caller); points of further new series count as ``rejected_limit``.
        """
        with self._lock:
            return self._ingest(points, new_series_budget)

    def end_series(self, points: Iterable[NumberPoint]) -> int:
        """End the presence of the gauge series ``points`` name, each at its point's time (its
        value is ignored): Prometheus' stale markers. Return how many series were ended.

        The slot of that time reads missing (NaN) and the series' newest point becomes that
        time, so ``latest`` reads it as unknown at once instead of after ``staleness_seconds``,
        and a matrix shows no value from then on until a new point comes. A series the store
        does not hold, a counter (whose slots hold increases), and a marker not newer than the
        series' newest point (a value after it must not be erased) are left alone.
        """
        with self._lock:
            table = self._table
            rows: list[int] = []
            times: list[int] = []
            for p in points:
                row = table.aliases.get(
                    (p.metric, p.resource.get(HOST_NAME), tuple(p.attributes.items()))
                )
                t = p.time_unix_nano
                counter = table.counter_row[row] != -1 if row is not None else False
                if row is None or counter or t <= table.last_seen_ns[row]:
                    continue
                rows.append(row)
                times.append(t)
            if not rows:
                return 0
            table.write(
                np.array(rows, dtype=np.int64),
                np.array(times, dtype=np.int64),
                np.full(len(rows), np.nan),
                self._step_ns,
                self._ratio,
                IngestCounts(),
            )
            return len(set(rows))

    def _ingest(self, points: Iterable[NumberPoint], budget: int | None = None) -> IngestCounts:
        table = self._table
        aliases = table.aliases
        resolve = table.resolve
        isfinite = math.isfinite
        future_ns = int((self._clock() + self._max_future_seconds) * NS)
        created_before = table.created
        rows: list[int] = []
        times: list[int] = []
        values: list[float] = []
        nonfinite = future = limit = 0
        # The per-point loop is the hot path: plain Python, no numpy scalars, one dict lookup.
        for p in points:
            value = p.value
            t = p.time_unix_nano
            if not isfinite(value):
                nonfinite += 1
                continue
            if t > future_ns:
                future += 1
                continue
            alias = (p.metric, p.resource.get(HOST_NAME), tuple(p.attributes.items()))
            row = aliases.get(alias)
            if row is None:
                create = budget is None or table.created - created_before < budget
                row = resolve(
                    alias,
                    unit=p.unit,
                    counter=p.kind == "sum" and p.monotonic,
                    time_ns=t,
                    total=len(self._histograms),
                    create=create,
                )
                if row < 0:
                    limit += 1
                    continue
            rows.append(row)
            times.append(t)
            values.append(value)
        counts = IngestCounts(
            rejected_nonfinite=nonfinite,
            rejected_future=future,
            rejected_limit=limit,
            new_series=table.created - created_before,
        )
        if not rows:
            return counts
        return table.write(
            np.array(rows, dtype=np.int64),
            np.array(times, dtype=np.int64),
            np.array(values, dtype=np.float64),
            self._step_ns,
            self._ratio,
            counts,
        )

    def _ingest_columns(
        self, columns: NumberColumns, budget: int | None, *, want_rows: bool
    ) -> tuple[IngestCounts, list[int] | None]:
        """Store decoded columns; with ``want_rows`` also each point's row (-1: not stored)."""
        table = self._table
        aliases = table.aliases
        resolve = table.resolve
        future_ns = int((self._clock() + self._max_future_seconds) * NS)
        created_before = table.created
        histograms = len(self._histograms)
        rows: list[int] = []
        times: list[int] = []
        values: list[float] = []
        point_rows: list[int] | None = [] if want_rows else None
        future = limit = 0
        hosts = [resource.get(HOST_NAME) for resource in columns.resources]
        for metric in columns.metrics:
            name, host = metric.name, hosts[metric.resource]
            for items, t, value in zip(metric.items, metric.times, metric.values, strict=True):
                if t > future_ns:
                    future += 1
                    if point_rows is not None:
                        point_rows.append(-1)
                    continue
                alias = (name, host, items)
                row = aliases.get(alias)
                if row is None:
                    create = budget is None or table.created - created_before < budget
                    row = resolve(
                        alias,
                        unit=metric.unit,
                        counter=metric.counter,
                        time_ns=t,
                        total=histograms,
                        create=create,
                    )
                    if row < 0:
                        limit += 1
                        if point_rows is not None:
                            point_rows.append(-1)
                        continue
                rows.append(row)
                times.append(t)
                values.append(value)
                if point_rows is not None:
                    point_rows.append(row)
        counts = IngestCounts(
            rejected_future=future,
            rejected_limit=limit,
            new_series=table.created - created_before,
        )
        if rows:
            counts = table.write(
                np.array(rows, dtype=np.int64),
                np.array(times, dtype=np.int64),
                np.array(values, dtype=np.float64),
                self._step_ns,
                self._ratio,
                counts,
            )
        return counts, point_rows

    def ingest_series(self, blocks: Sequence[SeriesBlock]) -> IngestCounts:
        """Store whole series at once (a warm start's read-back): one identity per series, then
        one vectorised write of all their points in time order. Points the recent window no
        longer holds count as ``rejected_old``, as in ``ingest``."""
        with self._lock:
            table = self._table
            future_ns = int((self._clock() + self._max_future_seconds) * NS)
            created_before = table.created
            rows: list[npt.NDArray[np.int64]] = []
            times: list[npt.NDArray[np.int64]] = []
            values: list[npt.NDArray[np.float64]] = []
            limit = 0
            for block in blocks:
                if not block.times_ns.size:
                    continue
                alias = (block.metric, block.host, tuple(block.attributes.items()))
                row = table.aliases.get(alias)
                if row is None:
                    row = table.resolve(
                        alias,
                        unit=block.unit,
                        counter=block.counter,
                        time_ns=int(block.times_ns[0]),
                        total=len(self._histograms),
                    )
                    if row < 0:
                        limit += int(block.times_ns.size)
                        continue
                rows.append(np.full(block.times_ns.size, row, dtype=np.int64))
                times.append(block.times_ns.astype(np.int64, copy=False))
                values.append(block.values.astype(np.float64, copy=False))
            if not rows:
                return IngestCounts(rejected_limit=limit)
            all_rows, all_times = np.concatenate(rows), np.concatenate(times)
            all_values = np.concatenate(values)
            finite = np.isfinite(all_values)
            timely = all_times <= future_ns
            keep = finite & timely
            order = np.argsort(all_times[keep], kind="stable")
            counts = IngestCounts(
                rejected_nonfinite=int((~finite).sum()),
                rejected_future=int((finite & ~timely).sum()),
                rejected_limit=limit,
                new_series=table.created - created_before,
            )
            if not order.size:
                return counts
            return table.write(
                all_rows[keep][order],
                all_times[keep][order],
                all_values[keep][order],
                self._step_ns,
                self._ratio,
                counts,
            )

    def fill_long(self, blocks: Sequence[SeriesBlock]) -> int:
        """Write long-ring slots directly (a warm start's history older than the recent window,
        read back as per-long-step means; counters as per-second rates, as the long ring holds
        them); return the slots written.

        ``times_ns`` are the long slots' starts. Only slots the long ring holds that are older
        than the recent window are written: the recent window's long slots are computed from the
        recent ring, as always. Series are created as needed (their newest point: the newest
        slot written). Blocks of metrics without a long ring (``long_metrics``) are left out.
        """
        with self._lock:
            table = self._table
            long_step_ns = self.long_step_seconds * NS
            now_slot = int(self._clock() // self.step_seconds)
            head = table.advance(max(now_slot, table.recent.head or now_slot), self._ratio)
            long_head = head // self._ratio
            oldest = long_head - table.long.n_slots + 1
            recent_first = (head - table.recent.n_slots + 1 + self._ratio - 1) // self._ratio
            written = 0
            for block in blocks:
                slots = block.times_ns // long_step_ns
                keep = (slots >= oldest) & (slots < recent_first) & np.isfinite(block.values)
                if not keep.any() or not table.keeps_long(block.metric):
                    continue
                alias = (block.metric, block.host, tuple(block.attributes.items()))
                row = table.aliases.get(alias)
                if row is None:
                    row = table.resolve(
                        alias,
                        unit=block.unit,
                        counter=block.counter,
                        time_ns=int(block.times_ns[keep].max()),
                        total=len(self._histograms),
                    )
                    if row < 0:
                        continue
                chosen = slots[keep]
                long_row = int(table.long_row[row])
                table.long.bits[long_row, chosen % table.long.n_slots] = encode(block.values[keep])
                first = int(chosen.min()) * self._ratio
                if table.first_slot is None or first < table.first_slot:
                    table.first_slot = first
                written += int(chosen.size)
            return written

    def ingest_histogram(
        self,
        metric: str,
        attributes: Mapping[str, AttrValue],
        *,
        time_unix_nano: int,
        bounds: Sequence[float],
        bucket_counts: Sequence[float],
        sum_value: float,
        unit: str = "",
    ) -> IngestCounts:
        """Store one cumulative explicit-bucket histogram point.

        Args:
            metric: metric name.
            attributes: point attributes plus the resource's ``host.name``.
            time_unix_nano: point time.
            bounds: explicit bucket bounds, increasing.
            bucket_counts: observations per bucket since the series started,
                ``len(bounds) + 1`` of them (the last is the +Inf bucket).
            sum_value: sum of the observations since the series started.
            unit: metric unit.
        """
        if len(bucket_counts) != len(bounds) + 1:
            raise ValueError(
                f"{metric}: {len(bucket_counts)} bucket counts for {len(bounds)} bounds"
            )
        counts = np.asarray(bucket_counts, dtype=np.float64)
        with self._lock:
            if not (np.isfinite(counts).all() and math.isfinite(sum_value)):
                return IngestCounts(rejected_nonfinite=1)
            if time_unix_nano > int((self._clock() + self._max_future_seconds) * NS):
                return IngestCounts(rejected_future=1)
            key = series_key(metric, attributes)
            series = self._histograms.get(key)
            new = 0
            if series is None or series.bounds != tuple(bounds):
                if series is None and self._series_count() >= self._max_series:
                    return IngestCounts(rejected_limit=1)
                series = HistogramSeries(
                    self._table.info(key, unit, Kind.HISTOGRAM),
                    tuple(float(b) for b in bounds),
                    self._table.recent.n_slots,
                )
                new = int(key not in self._histograms)
                self._histograms[key] = series
            slot = time_unix_nano // self._step_ns
            head = self._table.advance(slot, self._ratio)
            return series.observe(slot, head, time_unix_nano, counts, sum_value, new_series=new)
