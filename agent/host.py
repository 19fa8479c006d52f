"""Host telemetry from ``/proc`` and the powercap (RAPL) tree in ``/sys``.

Both roots are constructor arguments so tests replay a recorded tree instead of patching. Each
file is read once per sample. A file that cannot be read or parsed empties only its own part of
the :class:`~agent.model.HostSample` and is logged once per reader; :meth:`HostReader.sample`
never raises for a missing or malformed file.

Disk rule: a device in ``/proc/diskstats`` is counted when it is listed in ``/sys/block`` (the
kernel lists whole disks there, never partitions) and its name does not start with ``loop``,
``ram`` or ``zram``. Device-mapper and md devices are kept, as node_exporter does. When
``/sys/block`` cannot be listed (a container without ``/sys``), partitions are recognised by name
instead (``sda1``, ``vdb2``, ``xvda1``, ``nvme0n1p1``, ``mmcblk0p1``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gpuwarden.agent.model import HostSample

_LOG = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Modes of the aggregate ``cpu`` line of ``/proc/stat``, in kernel order. ``guest`` and
#: ``guest_nice`` follow but are already included in ``user`` and ``nice``.
CPU_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

#: ``/proc/diskstats`` counts sectors of 512 bytes whatever the device's sector size.
DISKSTATS_SECTOR_BYTES = 512

_VIRTUAL_DISK_PREFIXES = ("loop", "ram", "zram")
_PARTITION_NAME = re.compile(r"(?:(?:h|s|v|xv)d[a-z]+\d+|(?:nvme\d+n\d+|mmcblk\d+)p\d+)")
_MEMINFO_KEYS = ("MemTotal", "MemFree", "Buffers", "Cached", "SReclaimable")
_RAPL_ZONE_PREFIX = "intel-rapl:"


@dataclass(slots=True)
class _RaplCounter:
    """Running state of one RAPL zone: the last raw reading and what wraps added so far."""

    max_energy_range_uj: int
    last_raw_uj: int
    wrapped_uj: int = 0

    def advance(self, raw_uj: int) -> float:
        """Fold one raw reading in and return the cumulative energy in joules.

        A reading below the previous one means the counter wrapped once (more than one wrap
        between two samples is undetectable: at package power it takes hours).
        """
        if raw_uj < self.last_raw_uj:
            self.wrapped_uj += self.max_energy_range_uj
        self.last_raw_uj = raw_uj
        return (self.wrapped_uj + raw_uj) / 1e6


class HostReader:
    """Reads host CPU, memory, disk, network and RAPL energy counters.

    Args:
        proc_root: where ``/proc`` is mounted (a recorded tree in tests).
        sys_root: where ``/sys`` is mounted.
        clock_ticks_per_second: USER_HZ; ``None`` asks ``os.sysconf("SC_CLK_TCK")``.

    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        sys_root: Path = Path("/sys"),
        *,
        clock_ticks_per_second: int | None = None,
    ) -> None:
        self._proc = proc_root
        self._sys = sys_root
        self._ticks_per_second = clock_ticks_per_second or os.sysconf("SC_CLK_TCK")
        self._rapl: dict[str, _RaplCounter] = {}
        self._logged: set[str] = set()

    def sample(self) -> HostSample:
        """Read every source once and return what could be read."""
        no_cpu: tuple[dict[str, float], int | None] = ({}, None)
        no_memory: tuple[dict[str, int], int | None] = ({}, None)
        cpu_time, cpu_count = self._read_part("cpu", self._cpu, no_cpu)
        memory, memory_limit = self._read_part("memory", self._memory, no_memory)
        return HostSample(
            cpu_time_seconds=cpu_time,
            cpu_count=cpu_count,
            memory_bytes=memory,
            memory_limit_bytes=memory_limit,
            disk_io_bytes=self._read_part("disk", self._disks, {}),
            network_io_bytes=self._read_part("network", self._network, {}),
            cpu_energy_joules=self._rapl_energy(),
        )

    def _read_part(self, part: str, read: Callable[[], _T], empty: _T) -> _T:
        try:
            return read()
        except (OSError, ValueError, IndexError) as error:
            self._log_once(part, logging.WARNING, "host %s metrics unavailable: %s", part, error)
            return empty

    def _log_once(self, key: str, level: int, message: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            _LOG.log(level, message, *args)

    def _cpu(self) -> tuple[dict[str, float], int | None]:
        times: dict[str, float] = {}
        cpu_count = 0
        for line in (self._proc / "stat").read_text().splitlines():
            if not line.startswith("cpu"):
                break  # the kernel prints the cpu lines first; skip the long intr line
            name, _, rest = line.partition(" ")
            if name == "cpu":
                ticks = rest.split()
                for mode, value in zip(CPU_MODES, ticks, strict=False):
                    times[mode] = int(value) / self._ticks_per_second
            else:
                cpu_count += 1
        if not times:
            raise ValueError("no aggregate 'cpu' line in /proc/stat")
        return times, cpu_count or None

    def _memory(self) -> tuple[dict[str, int], int | None]:
        kib: dict[str, int] = {}
        for line in (self._proc / "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in _MEMINFO_KEYS:
                kib[key] = int(rest.split()[0])
        missing = [key for key in _MEMINFO_KEYS if key not in kib]
        if missing:
            raise ValueError(f"/proc/meminfo lacks {', '.join(missing)}")
        total, free = kib["MemTotal"], kib["MemFree"]
        buffers, cached = kib["Buffers"], kib["Cached"]
        used = max(0, total - free - buffers - cached - kib["SReclaimable"])
        memory = {"used": used, "free": free, "cached": cached, "buffers": buffers}
        return {state: value * 1024 for state, value in memory.items()}, total * 1024

    def _whole_disk(self) -> Callable[[str], bool]:
        try:
            # The kernel writes '/' in a block device name as '!' in sysfs (cciss!c0d0).
            listed = {entry.replace("!", "/") for entry in os.listdir(self._sys / "block")}
        except OSError as error:
            self._log_once("sys-block", logging.INFO, "no %s (%s)", self._sys / "block", error)
            return lambda name: _PARTITION_NAME.fullmatch(name) is None
        return listed.__contains__

    def _disks(self) -> dict[tuple[str, str], int]:
        whole_disk = self._whole_disk()
        disk_io: dict[tuple[str, str], int] = {}
        for line in (self._proc / "diskstats").read_text().splitlines():
            fields = line.split()
            if len(fields) < 10:
                continue
            device = fields[2]
            if device.startswith(_VIRTUAL_DISK_PREFIXES) or not whole_disk(device):
                continue
            disk_io[device, "read"] = int(fields[5]) * DISKSTATS_SECTOR_BYTES
            disk_io[device, "write"] = int(fields[9]) * DISKSTATS_SECTOR_BYTES
        return disk_io

    def _network(self) -> dict[tuple[str, str], int]:
        network_io: dict[tuple[str, str], int] = {}
        # Two header lines; then "iface: rx_bytes packets ... (8 receive fields) tx_bytes ...".
        for line in (self._proc / "net" / "dev").read_text().splitlines()[2:]:
            iface, colon, counters = line.partition(":")
            iface = iface.strip()
            if not colon or iface == "lo":
                continue
            fields = counters.split()
            network_io[iface, "receive"] = int(fields[0])
            network_io[iface, "transmit"] = int(fields[8])
        return network_io

    def _rapl_energy(self) -> dict[str, float]:
        powercap = self._sys / "class" / "powercap"
        try:
            # Only top-level zones (intel-rapl:0, not intel-rapl:0:0): a package zone already
            # contains its core, uncore and dram sub-zones.
            zones = sorted(
                entry
                for entry in os.listdir(powercap)
                if entry.startswith(_RAPL_ZONE_PREFIX) and entry.count(":") == 1
            )
        except OSError as error:
            self._log_once("rapl", logging.INFO, "no RAPL energy: %s (%s)", powercap, error)
            return {}
        energy: dict[str, float] = {}
        for zone in zones:
            try:
                name, joules = self._rapl_zone(powercap / zone)
            except (OSError, ValueError) as error:
                # Since Linux 5.10 energy_uj is readable by root only (CVE-2020-8694).
                self._log_once("rapl", logging.INFO, "no RAPL energy for %s: %s", zone, error)
                continue
            energy[name] = joules
        if not zones:
            self._log_once("rapl", logging.INFO, "no RAPL zones under %s", powercap)
        return energy

    def _rapl_zone(self, zone: Path) -> tuple[str, float]:
        name = (zone / "name").read_text().strip()
        raw_uj = int((zone / "energy_uj").read_text())
        counter = self._rapl.get(zone.name)
        if counter is None:
            max_range_uj = int((zone / "max_energy_range_uj").read_text())
            counter = self._rapl[zone.name] = _RaplCounter(max_range_uj, raw_uj)
        return name, counter.advance(raw_uj)
