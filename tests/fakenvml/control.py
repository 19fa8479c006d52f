"""Build the fake ``libnvidia-ml.so.1`` (fake_nvml.c) and drive it through its control API.

The constants below are NVML's C ABI, written out here on purpose rather than imported from the
agent: a test that sets field 82 through this module and reads ``memory_temperature_celsius``
back fails if the agent asked NVML for the wrong field.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

SOURCE: Final = Path(__file__).with_name("fake_nvml.c")
LIBRARY_NAME: Final = "libnvidia-ml.so.1"
_STAMP_NAME: Final = ".fake_nvml.sha256"
_CFLAGS: Final = (
    "-shared",
    "-fPIC",
    "-O2",
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-fvisibility=hidden",
)
#: Build variants: ``no-processes-v3`` lacks nvmlDeviceGetComputeRunningProcesses_v3, like a
#: driver older than the pynvml in use (pynvml raises NVMLLibraryMismatchError).
VARIANTS: Final[Mapping[str, tuple[str, ...]]] = {
    "full": (),
    "no-processes-v3": ("-DFAKE_NVML_NO_PROCESSES_V3",),
}

# nvmlReturn_t codes used by tests.
SUCCESS: Final = 0
ERROR_INVALID_ARGUMENT: Final = 2
ERROR_NOT_SUPPORTED: Final = 3
ERROR_NO_PERMISSION: Final = 4
ERROR_NOT_FOUND: Final = 6
ERROR_DRIVER_NOT_LOADED: Final = 9
ERROR_FUNCTION_NOT_FOUND: Final = 13
ERROR_GPU_IS_LOST: Final = 15
ERROR_LIB_RM_VERSION_MISMATCH: Final = 18
ERROR_GPU_NOT_FOUND: Final = 28
ERROR_UNKNOWN: Final = 999

# nvmlValueType_t
VALUE_TYPE_DOUBLE: Final = 0
VALUE_TYPE_UNSIGNED_INT: Final = 1
VALUE_TYPE_UNSIGNED_LONG: Final = 2
VALUE_TYPE_UNSIGNED_LONG_LONG: Final = 3
VALUE_TYPE_SIGNED_LONG_LONG: Final = 4
VALUE_TYPE_SIGNED_INT: Final = 5
VALUE_TYPE_UNSIGNED_SHORT: Final = 6

# NVML_FI_DEV_* field ids
FI_MEMORY_TEMP: Final = 82
FI_NVLINK_THROUGHPUT_DATA_TX: Final = 138
FI_NVLINK_THROUGHPUT_DATA_RX: Final = 139
FI_REMAPPED_COR: Final = 142
FI_REMAPPED_UNC: Final = 143
FI_REMAPPED_PENDING: Final = 144
FI_REMAPPED_FAILURE: Final = 145
FI_POWER_AVERAGE: Final = 185
FI_POWER_INSTANT: Final = 186

# nvmlEventType*
EVENT_XID_CRITICAL_ERROR: Final = 0x8
EVENT_MIG_CONFIG_CHANGE: Final = 0x100

U64Key = Literal[
    "util_gpu",
    "util_mem",
    "mem_total",
    "mem_used",
    "mem_reserved",
    "power_mw",
    "energy_mj",
    "temp_c",
    "clock_graphics_mhz",
    "clock_sm_mhz",
    "clock_mem_mhz",
    "clock_video_mhz",
    "clock_event_reasons",
    "pcie_tx_kbps",
    "pcie_rx_kbps",
    "pcie_gen",
    "pcie_width",
    "ecc_cor_volatile",
    "ecc_unc_volatile",
    "ecc_cor_aggregate",
    "ecc_unc_aggregate",
    "mig_mode",
    "mig_pending",
    "max_mig",
    "supported_events",
    "nvlink_links",
    "last_util_ts",
    "last_field_count",
    "pci_domain",
    "pci_bus",
    "pci_device",
    "pci_device_id",
    "pci_subsystem_id",
]
StrKey = Literal["name", "uuid", "pci_bus_id"]
GlobalKey = Literal["init_refcount", "event_sets", "n_gpus", "last_wait_timeout_ms"]

_NOT_AVAILABLE: Final = 2**64 - 1
_NO_INSTANCE: Final = 0xFFFFFFFF


class FakeNvmlBuildError(RuntimeError):
    """gcc is missing or failed to compile fake_nvml.c."""


def build_fake_nvml(out_dir: Path, *, variant: str = "full", compiler: str = "gcc") -> Path:
    """Compile fake_nvml.c into ``<out_dir>/libnvidia-ml.so.1`` and return its path.

    The build is skipped when the library next to a stamp of the same source hash and variant
    already exists, so a session (or a persistent cache directory) compiles once.
    """
    try:
        flags = VARIANTS[variant]
    except KeyError:
        msg = f"unknown fake NVML variant {variant!r}; choose one of {sorted(VARIANTS)}"
        raise ValueError(msg) from None
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(repr((variant, flags, _CFLAGS)).encode())
    stamp_text = digest.hexdigest()
    library = out_dir / LIBRARY_NAME
    stamp = out_dir / _STAMP_NAME
    if library.is_file() and stamp.is_file() and stamp.read_text() == stamp_text:
        return library
    gcc = shutil.which(compiler)
    if gcc is None:
        msg = f"{compiler} is not installed: cannot build the fake NVML library from {SOURCE}"
        raise FakeNvmlBuildError(msg)
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / f".{LIBRARY_NAME}.partial"
    result = subprocess.run(
        [gcc, *_CFLAGS, *flags, "-o", str(partial), str(SOURCE)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        msg = f"{compiler} failed to build {SOURCE} ({variant}):\n{result.stderr}"
        raise FakeNvmlBuildError(msg)
    # rename() keeps a copy that a process already mapped intact.
    partial.replace(library)
    stamp.write_text(stamp_text)
    return library


@dataclass(frozen=True, slots=True)
class FakeProcess:
    """One compute process on a fake GPU; ``memory_bytes=None`` is NVML's "not available"."""

    pid: int
    memory_bytes: int | None
    sm_percent: int = 0
    memory_percent: int = 0
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class FakeMigDevice:
    """One MIG device (a GPU instance with one compute instance) of a fake GPU."""

    uuid: str
    name: str
    gpu_instance_id: int
    compute_instance_id: int
    memory_total_bytes: int
    memory_used_bytes: int
    memory_reserved_bytes: int = 0


