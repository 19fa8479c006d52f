"""Per-job GPU accounting: GPU-hours held, busy and idle, no data, energy, cost and carbon.

Pure functions over aligned arrays, so they are exact and testable without a store. A GPU's
timeline is a fixed-step grid of slots; for every slot we know whether the GPU was there to be
charged (between its first and last sample, :mod:`.presence`), its utilisation (NaN when no
sample speaks for it), the energy it drew in joules, and which job held it. A job holds a GPU
for the part of a slot its allocation overlaps, so jobs that start or end mid-slot are charged
exactly.

- outside the GPU's span (before its node's first sample, after its last) nothing is charged.
- busy: utilisation at or above ``idle_threshold_ratio``; idle: below it. A slot inside the span
  with no sample is *no data*: neither busy nor idle, never billed to a job; it and its energy
  go to the GPU's no-job row (``gpu_seconds_unknown``), so time and energy still add up.
- GPU-hours of a job are its busy + idle time: what it is billed for.
- energy comes from the energy counter's increases spread over the time they cover
  (:func:`.presence.spread_back`), never power samples × time.
- carbon is kWh × the grid's intensity (g CO2e/kWh) of the node's cluster, else its region,
  else the fleet's (``grid_intensity_grams_per_kwh``, default 400 g/kWh: roughly the world
  average of electricity generation).
- cost is a job's GPU-hours × the price of that GPU model at the job's price tier (on-demand,
  spot, reserved) on the node's cluster or region (:mod:`.prices`), in the table's currency.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.accounting.prices import PriceTable
from gpuwarden.collector.budgets.config import Budgets
from gpuwarden.collector.jobs.model import Job, JobState

FloatArray = npt.NDArray[np.floating[Any]]
UNALLOCATED = ""


@dataclass(frozen=True, slots=True)
class AccountingConfig:
    """Thresholds and prices for accounting."""

    idle_threshold_ratio: float = 0.05
    grid_intensity_grams_per_kwh: float = 400.0
    prices: PriceTable = field(default_factory=PriceTable)
    default_price_tier: str = "on-demand"
    #: samples of a GPU further apart than this (or than three of its own sampling intervals,
    #: if longer) leave "no data" between them; closer ones cover the slots between them
    max_sample_gap_seconds: float = 30.0
    #: grid carbon intensity per cluster (a node's ``gpuwarden.cluster``) and per region (its
    #: ``cloud.region``), overriding ``grid_intensity_grams_per_kwh`` (the cluster's first)
    grid_intensity_clusters: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({})
    )
    grid_intensity_regions: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: the teams' and projects' monthly budgets (``budgets:``; none by default)
    budgets: Budgets = field(default_factory=Budgets)
    #: each team's entitled share of the GPUs (``fairness.targets``), for the fairness rules
    fairness_targets: Mapping[str, float] = field(default_factory=dict)


def grid_intensity(config: AccountingConfig, cluster: str | None, region: str | None) -> float:
    """Grams CO2e per kWh on a node of ``cluster`` in ``region``: the cluster's intensity, else
    the region's, else the fleet's (``grid_intensity_grams_per_kwh``)."""
    if cluster and cluster in config.grid_intensity_clusters:
        return config.grid_intensity_clusters[cluster]
    if region and region in config.grid_intensity_regions:
        return config.grid_intensity_regions[region]
    return config.grid_intensity_grams_per_kwh


@dataclass(frozen=True, slots=True)
class GpuRef:
    """One GPU the collector knows from the agents' ``gpuwarden.gpu.info``."""

    node: str
    uuid: str
    index: int | None
    model: str
    parent_uuid: str | None = None
    #: the node's cluster (its agent's ``gpuwarden.cluster``), for per-cluster prices
    cluster: str | None = None
    #: the node's region (its agent's ``cloud.region``), for per-region prices
    region: str | None = None


