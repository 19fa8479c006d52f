"""Warm start from the TSDB: the store refilled with what the collector wrote by remote-write.

A snapshot (``store.snapshot``) holds the store up to the moment it was written; after a
``kill -9`` that is up to ``snapshot_seconds`` ago, and without a snapshot (a new host, a lost
disk, a standby taking over) it holds nothing. The TSDB holds every gauge and counter the
collector took, so at start :func:`warm_from_tsdb` reads back the span the snapshot does not
cover (from the snapshot's time, or ``lookback_seconds`` back, to now) and stores it as the
agents had sent it: series by series (``Inverse``), counters from their cumulative values
(so increases come out as they did), in time order, through the store's ordinary write.

What it reads also tells the history writer the newest sample the TSDB holds for each series
(:attr:`WarmStart.newest_ms`), so a point the agents resend after the restart is not written
a second time (``HistoryWriter.seed_newest``).

Histograms are not written out, so they come back from the snapshot only (``inverse.NOT_WRITTEN``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuwarden.collector.remote_write.inverse import Inverse, Origin
from gpuwarden.collector.remote_write.reader import RawSeries, ReadError, TsdbReader
from gpuwarden.collector.remote_write.wire import Labels
from gpuwarden.collector.store.types import SeriesBlock
from gpuwarden.collector.store.window import WindowStore

log = logging.getLogger(__name__)

_NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class WarmStart:
    """What a warm start read from the TSDB and stored."""

    start: float
    """Start of the span read (Unix seconds)."""
    end: float
    series: int = 0
    samples: int = 0
    stored: int = 0
    """Points the store took (the rest: already held, or out of its window)."""
    unknown_series: int = 0
    """Series whose name this collector does not write (left out)."""
    error: str | None = None
    """Why the read stopped early (the store keeps what came before), or None."""
    long_slots: int = 0
    """Long-ring slots filled from the TSDB's per-minute means (before the recent window)."""
    seconds: float = 0.0
    newest_ms: dict[Labels, int] = field(default_factory=dict, repr=False)
    """Each series' newest sample in the TSDB (milliseconds), by its labels."""


def _block(origin: Origin, raw: RawSeries) -> SeriesBlock:
    """One series read back, as the store takes it (the point identity ``origin`` gives it)."""
    return SeriesBlock(
        metric=origin.metric.metric,
        host=origin.host,
        attributes=origin.attributes,
        unit=origin.metric.unit,
        counter=origin.metric.counter,
        times_ns=raw.timestamps_ms * _NS_PER_MS,
        values=raw.values,
    )


def warm_span(
    store: WindowStore, now: float, lookback_seconds: float, snapshot_at: float | None
) -> float:
    """Where the read starts: ``lookback_seconds`` back (at most the recent window, the part
    the store rebuilds point by point), or the snapshot's time when that is later."""
    start = now - min(lookback_seconds, store.recent_seconds - store.step_seconds)
    if snapshot_at is not None:
        start = max(start, snapshot_at - store.step_seconds)
    return start


def warm_from_tsdb(
    store: WindowStore,
    reader: TsdbReader,
    *,
    start: float,
    end: float,
    inverse: Inverse | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> WarmStart:
    """Read ``[start, end]`` back from the TSDB into ``store``, page by page, oldest first.

    A failing read (unreachable TSDB, an answer over a bound) stops the warm start: what was
    stored stays, ``error`` says why, and the collector starts with that (logged).
    """
    inverse = Inverse() if inverse is None else inverse
    began = monotonic()
    series: set[Labels] = set()
    unknown: set[Labels] = set()
    samples = stored = 0
    newest: dict[Labels, int] = {}
    error = None
    # Newest page first, so the bound (``read_max_samples``) leaves out the oldest data, never
    # the newest; stored oldest first afterwards (a counter's increases need its points in order).
    pages: list[list[SeriesBlock]] = []
    try:
        for page in reader.pages(
            sorted(inverse.names), int(start * 1000), int(end * 1000), newest_first=True
        ):
            blocks = []
            for raw in page:
                origin = inverse.origin(raw.labels)
                if origin is None:
                    unknown.add(raw.labels)
                    continue
                series.add(raw.labels)
                samples += raw.timestamps_ms.size
                newest[raw.labels] = max(newest.get(raw.labels, -1), int(raw.timestamps_ms[-1]))
                blocks.append(_block(origin, raw))
            pages.append(blocks)
    except ReadError as exc:
        error = str(exc)
        log.error("warm start from the TSDB stopped: %s (starting with what was read)", exc)
    for blocks in reversed(pages):
        stored += store.ingest_series(blocks).accepted
    result = WarmStart(
        start=start,
        end=end,
        series=len(series),
        samples=samples,
        stored=stored,
        unknown_series=len(unknown),
        error=error,
        seconds=monotonic() - began,
        newest_ms=newest,
    )
    log.info(
        "warm start from the TSDB: %d series, %d samples read, %d stored, %d of unknown names "
        "left out, %.1f s",
        result.series,
        result.samples,
        result.stored,
        result.unknown_series,
        result.seconds,
    )
    return result


def warm_long_from_tsdb(
    store: WindowStore,
    reader: TsdbReader,
    *,
    start: float,
    end: float,
    inverse: Inverse | None = None,
) -> tuple[int, str | None]:
    """Fill the long ring over ``[start, end)`` (older than the recent window) from the TSDB's
    per-long-step means, metric by metric; return the slots written and the error that stopped
    it (None: none). What cannot be read is logged; the start goes on without it."""
    inverse = Inverse() if inverse is None else inverse
    step = store.long_step_seconds
    written = 0
    try:
        for name, origin in sorted(inverse.names.items()):
            if not store.keeps_long(origin.metric):
                continue  # no long ring for it here: not worth reading (``long_metrics``)
            for page in reader.means(
                name, origin.counter, int(start * 1000), int(end * 1000), step
            ):
                blocks = []
                for raw in page:
                    found = inverse.origin(raw.labels)
                    if found is None:
                        continue
                    blocks.append(_block(found, raw))
                written += store.fill_long(blocks)
    except ReadError as exc:
        log.error("warm start of the long window from the TSDB stopped: %s", exc)
        return written, str(exc)
    log.info("warm start from the TSDB: %d long-window slots (per-%d s means)", written, step)
    return written, None
