"""The fleet's GPUs and their accounting: the inventory the agents describe, each physical GPU's
timeline on the store's slot grid, and the periodic GPU-hour, energy, cost and carbon rows.

``timelines`` is the raw view detectors read (missing samples stay NaN). Accounting reads
``charged_timelines``: each GPU's span (first to last sample, over the store's whole recent
window, so a period is judged by samples outside it too), short sampling gaps covered, and
energy from the counter spread over the time it covers (:mod:`.presence`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from gpuwarden.collector.accounting.gpu_time import (
    UNALLOCATED,
    AccountingConfig,
    GpuRef,
    GpuTimeline,
    Usage,
    account,
)
from gpuwarden.collector.accounting.presence import (
    fill_short_gaps,
    hold_through_short_gaps,
    max_gap_seconds,
    span,
    spread_back,
)
from gpuwarden.collector.accounting.recompute import not_less_informed
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import AccountingRow
from gpuwarden.collector.store.types import LatestValues
from gpuwarden.collector.store.window import WindowStore

PROJECT_LABEL = "project"
"""The job label naming the project a job's cost is charged to (chargeback, budgets)."""

Batches = list[list[AccountingRow]]
"""Accounting rows of each recomputed period, oldest first."""
Offload = Callable[[Callable[[], Batches]], Batches]
"""Runs a computation somewhere (``Fleet.offload``) and returns its result."""

