"""What the NVML source asks NVML, as data: constants, queries, scalar metrics and field values.

Nothing here imports pynvml. The numbers are NVML's C ABI (``nvml.h``), stable across driver
releases, so this module can be read (and tested) without the library.

Units: NVML reports mW, mJ, MHz, percent, KB/s and KiB; the converters below turn them into the
OpenTelemetry units of :class:`~gpuwarden.agent.model.GpuSample` (W, J, Hz, ratio, bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

# --- nvmlReturn_t ---------------------------------------------------------------------------
NOT_SUPPORTED: Final = 3
NO_PERMISSION: Final = 4
NOT_FOUND: Final = 6
DRIVER_NOT_LOADED: Final = 9
TIMEOUT: Final = 10
LIBRARY_NOT_FOUND: Final = 12
FUNCTION_NOT_FOUND: Final = 13
GPU_IS_LOST: Final = 15
RESET_REQUIRED: Final = 16
LIB_RM_VERSION_MISMATCH: Final = 18
ARGUMENT_VERSION_MISMATCH: Final = 25
GPU_NOT_FOUND: Final = 28
UNKNOWN: Final = 999

#: Codes that mean the GPU itself is gone or unusable: its sample becomes FAILED. RESET_REQUIRED
#: is included because a GPU that needs a reset serves no work either.
LOST_CODES: Final = frozenset({GPU_IS_LOST, GPU_NOT_FOUND, UNKNOWN, RESET_REQUIRED})
#: Codes that will not change while the driver stays loaded: the call is not repeated.
PERMANENT_CODES: Final = frozenset({NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH})

# --- enums and versions ---------------------------------------------------------------------
TEMPERATURE_GPU: Final = 0
CLOCK_SM: Final = 1
CLOCK_MEM: Final = 2
PCIE_UTIL_TX_BYTES: Final = 0
PCIE_UTIL_RX_BYTES: Final = 1
MEMORY_ERROR_TYPE_CORRECTED: Final = 0
MEMORY_ERROR_TYPE_UNCORRECTED: Final = 1
VOLATILE_ECC: Final = 0
MEMORY_V2_VERSION: Final = 0x02000028  # nvmlMemory_v2
MIG_ENABLE: Final = 1
NO_INSTANCE: Final = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId outside MIG
EVENT_XID_CRITICAL_ERROR: Final = 0x8
EVENT_MIG_CONFIG_CHANGE: Final = 0x100
SCOPE_ALL_LINKS: Final = 0xFFFFFFFF  # scopeId of an NVLink field: the sum over all links

#: XIDs that make a GPU DEGRADED in the round they are seen (NVIDIA's XID catalogue):
#: 48 double-bit ECC error; 63 ECC page retirement or row remapping recorded; 64 page retirement
#: or row remapper failure; 74 NVLink error; 79 GPU has fallen off the bus; 92 high single-bit
#: ECC error rate; 94 contained ECC error; 95 uncontained ECC error.
XIDS_OF_CONCERN: Final = frozenset({48, 63, 64, 74, 79, 92, 94, 95})
#: The XID reported as an event when NVML says a GPU is lost (GPU_IS_LOST and friends). The
#: driver logs XID 79 ("fallen off the bus") for the same condition, and a lost GPU's event set
#: may never deliver it, so the source reports it itself unless the driver already did.

# --- unit conversions -----------------------------------------------------------------------


def milli(raw: Any) -> float:
    """Milli-units to units: mW → W, mJ → J."""
    return int(raw) / 1000


def mega(raw: Any) -> float:
    """MHz → Hz."""
    return int(raw) * 1_000_000.0


def percent(raw: Any) -> float:
    """Percent (0..100) → ratio (0..1)."""
    return int(raw) / 100


def kib_per_second(raw: Any) -> float:
    """PCIe throughput → bytes/s.

    NVML documents the counter as "KB/s"; we multiply by 1024, reading KB as KiB like NVML's
    other byte counters (the NVLink throughput fields say KiB explicitly). The difference from
    1000 is 2.4 %.
    """
    return float(int(raw) * 1024)


def kib(raw: Any) -> int:
    """KiB → bytes (NVLink throughput counters)."""
    return int(raw) * 1024


def integer(raw: Any) -> int:
    return int(raw)


def celsius(raw: Any) -> float:
    return float(raw)


# --- queries --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Query:
    """One pynvml call: ``function(*call_args, *args)``; ``label`` names it in logs."""

    function: str
    label: str
    args: tuple[int, ...] = ()


def _q(function: str, *args: int, label: str | None = None) -> Query:
    return Query(function, label or function, args)


INIT: Final = _q("nvmlInit")
SHUTDOWN: Final = _q("nvmlShutdown")
DRIVER_VERSION: Final = _q("nvmlSystemGetDriverVersion")
DEVICE_COUNT: Final = _q("nvmlDeviceGetCount", label="nvmlDeviceGetCount_v2")
HANDLE_BY_INDEX: Final = _q("nvmlDeviceGetHandleByIndex", label="nvmlDeviceGetHandleByIndex_v2")
NAME: Final = _q("nvmlDeviceGetName")
UUID: Final = _q("nvmlDeviceGetUUID")
PCI_INFO: Final = _q("nvmlDeviceGetPciInfo", label="nvmlDeviceGetPciInfo_v3")
MIG_MODE: Final = _q("nvmlDeviceGetMigMode")
MAX_MIG_DEVICES: Final = _q("nvmlDeviceGetMaxMigDeviceCount")
MIG_HANDLE: Final = _q("nvmlDeviceGetMigDeviceHandleByIndex")
GPU_INSTANCE_ID: Final = _q("nvmlDeviceGetGpuInstanceId")
COMPUTE_INSTANCE_ID: Final = _q("nvmlDeviceGetComputeInstanceId")
EVENT_SET_CREATE: Final = _q("nvmlEventSetCreate")
EVENT_SET_FREE: Final = _q("nvmlEventSetFree")
SUPPORTED_EVENTS: Final = _q("nvmlDeviceGetSupportedEventTypes")
REGISTER_EVENTS: Final = _q("nvmlDeviceRegisterEvents")
# Timeout 0: never wait inside a sample round.
EVENT_WAIT: Final = _q("nvmlEventSetWait", 0, label="nvmlEventSetWait_v2")

UTILIZATION: Final = _q("nvmlDeviceGetUtilizationRates")
MEMORY_V2: Final = _q(
    "nvmlDeviceGetMemoryInfo", MEMORY_V2_VERSION, label="nvmlDeviceGetMemoryInfo_v2"
)
MEMORY_V1: Final = _q("nvmlDeviceGetMemoryInfo")
TEMPERATURE_V: Final = _q(
    "nvmlDeviceGetTemperatureV", TEMPERATURE_GPU, label="nvmlDeviceGetTemperatureV(GPU)"
)
# Deprecated ("removed in CUDA 14"), but the only one on drivers older than TemperatureV.
TEMPERATURE: Final = _q(
    "nvmlDeviceGetTemperature", TEMPERATURE_GPU, label="nvmlDeviceGetTemperature(GPU)"
)
FIELD_VALUES: Final = _q("nvmlDeviceGetFieldValues")
PROCESSES: Final = _q(
    "nvmlDeviceGetComputeRunningProcesses", label="nvmlDeviceGetComputeRunningProcesses_v3"
)
PROCESS_UTILIZATION: Final = _q("nvmlDeviceGetProcessUtilization")


@dataclass(frozen=True, slots=True)
class Scalar:
    """A per-round call whose result converts into one GpuSample attribute."""

    query: Query
    attribute: str
    convert: Callable[[Any], int | float]


#: Simple per-round readings, one call each per GPU.
SCALARS: Final = (
    Scalar(_q("nvmlDeviceGetPowerUsage"), "power_watts", milli),
    Scalar(_q("nvmlDeviceGetTotalEnergyConsumption"), "energy_joules", milli),
    Scalar(
        _q("nvmlDeviceGetClockInfo", CLOCK_SM, label="nvmlDeviceGetClockInfo(SM)"),
        "sm_clock_hertz",
        mega,
    ),
    Scalar(
        _q("nvmlDeviceGetClockInfo", CLOCK_MEM, label="nvmlDeviceGetClockInfo(MEM)"),
        "memory_clock_hertz",
        mega,
    ),
    Scalar(_q("nvmlDeviceGetCurrentClocksEventReasons"), "clock_event_reasons", integer),
    Scalar(
        _q(
            "nvmlDeviceGetPcieThroughput",
            PCIE_UTIL_TX_BYTES,
            label="nvmlDeviceGetPcieThroughput(TX)",
        ),
        "pcie_tx_bytes_per_second",
        kib_per_second,
    ),
    Scalar(
        _q(
            "nvmlDeviceGetPcieThroughput",
            PCIE_UTIL_RX_BYTES,
            label="nvmlDeviceGetPcieThroughput(RX)",
        ),
        "pcie_rx_bytes_per_second",
        kib_per_second,
    ),
    Scalar(_q("nvmlDeviceGetCurrPcieLinkGeneration"), "pcie_link_generation", integer),
    Scalar(_q("nvmlDeviceGetCurrPcieLinkWidth"), "pcie_link_width", integer),
    Scalar(
        _q(
            "nvmlDeviceGetTotalEccErrors",
            MEMORY_ERROR_TYPE_CORRECTED,
            VOLATILE_ECC,
            label="nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)",
        ),
        "ecc_corrected_errors",
        integer,
    ),
    Scalar(
        _q(
            "nvmlDeviceGetTotalEccErrors",
            MEMORY_ERROR_TYPE_UNCORRECTED,
            VOLATILE_ECC,
            label="nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)",
        ),
        "ecc_uncorrected_errors",
        integer,
    ),
)

# --- field values (one nvmlDeviceGetFieldValues call per GPU per round) -----------------------


@dataclass(frozen=True, slots=True)
class Field:
    """One NVML_FI_DEV_* entry of the batched field-value read."""

    field_id: int
    name: str
    attribute: str
    convert: Callable[[Any], int | float]
    scope_id: int | None = None

    @property
    def request(self) -> int | tuple[int, int]:
        """The entry as pynvml's nvmlDeviceGetFieldValues takes it."""
        return self.field_id if self.scope_id is None else (self.field_id, self.scope_id)

    @property
    def label(self) -> str:
        return f"nvmlDeviceGetFieldValues({self.name})"


FIELDS: Final = (
    Field(186, "NVML_FI_DEV_POWER_INSTANT", "power_instant_watts", milli),  # mW
    Field(82, "NVML_FI_DEV_MEMORY_TEMP", "memory_temperature_celsius", celsius),
    Field(138, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "nvlink_tx_bytes", kib, SCOPE_ALL_LINKS),
    Field(139, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", "nvlink_rx_bytes", kib, SCOPE_ALL_LINKS),
    Field(142, "NVML_FI_DEV_REMAPPED_COR", "remapped_rows_corrected", integer),
    Field(143, "NVML_FI_DEV_REMAPPED_UNC", "remapped_rows_uncorrected", integer),
    Field(144, "NVML_FI_DEV_REMAPPED_PENDING", "remapped_rows_pending", integer),
    Field(145, "NVML_FI_DEV_REMAPPED_FAILURE", "remapped_rows_failure", integer),
)

#: The c_nvmlValue_t member to read, by nvmlValueType_t (DOUBLE, UINT, ULONG, ULONGLONG,
#: SLONGLONG, SINT, USHORT).
VALUE_MEMBERS: Final = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
