"""The read view detectors get: the fleet seen as ``detect.contract.DetectionContext``.

Stale data is unknown here, never fine or busy: the store is read through
:class:`~gpuwarden.collector.store.fresh.FreshReads` (a series silent for longer than the store's
``staleness_seconds`` reads as NaN), and a GPU whose utilisation series is stale has a timeline
of NaN with no jobs seen on it, so detectors' coverage checks make it UNKNOWN.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import replace
from typing import Any, TypeVar, cast

import numpy as np

from gpuwarden.collector.accounting.fleet import Fleet
from gpuwarden.collector.accounting.gpu_time import GpuRef, GpuTimeline
from gpuwarden.collector.budgets.config import Budgets
from gpuwarden.collector.budgets.spend import WindowSpend, WindowSpendCache
from gpuwarden.collector.jobs.kueue_workloads import KueueWorkload
from gpuwarden.collector.jobs.model import Job
from gpuwarden.collector.storage.records import Event, EventKind, ModelDeployment
from gpuwarden.collector.store.fresh import FreshReads
from gpuwarden.collector.store.window import WindowStore

C = TypeVar("C")


class DetectionView:
    """The collector as a detector sees it (``detect.contract.DetectionContext``): read-only
    data, the clock and the detectors' caches; no ingest, no storage writes."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._store = FreshReads(fleet.store, clock=self.now)
        self._caches: dict[object, object] = {}
        self._lock = threading.Lock()
        self._cache_source: Callable[[Callable[[], Any]], Any] | None = None
        self._spend = WindowSpendCache(fleet.storage)  # settled hours of spend, read once

    @property
    def store(self) -> WindowStore:
        """The time series, stale ones unknown (``FreshReads``)."""
        return self._store

    def now(self) -> float:
        """The collector's clock."""
        return self._fleet.clock()

    def gpus(self) -> list[GpuRef]:
        """Every GPU the agents described."""
        return self._fleet.gpus()

    def timelines(self, start: float, end: float) -> tuple[np.ndarray, list[GpuTimeline]]:
        """Each physical GPU's timeline over ``[start, end)``; a stale GPU's is all unknown."""
        times, timelines = self._fleet.timelines(start, end)
        return times, stale_unknown(self._fleet.store, timelines, min(end, self.now()))

    def jobs(self) -> list[Job]:
        """Every job known."""
        return self._fleet.registry.known()

    def kueue_workloads(self) -> list[KueueWorkload]:
        """The job registry's last good list of Kueue Workloads."""
        return self._fleet.registry.kueue_workloads()

    def job(self, key: str) -> Job | None:
        """One job by key."""
        return self._fleet.registry.get(key)

    def resolve_job(self, scheduler: str, ident: str, node: str) -> str:
        """The job key for a process's scheduler attributes."""
        return self._fleet.registry.resolve(scheduler, ident, node)

    def deployments(self) -> list[ModelDeployment]:
        """The model deployments known."""
        return self._fleet.storage.models()

    def events(self, *, since: float, kinds: Collection[EventKind]) -> list[Event]:
        """Events of some kinds at or after ``since``."""
        return self._fleet.storage.events(since=since, kinds=kinds)

    def budgets(self) -> Budgets:
        """The monthly budgets (the accounting config's)."""
        return self._fleet.accounting.budgets

    def spend(self, *, since: float, until: float) -> WindowSpend:
        """Spend per budget scope over ``[since, until)`` (this collector's accounting), cut at
        the end of the last period the accounting wrote (its ``seconds`` say how much is left)."""
        accounted = self._fleet.accounted_until
        end = until if accounted is None else min(until, accounted)
        if end <= since:
            return WindowSpend({}, accounted=False, seconds=0.0)
        scopes = sorted({b.scope for b in self.budgets().items})
        return self._spend.spend_in(scopes, since, end)

    def price(self, gpu_model: str, tier: str, cluster: str | None = None) -> float:
        """Price per GPU-hour (in the price table's currency)."""
        return self._fleet.accounting.prices.price(gpu_model, tier, cluster)

    @property
    def fairness_targets(self) -> Mapping[str, float]:
        """Each team's entitled share of the GPUs (``fairness.targets``)."""
        return self._fleet.accounting.fairness_targets

    @property
    def default_price_tier(self) -> str:
        """The tier of GPUs and jobs that name none."""
        return self._fleet.accounting.default_price_tier

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the store's and the job registry's locks (forking a detection child,
        ``detect.fork``: no other thread is half-way through them in the child's copy)."""
        with self._fleet.store.exclusive(), self._fleet.registry.exclusive():
            yield

    def cache(self, kind: Callable[[], C]) -> C:
        """The detector state of this kind, made on first use; once a forked engine shares
        them (:meth:`share_caches`), the state its cycles hold."""
        source = self._cache_source
        if source is not None:
            return cast("C", source(kind))
        return self.own_cache(kind)

    def own_cache(self, kind: Callable[[], C]) -> C:
        """The view's own state of this kind (what was read at start: level-shift's fits)."""
        with self._lock:
            if kind not in self._caches:
                self._caches[kind] = kind()
            return cast("C", self._caches[kind])

    def share_caches(self, source: Callable[[Callable[[], Any]], Any]) -> None:
        """Read caches through ``source`` from now on: a forked engine's context, which holds
        what its cycles' children send back (``detect.fork.ForkContext``), so that a snapshot
        writes the fits the cycles made, not the ones read at start."""
        self._cache_source = source


def stale_unknown(store: WindowStore, timelines: list[GpuTimeline], at: float) -> list[GpuTimeline]:
    """The timelines, those of GPUs silent at ``at`` (no utilisation sample for the store's
    ``staleness_seconds``) replaced by unknown: NaN utilisation and energy, no jobs seen."""
    latest = store.latest("hw.gpu.utilization", max_age_seconds=math.inf)
    seen: dict[tuple[str, str], float] = {}
    for info, t in zip(latest.series, latest.times.tolist(), strict=True):
        key = (str(info.attributes.get("host.name", "")), str(info.attributes.get("hw.id", "")))
        if math.isfinite(t):
            seen[key] = max(seen.get(key, t), t)
    cutoff = at - store.staleness_seconds
    out = []
    for timeline in timelines:
        if seen.get((timeline.node, timeline.uuid), -math.inf) >= cutoff:
            out.append(timeline)
            continue
        n = len(timeline.utilization_ratio)
        out.append(
            replace(
                timeline,
                utilization_ratio=np.full(n, np.nan),
                energy_joules=np.full(n, np.nan),
                process_jobs=tuple(frozenset() for _ in timeline.process_jobs),
            )
        )
    return out
