"""Replay of recorded traces: our CSV format and the Alibaba GenTD26 duty-cycle trace."""

from __future__ import annotations

import csv
import gzip
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuwarden.agent.model import GpuSample
from gpuwarden.agent.sources.replay import REPLAY_FIELDS, ReplaySource, write_trace
from gpuwarden.agent.sources.simulated import PRESETS, SimulatedSource

GENTD26 = Path("/work/shared/data/alibaba_gentd26")
UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"

TRACE = f"""\
time_seconds,gpu_uuid,name,utilization_ratio,memory_used_bytes,power_watts
100,{UUID_A},NVIDIA H100 80GB HBM3,0.5,1073741824,300.25
100.0,{UUID_A},NVIDIA H100 80GB HBM3,0.5,1073741824,300.25
120,{UUID_A},,0.75,,
110,{UUID_A},,0.625,2147483648,410.5
110,{UUID_B},NVIDIA L4,0.0,0,16.125
"""


@dataclass
class FakeClock:
    now: float = 5000.0

    def __call__(self) -> float:
        return self.now


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def readings(sample: GpuSample) -> tuple[float | None, int | None, float | None]:
    return sample.utilization_ratio, sample.memory_used_bytes, sample.power_watts


def test_trace_format_replays_exact_values_with_step_interpolation(tmp_path: Path) -> None:
    clock = FakeClock()
    replay = ReplaySource(write(tmp_path, TRACE), clock=clock, loop=False)
    a, b = replay.sample()  # trace time 100: B has no row yet
    assert (a.uuid, a.index, a.name) == (UUID_A, 0, "NVIDIA H100 80GB HBM3")
    assert (b.uuid, b.index, b.name) == (UUID_B, 1, "NVIDIA L4")
    assert readings(a) == (0.5, 1073741824, 300.25)
    assert readings(b) == (None, None, None)
    clock.now += 9.999
    assert readings(replay.sample()[0]) == (0.5, 1073741824, 300.25)
    clock.now = 5010.0  # rows are sorted by time: 110 comes before 120 though written after it
    a, b = replay.sample()
    assert readings(a) == (0.625, 2147483648, 410.5)
    assert readings(b) == (0.0, 0, 16.125)
    clock.now = 5020.0
    assert readings(replay.sample()[0]) == (0.75, None, None)  # empty cells are None
    clock.now = 9999.0
    assert readings(replay.sample()[0]) == (0.75, None, None)  # no loop: the last row stays


def test_speed_scales_trace_time(tmp_path: Path) -> None:
    clock = FakeClock()
    replay = ReplaySource(write(tmp_path, TRACE), clock=clock, speed=4.0, loop=False)
    clock.now += 2.5  # 10 trace seconds
    assert replay.sample()[0].utilization_ratio == 0.625
    clock.now += 2.5
    assert replay.sample()[0].utilization_ratio == 0.75


def test_loop_restarts_one_interval_after_the_end(tmp_path: Path) -> None:
    clock = FakeClock()
    replay = ReplaySource(write(tmp_path, TRACE), clock=clock)  # rows 100, 110, 120: period 30
    expected = {0: 0.5, 10: 0.625, 20: 0.75, 29.9: 0.75, 30: 0.5, 45: 0.625, 95: 0.5}
    for offset, util in expected.items():
        clock.now = 5000.0 + offset
        assert replay.sample()[0].utilization_ratio == util, offset


def test_stale_rows_replay_as_none(tmp_path: Path) -> None:
    clock = FakeClock()
    replay = ReplaySource(write(tmp_path, TRACE), clock=clock, loop=False, stale_after_seconds=5)
    clock.now += 4
    assert replay.sample()[0].utilization_ratio == 0.5
    clock.now += 2
    assert replay.sample()[0].utilization_ratio is None


def test_round_trip_of_simulated_samples_is_exact(tmp_path: Path) -> None:
    sim_clock = FakeClock(1_767_225_600.0)
    sim = SimulatedSource(PRESETS["mixed"], clock=sim_clock, seed=3)
    rounds = []
    for seconds in (0.0, 1.5, 2.0, 299.0, 300.0, 301.0):
        sim_clock.now = 1_767_225_600.0 + seconds
        rounds.append((seconds, sim.sample()))
    path = tmp_path / "mixed.csv.gz"
    assert write_trace(path, rounds, list(REPLAY_FIELDS)) == 6 * 8

    clock = FakeClock()
    replay = ReplaySource(path, clock=clock, loop=False)
    for seconds, expected in rounds:
        clock.now = 5000.0 + seconds
        replayed = replay.sample()
        assert [g.uuid for g in replayed] == [g.uuid for g in expected]
        for got, want in zip(replayed, expected, strict=True):
            assert got.name == want.name
            for name in REPLAY_FIELDS:
                assert getattr(got, name) == getattr(want, name), (seconds, got.index, name)
    assert replayed[1].utilization_ratio is None  # GPU 1 was lost at 300 s


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", ":1: unknown header ''"),
        ("time,gpu_uuid,power_watts\n", ":1: unknown header 'time,gpu_uuid,power_watts'"),
        ("time_seconds,gpu_uuid,power\n", ":1: unknown column 'power'"),
        ("time_seconds,gpu_uuid,index\n", ":1: column 'index' belongs to backtest traces"),
        ("time_seconds,gpu_uuid,node,job\n", ":1: column 'node' belongs to backtest traces"),
        ("time_seconds,gpu_uuid,power_watts,power_watts\n", ":1: a column appears twice"),
    ],
)
def test_bad_header_is_reported_at_construction(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=re.escape(f"{path}{message}")):
        ReplaySource(path, clock=FakeClock())


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("1,GPU-x,abc,1", ":3: power_watts: 'abc' is not a number"),
        ("1,GPU-x,1.5,1.5", ":3: memory_used_bytes: '1.5' is not an integer"),
        ("1,GPU-x,1", ":3: 3 cells, the header has 4"),
        (",GPU-x,1,1", ":3: time_seconds: empty"),
        ("1,,1,1", ":3: empty gpu_uuid"),
    ],
)
def test_bad_value_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    text = f"time_seconds,gpu_uuid,power_watts,memory_used_bytes\n0,GPU-x,1,1\n{row}\n"
    path = write(tmp_path, text)
    replay = ReplaySource(path, clock=FakeClock())
    with pytest.raises(ValueError, match=re.escape(f"{path}{message}")):
        replay.sample()