_c_str = ctypes.c_char_p
_c_int = ctypes.c_int
_c_uint = ctypes.c_uint
_c_ull = ctypes.c_ulonglong

_SIGNATURES: Final[Mapping[str, tuple[type | None, tuple[type, ...]]]] = {
    "fake_reset": (None, (_c_int,)),
    "fake_max_gpus": (_c_int, ()),
    "fake_set_u64": (_c_int, (_c_int, _c_str, _c_ull)),
    "fake_get_u64": (_c_int, (_c_int, _c_str, ctypes.POINTER(_c_ull))),
    "fake_set_str": (_c_int, (_c_int, _c_str, _c_str)),
    "fake_get_str": (_c_int, (_c_int, _c_str, _c_str, _c_uint)),
    "fake_set_field_u64": (_c_int, (_c_int, _c_uint, _c_uint, _c_ull)),
    "fake_set_field_double": (_c_int, (_c_int, _c_uint, ctypes.c_double)),
    "fake_set_field_return": (_c_int, (_c_int, _c_uint, _c_int)),
    "fake_set_field_unsupported": (_c_int, (_c_int, _c_uint)),
    "fake_set_processes": (
        _c_int,
        (
            _c_int,
            _c_int,
            ctypes.POINTER(_c_uint),
            ctypes.POINTER(_c_ull),
            ctypes.POINTER(_c_uint),
            ctypes.POINTER(_c_uint),
        ),
    ),
    "fake_set_process_instance": (_c_int, (_c_int, _c_int, _c_uint, _c_uint)),
    "fake_set_mig": (_c_int, (_c_int, _c_int)),
    "fake_set_mig_device": (
        _c_int,
        (_c_int, _c_int, _c_str, _c_str, _c_uint, _c_uint, _c_ull, _c_ull, _c_ull),
    ),
    "fake_push_event": (_c_int, (_c_int, _c_ull, _c_ull)),
    "fake_push_xid": (_c_int, (_c_int, _c_ull)),
    "fake_set_error": (_c_int, (_c_str, _c_int, _c_int)),
    "fake_clear_errors": (None, ()),
    "fake_calls": (ctypes.c_longlong, (_c_str,)),
    "fake_calls_gpu": (ctypes.c_longlong, (_c_str, _c_int)),
    "fake_reset_calls": (None, ()),
    "fake_symbol_name": (_c_str, (_c_int,)),
}