RANGE_READS = frozenset(
    {
        "hw.gpu.utilization",
        "hw.energy",
        "gpuwarden.gpu.info",
        "gpuwarden.gpu.process.memory.usage",
    }
)
"""The metrics the fleet reads over a time range (timelines, usage, presence): the store must
keep their recent ring (``WindowStore`` ``recent_metrics``; ``detect.catalog.recent_metrics``)."""


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
    #: the end of the newest period ``run_accounting`` wrote (None: it has not run here): spend
    #: windows ending now stop there (``views.DetectionView.spend``)
    accounted_until: float | None = None
    #: runs the computing part of ``run_accounting`` (reading the window, the jobs and the
    #: stored rows it was given; no storage, no state written) and returns its result: a forked
    #: child (``detect.fork.ForkedCycles.run``, what the collector wires), so that minutes of
    #: Python over every GPU never hold the GIL ingest needs; None: in the calling thread
    offload: (
        Callable[[Callable[[], list[list[AccountingRow]]]], list[list[AccountingRow]]] | None
    ) = None
    #: each GPU's newest sample time at the previous ``run_accounting``
    _newest_seen: dict[tuple[str, str], float] = field(default_factory=dict, repr=False)

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
                    region=self.nodes.get(str(attrs.get("host.name", "")), {}).get("cloud.region")
                    or None,
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
        step = float(self.store.step_seconds)
        first = round(times[0] / step) if n else math.ceil(start / step)
        by_gpu_util = {_gpu_key(s.attributes): util.values[i] for i, s in enumerate(util.series)}
        by_gpu_energy = {
            _gpu_key(s.attributes): energy.values[i] for i, s in enumerate(energy.series)
        }
        seen = self._process_jobs(first, n)
        timelines = []
        for ref in self.gpus():
            if ref.parent_uuid is not None:
                continue  # MIG devices are accounted through their parent GPU
            key = (ref.node, ref.uuid)
            timelines.append(
                self._timeline(
                    ref,
                    by_gpu_util.get(key, np.full(n, np.nan)).astype(np.float64),
                    by_gpu_energy.get(key, np.full(n, np.nan)).astype(np.float64),
                    seen.get(key, ()),
                )
            )
        return times, timelines

    def _timeline(
        self,
        ref: GpuRef,
        utilization: np.ndarray,
        energy: np.ndarray,
        jobs: Sequence[frozenset[str]],
        *,
        present: np.ndarray | None = None,
    ) -> GpuTimeline:
        """One GPU's timeline from its slot arrays, priced at its node's tier."""
        tier = self.nodes.get(ref.node, {}).get("gpuwarden.price_tier", "")
        return GpuTimeline(
            node=ref.node,
            uuid=ref.uuid,
            index=ref.index,
            model=ref.model,
            price_tier=tier or self.accounting.default_price_tier,
            utilization_ratio=utilization,
            energy_joules=energy,
            process_jobs=tuple(jobs),
            cluster=ref.cluster,
            region=ref.region,
            present=present,
        )

    def _process_jobs(
        self, first: int, n: int
    ) -> dict[tuple[str, str], tuple[frozenset[str], ...]]:
        """The job keys seen on each GPU in each of the ``n`` slots from slot ``first`` (from
        process memory).

        A job seen on a GPU before and after a short gap (a missed agent round, or a scrape
        interval longer than the store's step, as with a remote-writing Prometheus) holds the GPU
        through the gap, by the same rule as utilisation (:func:`.presence.max_gap_seconds`);
        the samples are read a gap's width beyond both ends so a gap across the window's edge is
        judged by its samples too. Vectorised: one presence mask per (GPU, job), then one
        frozenset object per distinct set of jobs (a GPU's slots mostly share one), so a 24 h
        window of a large fleet does not build a set per GPU and slot.
        """
        step = float(self.store.step_seconds)
        floor = self.accounting.max_sample_gap_seconds
        margin = math.ceil(floor / step)
        procs = self.store.matrix(
            "gpuwarden.gpu.process.memory.usage",
            start=(first - margin) * step,
            end=(first + n + margin) * step,
        )
        masks: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        resolved: dict[tuple[str, str, str], str] = {}
        present = ~np.isnan(procs.values)
        for i, s in enumerate(procs.series):
            attrs = s.attributes
            scheduler = attrs.get("gpuwarden.job.scheduler")
            ident = attrs.get("gpuwarden.job.id") or attrs.get("k8s.pod.uid")
            if scheduler is None or ident is None:
                continue
            node, uuid = _gpu_key(attrs)
            asked = (str(scheduler), str(ident), node)
            job_key = resolved.get(asked)
            if job_key is None:
                job_key = resolved[asked] = self.registry.resolve(*asked)
            jobs = masks.setdefault((node, uuid), {})
            jobs[job_key] = jobs[job_key] | present[i] if job_key in jobs else present[i]
        # the matrix's slots against the ``n`` asked for (it holds at most one ring length)
        column = np.rint(procs.times / step).astype(np.int64) - first
        inside = (column >= 0) & (column < n)
        for jobs in masks.values():
            for key, seen in jobs.items():
                filled = hold_through_short_gaps(seen, step, floor)
                out = np.zeros(n, dtype=bool)
                out[column[inside]] = filled[inside]
                jobs[key] = out
        return {key: slot_sets(jobs, n) for key, jobs in masks.items()}

    def charged_timelines(self, start: float, end: float) -> tuple[np.ndarray, list[GpuTimeline]]:
        """Each physical GPU over ``[start, end)`` as accounting charges it (see the module).

        The samples that decide a GPU's span and gaps are read over the store's recent window
        up to ``max(end, now)``, so a period is judged by its GPU's samples before and after it.
        """
        step = float(self.store.step_seconds)
        horizon = max(end, self.clock())
        lo, hi = math.ceil(start / step), math.ceil(end / step)
        util = self.store.matrix("hw.gpu.utilization", start=0.0, end=horizon)
        info = self.store.matrix("gpuwarden.gpu.info", start=0.0, end=horizon)
        power = self.store.matrix("hw.energy", selector={"hw.type": "gpu"}, start=0.0, end=horizon)
        n = max(0, hi - lo)
        times = np.arange(lo, lo + n, dtype=np.float64) * step
        first = round(util.times[0] / step) if len(util.times) else hi
        window = slice(max(lo - first, 0), max(hi - first, 0))  # the part the ring still holds
        pad = n - (window.stop - window.start)  # older than the recent window: not charged
        width = len(util.times)
        rows: dict[str, dict[tuple[str, str], np.ndarray]] = {}
        for name, matrix in (("util", util), ("info", info), ("power", power)):
            rows[name] = {
                _gpu_key(s.attributes): matrix.values[i] for i, s in enumerate(matrix.series)
            }
        none = np.full(width, np.nan)
        seen = self._process_jobs(lo, n)
        timelines = []
        for ref in self.gpus():
            if ref.parent_uuid is not None:
                continue  # MIG devices are accounted through their parent GPU
            key = (ref.node, ref.uuid)
            u = rows["util"].get(key, none).astype(np.float64)
            sampled = ~np.isnan(u) | ~np.isnan(rows["info"].get(key, none))
            present = span(sampled)
            gap = max_gap_seconds(sampled, step, self.accounting.max_sample_gap_seconds)
            u = np.where(present, fill_short_gaps(u, step, gap), np.nan)
            watts = spread_back(rows["power"].get(key, none).astype(np.float64))
            joules = np.where(present, watts * step, np.nan)
            timelines.append(
                self._timeline(
                    ref,
                    _padded(u[window], pad, np.nan),
                    _padded(joules[window], pad, np.nan),
                    seen.get(key, ()),
                    present=_padded(present[window], pad, False),
                )
            )
        return times, timelines

    def usage(self, start: float, end: float) -> list[Usage]:
        """Accounting of every GPU over ``[start, end)`` against the known jobs."""
        times, gpus = self.charged_timelines(start, end)
        return account(
            gpus, self.registry.known(), times, self.store.step_seconds, end, self.accounting
        )

    def rows(self, period_start: float) -> list[AccountingRow]:
        """Accounting rows of one period, ready for storage."""
        return self._rows(
            period_start, self.usage(period_start, period_start + self.period_seconds)
        )

    def _rows(self, period_start: float, usage: list[Usage]) -> list[AccountingRow]:
        rows = []
        currency = self.accounting.prices.currency
        for use in usage:
            if use.gpu_seconds_allocated <= 0 and use.gpu_seconds_unknown <= 0:
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
                    cost=use.cost,
                    currency=currency,
                    carbon_grams=use.carbon_grams,
                    project=(job.labels.get(PROJECT_LABEL) or None) if job else None,
                    gpu_model=use.model or None,
                )
            )
        return rows

    def _resumed_after(self) -> float | None:
        """The oldest previous last sample of a GPU that has sent newer ones since the last run.

        Remembers each GPU's newest sample time (``_newest_seen``) from run to run.
        """
        newest = _newest(self.store.latest("gpuwarden.gpu.info"))
        for key, seen in _newest(self.store.latest("hw.gpu.utilization")).items():
            newest[key] = max(seen, newest.get(key, seen))
        resumed = [
            before
            for key, seen in newest.items()
            if (before := self._newest_seen.get(key)) is not None and seen > before
        ]
        self._newest_seen = newest
        return min(resumed, default=None)

    def run_accounting(self, now: float | None = None) -> int:
        """Recompute the last complete periods (late and spooled data land in them too).

        The store is read once for all of them; each period is a slice of that read. A GPU's
        recomputed period replaces the stored one only when it knows at least as much of the
        GPU's time (:mod:`.recompute`): a restart's empty window never erases what was known.
        """
        current = self.clock() if now is None else now
        last_complete = math.floor(current / self.period_seconds) * self.period_seconds
        first = last_complete - self.recompute_periods * self.period_seconds
        resumed = self._resumed_after()
        if resumed is not None and resumed < first:
            # a GPU came back after a gap longer than the recompute window: its gap becomes
            # no data from the first period after its previous sample, not nobody's time
            first = math.floor(resumed / self.period_seconds) * self.period_seconds
        stored = self.storage.accounting_rows(since=first, until=last_complete)

        def compute() -> Batches:
            times, gpus = self.charged_timelines(first, last_complete)
            jobs = self.registry.known()
            batches = []
            for k in range(round((last_complete - first) / self.period_seconds)):
                start = first + k * self.period_seconds
                end = start + self.period_seconds
                part = (times >= start) & (times < end)
                sliced = [_sliced(gpu, part) for gpu in gpus]
                usage = account(
                    sliced, jobs, times[part], self.store.step_seconds, end, self.accounting
                )
                # never replace a GPU's period with one that knows less (a restart's empty window)
                batches.append(not_less_informed(self._rows(start, usage), stored))
            return batches

        batches = compute() if self.offload is None else self.offload(compute)
        written = sum(self.storage.write_rollups(rows) for rows in batches if rows)
        self.accounted_until = last_complete
        return written


