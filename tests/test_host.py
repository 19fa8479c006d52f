"""HostReader against recorded /proc and /sys trees, plus one smoke test on this machine."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuwarden.agent.host import HostReader

# Shapes copied from a real Linux 6.x host (4 CPUs, NVMe + virtio disks).
PROC_STAT = """\
cpu  3872 7 2314 424879 381 11 56 38 5 0
cpu0 1179 0 785 213659 158 0 6 14 0 0
cpu1 2692 7 1528 211219 223 11 49 24 5 0
cpu2 1 0 1 1 0 0 0 0 0 0
cpu3 0 0 0 0 0 0 1 0 0 0
intr 160874 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 1 1 14 0
ctxt 292819
btime 1795317963
processes 4254
procs_running 1
procs_blocked 0
softirq 128381 0 24844 4 2547 36237 0 2 39408 0 25339
"""

PROC_MEMINFO = """\
MemTotal:       24684084 kB
MemFree:        20468620 kB
MemAvailable:   22399124 kB
Buffers:           11256 kB
Cached:          1046436 kB
SwapCached:            0 kB
Active:            11192 kB
Inactive:          34860 kB
Shmem:              8872 kB
KReclaimable:      66108 kB
Slab:              88452 kB
SReclaimable:      66108 kB
SUnreclaim:        22344 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""

PROC_DISKSTATS = """\
   7       0 loop0 52 0 2100 10 0 0 0 0 0 12 10 0 0 0 0 0 0
   1       0 ram0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 259       0 nvme0n1 157200 1200 9876543 40100 88100 54000 3456789 91000 0 70000 131100 0 0 0 0 2100 900
 259       1 nvme0n1p1 300 0 12000 100 2 0 16 1 0 90 101 0 0 0 0 0 0
 259       2 nvme0n1p2 156800 1200 9864000 40000 88098 54000 3456773 90999 0 69900 130999 0 0 0 0 0 0
 254       0 vda 33070 9530 2465770 13282 6346 15285 1044248 2672 0 5244 16279 3827 43 87848 271 1049 52
 254       1 vda1 33000 9530 2465000 13200 6346 15285 1044248 2672 0 5200 16200 3827 43 87848 271 0 0
 253       0 zram0 4 0 32 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 252       0 dm-0 1000 0 8000 10 2000 0 16000 20 0 30 30 0 0 0 0 0 0
"""  # noqa: E501 (verbatim /proc format)

PROC_NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    3193      29    0    0    0     0          0         0     3193      29    0    0    0     0       0          0
  eth0: 81725552    2207    0    0    0     0          0         0   140116    1106    0    0    0     0       0          0
