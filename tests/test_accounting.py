"""Accounting on aligned arrays: exact shares, busy/idle/unknown, energy, cost by tier, carbon."""

from __future__ import annotations

import numpy as np
import pytest

from gpuwarden.collector.accounting.gpu_time import (
    UNALLOCATED,
    AccountingConfig,
    GpuTimeline,
    account,
    ownership,
    slot_overlap,
    totals,
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


def test_busy_idle_and_unknown_are_separate():
    util = np.full(360, 0.9)
    util[:60] = 0.0  # 10 idle minutes
    util[60:90] = np.nan  # 5 minutes with no data: unknown, never idle
    rows = account(
        [gpu(0, util)], [job("j1", "n1", (0,), T0, None)], TIMES, STEP, NOW, AccountingConfig()
    )
    (row,) = rows
    assert row.job_key == "j1"
    assert row.gpu_seconds_allocated == 3600
    assert row.gpu_seconds_idle == 600
    assert row.gpu_seconds_unknown == 300
    assert row.gpu_seconds_busy == 2700
    assert row.energy_joules == pytest.approx(700 * 3600)
    assert row.cost_usd == pytest.approx(4.00)
    assert row.carbon_grams == pytest.approx(0.7 * 400)


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
    assert by_key[UNALLOCATED].cost_usd == 0
    assert by_key["j"].energy_joules + by_key[UNALLOCATED].energy_joules == pytest.approx(
        700 * 3600
    )


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
    cost = {r.job_key: r.cost_usd for r in rows}
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
    assert team.cost_usd == pytest.approx(8.0)
