"""The collector's core: ingest into the WindowStore, node facts, jobs, and periodic accounting.

Framework-free: the aiohttp app calls ``accept`` for every OTLP request and runs ``poll_jobs``
and ``run_accounting`` as background tasks; tests and the demo call them directly.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar, cast

import numpy as np

from gpuwarden.collector.accounting.gpu_time import (
    UNALLOCATED,
    AccountingConfig,
    GpuRef,
    GpuTimeline,
    Usage,
    account,
)
from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint, histogram_points
from gpuwarden.collector.ingest.scrape import ModelServerScraper
from gpuwarden.collector.ingest.workloads import announcement
from gpuwarden.collector.jobs.model import Job
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import AccountingRow, Event, EventKind, ModelDeployment
from gpuwarden.collector.store.types import IngestCounts
from gpuwarden.collector.store.window import WindowStore

log = logging.getLogger(__name__)
C = TypeVar("C")

#: Resource attributes of an agent that the collector keeps per node.
NODE_FACTS = (
    "host.id",
    "host.type",
    "cloud.region",
    "gpuwarden.cluster",
    "gpuwarden.price_tier",
    "gpuwarden.agent.version",
)


@dataclass
class IngestTotals:
    """Running totals of what the store did with incoming points."""

    accepted: int = 0
    rejected: int = 0
    new_series: int = 0
    counter_resets: int = 0
    last_point_unix: float = 0.0


@dataclass(frozen=True, slots=True)
class Accepted:
    """What became of one OTLP request: the receiver's answer and counters."""

    points: int
    """Gauge and sum points decoded (the length of ``number_points``' list)."""
    rejected: int
    """Points to report to the sender as rejected (OTLP partial success), histograms included."""
    stored_rejected: int
    """Of ``points``, those the store refused."""


