"""Accounting on aligned arrays: exact shares, busy/idle/unknown, energy, cost by tier, carbon."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpuwarden.collector.accounting.gpu_time import (
    UNALLOCATED,
    AccountingConfig,
    GpuTimeline,
    account,
    holders,
    main_holders,
    ownership,
    slot_overlap,
    totals,
)
from gpuwarden.collector.accounting.presence import (
    fill_short_gaps,
    max_gap_seconds,
    span,
    spread_back,
)
from gpuwarden.collector.accounting.prices import PriceTable
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState

STEP = 10.0
T0 = 1_000_000.0
TIMES = T0 + STEP * np.arange(360)  # one hour
NOW = T0 + 3600


def job(
    key: str,
    node: str,
    indices: tuple[int, ...],
    start: float,
    end: float | None,
    tier: str | None = None,
) -> Job:
    return Job(
        key=key,
        scheduler="slurm",
        job_id=key,
        state=JobState.RUNNING if end is None else JobState.COMPLETED,
        allocations=(GpuAllocation(node, indices),),
        gpus=len(indices),
        start_time=start,
        end_time=end,
        price_tier=tier,
    )


def gpu(
    index: int,
    util: np.ndarray,
    energy: np.ndarray | None = None,
    node: str = "n1",
    tier: str = "on-demand",
    process_jobs: tuple[frozenset[str], ...] = (),
) -> GpuTimeline:
    return GpuTimeline(
        node=node,
        uuid=f"GPU-{node}-{index}",
        index=index,
        model="NVIDIA H100 80GB HBM3",
        price_tier=tier,
        utilization_ratio=util,
        energy_joules=np.full(len(TIMES), 700.0 * STEP) if energy is None else energy,
        process_jobs=process_jobs,
    )


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (T0, T0 + 10, [1.0, 0.0, 0.0]),
        (T0 + 5, T0 + 25, [0.5, 1.0, 0.5]),
        (T0 - 100, T0 + 100, [1.0, 1.0, 1.0]),
        (T0 + 30, T0 + 40, [0.0, 0.0, 0.0]),
        (T0 + 12, T0 + 13, [0.0, 0.1, 0.0]),
    ],
)
def test_slot_overlap(start, end, expected):
    assert slot_overlap(TIMES[:3], STEP, start, end) == pytest.approx(expected)


def test_busy_idle_and_no_data_are_separate_and_no_data_is_never_billed():
    util = np.full(360, 0.9)
    util[:60] = 0.0  # 10 idle minutes
    util[60:90] = np.nan  # 5 minutes with no data: neither idle nor billed to the job
    rows = account(
        [gpu(0, util)], [job("j1", "n1", (0,), T0, None)], TIMES, STEP, NOW, AccountingConfig()
    )
    by_key = {r.job_key: r for r in rows}
    row, no_job = by_key["j1"], by_key[UNALLOCATED]
    assert row.gpu_seconds_allocated == 3300  # busy + idle: what the job is billed for
    assert row.gpu_seconds_idle == 600
    assert row.gpu_seconds_unknown == 0
    assert row.gpu_seconds_busy == 2700
    assert row.energy_joules == pytest.approx(700 * 3300)
    assert row.cost == pytest.approx(4.00 * 3300 / 3600)
    assert row.carbon_grams == pytest.approx(0.7 * 3300 / 3600 * 400)
    # the no-data time and its energy are the no-job row's, never billed
    assert (no_job.gpu_seconds_allocated, no_job.gpu_seconds_unknown) == (0, 300)
    assert no_job.energy_joules == pytest.approx(700 * 300)
    assert no_job.cost == 0


def test_nothing_is_charged_outside_the_gpus_span():
    present = np.zeros(360, dtype=bool)
    present[100:200] = True  # the node sampled from slot 100 to slot 199 only
    timeline = replace(gpu(0, np.ones(360)), present=present)
    rows = account(
        [timeline], [job("j1", "n1", (0,), T0, None)], TIMES, STEP, NOW, AccountingConfig()
    )
    (row,) = rows
    assert (row.job_key, row.gpu_seconds_allocated, row.gpu_seconds_unknown) == ("j1", 1000, 0)
    assert row.energy_joules == pytest.approx(700 * 1000)


def test_a_gpu_without_energy_readings_has_no_energy_not_zero():
    rows = account(
        [gpu(0, np.ones(360), energy=np.full(360, np.nan))],
        [job("j1", "n1", (0,), T0, None)],
        TIMES,
        STEP,
        NOW,
        AccountingConfig(),
    )
    (row,) = rows
    assert (row.energy_joules, row.carbon_grams) == (None, None)


@pytest.mark.parametrize(
    ("sampled", "expected"),
    [
        ([0, 0, 1, 0, 1, 0], [0, 0, 1, 1, 1, 0]),
        ([1, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1]),
        ([0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]),
    ],
)
def test_span_runs_from_the_first_sample_to_the_last(sampled, expected):
    assert span(np.array(sampled, dtype=bool)).tolist() == [bool(x) for x in expected]


def test_short_gaps_take_the_next_sample_and_long_ones_stay_no_data():
    values = np.array([0.1, np.nan, 0.3, np.nan, np.nan, np.nan, np.nan, 0.8])
    filled = fill_short_gaps(values, 10.0, 30.0)
    assert filled[:3].tolist() == [0.1, 0.3, 0.3]  # 20 s apart: covered by the next sample
    assert np.isnan(filled[3:7]).all()  # 50 s apart: no data
    # an agent sampling every 30 s is not "no data" between its rounds
    sampled = np.zeros(60, dtype=bool)
    sampled[::3] = True
    assert max_gap_seconds(sampled, 10.0, 30.0) == 90.0


def test_a_gaps_energy_is_spread_over_the_gap_not_charged_to_one_slot():
    # counter rates as the store reads them: the point after a 4-slot gap covers all of it
    rates = np.array([np.nan, 300.0, np.nan, np.nan, np.nan, 500.0, 300.0])
    watts = spread_back(rates)
    assert watts.tolist() == [300.0, 300.0, 500.0, 500.0, 500.0, 500.0, 300.0]
    assert watts.max() <= 700  # never above the board's power: no slot holds a gap's energy


def test_mid_slot_start_and_end_are_charged_exactly():
    start, end = T0 + 125, T0 + 1925  # exactly 30 minutes, neither on a slot edge
    rows = account(
        [gpu(1, np.ones(360))],
        [job("j", "n1", (1,), start, end)],
        TIMES,
        STEP,
        NOW,
        AccountingConfig(),
    )
    by_key = {r.job_key: r for r in rows}
    assert by_key["j"].gpu_seconds_allocated == pytest.approx(1800)
    assert by_key[UNALLOCATED].gpu_seconds_allocated == pytest.approx(1800)
    assert by_key[UNALLOCATED].cost == 0
    energy = [by_key[k].energy_joules for k in ("j", UNALLOCATED)]
    assert sum(e for e in energy if e is not None) == pytest.approx(700 * 3600)


def test_price_tiers_from_job_then_node():
    prices = PriceTable()
    jobs = [job("spot", "n1", (0,), T0, None, tier="spot"), job("node-tier", "n1", (1,), T0, None)]
    rows = account(
        [gpu(0, np.ones(360)), gpu(1, np.ones(360), tier="reserved")],
        jobs,
        TIMES,
        STEP,
        NOW,
        AccountingConfig(prices=prices),
    )
    cost = {r.job_key: r.cost for r in rows}
    assert cost == pytest.approx({"spot": 1.60, "node-tier": 2.60})
    assert prices.price("Tesla T4", "spot") == 0.80  # default table


def test_jobs_only_hold_their_own_node_and_gpus():
    jobs = [job("a", "n1", (0,), T0, None), job("b", "n2", (0,), T0, None)]
    shares = ownership(gpu(0, np.ones(360)), jobs, TIMES, STEP, NOW)
    assert set(shares) == {"a"}
    assert shares["a"].sum() == 360


def test_process_attribution_fills_slots_without_an_allocation():
    seen = tuple(frozenset({"k8s:pod-1"}) if i < 180 else frozenset() for i in range(360))
    shares = ownership(gpu(0, np.ones(360), process_jobs=seen), [], TIMES, STEP, NOW)
    assert shares["k8s:pod-1"].sum() == 180
    assert shares[UNALLOCATED].sum() == 180


def test_a_process_outliving_its_ended_job_is_unallocated_not_the_jobs():
    """An orphan process (its job completed at 20 min, mid-slot) keeps the job's key in the
    agent's attribution; after the end the time is nobody's: not billed, no holder."""
    end = T0 + 1205
    seen = tuple(frozenset({"j"}) for _ in range(360))
    g = gpu(0, np.zeros(360), process_jobs=seen)
    jobs = [job("j", "n1", (0,), T0, end)]
    shares = ownership(g, jobs, TIMES, STEP, NOW)
    assert shares["j"].sum() * STEP == pytest.approx(1205)
    assert shares[UNALLOCATED].sum() * STEP == pytest.approx(3600 - 1205)
    rows = {r.job_key: r for r in account([g], jobs, TIMES, STEP, NOW, AccountingConfig())}
    assert rows["j"].gpu_seconds_allocated == pytest.approx(1205)
    late = replace(g, utilization_ratio=g.utilization_ratio[180:], process_jobs=seen[180:])
    owners, held = main_holders([late], jobs, TIMES[180:], STEP, NOW)  # the last 30 min
    assert owners == [""]
    assert not held.any()


def test_a_running_jobs_process_still_fills_its_slots():
    seen = tuple(frozenset({"j"}) for _ in range(360))
    running = [job("j", "n2", (0,), T0, None)]  # the scheduler lists another GPU
    shares = ownership(gpu(0, np.ones(360), process_jobs=seen), running, TIMES, STEP, NOW)
    assert shares["j"].sum() == 360


def test_a_gpu_is_never_shared_beyond_itself():
    jobs = [job("a", "n1", (0,), T0, None), job("b", "n1", (0,), T0, None)]
    shares = ownership(gpu(0, np.ones(360)), jobs, TIMES, STEP, NOW)
    assert sum(s.sum() for s in shares.values()) == 360


def test_totals_by_group():
    util = np.ones(360)
    rows = account(
        [gpu(0, util), gpu(1, util)],
        [job("a", "n1", (0,), T0, None), job("b", "n1", (1,), T0, None)],
        TIMES,
        STEP,
        NOW,
        AccountingConfig(),
    )
    (team,) = totals(rows, {"a": "ml", "b": "ml"})
    assert team.group == "ml"
    assert team.gpu_hours_allocated == pytest.approx(2.0)
    assert team.energy_kwh == pytest.approx(2 * 0.7)
    assert team.cost == pytest.approx(8.0)


def _pod_gpu(silent: slice, *, node: str = "n1") -> GpuTimeline:
    """GPU 0 held by the pod ``k8s:p`` (known from its processes only), idle, silent in
    ``silent``: no utilisation sample and no process seen."""
    util = np.zeros(360)
    util[silent] = np.nan
    seen = [frozenset({"k8s:p"}) for _ in range(360)]
    seen[silent] = [frozenset()] * len(seen[silent])
    return gpu(0, util, node=node, process_jobs=tuple(seen))


def test_a_silent_slot_is_neither_held_nor_free():
    """Issue 17: the newest slot not delivered yet, a failed scrape: nothing says whether the
    pod still held the GPU there, so it is unknown, not "not held"."""
    found = holders([_pod_gpu(slice(350, 360))], [], TIMES, STEP, NOW)
    assert found.owners == ["k8s:p"]
    assert found.held[0, :350].all()
    assert not found.held[0, 350:].any()
    assert found.unknown[0, 350:].all()
    assert not found.unknown[0, :350].any()
    assert main_holders([_pod_gpu(slice(350, 360))], [], TIMES, STEP, NOW)[1].tolist() == (
        found.held.tolist()
    )


def test_a_sample_without_the_pods_process_is_known_not_held():
    """The exporter still reports the GPU but no longer names the pod: the pod let it go."""
    g = _pod_gpu(slice(0, 0))
    seen = [*g.process_jobs[:300], *[frozenset()] * 60]
    found = holders([replace(g, process_jobs=tuple(seen))], [], TIMES, STEP, NOW)
    assert not found.held[0, 300:].any()
    assert not found.unknown[0].any()


def test_an_allocation_or_the_jobs_known_end_decides_a_silent_slot():
    """A scheduler allocation says who holds a GPU without samples; after a job's known end,
    silence is not its holding either."""
    allocated = [job("k8s:p", "n1", (0,), T0, None)]
    found = holders([_pod_gpu(slice(300, 360))], allocated, TIMES, STEP, NOW)
    assert found.held[0].all()  # the allocation holds it throughout
    assert not found.unknown[0].any()
    ended = [replace(job("k8s:p", "n2", (0,), T0, T0 + 3000), scheduler="kubernetes")]
    found = holders([_pod_gpu(slice(250, 360))], ended, TIMES, STEP, NOW)
    assert found.owners == ["k8s:p"]
    assert found.unknown[0, 250:300].all()  # silent before its end: unknown
    assert not found.unknown[0, 300:].any()  # after its end: not its slots
