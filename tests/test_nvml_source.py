"""NvmlSource through the real pynvml against the fake libnvidia-ml.so.1 (tests/fakenvml)."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuwarden.agent.model import GpuEvent, GpuEventKind, GpuSample, GpuStatus, ProcessSample
from gpuwarden.agent.sources.nvml import NvmlSource, NvmlUnavailableError
from tests.fakenvml import control as fk
from tests.fakenvml.control import FakeMigDevice, FakeNvml, FakeProcess

LOGGER = "gpuwarden.agent.sources.nvml"
NOW_NS = 1_750_000_000_123_456_789
GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture
def source(fake_nvml: FakeNvml) -> Iterator[NvmlSource]:
    with NvmlSource(time_ns=lambda: NOW_NS) as nvml:
        yield nvml


def records(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= level]


def by_index(samples: list[GpuSample]) -> dict[int, GpuSample]:
    """GPU samples (not MIG devices) by NVML index."""
    return {s.index: s for s in samples if s.parent_uuid is None}


def set_stable(fake: FakeNvml) -> None:
    """No processes: every round then reports identical values."""
    for gpu in range(8):
        fake.set_processes(gpu, [])


# --- every field, every GPU --------------------------------------------------------------------


def program(fake: FakeNvml, gpu: int) -> None:
    """Distinct raw NVML values for one GPU, in NVML's units."""
    fake.set_many(
        gpu,
        {
            "util_gpu": 10 + gpu,
            "util_mem": 20 + gpu,
            "mem_total": 80 * GIB,
            "mem_used": (gpu + 1) * GIB,
            "mem_reserved": (gpu + 1) * MIB,
            "power_mw": 250_000 + 1_250 * gpu,
            "energy_mj": 5_000_000_000 + 7 * gpu,
            "temp_c": 30 + gpu,
            "clock_sm_mhz": 1_410 + gpu,
            "clock_mem_mhz": 1_593,
            "clock_event_reasons": 0x4 if gpu % 2 else 0x1,
            "pcie_tx_kbps": 100 + gpu,
            "pcie_rx_kbps": 200 + gpu,
            "pcie_gen": 4 + gpu % 2,
            "pcie_width": 16 if gpu < 4 else 8,
            "ecc_cor_volatile": gpu,
            "ecc_unc_volatile": gpu // 2,
        },
    )
    fake.set_str(gpu, "name", f"NVIDIA A100-SXM4-80GB #{gpu}")
    fake.set_str(gpu, "uuid", f"GPU-0000000{gpu}-aaaa-bbbb-cccc-dddddddddddd")
    fake.set_str(gpu, "pci_bus_id", f"00000000:{0x10 + gpu:02X}:00.0")
    fake.set_field(gpu, fk.FI_POWER_INSTANT, 251_000 + 1_000 * gpu, fk.VALUE_TYPE_UNSIGNED_INT)
    if gpu == 5:  # NVML may answer any value type; honour it
        fake.set_field(gpu, fk.FI_MEMORY_TEMP, 61.5)
    else:
        fake.set_field(gpu, fk.FI_MEMORY_TEMP, 60 + gpu, fk.VALUE_TYPE_UNSIGNED_INT)
    fake.set_field(gpu, fk.FI_NVLINK_THROUGHPUT_DATA_TX, 1_000_000 * (gpu + 1))
    fake.set_field(gpu, fk.FI_NVLINK_THROUGHPUT_DATA_RX, 2_000_000 * (gpu + 1))
    fake.set_field(gpu, fk.FI_REMAPPED_COR, gpu, fk.VALUE_TYPE_UNSIGNED_INT)
    fake.set_field(gpu, fk.FI_REMAPPED_UNC, 0, fk.VALUE_TYPE_UNSIGNED_INT)
    fake.set_field(gpu, fk.FI_REMAPPED_PENDING, 0, fk.VALUE_TYPE_UNSIGNED_INT)
    fake.set_field(gpu, fk.FI_REMAPPED_FAILURE, 0, fk.VALUE_TYPE_UNSIGNED_INT)
    fake.set_processes(gpu, [FakeProcess(1000 + gpu, (gpu + 1) * 256 * MIB, 10 * gpu, 5 * gpu)])


