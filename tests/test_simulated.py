"""The scenario-driven simulated GPU source."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from gpuwarden.agent.model import GpuEvent, GpuSample, GpuStatus, JobRef
from gpuwarden.agent.sources.scenario import (
    L4,
    Assignment,
    Fault,
    IdleAllocated,
    Inference,
    InputBound,
    Training,
    Workload,
    ecc,
    lost,
    xid,
)
from gpuwarden.agent.sources.simulated import (
    PRESETS,
    Scenario,
    SimulatedSource,
    scenario_from_mapping,
)

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a midnight UTC
UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class FakeClock:
    now: float = START

    def __call__(self) -> float:
        return self.now


def one_gpu(workload: Workload, *faults: Fault, gpu_count: int = 1) -> Scenario:
    return Scenario(
        node_name="node-a",
        gpu_count=gpu_count,
        assignments=(Assignment((0,), workload),),
        faults=faults,
    )


def source(scenario: Scenario, clock: FakeClock, seed: int = 0) -> SimulatedSource:
    return SimulatedSource(scenario, clock=clock, seed=seed)


def at(sim: SimulatedSource, clock: FakeClock, seconds: float) -> list[GpuSample]:
    clock.now = START + seconds
    return sim.sample()


def test_same_seed_and_time_give_the_same_samples_whatever_the_history() -> None:
    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = source(PRESETS["mixed"], clock_a, seed=7), source(PRESETS["mixed"], clock_b, seed=7)
    for seconds in (0.5, 3.25, 17.0, 60.75, 121.5):
        at(a, clock_a, seconds)  # a is sampled often, b only at the end
    assert at(a, clock_a, 130.4) == at(b, clock_b, 130.4)


def test_another_seed_gives_other_noise() -> None:
    clock = FakeClock(START + 5)
    a = source(PRESETS["training"], clock, seed=1).sample()
    b = source(PRESETS["training"], clock, seed=2).sample()
    assert [g.uuid for g in a] == [g.uuid for g in b]  # identity depends on the node only
    assert [g.utilization_ratio for g in a] != [g.utilization_ratio for g in b]


def test_idle_gpus_do_nothing_at_idle_power() -> None:
    clock = FakeClock()
    sim = source(PRESETS["idle"], clock)
    for seconds in range(0, 120, 7):
        for gpu in at(sim, clock, seconds):
            assert gpu.utilization_ratio == 0.0
            assert gpu.memory_used_bytes == 0
            assert gpu.processes == ()
            assert gpu.power_watts is not None
            assert 60.0 <= gpu.power_watts <= 70.0
            assert gpu.status is GpuStatus.OK
    assert sim.jobs() == {}


def test_training_is_busy_with_nvlink_traffic_and_one_process_per_gpu() -> None:
    clock = FakeClock()
    sim = source(PRESETS["training"], clock)
    first = at(sim, clock, 1)
    later = at(sim, clock, 61)
    for before, gpu in zip(first, later, strict=True):
        assert gpu.utilization_ratio is not None
        assert 0.92 <= gpu.utilization_ratio <= 0.98
        assert gpu.power_watts is not None
        assert gpu.power_watts > 550
        assert gpu.temperature_celsius is not None
        assert before.temperature_celsius is not None
        assert gpu.nvlink_tx_bytes is not None
        assert before.nvlink_tx_bytes is not None
        assert gpu.nvlink_tx_bytes > before.nvlink_tx_bytes
        assert gpu.memory_used_bytes == int(80 * 2**30 * 0.92)
        (process,) = gpu.processes
        assert process.gpu_memory_bytes == gpu.memory_used_bytes
        assert process.job is None  # attribution is the agent's job
    pids = [gpu.processes[0].pid for gpu in later]
    assert len(set(pids)) == 8
    assert sim.jobs() == dict.fromkeys(pids, JobRef(scheduler="slurm", job_id="1001"))


def test_inference_follows_the_daily_curve() -> None:
    workload = Inference(peak_hour_utc=14.0, noise_ratio=0.0)

    def util_at_hour(hour: float) -> tuple[float, float]:
        (gpu,) = source(one_gpu(workload), FakeClock(START + hour * 3600)).sample()
        assert gpu.utilization_ratio is not None
        assert gpu.power_watts is not None
        return gpu.utilization_ratio, gpu.power_watts

    peak, trough, evening = util_at_hour(14), util_at_hour(2), util_at_hour(20)
    assert peak[0] == pytest.approx(0.85)
    assert trough[0] == pytest.approx(0.10)
    assert evening[0] == pytest.approx(0.475)
    assert peak[1] > evening[1] > trough[1]  # power follows load


def test_inference_noise_stays_around_the_curve() -> None:
    clock = FakeClock(START + 14 * 3600)
    sim = source(one_gpu(Inference(peak_hour_utc=14.0, noise_ratio=0.05)), clock)
    utils = [at(sim, clock, 14 * 3600 + s)[0].utilization_ratio for s in range(60)]
    assert all(u is not None and 0.80 <= u <= 0.90 for u in utils)
    assert len(set(utils)) > 50  # the noise is there


def test_input_bound_duty_cycle_over_full_periods() -> None:
    clock = FakeClock()
    sim = source(one_gpu(InputBound(duty_ratio=0.3, period_seconds=40.0)), clock)
    utils = [at(sim, clock, s + 0.5)[0].utilization_ratio or 0.0 for s in range(120)]
    assert sum(1 for u in utils if u > 0) == 36  # 12 busy seconds per 40-second period
    assert sum(utils) / len(utils) == pytest.approx(0.3, abs=0.015)
    assert all(u == 0.0 or u >= 0.97 for u in utils)  # bursts, not a smeared average


def test_energy_is_the_exact_integral_of_constant_power() -> None:
    clock = FakeClock(START + 0.3)
    sim = source(one_gpu(Training(noise_ratio=0.0)), clock)
    (start,) = sim.sample()
    assert start.energy_joules == 0.0
    (first,) = at(sim, clock, 10.25)
    (second,) = at(sim, clock, 73.5)
    assert first.power_watts == second.power_watts
    assert first.power_watts is not None
    elapsed = (START + 10.25) - (START + 0.3)  # what the clock can represent near 1.7e9
    assert first.energy_joules == pytest.approx(first.power_watts * elapsed, rel=1e-12)
    assert second.energy_joules is not None
    assert first.energy_joules is not None
    delta = second.energy_joules - first.energy_joules
    assert delta == pytest.approx(first.power_watts * 63.25, rel=1e-12)


def test_energy_within_one_second_is_power_times_dt_even_with_noise() -> None:
    clock = FakeClock()
    sim = source(PRESETS["mixed"], clock)
    before = at(sim, clock, 42.1)
    after = at(sim, clock, 42.9)
    for a, b in zip(before, after, strict=True):
        assert a.power_watts == b.power_watts
        assert a.power_watts is not None
        assert a.energy_joules is not None
        assert b.energy_joules is not None
        dt = (START + 42.9) - (START + 42.1)
        assert b.energy_joules - a.energy_joules == pytest.approx(a.power_watts * dt, rel=1e-9)


def test_xid_increments_counts_degrades_and_fires_one_event() -> None:
    clock = FakeClock()
    sim = source(one_gpu(Training(), xid(0, 79, 120), xid(1, 13, 10), gpu_count=2), clock)
    gpu0, gpu1 = at(sim, clock, 119.9)
    assert (gpu0.xid_counts, gpu0.last_xid, gpu0.status) == ({}, None, GpuStatus.OK)
    assert (gpu1.xid_counts, gpu1.last_xid, gpu1.status) == ({13: 1}, 13, GpuStatus.OK)
    assert sim.events() == [GpuEvent(gpu1.uuid, 13, int(START + 10) * 10**9)]
    assert sim.events() == []
    gpu0, _ = at(sim, clock, 120.0)
    assert (gpu0.xid_counts, gpu0.last_xid, gpu0.status) == ({79: 1}, 79, GpuStatus.DEGRADED)
    assert sim.events() == [GpuEvent(gpu0.uuid, 79, int(START + 120) * 10**9)]
    at(sim, clock, 500.0)
    assert sim.events() == []
    assert at(sim, clock, 500.0)[0].xid_counts == {79: 1}


def test_lost_gpu_fails_while_the_others_keep_reporting() -> None:
    clock = FakeClock()
    scenario = Scenario(
        node_name="node-a",
        gpu_count=3,
        assignments=(Assignment((0, 1, 2), Training()),),
        faults=(lost(1, 300),),
    )
    sim = source(scenario, clock)
    assert [g.status for g in at(sim, clock, 299.5)] == [GpuStatus.OK] * 3
    gpu0, gpu1, gpu2 = at(sim, clock, 300.0)
    assert gpu1.status is GpuStatus.FAILED
    assert UUID.fullmatch(gpu1.uuid)
    assert gpu1.pci_bus_id == "00000000:28:00.0"
    expected = GpuSample(
        uuid=gpu1.uuid,
        index=1,
        name="NVIDIA H100 80GB HBM3",
        status=GpuStatus.FAILED,
        pci_bus_id="00000000:28:00.0",
    )
    assert gpu1 == expected  # identity kept, every reading None, no processes
    for gpu in (gpu0, gpu2):
        assert gpu.status is GpuStatus.OK
        assert gpu.utilization_ratio is not None
        assert gpu.energy_joules is not None


def test_ecc_errors_count_from_their_time() -> None:
    clock = FakeClock()
    sim = source(one_gpu(Training(), ecc(0, uncorrected=2, corrected=5, at_seconds=60)), clock)
    (before,) = at(sim, clock, 59)
    (after,) = at(sim, clock, 61)
    assert (before.ecc_uncorrected_errors, before.ecc_corrected_errors) == (0, 0)
    assert (after.ecc_uncorrected_errors, after.ecc_corrected_errors) == (2, 5)
    assert (after.remapped_rows_uncorrected, after.remapped_rows_pending) == (2, 1)


def test_idle_allocated_holds_memory_without_work() -> None:
    (gpu,) = source(one_gpu(IdleAllocated(memory_used_ratio=0.5)), FakeClock()).sample()
    assert gpu.utilization_ratio == 0.0
    assert gpu.memory_used_bytes == 40 * 2**30
    assert len(gpu.processes) == 1
    assert gpu.processes[0].sm_utilization_ratio == 0.0


def test_pcie_only_model_has_no_nvlink() -> None:
    scenario = Scenario(node_name="edge", gpu_count=1, model=L4)
    (gpu,) = source(scenario, FakeClock()).sample()
    assert (gpu.name, gpu.nvlink_tx_bytes, gpu.nvlink_rx_bytes) == ("NVIDIA L4", None, None)
    assert gpu.power_watts is not None
    assert gpu.power_watts < 20


def test_presets_build_and_report_every_gpu() -> None:
    assert set(PRESETS) == {"idle", "training", "inference", "input-bound", "faults", "mixed"}
    for name, scenario in PRESETS.items():
        samples = source(scenario, FakeClock()).sample()
        assert len(samples) == 8, name
        assert all(UUID.fullmatch(g.uuid) for g in samples)
        assert len({g.uuid for g in samples}) == 8
        assert len({g.pci_bus_id for g in samples}) == 8


def test_mixed_preset_has_every_workload_an_xid_79_and_a_lost_gpu() -> None:
    scenario = PRESETS["mixed"]
    kinds = {scenario.workload(gpu).kind.value for gpu in range(scenario.gpu_count)}
    assert kinds == {"idle", "training", "inference", "input_bound", "idle_allocated"}
    clock = FakeClock()
    sim = source(scenario, clock)
    assert at(sim, clock, 119)[1].status is GpuStatus.OK
    assert at(sim, clock, 120)[1].status is GpuStatus.DEGRADED
    assert [e.xid for e in sim.events()] == [79]
    statuses = [g.status for g in at(sim, clock, 300)]
    assert statuses == [GpuStatus.OK, GpuStatus.FAILED] + [GpuStatus.OK] * 6
    assert len(sim.jobs()) == 7  # every GPU but the idle one runs a job's process


def test_scenario_from_mapping_builds_what_it_says() -> None:
    scenario = scenario_from_mapping(
        {
            "node_name": "gpu-node-07",
            "gpu_count": 4,
            "model": "l4",
            "assignments": [
                {"gpus": [0, 1], "kind": "training", "job": {"scheduler": "slurm", "job_id": "42"}},
                {"gpus": 2, "kind": "input_bound", "duty_ratio": 0.25},
            ],
            "faults": [
                {"kind": "xid", "gpu": 1, "xid": 79, "at_seconds": 120},
                {"kind": "lost", "gpu": 1, "at_seconds": 300},
                {"kind": "ecc", "gpu": 2, "uncorrected": 1, "at_seconds": 60},
            ],
        }
    )
    assert scenario == Scenario(
        node_name="gpu-node-07",
        gpu_count=4,
        model=L4,
        assignments=(
            Assignment((0, 1), Training(job=JobRef(scheduler="slurm", job_id="42"))),
            Assignment((2,), InputBound(duty_ratio=0.25)),
        ),
        faults=(xid(1, 79, 120), lost(1, 300), ecc(2, uncorrected=1, at_seconds=60)),
    )


BASE: dict[str, object] = {"node_name": "n", "gpu_count": 2}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpu_count": 2}, "scenario: missing key 'node_name'"),
        ({**BASE, "gpus": 2}, "scenario: unknown key 'gpus'"),
        ({**BASE, "gpu_count": "2"}, "scenario.gpu_count: expected an integer"),
        ({**BASE, "gpu_count": 0}, "scenario.gpu_count: must be in 1..64"),
        ({**BASE, "model": "b200"}, "scenario.model: expected one of h100, l4"),
        ({**BASE, "model": {"name": "X"}}, "scenario.model: missing key 'memory_total_bytes'"),
        ({**BASE, "assignments": {}}, "scenario.assignments: expected a list"),
        (
            {**BASE, "assignments": [{"gpus": [0], "kind": "train"}]},
            "scenario.assignments[0].kind: expected one of idle, training",
        ),
        (
            {**BASE, "assignments": [{"gpus": [0], "kind": "training", "util": 1}]},
            "scenario.assignments[0]: unknown key 'util'",
        ),
        (
            {**BASE, "assignments": [{"gpus": ["0"], "kind": "idle"}]},
            "scenario.assignments[0].gpus[0]: expected an integer",
        ),
        (
            {**BASE, "assignments": [{"gpus": [0], "kind": "input_bound", "duty_ratio": 1.5}]},
            "scenario.assignments[0].duty_ratio: must be in 0..1",
        ),
        (
            {**BASE, "assignments": [{"gpus": [0], "kind": "idle", "job": {"id": "1"}}]},
            "scenario.assignments[0].job: unknown key 'id'",
        ),
        (
            {**BASE, "faults": [{"kind": "xid", "gpu": 0, "at_seconds": 1}]},
            "faults[0]: missing key 'xid'",
        ),
        (
            {**BASE, "faults": [{"kind": "lost", "gpu": 5, "at_seconds": 1}]},
            "scenario.faults: GPU index 5 not in 0..1",
        ),
        ({**BASE, "faults": [{"kind": "boom"}]}, "scenario.faults[0].kind: expected one of xid"),
    ],
)
def test_scenario_from_mapping_names_the_bad_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        scenario_from_mapping(data)


def test_reassign_switches_the_workload_and_keeps_energy_exact():
    from gpuwarden.agent.sources.scenario import Idle, Scenario, Training

    now = [1_700_000_000.0]
    scenario = Scenario(node_name="n", gpu_count=1, assignments=())
    source = SimulatedSource(scenario, clock=lambda: now[0])
    source.reassign(0, Training())
    now[0] += 10
    busy = source.sample()[0]
    assert busy.utilization_ratio is not None
    assert busy.utilization_ratio > 0.8
    source.reassign(0, Idle())
    now[0] += 10
    idle = source.sample()[0]
    assert idle.utilization_ratio == 0.0
    assert busy.energy_joules is not None
    assert idle.energy_joules is not None
    assert idle.power_watts is not None
    # the second half integrates the idle power only
    assert idle.energy_joules - busy.energy_joules == pytest.approx(idle.power_watts * 10, rel=0.1)