ib0:123456789012   99999    0    0    0     0          0         0 987654321098   88888    0    0    0     0       0          0
"""  # noqa: E501 (verbatim /proc format)

SYS_BLOCK = ("loop0", "ram0", "nvme0n1", "vda", "zram0", "dm-0")
MAX_RANGE_UJ = 262143328850


def write_tree(root: Path) -> tuple[Path, Path]:
    proc, sys = root / "proc", root / "sys"
    (proc / "net").mkdir(parents=True)
    (proc / "stat").write_text(PROC_STAT)
    (proc / "meminfo").write_text(PROC_MEMINFO)
    (proc / "diskstats").write_text(PROC_DISKSTATS)
    (proc / "net" / "dev").write_text(PROC_NET_DEV)
    for device in SYS_BLOCK:
        (sys / "block" / device).mkdir(parents=True)
    return proc, sys


def write_rapl(sys: Path, zone: str, name: str, energy_uj: int) -> Path:
    path = sys / "class" / "powercap" / zone
    path.mkdir(parents=True, exist_ok=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{MAX_RANGE_UJ}\n")
    return path


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    return write_tree(tmp_path)


def reader(tree: tuple[Path, Path]) -> HostReader:
    proc, sys = tree
    return HostReader(proc, sys, clock_ticks_per_second=100)


def test_cpu_times_by_mode_and_count(tree: tuple[Path, Path]) -> None:
    sample = reader(tree).sample()
    assert sample.cpu_time_seconds == {
        "user": 38.72,
        "nice": 0.07,
        "system": 23.14,
        "idle": 4248.79,
        "iowait": 3.81,
        "irq": 0.11,
        "softirq": 0.56,
        "steal": 0.38,
    }
    assert sample.cpu_count == 4


def test_clock_ticks_are_injected(tree: tuple[Path, Path]) -> None:
    proc, sys = tree
    sample = HostReader(proc, sys, clock_ticks_per_second=1000).sample()
    assert sample.cpu_time_seconds["user"] == pytest.approx(3.872)


def test_memory_states_and_limit(tree: tuple[Path, Path]) -> None:
    sample = reader(tree).sample()
    used_kib = 24684084 - 20468620 - 11256 - 1046436 - 66108
    assert sample.memory_bytes == {
        "used": used_kib * 1024,
        "free": 20468620 * 1024,
        "cached": 1046436 * 1024,
        "buffers": 11256 * 1024,
    }
    assert sample.memory_limit_bytes == 24684084 * 1024


def test_disks_are_whole_physical_disks_only(tree: tuple[Path, Path]) -> None:
    sample = reader(tree).sample()
    assert sample.disk_io_bytes == {
        ("nvme0n1", "read"): 9876543 * 512,
        ("nvme0n1", "write"): 3456789 * 512,
        ("vda", "read"): 2465770 * 512,
        ("vda", "write"): 1044248 * 512,
        ("dm-0", "read"): 8000 * 512,
        ("dm-0", "write"): 16000 * 512,
    }


def test_disks_without_sys_block_skip_partitions_by_name(tree: tuple[Path, Path]) -> None:
    proc, _ = tree
    sample = HostReader(proc, proc / "no-sys", clock_ticks_per_second=100).sample()
    assert sorted({device for device, _ in sample.disk_io_bytes}) == ["dm-0", "nvme0n1", "vda"]


def test_network_skips_loopback(tree: tuple[Path, Path]) -> None:
    sample = reader(tree).sample()
    assert sample.network_io_bytes == {
        ("eth0", "receive"): 81725552,
        ("eth0", "transmit"): 140116,
        ("ib0", "receive"): 123456789012,
        ("ib0", "transmit"): 987654321098,
    }


def test_rapl_is_cumulative_across_wrap_around(tree: tuple[Path, Path]) -> None:
    _, sys = tree
    package0 = write_rapl(sys, "intel-rapl:0", "package-0", MAX_RANGE_UJ - 5_000_000)
    write_rapl(sys, "intel-rapl:0:0", "core", 1)  # sub-zone: contained in package-0
    write_rapl(sys, "intel-rapl:1", "package-1", 7_000_000)
    host = reader(tree)

    first = host.sample().cpu_energy_joules
    assert first == {"package-0": (MAX_RANGE_UJ - 5_000_000) / 1e6, "package-1": 7.0}

    (package0 / "energy_uj").write_text("3000000\n")  # wrapped: 5 J to the top, then 3 J
    second = host.sample().cpu_energy_joules
    assert second["package-0"] - first["package-0"] == pytest.approx(8.0)
    assert second["package-1"] == 7.0

    (package0 / "energy_uj").write_text("4000000\n")
    third = host.sample().cpu_energy_joules
    assert third["package-0"] - second["package-0"] == pytest.approx(1.0)


def test_rapl_unreadable_is_empty_and_logged_once(
    tree: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    _, sys = tree
    zone = write_rapl(sys, "intel-rapl:0", "package-0", 1)
    # Root ignores chmod; a directory where the file should be fails the read the same way.
    (zone / "energy_uj").unlink()
    (zone / "energy_uj").mkdir()
    host = reader(tree)
    with caplog.at_level(logging.INFO, logger="gpuwarden.agent.host"):
        assert host.sample().cpu_energy_joules == {}
        assert host.sample().cpu_energy_joules == {}
    rapl_records = [r for r in caplog.records if "RAPL" in r.getMessage()]
    assert len(rapl_records) == 1
    assert rapl_records[0].levelno == logging.INFO


def test_absent_powercap_is_empty(tree: tuple[Path, Path]) -> None:
    assert reader(tree).sample().cpu_energy_joules == {}


def test_unreadable_proc_file_empties_only_its_part(
    tree: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    proc, _ = tree
    (proc / "meminfo").unlink()
    (proc / "net" / "dev").write_text("garbage\nheader\n  eth0: not numbers\n")
    host = reader(tree)
    with caplog.at_level(logging.INFO, logger="gpuwarden.agent.host"):
        sample = host.sample()
        host.sample()
    assert sample.memory_bytes == {}
    assert sample.memory_limit_bytes is None
    assert sample.network_io_bytes == {}
    assert sample.cpu_count == 4
    assert len(sample.disk_io_bytes) == 6
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(messages) == 2
    assert any("memory" in message for message in messages)
    assert any("network" in message for message in messages)


def test_real_proc_smoke() -> None:
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc on this platform")
    sample = HostReader().sample()
    assert sample.cpu_count is not None
    assert sample.cpu_count >= 1
    assert set(sample.cpu_time_seconds) == {
        "user",
        "nice",
        "system",
        "idle",
        "iowait",
        "irq",
        "softirq",
        "steal",
    }
    assert all(isinstance(v, float) and v >= 0 for v in sample.cpu_time_seconds.values())
    assert set(sample.memory_bytes) == {"used", "free", "cached", "buffers"}
    assert all(isinstance(v, int) and v >= 0 for v in sample.memory_bytes.values())
    assert sample.memory_limit_bytes is not None
    assert sample.memory_limit_bytes > 0
    for counters in (sample.disk_io_bytes, sample.network_io_bytes):
        assert all(isinstance(v, int) and v >= 0 for v in counters.values())
    assert all(iface != "lo" for iface, _ in sample.network_io_bytes)
    assert all(v >= 0 for v in sample.cpu_energy_joules.values())