def expected(gpu: int) -> GpuSample:
    """``program(gpu)`` converted to OpenTelemetry units by hand."""
    return GpuSample(
        uuid=f"GPU-0000000{gpu}-aaaa-bbbb-cccc-dddddddddddd",
        index=gpu,
        name=f"NVIDIA A100-SXM4-80GB #{gpu}",
        status=GpuStatus.OK,
        pci_bus_id=f"00000000:{0x10 + gpu:02X}:00.0",
        utilization_ratio=(10 + gpu) / 100,
        memory_utilization_ratio=(20 + gpu) / 100,
        memory_used_bytes=(gpu + 1) * GIB,
        memory_total_bytes=80 * GIB,
        memory_reserved_bytes=(gpu + 1) * MIB,
        power_watts=(250_000 + 1_250 * gpu) / 1000,
        power_instant_watts=(251_000 + 1_000 * gpu) / 1000,
        energy_joules=(5_000_000_000 + 7 * gpu) / 1000,
        temperature_celsius=30.0 + gpu,
        memory_temperature_celsius=61.5 if gpu == 5 else 60.0 + gpu,
        sm_clock_hertz=(1_410 + gpu) * 1e6,
        memory_clock_hertz=1_593e6,
        clock_event_reasons=0x4 if gpu % 2 else 0x1,
        pcie_tx_bytes_per_second=(100 + gpu) * 1024.0,
        pcie_rx_bytes_per_second=(200 + gpu) * 1024.0,
        pcie_link_generation=4 + gpu % 2,
        pcie_link_width=16 if gpu < 4 else 8,
        nvlink_tx_bytes=1_000_000 * (gpu + 1) * 1024,
        nvlink_rx_bytes=2_000_000 * (gpu + 1) * 1024,
        ecc_corrected_errors=gpu,
        ecc_uncorrected_errors=gpu // 2,
        remapped_rows_corrected=gpu,
        remapped_rows_uncorrected=0,
        remapped_rows_pending=0,
        remapped_rows_failure=0,
        xid_counts={},
        last_xid=None,
        processes=(ProcessSample(1000 + gpu, (gpu + 1) * 256 * MIB, gpu / 10, gpu / 20),),
    )


def test_every_gpu_reports_every_field_converted_exactly(fake_nvml: FakeNvml) -> None:
    for gpu in range(8):
        program(fake_nvml, gpu)
    with NvmlSource() as nvml:
        samples = nvml.sample()
    assert samples == [expected(gpu) for gpu in range(8)]


@pytest.mark.parametrize(
    ("attribute", "value"),
    [
        ("utilization_ratio", 0.13),
        ("memory_used_bytes", 4 * GIB),
        ("memory_reserved_bytes", 4 * MIB),
        ("power_watts", 253.75),
        ("power_instant_watts", 254.0),
        ("energy_joules", 5_000_000.021),
        ("sm_clock_hertz", 1_413_000_000.0),
        ("pcie_tx_bytes_per_second", 105_472.0),
        ("nvlink_tx_bytes", 4_096_000_000),
        ("nvlink_rx_bytes", 8_192_000_000),
        ("clock_event_reasons", 0x4),
        ("ecc_uncorrected_errors", 1),
    ],
)
def test_gpu3_literal_values(fake_nvml: FakeNvml, attribute: str, value: float) -> None:
    for gpu in range(8):
        program(fake_nvml, gpu)
    with NvmlSource() as nvml:
        sample = nvml.sample()[3]
    assert getattr(sample, attribute) == value


