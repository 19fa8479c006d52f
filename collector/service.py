"""The collector's composition: one facade over the parts that do the work.

``CollectorService`` wires an :class:`~gpuwarden.collector.ingest.intake.Intake` (OTLP ingest,
series budgets, node facts, announcements), a :class:`~gpuwarden.collector.accounting.fleet.Fleet`
(the GPU inventory and its accounting) and the model-server scraper around one store, storage and
job registry, and hands detectors a :class:`~gpuwarden.collector.views.DetectionView`.
Framework-free: the aiohttp app calls ``accept`` for every OTLP request and runs ``poll_jobs``
and ``run_accounting`` as background tasks; tests and the demo call them directly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Generic, Self, TypeVar, cast, overload

import numpy as np

from gpuwarden.collector.accounting.fleet import Fleet
from gpuwarden.collector.accounting.gpu_time import AccountingConfig, GpuRef, GpuTimeline, Usage
from gpuwarden.collector.ingest.intake import Accepted, IngestTotals, Intake
from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint
from gpuwarden.collector.ingest.otlp_limits import DEFAULT_LIMITS, IngestLimits
from gpuwarden.collector.ingest.rounds_seen import AgentRounds
from gpuwarden.collector.ingest.scrape import ModelServerScraper
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.remote_write.writer import HistoryWriter
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import AccountingRow, Event
from gpuwarden.collector.store.snapshot import Restored, SnapshotStats
from gpuwarden.collector.store.types import AttrValue
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.store.window_rows import RowBatch, RowsIngested
from gpuwarden.collector.views import DetectionView

__all__ = ["Accepted", "CollectorService", "DetectionView", "IngestTotals"]

T = TypeVar("T")
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
        #: writes the stored points to a TSDB by remote-write (``remote_write:``), if set
        self.history = history
        self._view: DetectionView | None = None
        self._lock = threading.Lock()

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
        return restored

    def save_snapshot(self) -> SnapshotStats | None:
        """Write the store's snapshot (blocking); None when snapshots are off."""
        if self.snapshot_path is None:
            return None
        stats = self.store.write_snapshot(self.snapshot_path)
        log.info(
            "window snapshot: %d series, %.1f MB in %.2f s",
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

    # --- detection ----------------------------------------------------------------------------

    @property
    def detection_view(self) -> DetectionView:
        """The read view detectors get (one per service, so its fit caches persist)."""
        with self._lock:
            if self._view is None:
                self._view = DetectionView(self.fleet)
            return self._view
