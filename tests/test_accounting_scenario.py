"""Accounting against a scripted scenario with known truth, through the real store and service.

Two nodes × 8 GPUs, 2 h at 10 s. Three jobs (on-demand and spot), known idle spans, unallocated
GPUs, and one energy-counter reset (a driver reload on node b GPU 0 halfway). Truth is computed
from the script analytically; GPU-h, idle GPU-h, kWh and $ must be within 1 %.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.collector.accounting.gpu_time import UNALLOCATED, totals
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.store.types import AttrValue

T0 = 1_767_225_600.0  # aligned to the minute
STEP = 10
HOURS = 2
END = T0 + HOURS * 3600
BUSY_W, IDLE_W = 600.0, 80.0
MODEL = "NVIDIA H100 80GB HBM3"
PRICE = {"on-demand": 4.00, "spot": 1.60}


def uuid(node: str, gpu: int) -> str:
    return f"GPU-{node}-{gpu}"


# job key -> (tier, [(node, gpu)], start, end)
JOBS = {
    "slurm:c:1": ("on-demand", [("a", g) for g in range(4)], T0, END),
    "slurm:c:2": (
        "spot",
        [("a", g) for g in range(4, 8)] + [("b", g) for g in range(4)],
        T0 + 1800,
        T0 + 1800 + 5400,
    ),
    "slurm:c:3": ("on-demand", [("b", g) for g in range(4, 8)], T0, END),
}


def idle(node: str, gpu: int, t: float) -> bool:
    """Known idle spans: J1's GPU 2 for 30 min, J3's GPU 5 throughout, unallocated GPUs."""
    if (node, gpu) == ("a", 2):
        return T0 + 2400 <= t < T0 + 4200
    if (node, gpu) == ("b", 5):
        return True
    for _, gpus, start, end in JOBS.values():
        if (node, gpu) in gpus and start <= t < end:
            return False
    return True


def power(node: str, gpu: int, t: float) -> float:
    return IDLE_W if idle(node, gpu, t) else BUSY_W


def scripted_points() -> list[list[NumberPoint]]:
    rounds = []
    energy = {(n, g): 0.0 for n in "ab" for g in range(8)}
    for k in range(HOURS * 3600 // STEP):
        t = T0 + k * STEP
        batch = []
        for node in "ab":
            resource: dict[str, AttrValue] = {
                "host.name": node,
                "gpuwarden.price_tier": "on-demand",
            }
            for gpu in range(8):
                if k:  # the counter integrates the power of the previous interval
                    energy[node, gpu] += power(node, gpu, t - STEP) * STEP
                if (node, gpu) == ("b", 0) and k == 360:
                    energy[node, gpu] = power(node, gpu, t - STEP) * STEP  # driver reload
                attrs: dict[str, AttrValue] = {"hw.id": uuid(node, gpu)}
                util = 0.0 if idle(node, gpu, t) else 0.93
                ns = int(t * 1e9)
                batch += [
                    NumberPoint(
                        resource, "hw.gpu.utilization", "1", "gauge", False, attrs, ns, util
                    ),
                    NumberPoint(
                        resource,
                        "hw.energy",
                        "J",
                        "sum",
                        True,
                        {**attrs, "hw.type": "gpu"},
                        ns,
                        energy[node, gpu],
                    ),
                    NumberPoint(
                        resource,
                        "gpuwarden.gpu.info",
                        "1",
                        "gauge",
                        False,
                        {**attrs, "hw.model": MODEL, "gpuwarden.gpu.index": gpu},
                        ns,
                        1.0,
                    ),
                ]
        rounds.append(batch)
    return rounds


def truth() -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for key, (tier, gpus, start, end) in JOBS.items():
        hours = len(gpus) * (end - start) / 3600
        idle_s = energy_j = 0.0
        for node, gpu in gpus:
            for t in range(int(start), int(end), STEP):
                idle_s += STEP if idle(node, gpu, t) else 0
                energy_j += power(node, gpu, t) * STEP
        out[key] = {
            "gpu_h": hours,
            "idle_h": idle_s / 3600,
            "kwh": energy_j / 3.6e6,
            "usd": hours * PRICE[tier],
        }
    return out


@pytest.fixture
def service(tmp_path: Path) -> CollectorService:
    config = CollectorConfig(database=tmp_path / "c.db", recent_hours=6)
    svc = build_service(config, clock=lambda: END + STEP)
    jobs = []
    for key, (tier, gpus, start, end) in JOBS.items():
        nodes: dict[str, list[int]] = {}
        for node, gpu in gpus:
            nodes.setdefault(node, []).append(gpu)
        jobs.append(
            Job(
                key=key,
                scheduler="slurm",
                job_id=key.rsplit(":", 1)[1],
                state=JobState.COMPLETED,
                team="ml" if key != "slurm:c:3" else "research",
                gpus=len(gpus),
                start_time=start,
                end_time=end,
                price_tier=tier,
                allocations=tuple(GpuAllocation(n, tuple(g)) for n, g in nodes.items()),
            )
        )
    svc.registry.put(jobs)
    for batch in scripted_points():
        assert svc.accept(batch, "agents") == 0
    return svc


def test_accounting_matches_the_scripted_truth_within_one_percent(service):
    usage = service.usage(T0, END)
    got = {t.group: t for t in totals(usage)}
    for key, want in truth().items():
        row = got[key]
        assert row.gpu_hours_allocated == pytest.approx(want["gpu_h"], rel=0.01), key
        assert row.gpu_hours_idle == pytest.approx(want["idle_h"], rel=0.01, abs=1e-6), key
        assert row.energy_kwh == pytest.approx(want["kwh"], rel=0.01), key
        assert row.cost == pytest.approx(want["usd"], rel=0.01), key
    # the unallocated remainder: 16 GPUs × 2 h minus what the jobs held, all idle, no cost
    held = sum(w["gpu_h"] for w in truth().values())
    assert got[UNALLOCATED].gpu_hours_allocated == pytest.approx(16 * HOURS - held, rel=0.01)
    assert got[UNALLOCATED].cost == 0
    assert got[UNALLOCATED].gpu_hours_idle == pytest.approx(16 * HOURS - held, rel=0.01)


def test_periodic_rollups_add_up_to_the_same_truth(service):
    service.recompute_periods = HOURS * 60
    assert service.run_accounting(now=END) > 0
    by_job = {
        t.group["job_key"]: t for t in service.storage.rollups(since=T0, until=END, by=("job_key",))
    }
    for key, want in truth().items():
        total = by_job[key]
        assert total.gpu_seconds_allocated / 3600 == pytest.approx(want["gpu_h"], rel=0.01)
        assert total.gpu_seconds_idle / 3600 == pytest.approx(want["idle_h"], rel=0.01, abs=1e-6)
        assert (total.energy_joules or 0) / 3.6e6 == pytest.approx(want["kwh"], rel=0.01)
        assert total.cost == pytest.approx(want["usd"], rel=0.01)
    by_team = {
        t.group["team"]: t for t in service.storage.rollups(since=T0, until=END, by=("team",))
    }
    assert by_team["research"].cost == pytest.approx(truth()["slurm:c:3"]["usd"], rel=0.01)
    # rewriting the same periods is idempotent
    service.run_accounting(now=END)
    again = {
        t.group["job_key"]: t for t in service.storage.rollups(since=T0, until=END, by=("job_key",))
    }
    assert again == by_job
