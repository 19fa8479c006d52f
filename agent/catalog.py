"""The telemetry catalog: one declarative table of every metric the agent emits.

The table drives the OpenTelemetry instruments (``agent.telemetry``), the rendered docs
(``docs/metrics.md``, via ``gpuwarden catalog --format markdown``) and the tests that check what is
emitted against what is declared, in both directions.

Names follow the OpenTelemetry hardware and system semantic conventions where they exist
(``hw.*``, ``system.*``; ``hw.id`` is the GPU or MIG UUID). Everything else lives in the one
namespace of ours, ``gpuwarden.*``. Several rows may share a metric name when they differ only in
fixed attributes (``hw.temperature`` for the GPU and for its memory); they must then agree on
instrument and unit, which a test checks.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class Instrument(enum.StrEnum):
    """OpenTelemetry instrument kinds used by the agent (all observable)."""

    GAUGE = "gauge"
    COUNTER = "counter"
    UPDOWNCOUNTER = "updowncounter"


class Scope(enum.StrEnum):
    """Which sample object a row reads its field from."""

    GPU = "gpu"
    PROCESS = "process"
    HOST = "host"
    AGENT = "agent"


class Shape(enum.StrEnum):
    """How a field's value becomes data points.

    ``scalar``: one point. ``info``: the constant 1 carrying the device's descriptive
    attributes (join on ``hw.id``), so data points need not repeat them. ``mapping``: one point
    per key, keys become the attributes named in ``MetricDef.keys``. ``one_hot``: an enum becomes
    1 for the current value and 0 for the others (``hw.status``). ``bitmask``: one 0/1 point per
    known bit (clock-event reasons).
    """

    SCALAR = "scalar"
    INFO = "info"
    MAPPING = "mapping"
    ONE_HOT = "one_hot"
    BITMASK = "bitmask"


def _frozen(values: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(values or {}))


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One row of the catalog."""

    name: str
    instrument: Instrument
    unit: str
    scope: Scope
    field: str
    source: str
    description: str
    attributes: Mapping[str, str] = dataclasses.field(default_factory=_frozen)
    shape: Shape = Shape.SCALAR
    keys: tuple[str, ...] = ()


# NVML clock-event ("throttle") reason bits (nvmlClocksEventReason*), name -> bit.
CLOCK_EVENT_REASONS: Mapping[str, int] = MappingProxyType(
    {
        "gpu_idle": 0x1,
        "applications_clocks_setting": 0x2,
        "sw_power_cap": 0x4,
        "hw_slowdown": 0x8,
        "sync_boost": 0x10,
        "sw_thermal_slowdown": 0x20,
        "hw_thermal_slowdown": 0x40,
        "hw_power_brake_slowdown": 0x80,
        "display_clock_setting": 0x100,
    }
)

GPU_STATES: tuple[str, ...] = ("ok", "degraded", "failed")

G, P, H, A = Scope.GPU, Scope.PROCESS, Scope.HOST, Scope.AGENT
GAUGE, COUNTER, UPDOWN = Instrument.GAUGE, Instrument.COUNTER, Instrument.UPDOWNCOUNTER