@dataclass
class CollectorService:
    """Everything the collector holds, with the operations the app and CLI need."""

    store: WindowStore
    storage: Storage
    registry: JobRegistry
    accounting: AccountingConfig = field(default_factory=AccountingConfig)
    period_seconds: int = 60
    recompute_periods: int = 10
    clock: Callable[[], float] = time.time
    scraper: ModelServerScraper | None = None
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    totals: IngestTotals = field(default_factory=IngestTotals)
    #: new series one sender (token) may create per hour: a runaway label cannot flood the store
    max_new_series_per_source_hour: int = 100_000
    _new_series: dict[str, tuple[float, int]] = field(default_factory=dict)
    _announced: set[tuple[tuple[str, str | int | float | bool], ...]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _view: DetectionView | None = None

    # --- ingest -------------------------------------------------------------------------------

    def accept(self, points: Iterable[NumberPoint], source: str) -> int:
        """Store one request's points; remember node facts; return the rejected count."""
        points = list(points)
        seen: set[int] = set()
        resources = []
        for point in points:
            if id(point.resource) not in seen:
                seen.add(id(point.resource))
                resources.append(point.resource)
        self._remember_resources(resources, source)
        now = self.clock()
        window_start, created, budget = self._budget(source, now)
        counts = self.store.ingest(points, new_series_budget=budget)
        newest = max((p.time_unix_nano for p in points), default=None)
        self._count(source, window_start, created, counts, newest)
        return counts.rejected

    def accept_payload(self, payload: bytes, kind: str, source: str) -> Accepted:
        """Decode and store one OTLP/HTTP body: the receiver's fast path.

        The same series, counts, budget, node facts and announcements as ``number_points`` +
        ``accept`` + ``accept_histograms``, without a ``NumberPoint`` per point (and, for an
        agent's steady state, without parsing: ``WindowStore.ingest_payload``). Raises
        ``OtlpError`` (400) for a body that does not parse.
        """
        now = self.clock()
        window_start, created, budget = self._budget(source, now)
        result = self.store.ingest_payload(payload, kind, new_series_budget=budget)
        self._remember_resources(result.resources, source)
        self._count(source, window_start, created, result.counts, result.newest_ns)
        rejected = result.rejected + result.counts.rejected
        if result.histogram_request is not None:
            histograms = histogram_points(result.histogram_request)
            # counted as rejected by the decoder; the store says which it kept
            rejected -= len(histograms) - self.accept_histograms(histograms, source)
        return Accepted(
            points=result.points, rejected=rejected, stored_rejected=result.counts.rejected
        )

    def _remember_resources(
        self, resources: Iterable[Mapping[str, str | int | float | bool]], source: str
    ) -> None:
        """Announce each resource's workload and keep its node's facts."""
        for resource in resources:
            self._announce(resource)
            host = resource.get("host.name")
            if isinstance(host, str) and host:
                facts = {k: str(v) for k, v in resource.items() if k in NODE_FACTS}
                with self._lock:  # merge: other senders (scrapes) must not erase agent facts
                    self.nodes[host] = {**self.nodes.get(host, {}), **facts, "source": source}

    def _budget(self, source: str, now: float) -> tuple[float, int, int]:
        """The source's hourly window start, series created in it, and what it may still create."""
        with self._lock:
            window_start, created = self._new_series.get(source, (now, 0))
            if now - window_start >= 3600:
                window_start, created = now, 0
            return window_start, created, max(0, self.max_new_series_per_source_hour - created)

    def _count(
        self,
        source: str,
        window_start: float,
        created: int,
        counts: IngestCounts,
        newest_ns: int | None,
    ) -> None:
        with self._lock:
            self._new_series[source] = (window_start, created + counts.new_series)
            if counts.rejected_limit:
                log.warning(
                    "source %s: %d point(s) of new series refused (series limit)",
                    source,
                    counts.rejected_limit,
                )
            self.totals.accepted += counts.accepted
            self.totals.rejected += counts.rejected
            self.totals.new_series += counts.new_series
            self.totals.counter_resets += counts.counter_resets
            if newest_ns is not None:
                self.totals.last_point_unix = max(self.totals.last_point_unix, newest_ns / 1e9)

    def _announce(self, resource: Mapping[str, str | int | float | bool]) -> None:
        """Register the job and model a workload's resource declares, once per resource."""
        items = tuple(sorted(resource.items()))
        with self._lock:
            if items in self._announced:
                return
            if len(self._announced) >= 100_000:
                self._announced.clear()  # a cache, not a record
            self._announced.add(items)
        found = announcement(resource, self.clock())
        if found is None:
            return
        if found.job is not None:
            known = self.registry.get(found.job.key)
            job = found.job
            if known is not None:  # keep what the scheduler or API said; fill in the rest
                job = replace(
                    known,
                    model=known.model or job.model,
                    team=known.team or job.team,
                    name=known.name or job.name,
                )
            self.registry.put([job])
        if found.model is not None:
            current = self.storage.model(found.model.name)
            if current is None:
                self.storage.upsert_model(found.model)
            elif current.version != found.model.version:
                self.storage.upsert_model(replace(current, version=found.model.version))
                self.storage.record_event(
                    Event(
                        time=self.clock(),
                        kind=EventKind.DEPLOY,
                        subject=found.model.name,
                        attributes={"from": current.version, "to": found.model.version},
                    )
                )

    def accept_histograms(self, points: Sequence[HistogramPoint], source: str) -> int:
        """Store cumulative histogram points (bucket counts); return the rejected count."""
        rejected = 0
        for point in points:
            attrs = dict(point.attributes)
            host = point.resource.get("host.name")
            if host is not None and "host.name" not in attrs:
                attrs["host.name"] = host
            try:
                counts = self.store.ingest_histogram(
                    point.metric,
                    attrs,
                    time_unix_nano=point.time_unix_nano,
                    bounds=point.bounds,
                    bucket_counts=point.bucket_counts,
                    sum_value=point.sum_value,
                    unit=point.unit,
                )
            except ValueError as exc:  # e.g. bounds changed for an existing series
                log.warning("source %s: histogram %s refused: %s", source, point.metric, exc)
                rejected += 1
                continue
            rejected += counts.rejected
        return rejected

    # --- inventory ----------------------------------------------------------------------------

    def gpus(self) -> list[GpuRef]:
        """Every GPU (and MIG device) an agent described in ``gpuwarden.gpu.info``."""
        latest = self.store.latest("gpuwarden.gpu.info")
        refs = []
        for info in latest.series:
            attrs = info.attributes
            index = attrs.get("gpuwarden.gpu.index")
            parent = attrs.get("hw.parent")
            if isinstance(index, float):
                index = int(index)
            refs.append(
                GpuRef(
                    node=str(attrs.get("host.name", "")),
                    uuid=str(attrs.get("hw.id", "")),
                    index=index if isinstance(index, int) else None,
                    model=str(attrs.get("hw.model", "unknown")),
                    parent_uuid=str(parent) if parent is not None else None,
                )
            )
        return refs

    # --- accounting ---------------------------------------------------------------------------

    def timelines(self, start: float, end: float) -> tuple[np.ndarray, list[GpuTimeline]]:
        """Each physical GPU's utilisation, energy and seen jobs on the store's slot grid."""
        util = self.store.matrix("hw.gpu.utilization", start=start, end=end)
        energy = self.store.increase_matrix(
            "hw.energy", selector={"hw.type": "gpu"}, start=start, end=end
        )
        procs = self.store.matrix("gpuwarden.gpu.process.memory.usage", start=start, end=end)
        times = util.times
        n = len(times)
        by_gpu_util = {_gpu_key(s.attributes): util.values[i] for i, s in enumerate(util.series)}
        by_gpu_energy = {
            _gpu_key(s.attributes): energy.values[i] for i, s in enumerate(energy.series)
        }
        seen: dict[tuple[str, str], list[set[str]]] = {}
        for i, s in enumerate(procs.series):
            attrs = s.attributes
            scheduler = attrs.get("gpuwarden.job.scheduler")
            ident = attrs.get("gpuwarden.job.id") or attrs.get("k8s.pod.uid")
            if scheduler is None or ident is None:
                continue
            node, uuid = _gpu_key(attrs)
            job_key = self.registry.resolve(str(scheduler), str(ident), node)
            slots = seen.setdefault((node, uuid), [set() for _ in range(n)])
            for slot in np.flatnonzero(~np.isnan(procs.values[i])):
                slots[slot].add(job_key)
        timelines = []
        for ref in self.gpus():
            if ref.parent_uuid is not None:
                continue  # MIG devices are accounted through their parent GPU
            key = (ref.node, ref.uuid)
            tier = self.nodes.get(ref.node, {}).get("gpuwarden.price_tier", "")
            timelines.append(
                GpuTimeline(
                    node=ref.node,
                    uuid=ref.uuid,
                    index=ref.index,
                    model=ref.model,
                    price_tier=tier or self.accounting.default_price_tier,
                    utilization_ratio=by_gpu_util.get(key, np.full(n, np.nan)).astype(np.float64),
                    energy_joules=by_gpu_energy.get(key, np.full(n, np.nan)).astype(np.float64),
                    process_jobs=tuple(frozenset(s) for s in seen.get(key, [])),
                )
            )
        return times, timelines

    def usage(self, start: float, end: float) -> list[Usage]:
        """Accounting of every GPU over ``[start, end)`` against the known jobs."""
        times, gpus = self.timelines(start, end)
        return account(
            gpus, self.registry.known(), times, self.store.step_seconds, end, self.accounting
        )

    def rows(self, period_start: float) -> list[AccountingRow]:
        """Accounting rows of one period, ready for storage."""
        rows = []
        for use in self.usage(period_start, period_start + self.period_seconds):
            if use.gpu_seconds_allocated <= 0:
                continue
            job = None if use.job_key == UNALLOCATED else self.registry.get(use.job_key)
            rows.append(
                AccountingRow(
                    period_start=period_start,
                    period_seconds=self.period_seconds,
                    job_key=use.job_key or None,
                    team=job.team if job else None,
                    model=job.model if job else None,
                    node=use.node,
                    gpu_uuid=use.gpu_uuid,
                    price_tier=use.price_tier,
                    gpu_seconds_allocated=use.gpu_seconds_allocated,
                    gpu_seconds_busy=use.gpu_seconds_busy,
                    gpu_seconds_idle=use.gpu_seconds_idle,
                    gpu_seconds_unknown=use.gpu_seconds_unknown,
                    energy_joules=use.energy_joules,
                    cost_usd=use.cost_usd,
                    carbon_grams=use.carbon_grams,
                )
            )
        return rows

    def run_accounting(self, now: float | None = None) -> int:
        """Recompute the last complete periods (late and spooled data land in them too)."""
        current = self.clock() if now is None else now
        last_complete = math.floor(current / self.period_seconds) * self.period_seconds
        written = 0
        for k in range(self.recompute_periods, 0, -1):
            start = last_complete - k * self.period_seconds
            rows = self.rows(start)
            if rows:
                written += self.storage.write_rollups(rows)
        return written

    def scrape_models(self) -> int:
        """Scrape the configured model servers into the store (blocking); points stored."""
        if self.scraper is None:
            return 0
        result = self.scraper.scrape_once()
        rejected = result.accept_into(self, source="scrape")
        return len(result.points) + len(result.histograms) - rejected

    def poll_jobs(self, now: float | None = None) -> int:
        """Poll the job adapters (blocking); return the number of jobs."""
        return self.registry.poll(self.clock() if now is None else now).jobs

    # --- detection ----------------------------------------------------------------------------

    @property
    def detection_view(self) -> DetectionView:
        """The read view detectors get (one per service, so its fit caches persist)."""
        with self._lock:
            if self._view is None:
                self._view = DetectionView(self)
            return self._view


class DetectionView:
    """The service seen as a detector sees it (``detect.contract.DetectionContext``): read-only
    data, the clock and the detectors' caches; no ingest, no storage writes."""

    def __init__(self, service: CollectorService) -> None:
        self._service = service
        self._caches: dict[object, object] = {}
        self._lock = threading.Lock()

    @property
    def store(self) -> WindowStore:
        """The time series."""
        return self._service.store

    def now(self) -> float:
        """The collector's clock."""
        return self._service.clock()

    def gpus(self) -> list[GpuRef]:
        """Every GPU the agents described."""
        return self._service.gpus()

    def timelines(self, start: float, end: float) -> tuple[np.ndarray, list[GpuTimeline]]:
        """Each physical GPU's timeline over ``[start, end)``."""
        return self._service.timelines(start, end)

    def jobs(self) -> list[Job]:
        """Every job known."""
        return self._service.registry.known()

    def job(self, key: str) -> Job | None:
        """One job by key."""
        return self._service.registry.get(key)

    def resolve_job(self, scheduler: str, ident: str, node: str) -> str:
        """The job key for a process's scheduler attributes."""
        return self._service.registry.resolve(scheduler, ident, node)

    def deployments(self) -> list[ModelDeployment]:
        """The model deployments known."""
        return self._service.storage.models()

    def events(self, *, since: float, kinds: Collection[EventKind]) -> list[Event]:
        """Events of some kinds at or after ``since``."""
        return self._service.storage.events(since=since, kinds=kinds)

    def price(self, gpu_model: str, tier: str) -> float:
        """Dollars per GPU-hour."""
        return self._service.accounting.prices.price(gpu_model, tier)

    @property
    def default_price_tier(self) -> str:
        """The tier of GPUs and jobs that name none."""
        return self._service.accounting.default_price_tier

    def cache(self, kind: Callable[[], C]) -> C:
        """The detector state of this kind, made on first use."""
        with self._lock:
            if kind not in self._caches:
                self._caches[kind] = kind()
            return cast("C", self._caches[kind])


def _gpu_key(attrs: Mapping[str, object]) -> tuple[str, str]:
    return str(attrs.get("host.name", "")), str(attrs.get("hw.id", ""))