def write_gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt") as file:
        file.write(text)
    return path


def test_alibaba_format_pods_become_gpus_with_memory(tmp_path: Path) -> None:
    ip1, ip2 = "0123456789abcdef0123456789abcdef", "not-a-hash"
    duty = write_gz(
        tmp_path / "pod_gpu_duty_cycle_anon.csv.gz",
        "value,timestamp_anon,container_ip\n"
        f"0.0,1000.0,{ip2}\n12.5,1000.0,{ip1}\n50.0,1057.0,{ip1}\n99.0,1114.0,{ip1}\n",
    )
    write_gz(
        tmp_path / "pod_gpu_memory_used_bytes_anon.csv.gz",
        f"timestamp_anon,value,container_ip\n1057.0,33879490560.0,{ip1}\n",
    )
    clock = FakeClock()
    replay = ReplaySource(duty, clock=clock, gpu_name="GenTD26 pod")
    first, second = replay.sample()  # ip1 has more points: first
    assert first.uuid == "GPU-01234567-89ab-cdef-0123-456789abcdef"
    assert UUID_SHAPE.fullmatch(second.uuid)
    assert (first.name, first.utilization_ratio, first.memory_used_bytes) == (
        "GenTD26 pod",
        0.125,
        None,
    )
    assert (second.utilization_ratio, second.memory_used_bytes) == (0.0, None)
    clock.now += 57
    assert readings(replay.sample()[0])[:2] == (0.5, 33879490560)
    assert len(ReplaySource(duty, clock=clock, max_gpus=1).sample()) == 1


UUID_SHAPE = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("1,x,ip", ":3: could not convert string to float: 'x'"),
        ("33879490560.0,1000.0,ip", ":3: duty cycle '33879490560.0' is not a percentage"),
        ("1,1000.0", ":3: 2 cells, expected 3"),
    ],
)
def test_alibaba_bad_value_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    text = f"value,timestamp_anon,container_ip\n1,1000.0,ip\n{row}\n"
    path = write_gz(tmp_path / "d.csv.gz", text)
    with pytest.raises(ValueError, match=re.escape(f"{path}{message}")):
        ReplaySource(path, clock=FakeClock()).sample()


def test_real_gentd26_duty_cycle_trace() -> None:
    duty_path = GENTD26 / "pod_gpu_duty_cycle_anon.csv.gz"
    if not duty_path.exists():
        pytest.skip(f"{GENTD26} is not here (the GenTD26 trace is shared, not in the repository)")
    with gzip.open(duty_path, "rt", newline="") as file:
        rows = list(csv.DictReader(file))
    with gzip.open(GENTD26 / "pod_gpu_memory_used_bytes_anon.csv.gz", "rt", newline="") as file:
        memory_rows = list(csv.DictReader(file))
    counts = Counter(row["container_ip"] for row in rows)
    first = min(float(row["timestamp_anon"]) for row in rows)
    order = sorted(counts, key=lambda ip: (-counts[ip], ip))

    clock = FakeClock()
    replay = ReplaySource(duty_path, clock=clock, loop=False)
    samples = replay.sample()
    assert len(samples) == len(counts) == 143
    assert [s.uuid.replace("-", "")[3:] for s in samples] == order

    ticks = 100  # 100 ticks of 57 s in
    clock.now += ticks * 57
    samples = replay.sample()
    at = str(first + ticks * 57)
    duty = {row["container_ip"]: float(row["value"]) for row in rows if row["timestamp_anon"] == at}
    memory = {
        r["container_ip"]: int(float(r["value"])) for r in memory_rows if r["timestamp_anon"] == at
    }
    for index in (0, 1, 50):
        ip = order[index]
        assert samples[index].utilization_ratio == duty[ip] / 100.0
        assert samples[index].memory_used_bytes == memory[ip]
    busiest = max(duty, key=lambda ip: duty[ip])
    assert samples[order.index(busiest)].utilization_ratio == duty[busiest] / 100.0