# fmt: off
CATALOG: tuple[MetricDef, ...] = (
    # --- GPU identity ----------------------------------------------------------------------------
    MetricDef("gpuwarden.gpu.info", GAUGE, "1", G, "uuid",
              "nvmlDeviceGetName, GetUUID, GetPciInfo_v3; MIG: GetMigDeviceHandleByIndex",
              "Always 1; carries the GPU's model, index, PCI bus id and, for MIG, its parent.",
              shape=Shape.INFO, keys=("hw.model", "hw.vendor", "gpuwarden.gpu.index",
                                      "gpuwarden.gpu.pci_bus_id", "hw.parent",
                                      "gpuwarden.gpu.mig_profile")),
    # --- GPU: utilisation and memory -------------------------------------------------------
    MetricDef("hw.gpu.utilization", GAUGE, "1", G, "utilization_ratio",
              "nvmlDeviceGetUtilizationRates().gpu (% → ratio)",
              "Fraction of the last sample period in which one or more kernels ran.",
              _frozen({"hw.gpu.task": "general"})),
    MetricDef("gpuwarden.gpu.memory_controller.utilization", GAUGE, "1", G,
              "memory_utilization_ratio", "nvmlDeviceGetUtilizationRates().memory (% → ratio)",
              "Fraction of the last sample period in which device memory was read or written."),
    MetricDef("hw.gpu.memory.usage", UPDOWN, "By", G, "memory_used_bytes",
              "nvmlDeviceGetMemoryInfo_v2().used (bytes)", "GPU memory in use."),
    MetricDef("hw.gpu.memory.limit", UPDOWN, "By", G, "memory_total_bytes",
              "nvmlDeviceGetMemoryInfo_v2().total (bytes)", "Total GPU memory."),
    MetricDef("gpuwarden.gpu.memory.reserved", UPDOWN, "By", G, "memory_reserved_bytes",
              "nvmlDeviceGetMemoryInfo_v2().reserved (bytes)",
              "GPU memory reserved by the driver and firmware, not usable by processes."),
    # --- power and energy ----------------------------------------------------------------------
    MetricDef("hw.power", GAUGE, "W", G, "power_watts",
              "nvmlDeviceGetPowerUsage (mW → W)",
              "Power draw; averaged over 1 s on Ampere (except GA100) and newer, instantaneous "
              "before.", _frozen({"hw.type": "gpu"})),
    MetricDef("gpuwarden.gpu.power.instant", GAUGE, "W", G, "power_instant_watts",
              "nvmlDeviceGetFieldValues(NVML_FI_DEV_POWER_INSTANT) (mW → W)",
              "Instantaneous power draw, where the device supports it."),
    MetricDef("hw.energy", COUNTER, "J", G, "energy_joules",
              "nvmlDeviceGetTotalEnergyConsumption (mJ → J)",
              "Energy consumed since the driver was loaded (use its deltas for accounting).",
              _frozen({"hw.type": "gpu"})),
    # --- temperature and clocks ----------------------------------------------------------------
    MetricDef("hw.temperature", GAUGE, "Cel", G, "temperature_celsius",
              "nvmlDeviceGetTemperatureV(NVML_TEMPERATURE_GPU), else nvmlDeviceGetTemperature",
              "GPU die temperature.",
              _frozen({"hw.type": "gpu", "hw.sensor_location": "gpu"})),
    MetricDef("hw.temperature", GAUGE, "Cel", G, "memory_temperature_celsius",
              "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)", "GPU memory (HBM) temperature.",
              _frozen({"hw.type": "gpu", "hw.sensor_location": "memory"})),
    MetricDef("gpuwarden.gpu.clock.frequency", GAUGE, "Hz", G, "sm_clock_hertz",
              "nvmlDeviceGetClockInfo(NVML_CLOCK_SM) (MHz → Hz)", "Current SM clock.",
              _frozen({"gpuwarden.clock.domain": "sm"})),
    MetricDef("gpuwarden.gpu.clock.frequency", GAUGE, "Hz", G, "memory_clock_hertz",
              "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM) (MHz → Hz)", "Current memory clock.",
              _frozen({"gpuwarden.clock.domain": "memory"})),
    MetricDef("gpuwarden.gpu.clock_event.active", GAUGE, "1", G, "clock_event_reasons",
              "nvmlDeviceGetCurrentClocksEventReasons (bitmask)",
              "1 while the named reason holds the clocks down (throttling), else 0.",
              shape=Shape.BITMASK, keys=("gpuwarden.clock_event.reason",)),
    # --- PCIe and NVLink -----------------------------------------------------------------------
    MetricDef("gpuwarden.gpu.pcie.throughput", GAUGE, "By/s", G, "pcie_tx_bytes_per_second",
              "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES) (KiB/s → B/s)",
              "PCIe transmit throughput over NVML's last 20 ms window.",
              _frozen({"network.io.direction": "transmit"})),
    MetricDef("gpuwarden.gpu.pcie.throughput", GAUGE, "By/s", G, "pcie_rx_bytes_per_second",
              "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES) (KiB/s → B/s)",
              "PCIe receive throughput over NVML's last 20 ms window.",
              _frozen({"network.io.direction": "receive"})),
    MetricDef("gpuwarden.gpu.pcie.link.generation", GAUGE, "1", G, "pcie_link_generation",
              "nvmlDeviceGetCurrPcieLinkGeneration", "Current PCIe link generation."),
    MetricDef("gpuwarden.gpu.pcie.link.width", GAUGE, "{lane}", G, "pcie_link_width",
              "nvmlDeviceGetCurrPcieLinkWidth", "Current PCIe link width."),
    MetricDef("gpuwarden.gpu.nvlink.io", COUNTER, "By", G, "nvlink_tx_bytes",
              "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, all links) "
              "(KiB → B)", "NVLink data bytes transmitted, all links.",
              _frozen({"network.io.direction": "transmit"})),
    MetricDef("gpuwarden.gpu.nvlink.io", COUNTER, "By", G, "nvlink_rx_bytes",
              "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, all links) "
              "(KiB → B)", "NVLink data bytes received, all links.",
              _frozen({"network.io.direction": "receive"})),
    # --- errors and health ---------------------------------------------------------------------
    MetricDef("hw.errors", COUNTER, "{error}", G, "ecc_corrected_errors",
              "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)",
              "Corrected ECC memory errors since the last driver load.",
              _frozen({"hw.type": "gpu", "error.type": "corrected"})),
    MetricDef("hw.errors", COUNTER, "{error}", G, "ecc_uncorrected_errors",
              "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)",
              "Uncorrected ECC memory errors since the last driver load.",
              _frozen({"hw.type": "gpu", "error.type": "uncorrected"})),
    MetricDef("gpuwarden.gpu.memory.remapped_rows", GAUGE, "{row}", G, "remapped_rows_corrected",
              "nvmlDeviceGetFieldValues(NVML_FI_DEV_REMAPPED_COR)",
              "Rows remapped because of correctable errors.",
              _frozen({"gpuwarden.remap.cause": "correctable"})),
    MetricDef("gpuwarden.gpu.memory.remapped_rows", GAUGE, "{row}", G,
              "remapped_rows_uncorrected", "nvmlDeviceGetFieldValues(NVML_FI_DEV_REMAPPED_UNC)",
              "Rows remapped because of uncorrectable errors.",
              _frozen({"gpuwarden.remap.cause": "uncorrectable"})),
    MetricDef("gpuwarden.gpu.memory.remap_pending", GAUGE, "1", G, "remapped_rows_pending",
              "nvmlDeviceGetFieldValues(NVML_FI_DEV_REMAPPED_PENDING)",
              "1 if a row remap is pending (needs a GPU reset), else 0."),
    MetricDef("gpuwarden.gpu.memory.remap_failure", GAUGE, "1", G, "remapped_rows_failure",
              "nvmlDeviceGetFieldValues(NVML_FI_DEV_REMAPPED_FAILURE)",
              "1 if a row remap failed (the GPU should be replaced), else 0."),
    MetricDef("gpuwarden.gpu.xid.errors", COUNTER, "{error}", G, "xid_counts",
              "nvmlEventSetWait_v2 (nvmlEventTypeXidCriticalError)",
              "XID events seen since the agent started, by XID code.",
              shape=Shape.MAPPING, keys=("gpuwarden.gpu.xid",)),
    MetricDef("gpuwarden.gpu.xid.last", GAUGE, "1", G, "last_xid",
              "nvmlEventSetWait_v2 (nvmlEventTypeXidCriticalError)",
              "Code of the last XID event seen since the agent started."),
    MetricDef("hw.status", UPDOWN, "1", G, "status",
              "derived: lost GPU → failed; XID of concern, pending or failed remap → degraded",
              "1 for the GPU's current state, 0 for the others.",
              _frozen({"hw.type": "gpu"}), shape=Shape.ONE_HOT, keys=("hw.state",)),
    # --- per-process (attributes carry pid and job) --------------------------------------------
    MetricDef("gpuwarden.gpu.process.memory.usage", UPDOWN, "By", P, "gpu_memory_bytes",
              "nvmlDeviceGetComputeRunningProcesses_v3().usedGpuMemory (bytes)",
              "GPU memory held by one process."),
    MetricDef("gpuwarden.gpu.process.utilization", GAUGE, "1", P, "sm_utilization_ratio",
              "nvmlDeviceGetProcessUtilization().smUtil (% → ratio)",
              "Fraction of time the process had kernels on the SMs."),
    MetricDef("gpuwarden.gpu.process.memory_controller.utilization", GAUGE, "1", P,
              "memory_utilization_ratio", "nvmlDeviceGetProcessUtilization().memUtil (% → ratio)",
              "Fraction of time the process was reading or writing device memory."),
    # --- host ----------------------------------------------------------------------------------
    MetricDef("system.cpu.time", COUNTER, "s", H, "cpu_time_seconds",
              "/proc/stat (USER_HZ → s)", "CPU time of all logical CPUs by mode.",
              shape=Shape.MAPPING, keys=("cpu.mode",)),
    MetricDef("system.cpu.logical.count", UPDOWN, "{cpu}", H, "cpu_count", "/proc/stat",
              "Logical CPUs."),
    MetricDef("system.memory.usage", UPDOWN, "By", H, "memory_bytes",
              "/proc/meminfo (kB → B)", "Host memory by state.",
              shape=Shape.MAPPING, keys=("system.memory.state",)),
    MetricDef("system.memory.limit", UPDOWN, "By", H, "memory_limit_bytes",
              "/proc/meminfo MemTotal (kB → B)", "Total host memory."),
    MetricDef("system.disk.io", COUNTER, "By", H, "disk_io_bytes",
              "/proc/diskstats (sectors x 512 → B)", "Bytes read and written per whole disk.",
              shape=Shape.MAPPING, keys=("system.device", "disk.io.direction")),
    MetricDef("system.network.io", COUNTER, "By", H, "network_io_bytes", "/proc/net/dev",
              "Bytes received and transmitted per interface (loopback excluded).",
              shape=Shape.MAPPING, keys=("network.interface.name", "network.io.direction")),
    MetricDef("hw.energy", COUNTER, "J", H, "cpu_energy_joules",
              "/sys/class/powercap/intel-rapl:*/energy_uj (µJ → J, wrap-around handled)",
              "CPU package energy from RAPL, where readable.",
              _frozen({"hw.type": "cpu"}), shape=Shape.MAPPING, keys=("hw.id",)),
    # --- the agent itself ----------------------------------------------------------------------
    MetricDef("gpuwarden.agent.samples", COUNTER, "{round}", A, "sample_rounds",
              "agent", "Sample rounds taken since the agent started; one per export."),
    MetricDef("gpuwarden.agent.sample.duration", GAUGE, "s", A, "last_sample_seconds",
              "agent", "Wall time of the last sample round."),
    MetricDef("gpuwarden.agent.spool.usage", UPDOWN, "By", A, "spool_bytes",
              "agent", "Bytes of unsent OTLP requests waiting in the on-disk spool."),
    MetricDef("gpuwarden.agent.spool.evicted", COUNTER, "{request}", A, "spool_evicted",
              "agent", "Unsent requests dropped because the spool reached its size cap."),
    MetricDef("gpuwarden.agent.export.rejected", COUNTER, "{request}", A, "export_rejected",
              "agent", "Requests the collector rejected permanently (4xx other than 401/403)."),
)
# fmt: on


