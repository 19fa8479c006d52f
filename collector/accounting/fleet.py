"""The fleet's GPUs and their accounting: the inventory the agents describe, each physical GPU's
timeline on the store's slot grid, and the periodic GPU-hour, energy, cost and carbon rows."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from gpuwarden.collector.accounting.gpu_time import (
    UNALLOCATED,
    AccountingConfig,
    GpuRef,
    GpuTimeline,
    Usage,
    account,
)
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import AccountingRow
from gpuwarden.collector.store.window import WindowStore


@dataclass
class Fleet:
    """The GPUs in the store and who held them: ``gpus``, ``timelines``, ``usage``, ``rows``."""

    store: WindowStore
    storage: Storage
    registry: JobRegistry
    accounting: AccountingConfig = field(default_factory=AccountingConfig)
    period_seconds: int = 60
    recompute_periods: int = 10
    clock: Callable[[], float] = time.time
    #: node facts by host name (price tier, cluster), as the intake keeps them
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)

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
                    cluster=self.cluster_of(str(attrs.get("host.name", ""))),
                )
            )
        return refs

    def cluster_of(self, node: str) -> str | None:
        """The node's cluster, as its agent names it (``gpuwarden.cluster``), if it does."""
        return self.nodes.get(node, {}).get("gpuwarden.cluster") or None

    def timelines(self, start: float, end: float) -> tuple[np.ndarray, list[GpuTimeline]]:
        """Each physical GPU's utilisation, energy and seen jobs on the store's slot grid."""
        util = self.store.matrix("hw.gpu.utilization", start=start, end=end)
        energy = self.store.increase_matrix(
            "hw.energy", selector={"hw.type": "gpu"}, start=start, end=end
        )
        times = util.times
        n = len(times)
        by_gpu_util = {_gpu_key(s.attributes): util.values[i] for i, s in enumerate(util.series)}
        by_gpu_energy = {
            _gpu_key(s.attributes): energy.values[i] for i, s in enumerate(energy.series)
        }
        seen = self._process_jobs(start, end, n)
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
                    cluster=ref.cluster,
                )
            )
        return times, timelines

    def _process_jobs(
        self, start: float, end: float, n: int
    ) -> dict[tuple[str, str], list[set[str]]]:
        """The job keys seen on each GPU in each of the ``n`` slots (from process memory)."""
        procs = self.store.matrix("gpuwarden.gpu.process.memory.usage", start=start, end=end)
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
        return seen

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


def _gpu_key(attrs: Mapping[str, object]) -> tuple[str, str]:
    return str(attrs.get("host.name", "")), str(attrs.get("hw.id", ""))