@dataclass(frozen=True, slots=True)
class GpuTimeline:
    """One GPU over the accounting window, on the window's slot grid."""

    node: str
    uuid: str
    index: int | None
    model: str
    price_tier: str
    utilization_ratio: FloatArray
    energy_joules: FloatArray
    #: slot → job key from per-process attribution (the agent saw a job's process on this GPU)
    process_jobs: Sequence[frozenset[str]] = ()
    #: the node's cluster (its agent's ``gpuwarden.cluster``), for per-cluster prices
    cluster: str | None = None
    #: slots between the GPU's first and last sample (None: every slot); only they are charged
    present: npt.NDArray[np.bool_] | None = None
    #: the node's region (its agent's ``cloud.region``), for per-region prices
    region: str | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Accounting of one job on one GPU over the window (job_key ``""`` = unallocated).

    ``gpu_seconds_allocated`` = busy + idle: the time billed. ``gpu_seconds_unknown`` (no data)
    is only ever on the no-job row, with the energy drawn meanwhile; ``energy_joules`` is None
    when the GPU reported no energy for the row's slots. ``cost`` is in the price table's
    currency (0 for the no-job row).
    """

    job_key: str
    node: str
    gpu_uuid: str
    model: str
    price_tier: str
    gpu_seconds_allocated: float
    gpu_seconds_busy: float
    gpu_seconds_idle: float
    gpu_seconds_unknown: float
    energy_joules: float | None
    cost: float
    carbon_grams: float | None


def slot_overlap(times: FloatArray, step_seconds: float, start: float, end: float) -> FloatArray:
    """Fraction of every slot ``[t, t + step)`` that ``[start, end)`` covers."""
    lo = np.maximum(times, start)
    hi = np.minimum(times + step_seconds, end)
    return np.asarray(np.clip(hi - lo, 0.0, step_seconds) / step_seconds, dtype=np.float64)


def _holds(job: Job, gpu: GpuTimeline) -> bool:
    for alloc in job.allocations:
        if alloc.node != gpu.node:
            continue
        if gpu.uuid in alloc.uuids:
            return True
        if gpu.index is not None and gpu.index in alloc.indices:
            return True
    return False


def _span(job: Job, now: float) -> tuple[float, float] | None:
    if job.start_time is None:
        return None
    if job.end_time is not None:
        return job.start_time, job.end_time
    if job.state in (JobState.RUNNING, JobState.SUSPENDED):
        return job.start_time, now
    return None


#: states in which the scheduler says a job is over: its processes no longer make it a holder
ENDED_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED}
)


def ended_at(jobs: Sequence[Job]) -> dict[str, float]:
    """Job key → end time, for the jobs the scheduler reports ended with a known end time."""
    return {
        job.key: job.end_time
        for job in jobs
        if job.state in ENDED_STATES and job.end_time is not None
    }


def _alive(end_time: float | None, slot_start: float, step_seconds: float) -> float:
    """Share of the slot ``[slot_start, slot_start + step)`` before ``end_time`` (1 if none)."""
    if end_time is None:
        return 1.0
    return float(np.clip((end_time - slot_start) / step_seconds, 0.0, 1.0))


def ownership(
    gpu: GpuTimeline,
    jobs: Sequence[Job],
    times: FloatArray,
    step_seconds: float,
    now: float,
    *,
    ended: Mapping[str, float] | None = None,
) -> dict[str, FloatArray]:
    """Job key → per-slot share of this GPU the job held (scheduler allocations first).

    Where no scheduler allocation covers a slot, a job whose process the agent saw on the GPU
    holds it for that slot (the agent's attribution fills gaps, e.g. jobs outside a scheduler),
    but never after the scheduler says the job ended (completed, failed, cancelled, preempted,
    with an end time): a process that outlives its job is an orphan, not the job's work, so the
    time is unallocated (not billed to the ended job; ``orphaned_memory`` reports it) and the
    ended job is nobody's holder there (issue 14: ``idle_gpu`` paged ended jobs as idle).
    """
    shares: dict[str, FloatArray] = {}
    covered = np.zeros(len(times))
    for job in jobs:
        span = _span(job, now)
        if span is None or not _holds(job, gpu):
            continue
        share = slot_overlap(times, step_seconds, *span)
        share = np.minimum(share, 1.0 - covered)  # never more than the whole GPU
        if share.any():
            shares[job.key] = shares.get(job.key, np.zeros(len(times))) + share
            covered += share
    if ended is None:
        ended = ended_at(jobs)
    process_jobs = gpu.process_jobs
    # only slots with free share can go to a process's job: skip the others without a loop
    for slot in np.flatnonzero(covered[: len(process_jobs)] < 1.0).tolist():
        keys = process_jobs[slot]
        free = 1.0 - covered[slot]
        if not keys or free <= 0:
            continue
        # a key's part of the free share, cut to the part of the slot before its job ended
        # (less what allocations already cover of the slot: its own, up to the end)
        alive = {k: _alive(ended.get(k), float(times[slot]), step_seconds) for k in keys}
        part = {k: max(0.0, min(free / len(keys), a - covered[slot])) for k, a in alive.items()}
        for key in sorted(k for k in keys if part[k] > 0):
            shares.setdefault(key, np.zeros(len(times)))[slot] += part[key]
        if all(a >= 1.0 for a in alive.values()):
            covered[slot] = 1.0
        else:
            covered[slot] += sum(part.values())
    unallocated = 1.0 - covered
    if unallocated.any():
        shares[UNALLOCATED] = unallocated
    return shares


def jobs_by_node(jobs: Sequence[Job]) -> dict[str, list[Job]]:
    """The jobs with an allocation on each node, in their order in ``jobs`` (a job on several
    nodes is under each): what :func:`ownership` needs of a GPU's allocations, without looking
    through every job of the fleet for every GPU."""
    out: dict[str, list[Job]] = {}
    for job in jobs:
        for node in dict.fromkeys(alloc.node for alloc in job.allocations):
            out.setdefault(node, []).append(job)
    return out


@dataclass(frozen=True, slots=True)
class Holders:
    """Who held each GPU of a window (:func:`holders`)."""

    owners: list[str]
    """Per GPU, the job that held it longest ("" for none)."""
    held: npt.NDArray[np.bool_]
    """GPU × slot where that job held all of the GPU."""
    unknown: npt.NDArray[np.bool_]
    """GPU × slot where nothing tells whether that job held the GPU: the GPU sent nothing (no
    utilisation sample, no process seen), no scheduler allocation covers the slot, and the slot
    lies within the job's known span (its start and end, when the registry knows them). Missing
    data is neither held nor free (issue 17: a sender's newest slot not delivered yet when a
    detection cycle runs, a failed scrape): a detector counts such slots against coverage only."""


def holders(
    gpus: Sequence[GpuTimeline],
    jobs: Sequence[Job],
    times: FloatArray,
    step_seconds: float,
    now: float,
) -> Holders:
    """Per GPU, its main holder over ``times``, where that job held it and where nobody can tell
    (see :class:`Holders`, :func:`ownership`)."""
    held = np.zeros((len(gpus), len(times)), dtype=bool)
    unknown = np.zeros((len(gpus), len(times)), dtype=bool)
    owners: list[str] = []
    on_node = jobs_by_node(jobs)
    ended = ended_at(jobs)
    by_key = {job.key: job for job in jobs}
    for i, gpu in enumerate(gpus):
        shares = ownership(gpu, on_node.get(gpu.node, ()), times, step_seconds, now, ended=ended)
        main = max(
            (k for k in shares if k != UNALLOCATED), key=lambda k: shares[k].sum(), default=""
        )
        owners.append(main)
        if not main:
            continue
        held[i] = shares[main] > 0.999
        free = shares.get(UNALLOCATED)
        if free is None:
            continue  # every slot is somebody's
        silent = _silent(gpu, free, times)
        if silent.any():
            unknown[i] = silent & _within(by_key.get(main), ended.get(main), times, step_seconds)
    return Holders(owners, held, unknown)


def _silent(gpu: GpuTimeline, free: FloatArray, times: FloatArray) -> npt.NDArray[np.bool_]:
    """Slots no allocation covers (``free``: the unallocated share) where the GPU sent no
    utilisation sample and no process was seen on it."""
    n = len(times)
    silent = (free > 0.999) & np.isnan(gpu.utilization_ratio[:n])
    seen = gpu.process_jobs
    for slot in np.flatnonzero(silent[: len(seen)]).tolist():  # few: a GPU's gaps
        if seen[slot]:
            silent[slot] = False
    return np.asarray(silent, dtype=bool)


def _within(
    job: Job | None, end_time: float | None, times: FloatArray, step_seconds: float
) -> npt.NDArray[np.bool_]:
    """Slots wholly within the job's known span (every slot when the registry knows neither
    its start nor its end, as for a pod known only from dcgm-exporter's labels)."""
    start = job.start_time if job is not None and job.start_time is not None else -np.inf
    end = np.inf if end_time is None else end_time
    return np.asarray(slot_overlap(times, step_seconds, start, end) > 0.999, dtype=bool)


def main_holders(
    gpus: Sequence[GpuTimeline],
    jobs: Sequence[Job],
    times: FloatArray,
    step_seconds: float,
    now: float,
) -> tuple[list[str], npt.NDArray[np.bool_]]:
    """Per GPU, the job that held it longest over ``times`` ("" for none), and GPU × slot where
    that job held all of it (see :func:`ownership`, :func:`holders`)."""
    found = holders(gpus, jobs, times, step_seconds, now)
    return found.owners, found.held


def _joules(energy: FloatArray, weight: FloatArray) -> float | None:
    """Energy of the weighted slots; None when none of them has a reading."""
    used = weight > 0
    if not used.any() or np.isnan(energy[used]).all():
        return None
    return float(np.nansum(energy[used] * weight[used]))


def account(
    gpus: Sequence[GpuTimeline],
    jobs: Sequence[Job],
    times: FloatArray,
    step_seconds: float,
    now: float,
    config: AccountingConfig,
) -> list[Usage]:
    """Usage per (job, GPU) over the window described by ``times`` (slot starts).

    A job's row holds the time it held the GPU with data (busy + idle) and that time's energy
    and cost; the no-job row holds the unallocated time with data and every no-data slot of
    the span (with their energy). Slots outside the GPU's span are in no row.
    """
    job_tier = {job.key: job.price_tier for job in jobs if job.price_tier}
    rows = []
    on_node, ended = jobs_by_node(jobs), ended_at(jobs)
    for gpu in gpus:
        util = gpu.utilization_ratio
        present = np.ones(len(times), dtype=bool) if gpu.present is None else gpu.present
        known = present & ~np.isnan(util)
        no_data = present & np.isnan(util)
        busy = known & (util >= config.idle_threshold_ratio)
        idle = known & ~busy
        node_jobs = on_node.get(gpu.node, ())
        shares = ownership(gpu, node_jobs, times, step_seconds, now, ended=ended)
        shares.setdefault(UNALLOCATED, np.zeros(len(times)))
        for key, share in shares.items():
            held = share * known
            seconds = held * step_seconds
            unknown = no_data if key == UNALLOCATED else np.zeros(len(times), dtype=bool)
            weight = held + unknown
            if not weight.any():
                continue
            tier = job_tier.get(key, gpu.price_tier) or config.default_price_tier
            allocated = float(seconds.sum())
            energy_j = _joules(gpu.energy_joules, weight)
            cost = (
                0.0
                if key == UNALLOCATED
                else allocated
                / 3600
                * config.prices.price(gpu.model, tier, gpu.cluster, gpu.region)
            )
            rows.append(
                Usage(
                    job_key=key,
                    node=gpu.node,
                    gpu_uuid=gpu.uuid,
                    model=gpu.model,
                    price_tier=tier,
                    gpu_seconds_allocated=allocated,
                    gpu_seconds_busy=float(seconds[busy].sum()),
                    gpu_seconds_idle=float(seconds[idle].sum()),
                    gpu_seconds_unknown=float(unknown.sum() * step_seconds),
                    energy_joules=energy_j,
                    cost=cost,
                    carbon_grams=(
                        None
                        if energy_j is None
                        else energy_j / 3.6e6 * grid_intensity(config, gpu.cluster, gpu.region)
                    ),
                )
            )
    return rows


@dataclass(frozen=True, slots=True)
class Totals:
    """Usage summed over a group (team, job, model, ...)."""

    group: str
    gpu_hours_allocated: float
    gpu_hours_busy: float
    gpu_hours_idle: float
    gpu_hours_unknown: float
    energy_kwh: float
    cost: float
    carbon_kg: float


def totals(rows: Sequence[Usage], group_of: Mapping[str, str] | None = None) -> list[Totals]:
    """Sum usage by job key, or by ``group_of[job_key]`` (team, model) when given."""
    acc: dict[str, list[float]] = {}
    for row in rows:
        group = row.job_key if group_of is None else group_of.get(row.job_key, "")
        sums = acc.setdefault(group, [0.0] * 7)
        sums[0] += row.gpu_seconds_allocated / 3600
        sums[1] += row.gpu_seconds_busy / 3600
        sums[2] += row.gpu_seconds_idle / 3600
        sums[3] += row.gpu_seconds_unknown / 3600
        sums[4] += (row.energy_joules or 0.0) / 3.6e6
        sums[5] += row.cost
        sums[6] += (row.carbon_grams or 0.0) / 1000
    return [Totals(group, *values) for group, values in sorted(acc.items())]