def metric_names() -> frozenset[str]:
    """Every distinct metric name in the catalog."""
    return frozenset(row.name for row in CATALOG)


def rows_by_name() -> dict[str, tuple[MetricDef, ...]]:
    """Catalog rows grouped by metric name, in table order."""
    grouped: dict[str, list[MetricDef]] = {}
    for row in CATALOG:
        grouped.setdefault(row.name, []).append(row)
    return {name: tuple(rows) for name, rows in grouped.items()}


def render_markdown() -> str:
    """The catalog as a Markdown table (the source of ``docs/metrics.md``)."""
    lines = [
        "# Telemetry catalog",
        "",
        "Generated from `agent/catalog.py` by `gpuwarden catalog --format markdown`; a test keeps "
        "this file in step with the code.",
        "",
        "Every GPU point carries one identifying attribute, `hw.id` (GPU or MIG UUID); the "
        "descriptive ones (model, index, PCI bus id, MIG parent and profile) are on "
        "`gpuwarden.gpu.info`, joined on `hw.id` (e.g. `... * on (hw_id) group_left(hw_model) "
        "gpuwarden_gpu_info`), so they are not repeated on every point. Per-process points carry "
        "`hw.id`, `process.pid` and, when "
        "attributed, `gpuwarden.job.scheduler` plus `gpuwarden.job.id` (Slurm) or "
        "`k8s.pod.uid` and `container.id` (Kubernetes).",
        "",
        "| name | instrument | unit | scope | attributes | source | description |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in CATALOG:
        attrs = [f"`{k}={v}`" for k, v in row.attributes.items()]
        attrs += [f"`{k}`" for k in row.keys]
        lines.append(
            f"| `{row.name}` | {row.instrument} | `{row.unit}` | {row.scope} | "
            f"{', '.join(attrs)} | {row.source} | {row.description} |"
        )
    return "\n".join(lines) + "\n"