def _newest(latest: LatestValues) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for info, seen in zip(latest.series, latest.times.tolist(), strict=True):
        key = _gpu_key(info.attributes)
        if math.isfinite(seen) and seen > out.get(key, -math.inf):
            out[key] = seen
    return out


def _sliced(gpu: GpuTimeline, part: np.ndarray) -> GpuTimeline:
    """The timeline over the slots of ``part``."""
    return replace(
        gpu,
        utilization_ratio=gpu.utilization_ratio[part],
        energy_joules=gpu.energy_joules[part],
        process_jobs=tuple(s for s, keep in zip(gpu.process_jobs, part, strict=False) if keep),
        present=None if gpu.present is None else gpu.present[part],
    )


def _padded(values: np.ndarray, pad: int, fill: float | bool) -> np.ndarray:
    """``values`` after ``pad`` slots of ``fill`` (the part of a range the ring no longer holds)."""
    return np.concatenate([np.full(pad, fill, dtype=values.dtype), values]) if pad else values


def _gpu_key(attrs: Mapping[str, object]) -> tuple[str, str]:
    return str(attrs.get("host.name", "")), str(attrs.get("hw.id", ""))


def slot_sets(masks: Mapping[str, np.ndarray], n: int) -> tuple[frozenset[str], ...]:
    """Per slot, the keys whose presence mask is set there, as one shared frozenset object
    per distinct set of keys (``n`` slots; masks are boolean arrays of length ``n``)."""
    keys = sorted(masks)
    if len(keys) == 1:  # the common case: one job's processes on the GPU
        (only,) = keys
        sets = [frozenset(), frozenset(keys)]
        return tuple(map(sets.__getitem__, masks[only].astype(np.int64).tolist()))
    if len(keys) > 62:  # more than a code holds: a set per slot (never seen on one GPU)
        return tuple(frozenset(k for k in keys if masks[k][slot]) for slot in range(n))
    codes = np.zeros(n, dtype=np.int64)
    for bit, key in enumerate(keys):
        codes |= masks[key].astype(np.int64) << bit
    distinct, inverse = np.unique(codes, return_inverse=True)
    sets = [
        frozenset(k for bit, k in enumerate(keys) if code >> bit & 1) for code in distinct.tolist()
    ]
    return tuple(map(sets.__getitem__, inverse.tolist()))
