"""The collector's composition: one facade over the parts that do the work.

``CollectorService`` wires an :class:`~gpuwarden.collector.ingest.intake.Intake` (OTLP ingest,
series budgets, node facts, announcements), a :class:`~gpuwarden.collector.accounting.fleet.Fleet`
(the GPU inventory and its accounting) and the model-server scraper around one store, storage and
job registry, and hands detectors a :class:`~gpuwarden.collector.views.DetectionView`.
Framework-free: the aiohttp app calls ``accept`` for every OTLP request and runs ``poll_jobs``
and ``run_accounting`` as background tasks; tests and the demo call them directly.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Self, TypeVar, cast, overload

import numpy as np

from gpuwarden.collector.accounting.fleet import Fleet
from gpuwarden.collector.accounting.gpu_time import AccountingConfig, GpuRef, GpuTimeline, Usage
from gpuwarden.collector.ingest.creation_pace import CreationPace
from gpuwarden.collector.ingest.intake import Accepted, IngestTotals, Intake
from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint
from gpuwarden.collector.ingest.otlp_limits import DEFAULT_LIMITS, IngestLimits
from gpuwarden.collector.ingest.rounds_seen import AgentRounds
from gpuwarden.collector.ingest.scrape import ModelServerScraper
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.remote_write.reader import TsdbReader
from gpuwarden.collector.remote_write.warm_start import (
    WarmStart,
    warm_from_tsdb,
    warm_long_from_tsdb,
    warm_span,
)
from gpuwarden.collector.remote_write.writer import HistoryWriter
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import AccountingRow, Event
from gpuwarden.collector.store.snapshot import Restored, SnapshotStats
from gpuwarden.collector.store.types import AttrValue
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.store.window_rows import RowBatch, RowsIngested
from gpuwarden.collector.views import DetectionView

if TYPE_CHECKING:
    from gpuwarden.collector.detect.fork import ForkedCycles

__all__ = ["Accepted", "CollectorService", "DetectionView", "IngestTotals"]

T = TypeVar("T")

FOLLOW_OVERLAP_SECONDS = 60.0
"""How much of what a standby read last time it reads again (see ``follow_tsdb``)."""
log = logging.getLogger(__name__)


class _OnParts(Generic[T]):
    """A facade attribute that lives on its parts: read from the first, written to each, so
    assigning it on the service (``service.recompute_periods = ...``) reaches every part."""

    def __init__(self, *parts: str) -> None:
        self._parts = parts
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, service: None, owner: type) -> Self: ...
    @overload
    def __get__(self, service: object, owner: type | None = None) -> T: ...
    def __get__(self, service: object, owner: type | None = None) -> T | Self:
        if service is None:
            return self
        return cast("T", getattr(getattr(service, self._parts[0]), self._name))

    def __set__(self, service: object, value: T) -> None:
        for part in self._parts:
            setattr(getattr(service, part), self._name, value)


class CollectorService:
    """Everything the collector holds, with the operations the app and CLI need."""

    store = _OnParts[WindowStore]("intake", "fleet")
    storage = _OnParts[Storage]("intake", "fleet")
    registry = _OnParts[JobRegistry]("intake", "fleet")
    clock = _OnParts[Callable[[], float]]("intake", "fleet")
    nodes = _OnParts[dict[str, dict[str, str]]]("intake", "fleet")
    totals = _OnParts[IngestTotals]("intake")
    max_new_series_per_source_hour = _OnParts[int]("intake")
    pace = _OnParts[CreationPace | None]("intake")
    limits = _OnParts[IngestLimits]("intake")
    accounting = _OnParts[AccountingConfig]("fleet")
    period_seconds = _OnParts[int]("fleet")
    recompute_periods = _OnParts[int]("fleet")

    def __init__(
        self,
        store: WindowStore,
        storage: Storage,
        registry: JobRegistry,
        accounting: AccountingConfig | None = None,
        period_seconds: int = 60,
        recompute_periods: int = 10,
        clock: Callable[[], float] = time.time,
        scraper: ModelServerScraper | None = None,
        nodes: dict[str, dict[str, str]] | None = None,
        totals: IngestTotals | None = None,
        max_new_series_per_source_hour: int = 100_000,
        limits: IngestLimits = DEFAULT_LIMITS,
        snapshot_path: Path | None = None,
        history: HistoryWriter | None = None,
        pace: CreationPace | None = None,
    ) -> None:
        nodes = {} if nodes is None else nodes  # one dict: the intake writes, the fleet reads
        self.intake = Intake(
            store,
            storage,
            registry,
            clock=clock,
            nodes=nodes,
            totals=IngestTotals() if totals is None else totals,
            max_new_series_per_source_hour=max_new_series_per_source_hour,
            limits=limits,
            tap=history,
            pace=pace,
        )
        self.fleet = Fleet(
            store,
            storage,
            registry,
            accounting=AccountingConfig() if accounting is None else accounting,
            period_seconds=period_seconds,
            recompute_periods=recompute_periods,
            clock=clock,
            nodes=nodes,
        )
        self.scraper = scraper
        self.snapshot_path = snapshot_path
        """Where the store is snapshotted (None: never; ``store.snapshot``)."""
        self.restored: Restored | None = None
        """What the snapshot read at start gave the store (None: nothing)."""
        self.warm: WarmStart | None = None
        """What the read-back from the TSDB at start gave the store (None: none was done)."""
        self.tsdb_reader: TsdbReader | None = None
        """The TSDB this collector reads back from (``remote_write.read_url``; None: none)."""
        self._followed_until: float | None = None
        #: writes the stored points to a TSDB by remote-write (``remote_write:``), if set
        self.history = history
        self._view: DetectionView | None = None
        self._lock = threading.Lock()
        self._accounting_forks: ForkedCycles | None = None

    # --- ingest (the intake) ------------------------------------------------------------------

    def accept(self, points: Iterable[NumberPoint], source: str, *, history: bool = True) -> int:
        """Store one request's points; remember node facts; return the rejected count
        (``history=False``: not for the remote-write history writer, ``Intake.accept``)."""
        return self.intake.accept(points, source, history=history)

    def accept_rows(
        self, batch: RowBatch, resources: Iterable[Mapping[str, AttrValue]], source: str
    ) -> RowsIngested:
        """Store columns of series whose rows the caller keeps (``Intake.accept_rows``)."""
        return self.intake.accept_rows(batch, resources, source)

    def end_series(self, points: Iterable[NumberPoint]) -> int:
        """End the presence of the series ``points`` name (stale markers, ``Intake``)."""
        return self.intake.end_series(points)

    def accept_payload(
        self, payload: bytes, kind: str, source: str, rounds: AgentRounds | None = None
    ) -> Accepted:
        """Decode and store one OTLP/HTTP body: the receiver's fast path (``Intake``); an
        agent's ``rounds`` already stored are acknowledged, not stored again."""
        return self.intake.accept_payload(payload, kind, source, rounds)

    def accept_histograms(self, points: Sequence[HistogramPoint], source: str) -> int:
        """Store cumulative histogram points (bucket counts); return the rejected count."""
        return self.intake.accept_histograms(points, source)

    def record_events(self, events: Iterable[Event]) -> int:
        """Store events; a model's newest deploy or rollback updates its record (``Intake``)."""
        return self.intake.record_events(events)

    def scrape_models(self) -> int:
        """Scrape the configured model servers into the store (blocking); points stored."""
        if self.scraper is None:
            return 0
        result = self.scraper.scrape_once()
        rejected = result.accept_into(self.intake, source="scrape")
        return len(result.points) + len(result.histograms) - rejected

    def poll_jobs(self, now: float | None = None) -> int:
        """Poll the job adapters (blocking); return the number of jobs."""
        return self.registry.poll(self.clock() if now is None else now).jobs

    # --- the store on disk (warm start) -------------------------------------------------------

    def restore_snapshot(self) -> Restored | None:
        """Fill the (empty) store from its snapshot, if there is a usable one."""
        if self.snapshot_path is None:
            return None
        restored = self.store.read_snapshot(self.snapshot_path)
        if restored is not None:
            log.info(
                "window restored from %s: %d series, %d histograms, data since %s",
                self.snapshot_path,
                restored.series,
                restored.histograms,
                restored.held_since,
            )
        self.restored = restored
        if restored is not None:  # level_shift's fits, so its first cycle needs no new fits
            from gpuwarden.collector.detect.fit_state import fits_path, read_fits
            from gpuwarden.collector.detect.level_shift import new_fit_cache

            fits = read_fits(
                self.detection_view.cache(new_fit_cache), fits_path(self.snapshot_path)
            )
            if fits:
                log.info("level-shift fits restored: %d", fits)
        return restored

    def warm_from_tsdb(
        self, reader: TsdbReader, lookback_seconds: float, long_lookback_seconds: float = 0.0
    ) -> WarmStart:
        """Read back from the TSDB the span the snapshot does not cover (all of the lookback
        without one) into the store, and tell the history writer what the TSDB holds. Without
        a snapshot, the long window is also filled ``long_lookback_seconds`` back, from the
        TSDB's per-minute means."""
        now = self.clock()
        snapshot_at = None if self.restored is None else self.restored.written_at
        start = warm_span(self.store, now, lookback_seconds, snapshot_at)
        long_slots, long_error = 0, None
        if snapshot_at is None and long_lookback_seconds > 0:
            store = self.store
            long_start = now - min(long_lookback_seconds, store.long_seconds)
            long_slots, long_error = warm_long_from_tsdb(
                store, reader, start=long_start, end=now - store.recent_seconds
            )
        warm = warm_from_tsdb(self.store, reader, start=start, end=now)
        warm = dataclasses.replace(warm, long_slots=long_slots, error=warm.error or long_error)
        if self.history is not None:
            self.history.seed_newest(warm.newest_ms)
        self.warm = warm
        self.tsdb_reader = reader
        self._followed_until = now
        return warm

    def follow_tsdb(self, overlap_seconds: float = FOLLOW_OVERLAP_SECONDS) -> WarmStart | None:
        """A standby's catch-up (``collector.ha``): read from the TSDB what the leader stored
        since the last read, so that the standby's window is warm when it takes over.

        Agents send to the leader, so a standby's own window holds little; the leader writes
        everything it stores to the TSDB (``remote_write``), and the standby reads it back every
        so often. The last ``overlap_seconds`` are read again, because a point reaches the TSDB
        a few seconds after its time (the leader's flush, the TSDB's own indexing); a point read
        twice lands in the same slot. None without a reader (no ``read_url``: a standby then
        takes over with what it holds, and its rules say so on ``/readyz``)."""
        reader = self.tsdb_reader
        if reader is None:
            return None
        now = self.clock()
        last = self._followed_until
        start = now - self.store.recent_seconds if last is None else last - overlap_seconds
        start = max(start, now - self.store.recent_seconds + self.store.step_seconds)
        warm = warm_from_tsdb(self.store, reader, start=start, end=now)
        if warm.error is None:
            self._followed_until = now
        if self.history is not None:  # what the TSDB holds is never written again
            self.history.seed_newest(warm.newest_ms)
        return warm

    def save_snapshot(self, *, changes_only: bool = False) -> SnapshotStats | None:
        """Write the store's snapshot (blocking); None when snapshots are off. ``changes_only``
        (at shutdown): only what changed since the last full snapshot, in seconds, not minutes."""
        if self.snapshot_path is None:
            return None
        from gpuwarden.collector.detect.fit_state import fits_path, write_fits
        from gpuwarden.collector.detect.level_shift import new_fit_cache

        stats = self.store.write_snapshot(self.snapshot_path, changes_only=changes_only)
        write_fits(self.detection_view.cache(new_fit_cache), fits_path(self.snapshot_path))
        log.info(
            "window snapshot%s: %d series, %.1f MB in %.2f s",
            " (changes since the last full one)" if stats.changes_only else "",
            stats.series,
            stats.size_bytes / 1e6,
            stats.write_seconds,
        )
        return stats

    # --- inventory and accounting (the fleet) -------------------------------------------------

    def gpus(self) -> list[GpuRef]:
        """Every GPU (and MIG device) an agent described in ``gpuwarden.gpu.info``."""
        return self.fleet.gpus()

    def timelines(self, start: float, end: float) -> tuple[np.ndarray, list[GpuTimeline]]:
        """Each physical GPU's utilisation, energy and seen jobs on the store's slot grid."""
        return self.fleet.timelines(start, end)

    def usage(self, start: float, end: float) -> list[Usage]:
        """Accounting of every GPU over ``[start, end)`` against the known jobs."""
        return self.fleet.usage(start, end)

    def rows(self, period_start: float) -> list[AccountingRow]:
        """Accounting rows of one period, ready for storage."""
        return self.fleet.rows(period_start)

    def run_accounting(self, now: float | None = None) -> int:
        """Recompute the last complete periods (late and spooled data land in them too)."""
        return self.fleet.run_accounting(now)

    def fork_accounting(self, *, timeout_seconds: float = 600.0) -> None:
        """From now on compute each accounting run in a forked child (what the collector does).

        Accounting is Python over every GPU, its jobs and ten recomputed periods: 38-42 s a run
        at 4,000 GPUs measured on a busy machine (issue 16), all of it holding the GIL that
        ingest needs. The child gets the store and the registry as they were at the fork (their
        locks held while forking, as for detection: ``detect.fork``) and sends back the rows;
        storage reads and writes stay here.
        """
        from gpuwarden.collector.detect.fork import ForkedCycles

        forks = ForkedCycles(self.detection_view.exclusive, timeout_seconds=timeout_seconds)
        self._accounting_forks = forks
        self.fleet.offload = forks.run

    def stop_forks(self) -> None:
        """Kill a running accounting child, if any, and fork no other (shutdown): a run then
        raises ``detect.fork.CycleStoppedError``."""
        if self._accounting_forks is not None:
            self._accounting_forks.stop()

    # --- detection ----------------------------------------------------------------------------

    @property
    def detection_view(self) -> DetectionView:
        """The read view detectors get (one per service, so its fit caches persist)."""
        with self._lock:
            if self._view is None:
                self._view = DetectionView(self.fleet)
            return self._view