@pytest.mark.parametrize(
    "code", [fk.ERROR_NOT_SUPPORTED, fk.ERROR_FUNCTION_NOT_FOUND, 25], ids=["3", "13", "25"]
)
def test_memory_falls_back_to_v1_whose_used_includes_reserved(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    fake_nvml.set_error("nvmlDeviceGetMemoryInfo_v2", code)
    with NvmlSource() as nvml:
        rounds = [nvml.sample() for _ in range(3)]
    for samples in rounds:
        gpu = samples[2]
        assert gpu.memory_used_bytes == (20 << 30) + (514 << 20)  # allocated + reserved
        assert gpu.memory_total_bytes == 80 * GIB
        assert gpu.memory_reserved_bytes is None
    assert fake_nvml.calls("nvmlDeviceGetMemoryInfo_v2") <= 8  # given up after one refusal
    assert fake_nvml.calls("nvmlDeviceGetMemoryInfo", gpu=2) == 3
    assert records(caplog) == []  # a fallback is not a missing metric


def test_temperature_falls_back_to_the_deprecated_call(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_error("nvmlDeviceGetTemperatureV", fk.ERROR_FUNCTION_NOT_FOUND)
    with NvmlSource() as nvml:
        nvml.sample()
        fake_nvml.reset_calls()
        samples = nvml.sample()
    assert [s.temperature_celsius for s in samples] == [40.0 + g for g in range(8)]
    assert fake_nvml.calls("nvmlDeviceGetTemperatureV") == 0
    assert fake_nvml.calls("nvmlDeviceGetTemperature") == 8


# --- processes ---------------------------------------------------------------------------------


def test_processes_joined_with_their_utilisation(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_processes(
        2,
        [
            FakeProcess(4242, 3 * GIB, sm_percent=87, memory_percent=41),
            FakeProcess(4243, None, sm_percent=5, memory_percent=2),
            FakeProcess(4244, 512 * MIB, sm_percent=0, memory_percent=0),
        ],
    )
    with NvmlSource() as nvml:
        first = nvml.sample()[2].processes
        seen_after_first = fake_nvml.get_u64(2, "last_util_ts")
        second = nvml.sample()[2].processes
        seen_after_second = fake_nvml.get_u64(2, "last_util_ts")
        fake_nvml.set_processes(2, [FakeProcess(4242, 3 * GIB, 90, 44)])
        third = nvml.sample()[2].processes
        fourth_seen = fake_nvml.get_u64(2, "last_util_ts")
        nvml.sample()
    assert first == (
        ProcessSample(4242, 3 * GIB, 0.87, 0.41),
        ProcessSample(4243, None, 0.05, 0.02),
        ProcessSample(4244, 512 * MIB, 0.0, 0.0),
    )
    # No new sample since the last round (NVML says NOT_FOUND): listed, utilisation unknown.
    assert second == (
        ProcessSample(4242, 3 * GIB),
        ProcessSample(4243, None),
        ProcessSample(4244, 512 * MIB),
    )
    assert third == (ProcessSample(4242, 3 * GIB, 0.9, 0.44),)
    # Each call passes the newest sample timestamp seen so far.
    assert seen_after_first == 0
    assert seen_after_second > 0
    assert fourth_seen == seen_after_second
    assert fake_nvml.get_u64(2, "last_util_ts") > seen_after_second


def test_gpu_without_processes_skips_the_utilisation_call(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_processes(6, [])
    with NvmlSource() as nvml:
        samples = nvml.sample()
    assert samples[6].processes == ()
    assert fake_nvml.calls("nvmlDeviceGetProcessUtilization", gpu=6) == 0
    assert fake_nvml.calls("nvmlDeviceGetProcessUtilization", gpu=5) == 2  # size, then data


# --- MIG ---------------------------------------------------------------------------------------

H100_MIG = "NVIDIA H100 80GB HBM3 MIG"
MIGS = [
    FakeMigDevice("MIG-aaaa-0001", f"{H100_MIG} 3g.40gb", 1, 0, 40 * GIB, 9 * GIB, 64 * MIB),
    FakeMigDevice("MIG-aaaa-0002", f"{H100_MIG} 1g.10gb", 9, 0, 10 * GIB, 1 * GIB, 32 * MIB),
]


def expected_migs(fake: FakeNvml, gpu: int) -> list[GpuSample]:
    return [
        GpuSample(
            uuid="MIG-aaaa-0001",
            index=gpu,
            name="NVIDIA H100 80GB HBM3 MIG 3g.40gb",
            pci_bus_id=fake.get_str(gpu, "pci_bus_id"),
            parent_uuid=fake.uuid(gpu),
            mig_profile="3g.40gb",
            memory_used_bytes=9 * GIB,
            memory_total_bytes=40 * GIB,
            memory_reserved_bytes=64 * MIB,
            processes=(ProcessSample(7001, 2 * GIB), ProcessSample(7003, 3 * GIB)),
        ),
        GpuSample(
            uuid="MIG-aaaa-0002",
            index=gpu,
            name="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
            pci_bus_id=fake.get_str(gpu, "pci_bus_id"),
            parent_uuid=fake.uuid(gpu),
            mig_profile="1g.10gb",
            memory_used_bytes=1 * GIB,
            memory_total_bytes=10 * GIB,
            memory_reserved_bytes=32 * MIB,
            processes=(ProcessSample(7002, 1 * GIB),),
        ),
    ]


def mig_processes(fake: FakeNvml, gpu: int) -> None:
    fake.set_processes(
        gpu,
        [
            FakeProcess(7001, 2 * GIB, 50, 20, gpu_instance_id=1, compute_instance_id=0),
            FakeProcess(7002, 1 * GIB, 50, 20, gpu_instance_id=9, compute_instance_id=0),
            FakeProcess(7003, 3 * GIB, 50, 20, gpu_instance_id=1, compute_instance_id=0),
        ],
    )


def test_mig_devices_follow_their_parent(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake_nvml.set_mig(1, MIGS)
    mig_processes(fake_nvml, 1)
    with NvmlSource() as nvml:
        rounds = [nvml.sample() for _ in range(3)]
    samples = rounds[0]
    assert [(s.index, s.parent_uuid is not None) for s in samples] == [
        (0, False), (1, False), (1, True), (1, True), (2, False), (3, False), (4, False),
        (5, False), (6, False), (7, False),
    ]  # fmt: skip
    parent = samples[1]
    assert parent.uuid == fake_nvml.uuid(1)
    assert parent.utilization_ratio is None  # NVML: not supported while MIG mode is on
    assert parent.power_watts == 312.345
    assert parent.processes == ()  # every process runs in a MIG device
    assert samples[2:4] == expected_migs(fake_nvml, 1)
    assert rounds[2][2:4] == expected_migs(fake_nvml, 1)
    unsupported = [m for m in records(caplog) if "nvmlDeviceGetUtilizationRates" in m]
    assert len(unsupported) == 1
    assert "GPU 1" in unsupported[0]


def test_mig_reconfiguration_is_picked_up_from_the_event(fake_nvml: FakeNvml) -> None:
    with NvmlSource() as nvml:
        assert len(nvml.sample()) == 8
        fake_nvml.set_mig(4, MIGS)
        mig_processes(fake_nvml, 4)
        assert fake_nvml.push_event(4, fk.EVENT_MIG_CONFIG_CHANGE) == 1
        samples = nvml.sample()
    assert [s.uuid for s in samples if s.parent_uuid] == ["MIG-aaaa-0001", "MIG-aaaa-0002"]
    assert samples[5:7] == expected_migs(fake_nvml, 4)


# --- XID events and status ---------------------------------------------------------------------


def test_xid_counts_are_cumulative_and_events_drained_per_round(
    fake_nvml: FakeNvml, source: NvmlSource
) -> None:
    uuid2, uuid4 = fake_nvml.uuid(2), fake_nvml.uuid(4)
    assert [fake_nvml.push_xid(2, 13), fake_nvml.push_xid(2, 13), fake_nvml.push_xid(4, 79)] == [
        1,
        1,
        1,
    ]
    first = source.sample()
    assert source.events() == [
        GpuEvent(uuid2, 13, NOW_NS),
        GpuEvent(uuid2, 13, NOW_NS),
        GpuEvent(uuid4, 79, NOW_NS),
    ]
    assert (first[2].xid_counts, first[2].last_xid, first[2].status) == ({13: 2}, 13, "ok")
    assert (first[4].xid_counts, first[4].last_xid, first[4].status) == ({79: 1}, 79, "degraded")
    assert first[0].xid_counts == {}
    assert first[0].last_xid is None

    second = source.sample()
    assert source.events() == []
    assert (second[4].xid_counts, second[4].last_xid, second[4].status) == ({79: 1}, 79, "ok")

    fake_nvml.push_xid(2, 48)
    third = source.sample()
    assert (third[2].xid_counts, third[2].last_xid, third[2].status) == (
        {13: 2, 48: 1},
        48,
        "degraded",
    )
    assert source.events() == [GpuEvent(uuid2, 48, NOW_NS)]
    # Each round waits, with timeout 0, until NVML answers TIMEOUT: 3 events, 0, then 1.
    assert fake_nvml.calls("nvmlEventSetWait_v2") == (3 + 1) + 1 + (1 + 1)
    assert fake_nvml.get_global("last_wait_timeout_ms") == 0


@pytest.mark.parametrize(
    ("xid", "status"),
    [(x, GpuStatus.DEGRADED) for x in (48, 63, 64, 74, 79, 92, 94, 95)]
    + [(x, GpuStatus.OK) for x in (13, 31, 43, 45, 119)],
)
def test_xids_of_concern_degrade_the_gpu(
    fake_nvml: FakeNvml, source: NvmlSource, xid: int, status: GpuStatus
) -> None:
    fake_nvml.push_xid(0, xid)
    assert source.sample()[0].status == status


@pytest.mark.parametrize(
    ("field_id", "value", "status"),
    [
        (fk.FI_REMAPPED_PENDING, 1, GpuStatus.DEGRADED),
        (fk.FI_REMAPPED_FAILURE, 1, GpuStatus.DEGRADED),
        (fk.FI_REMAPPED_COR, 5, GpuStatus.OK),
        (fk.FI_REMAPPED_UNC, 2, GpuStatus.OK),
    ],
)
def test_row_remapping_status(
    fake_nvml: FakeNvml, source: NvmlSource, field_id: int, value: int, status: GpuStatus
) -> None:
    fake_nvml.set_field(7, field_id, value, fk.VALUE_TYPE_UNSIGNED_INT)
    samples = source.sample()
    assert samples[7].status == status
    assert {s.status for s in samples[:7]} == {GpuStatus.OK}


# --- a GPU lost mid-run ------------------------------------------------------------------------

Breakage = Callable[[FakeNvml], None]
BREAKAGES: dict[str, Breakage] = {
    "all-calls-gpu-is-lost": lambda f: f.set_error("*", fk.ERROR_GPU_IS_LOST, gpu=3),
    "all-calls-unknown": lambda f: f.set_error("*", fk.ERROR_UNKNOWN, gpu=3),
    "all-calls-gpu-not-found": lambda f: f.set_error("*", fk.ERROR_GPU_NOT_FOUND, gpu=3),
    "one-call-gpu-is-lost": lambda f: f.set_error(
        "nvmlDeviceGetPowerUsage", fk.ERROR_GPU_IS_LOST, gpu=3
    ),
    "one-field-gpu-is-lost": lambda f: f.set_field_return(
        3, fk.FI_POWER_INSTANT, fk.ERROR_GPU_IS_LOST
    ),
}


@pytest.mark.parametrize("breakage", BREAKAGES.values(), ids=BREAKAGES.keys())
def test_lost_gpu_fails_alone_logs_once_and_recovers(
    fake_nvml: FakeNvml,
    source: NvmlSource,
    caplog: pytest.LogCaptureFixture,
    breakage: Breakage,
) -> None:
    set_stable(fake_nvml)
    good = source.sample()
    uuid3 = fake_nvml.uuid(3)
    caplog.set_level(logging.INFO, logger=LOGGER)

    breakage(fake_nvml)
    lost_rounds = [source.sample() for _ in range(4)]
    events = source.events()

    failed = GpuSample(
        uuid3,
        3,
        "NVIDIA H100 80GB HBM3",
        status=GpuStatus.FAILED,
        pci_bus_id=fake_nvml.get_str(3, "pci_bus_id"),
    )
    for samples in lost_rounds:
        assert samples[3] == failed
        assert samples[:3] + samples[4:] == good[:3] + good[4:]
    errors = records(caplog, logging.ERROR)
    assert len(errors) == 1
    assert f"GPU 3 ({uuid3}) is lost" in errors[0]
    assert records(caplog) == errors  # nothing else above INFO: no spam in later rounds
    assert events == [GpuEvent(uuid3, None, NOW_NS, GpuEventKind.GPU_LOST)]

    fake_nvml.clear_errors()
    fake_nvml.set_field(3, fk.FI_POWER_INSTANT, 301_500 + 12_345 * 3, fk.VALUE_TYPE_UNSIGNED_INT)
    recovered = source.sample()
    assert recovered[3] == good[3]
    assert source.events() == []
    assert any("answers NVML again" in m for m in records(caplog, logging.INFO))


def test_gpu_lost_before_start_is_reported_failed(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake_nvml.set_error("*", fk.ERROR_GPU_IS_LOST, gpu=6)
    with NvmlSource(time_ns=lambda: NOW_NS) as nvml:
        samples = nvml.sample()
        events = nvml.events()
    assert samples[6] == GpuSample("nvml-index-6", 6, "unknown", status=GpuStatus.FAILED)
    assert [s.status for s in samples[:6] + samples[7:]] == [GpuStatus.OK] * 7
    assert events == [GpuEvent("nvml-index-6", None, NOW_NS, GpuEventKind.GPU_LOST)]
    assert len(records(caplog, logging.ERROR)) == 1


# --- unsupported metrics -----------------------------------------------------------------------

UNSUPPORTED = [
    # (what to break, attributes that go absent, log must name, calls over 4 rounds on GPU 5)
    ("nvmlDeviceGetPowerUsage", ("power_watts",), "nvmlDeviceGetPowerUsage", 1),
    ("nvmlDeviceGetCurrPcieLinkWidth", ("pcie_link_width",), "nvmlDeviceGetCurrPcieLinkWidth", 1),
    (
        "nvmlDeviceGetUtilizationRates",
        ("utilization_ratio", "memory_utilization_ratio"),
        "nvmlDeviceGetUtilizationRates",
        1,
    ),
    ("nvmlDeviceGetFieldValues", ("power_instant_watts", "nvlink_tx_bytes"), "FieldValues", 1),
    (fk.FI_MEMORY_TEMP, ("memory_temperature_celsius",), "NVML_FI_DEV_MEMORY_TEMP", 4),
    (fk.FI_NVLINK_THROUGHPUT_DATA_RX, ("nvlink_rx_bytes",), "NVLINK_THROUGHPUT_DATA_RX", 4),
    (fk.FI_REMAPPED_FAILURE, ("remapped_rows_failure",), "NVML_FI_DEV_REMAPPED_FAILURE", 4),
]


@pytest.mark.parametrize(("broken", "attributes", "named", "calls"), UNSUPPORTED)
def test_unsupported_metric_is_absent_and_logged_once(
    fake_nvml: FakeNvml,
    caplog: pytest.LogCaptureFixture,
    broken: str | int,
    attributes: tuple[str, ...],
    named: str,
    calls: int,
) -> None:
    if isinstance(broken, str):
        fake_nvml.set_error(broken, fk.ERROR_NOT_SUPPORTED, gpu=5)
        symbol = broken
    else:
        fake_nvml.set_field_unsupported(5, broken)
        symbol = "nvmlDeviceGetFieldValues"
    with NvmlSource() as nvml:
        rounds = [nvml.sample() for _ in range(4)]
    for samples in rounds:
        for attribute in attributes:
            assert getattr(samples[5], attribute) is None
            assert getattr(samples[4], attribute) is not None
        assert samples[5].status == GpuStatus.OK
    warnings = records(caplog)
    assert len(warnings) == 1
    assert named in warnings[0]
    assert "GPU 5" in warnings[0]
    assert fake_nvml.calls(symbol, gpu=5) == calls  # a refused call is not repeated


@pytest.mark.parametrize(
    ("code", "requested"), [(fk.ERROR_NOT_SUPPORTED, 7), (fk.ERROR_NO_PERMISSION, 8)]
)
def test_refused_field_leaves_the_batch(fake_nvml: FakeNvml, code: int, requested: int) -> None:
    fake_nvml.set_field_return(5, fk.FI_POWER_INSTANT, code)
    with NvmlSource() as nvml:
        first = fake_nvml.get_u64(5, "last_field_count")
        nvml.sample()
        nvml.sample()
    assert first == 0  # fields are read per round, not at start
    assert fake_nvml.get_u64(5, "last_field_count") == requested
    assert fake_nvml.get_u64(4, "last_field_count") == 8


def test_transient_error_is_logged_once_but_retried(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake_nvml.set_error("nvmlDeviceGetPcieThroughput", fk.ERROR_NO_PERMISSION, gpu=1)
    with NvmlSource() as nvml:
        rounds = [nvml.sample() for _ in range(3)]
        fake_nvml.clear_errors()
        healed = nvml.sample()
    assert [r[1].pcie_tx_bytes_per_second for r in rounds] == [None] * 3
    assert healed[1].pcie_tx_bytes_per_second == 2017 * 1024.0
    assert fake_nvml.calls("nvmlDeviceGetPcieThroughput", gpu=1) == 2 * 4
    warnings = records(caplog)
    assert len(warnings) == 2  # TX and RX, each once
    assert all("nvmlDeviceGetPcieThroughput" in w and "GPU 1" in w for w in warnings)


def test_missing_function_is_logged_once_for_the_library(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake_nvml.set_error("nvmlDeviceGetTotalEnergyConsumption", fk.ERROR_FUNCTION_NOT_FOUND)
    with NvmlSource() as nvml:
        rounds = [nvml.sample() for _ in range(3)]
    assert {s.energy_joules for r in rounds for s in r} == {None}
    assert fake_nvml.calls("nvmlDeviceGetTotalEnergyConsumption") == 1
    warnings = records(caplog)
    assert len(warnings) == 1
    assert "nvmlDeviceGetTotalEnergyConsumption" in warnings[0]


def test_library_mismatch_leaves_processes_absent(
    fake_nvml_mismatch: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    with NvmlSource() as nvml:
        rounds = [nvml.sample() for _ in range(3)]
    for samples in rounds:
        assert len(samples) == 8
        assert {s.processes for s in samples} == {()}
        assert {s.status for s in samples} == {GpuStatus.OK}
        assert samples[3].power_watts == (300_000 + 12_345 * 3) / 1000
    warnings = records(caplog)
    assert len(warnings) == 1
    assert "library version mismatch" in warnings[0]
    assert "nvmlDeviceGetComputeRunningProcesses" in warnings[0]
    assert fake_nvml_mismatch.calls("nvmlDeviceGetProcessUtilization") == 0


# --- NVML missing or broken at start -----------------------------------------------------------


def test_missing_library_path_names_the_fix(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "libnvidia-ml.so.1"
    with pytest.raises(NvmlUnavailableError) as caught:
        NvmlSource(library_path=str(missing))
    message = str(caught.value)
    for fix in (
        str(missing),
        "NVIDIA driver",
        "nvml_library_path",
        "container",
        "--source simulated",
    ):
        assert fix in message
    assert fake_nvml.init_refcount == 0


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        (fk.ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (fk.ERROR_NO_PERMISSION, "/dev/nvidia"),
        (fk.ERROR_LIB_RM_VERSION_MISMATCH, "reboot"),
        (fk.ERROR_UNKNOWN, "nvml_library_path"),
    ],
)
def test_init_failure_is_an_actionable_error(fake_nvml: FakeNvml, code: int, hint: str) -> None:
    fake_nvml.set_error("nvmlInitWithFlags", code)
    with pytest.raises(NvmlUnavailableError, match="NVML is unavailable") as caught:
        NvmlSource()
    assert hint in str(caught.value)
    assert "--source simulated" in str(caught.value)


def test_failure_after_init_shuts_nvml_down(fake_nvml: FakeNvml) -> None:
    fake_nvml.set_error("nvmlDeviceGetCount_v2", fk.ERROR_UNKNOWN)
    with pytest.raises(NvmlUnavailableError):
        NvmlSource()
    assert fake_nvml.init_refcount == 0
    assert fake_nvml.open_event_sets == 0


def test_library_path_loads_that_file(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    # A copy at another path is a separate library with its own state: 3 GPUs, not 8.
    copy = tmp_path / "odd" / "place" / "libnvidia-ml.so.1"
    copy.parent.mkdir(parents=True)
    shutil.copy(fake_nvml.path, copy)
    other = FakeNvml(ctypes.CDLL(str(copy)), copy)
    other.reset(3)
    with NvmlSource(library_path=str(copy)) as nvml:
        samples = nvml.sample()
        assert other.init_refcount == 1
    assert [s.uuid for s in samples] == [other.uuid(g) for g in range(3)]
    assert other.init_refcount == 0
    assert fake_nvml.calls("nvmlInitWithFlags") == 0


def _run_agent_probe(library_dir: Path) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(
        """
        import json, sys
        from gpuwarden.agent.sources.nvml import NvmlSource, NvmlUnavailableError
        try:
            source = NvmlSource()
        except NvmlUnavailableError as exc:
            print(exc, file=sys.stderr)
            sys.exit(3)
        with source:
            samples = source.sample()
        print(json.dumps([[s.index, s.uuid, s.power_watts] for s in samples]))
        """
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(library_dir)}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )


def test_subprocess_finds_the_fake_through_ld_library_path(fake_nvml_dir: Path) -> None:
    result = _run_agent_probe(fake_nvml_dir)
    assert result.returncode == 0, result.stderr
    gpus = json.loads(result.stdout)
    assert len(gpus) == 8
    assert gpus[0] == [0, "GPU-c0ffee00-7b3c-4d2e-9f10-0000000a11ce", 300.0]
    assert gpus[7][2] == (300_000 + 12_345 * 7) / 1000


def test_subprocess_without_nvml_exits_with_the_fix(tmp_path: Path) -> None:
    if ctypes.util.find_library("nvidia-ml") is not None:
        pytest.skip("this machine has a real libnvidia-ml")
    result = _run_agent_probe(tmp_path)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "NVML Shared Library Not Found" in result.stderr
    assert "nvml_library_path" in result.stderr


# --- NVML load ---------------------------------------------------------------------------------

# C calls per GPU in one round with one process per GPU (the first round: fresh samples).
PER_GPU_CALLS = {
    "nvmlDeviceGetUtilizationRates": 1,
    "nvmlDeviceGetMemoryInfo_v2": 1,
    "nvmlDeviceGetPowerUsage": 1,
    "nvmlDeviceGetTotalEnergyConsumption": 1,
    "nvmlDeviceGetTemperatureV": 1,
    "nvmlDeviceGetClockInfo": 2,  # SM, MEM
    "nvmlDeviceGetCurrentClocksEventReasons": 1,
    "nvmlDeviceGetPcieThroughput": 2,  # TX, RX
    "nvmlDeviceGetCurrPcieLinkGeneration": 1,
    "nvmlDeviceGetCurrPcieLinkWidth": 1,
    "nvmlDeviceGetFieldValues": 1,  # every NVML_FI_* of the round in one batch
    "nvmlDeviceGetTotalEccErrors": 2,  # corrected, uncorrected
    "nvmlDeviceGetComputeRunningProcesses_v3": 2,  # size query, then data
    "nvmlDeviceGetProcessUtilization": 2,  # size query, then data
}


def test_each_round_calls_each_function_once_per_gpu(fake_nvml: FakeNvml) -> None:
    with NvmlSource() as nvml:
        fake_nvml.reset_calls()
        nvml.sample()
        for gpu in range(8):
            for symbol, count in PER_GPU_CALLS.items():
                assert (symbol, fake_nvml.calls(symbol, gpu=gpu)) == (symbol, count)
        expected_total = {symbol: 8 * n for symbol, n in PER_GPU_CALLS.items()}
        assert fake_nvml.call_counts() == {**expected_total, "nvmlEventSetWait_v2": 1}


def test_round_cpu_time_stays_within_budget(fake_nvml: FakeNvml) -> None:
    rounds = 100
    with NvmlSource() as nvml:
        nvml.sample()
        started = time.process_time()
        for _ in range(rounds):
            nvml.sample()
        cpu_per_round = (time.process_time() - started) / rounds
    assert cpu_per_round < 0.005  # the agent's budget: 5 ms CPU per 8-GPU round


def test_close_shuts_down_and_frees_the_event_set(fake_nvml: FakeNvml) -> None:
    nvml = NvmlSource()
    assert (fake_nvml.init_refcount, fake_nvml.open_event_sets) == (1, 1)
    nvml.close()
    nvml.close()
    assert (fake_nvml.init_refcount, fake_nvml.open_event_sets) == (0, 0)
    assert fake_nvml.calls("nvmlShutdown") == 1