class FakeNvml:
    """Typed control of a loaded fake NVML library (the ``fake_*`` functions of fake_nvml.c)."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.library = library
        self.path = path
        for name, (restype, argtypes) in _SIGNATURES.items():
            function = getattr(library, name)
            function.restype = restype
            function.argtypes = argtypes

    @property
    def directory(self) -> Path:
        """The directory holding ``libnvidia-ml.so.1`` (for ``LD_LIBRARY_PATH``)."""
        return self.path.parent

    def _check(self, rc: int, what: str) -> None:
        if rc == -1:
            raise KeyError(what)
        if rc == -2:
            msg = f"{what}: GPU index out of range"
            raise IndexError(msg)
        if rc < 0:
            msg = f"{what}: rejected by the fake (code {rc})"
            raise ValueError(msg)

    # --- devices ----------------------------------------------------------------------------

    def reset(self, n_gpus: int = 8) -> None:
        """Forget everything (values, errors, events, counters) and describe ``n_gpus`` GPUs."""
        self.library.fake_reset(n_gpus)

    @property
    def max_gpus(self) -> int:
        return int(self.library.fake_max_gpus())

    def set_u64(self, gpu: int, key: U64Key, value: int) -> None:
        self._check(self.library.fake_set_u64(gpu, key.encode(), value), key)

    def set_many(self, gpu: int, values: Mapping[U64Key, int]) -> None:
        for key, value in values.items():
            self.set_u64(gpu, key, value)

    def get_u64(self, gpu: int, key: U64Key) -> int:
        out = _c_ull()
        self._check(self.library.fake_get_u64(gpu, key.encode(), ctypes.byref(out)), key)
        return int(out.value)

    def get_global(self, key: GlobalKey) -> int:
        out = _c_ull()
        self._check(self.library.fake_get_u64(-1, key.encode(), ctypes.byref(out)), key)
        return int(out.value)

    @property
    def init_refcount(self) -> int:
        """nvmlInit calls not yet matched by nvmlShutdown."""
        return self.get_global("init_refcount")

    @property
    def open_event_sets(self) -> int:
        return self.get_global("event_sets")

    def set_str(self, gpu: int, key: StrKey, value: str) -> None:
        self._check(self.library.fake_set_str(gpu, key.encode(), value.encode()), key)

    def get_str(self, gpu: int, key: StrKey) -> str:
        buffer = ctypes.create_string_buffer(96)
        self._check(self.library.fake_get_str(gpu, key.encode(), buffer, len(buffer)), key)
        return buffer.value.decode()

    def set_driver_version(self, version: str) -> None:
        self._check(self.library.fake_set_str(-1, b"driver_version", version.encode()), "driver")

    def uuid(self, gpu: int) -> str:
        return self.get_str(gpu, "uuid")

    # --- field values -----------------------------------------------------------------------

    def set_field(
        self,
        gpu: int,
        field_id: int,
        value: int | float,
        value_type: int = VALUE_TYPE_UNSIGNED_LONG_LONG,
    ) -> None:
        """Set one field's value; a ``float`` is stored as NVML_VALUE_TYPE_DOUBLE."""
        if isinstance(value, float) or value_type == VALUE_TYPE_DOUBLE:
            rc = self.library.fake_set_field_double(gpu, field_id, float(value))
        else:
            rc = self.library.fake_set_field_u64(gpu, field_id, value_type, value)
        self._check(rc, f"field {field_id}")

    def set_field_return(self, gpu: int, field_id: int, code: int) -> None:
        """Make one field's entry carry ``code`` as its nvmlReturn (0 restores the value)."""
        self._check(self.library.fake_set_field_return(gpu, field_id, code), f"field {field_id}")

    def set_field_unsupported(self, gpu: int, field_id: int) -> None:
        self._check(self.library.fake_set_field_unsupported(gpu, field_id), f"field {field_id}")

    # --- processes and MIG ------------------------------------------------------------------

    def set_processes(self, gpu: int, processes: Sequence[FakeProcess]) -> None:
        """Replace the GPU's compute processes; each call is a fresh utilisation sample."""
        n = len(processes)
        pids = (_c_uint * n)(*(p.pid for p in processes))
        memory = (_c_ull * n)(
            *(_NOT_AVAILABLE if p.memory_bytes is None else p.memory_bytes for p in processes)
        )
        sm = (_c_uint * n)(*(p.sm_percent for p in processes))
        mem_util = (_c_uint * n)(*(p.memory_percent for p in processes))
        self._check(
            self.library.fake_set_processes(gpu, n, pids, memory, sm, mem_util), "processes"
        )
        for i, p in enumerate(processes):
            if p.gpu_instance_id is not None or p.compute_instance_id is not None:
                gi = _NO_INSTANCE if p.gpu_instance_id is None else p.gpu_instance_id
                ci = _NO_INSTANCE if p.compute_instance_id is None else p.compute_instance_id
                self._check(self.library.fake_set_process_instance(gpu, i, gi, ci), "instance")

    def set_mig(self, gpu: int, devices: Sequence[FakeMigDevice]) -> None:
        """Turn MIG mode on with these devices (an empty sequence turns it off)."""
        self._check(self.library.fake_set_mig(gpu, len(devices)), "mig")
        for i, d in enumerate(devices):
            rc = self.library.fake_set_mig_device(
                gpu,
                i,
                d.uuid.encode(),
                d.name.encode(),
                d.gpu_instance_id,
                d.compute_instance_id,
                d.memory_total_bytes,
                d.memory_used_bytes,
                d.memory_reserved_bytes,
            )
            self._check(rc, f"mig device {i}")

    # --- events -----------------------------------------------------------------------------

    def push_xid(self, gpu: int, xid: int) -> int:
        """Queue an XID event; returns how many registered event sets received it."""
        rc = int(self.library.fake_push_xid(gpu, xid))
        self._check(rc, "xid")
        return rc

    def push_event(self, gpu: int, event_type: int, data: int = 0) -> int:
        rc = int(self.library.fake_push_event(gpu, event_type, data))
        self._check(rc, "event")
        return rc

    # --- error injection and call counters --------------------------------------------------

    def set_error(self, symbol: str, code: int, gpu: int = -1) -> None:
        """Make ``symbol`` (or ``"*"``: every call about one GPU) return ``code``.

        ``gpu=-1`` applies to all GPUs; ``code=0`` removes the rule.
        """
        self._check(self.library.fake_set_error(symbol.encode(), gpu, code), symbol)

    def clear_error(self, symbol: str, gpu: int = -1) -> None:
        self.set_error(symbol, SUCCESS, gpu)

    def clear_errors(self) -> None:
        self.library.fake_clear_errors()

    def calls(self, symbol: str, gpu: int | None = None) -> int:
        """Calls of an NVML symbol since the last reset (on one GPU, or in total)."""
        if gpu is None:
            count = int(self.library.fake_calls(symbol.encode()))
        else:
            count = int(self.library.fake_calls_gpu(symbol.encode(), gpu))
        self._check(int(count), symbol)
        return count

    def call_counts(self) -> dict[str, int]:
        """Every symbol called since the last reset, with its total count."""
        counts: dict[str, int] = {}
        i = 0
        while (name := self.library.fake_symbol_name(i)) is not None:
            symbol = name.decode()
            count = self.calls(symbol)
            if count:
                counts[symbol] = count
            i += 1
        return counts

    def reset_calls(self) -> None:
        self.library.fake_reset_calls()
