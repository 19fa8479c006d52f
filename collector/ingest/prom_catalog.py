"""The Prometheus mapping table: dcgm-exporter series as the points our own agent sends.

One declarative row per dcgm-exporter field, like the agent's telemetry catalog
(``gpuwarden.agent.catalog``): the series name as remote-write carries it, its type and unit as
dcgm-exporter prints them, and the metric, instrument, unit, scale and fixed attributes it
becomes. :mod:`.prom_map` reads it; ``docs/metrics.md`` renders it (:func:`render_markdown`);
tests check the doc and the table both ways, and every row that lands on an agent metric against
the agent's catalog (same instrument, same unit).

Model-server series (vLLM, Triton) are not repeated here: their one table is
``gpuwarden.collector.ingest.scrape.MODEL_METRICS`` (``docs/model-metrics.md``), which
:mod:`.prom_map` reads for remote-written series too.

Sources, checked for every name, type and unit below:

- dcgm-exporter ``etc/default-counters.csv`` and ``etc/dcp-metrics-included.csv``
  (github.com/NVIDIA/dcgm-exporter at d5e5f51, 2026-05-12): names, Prometheus types, help text
  with units; ``default`` marks the rows enabled (not commented out) in ``default-counters.csv``
  (a copy is ``tests/data/dcgm-exporter-default-counters.csv``; a test checks types and flags);
- DCGM ``dcgmlib/dcgm_fields.h`` (github.com/NVIDIA/DCGM): units the help text omits
  (``DCGM_FI_DEV_FB_*`` "in MB", computed by DCGM as MiB; ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``
  "in mJ"; ``DCGM_FI_PROF_*_BYTES`` bytes per second); ``dcgmlib/src/DcgmCacheManager.cpp``
  ``ReadAndCacheNvLinkBandwidth``: ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` is NVML's KiB counters
  of both directions turned into a rate and divided by 1000 (so one unit is 1,024,000 B/s);
- dcgm-exporter ``internal/pkg/rendermetrics/render_metrics.go`` and
  ``internal/pkg/transformation/{const,kubernetes}.go``: the labels (``gpu``, ``UUID``,
  ``pci_bus_id``, ``device``, ``modelName``, ``GPU_I_PROFILE``, ``GPU_I_ID``, ``Hostname`` in
  every release up to 4.5.3-4.8.2 and ``hostname`` after commit d5e5f51, ``pod``,
  ``namespace``, ``container``, ``pod_uid``, ``hpc_job``).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from gpuwarden.agent.catalog import Instrument, metric_names


def _frozen(values: Mapping[str, str] | None = None) -> Mapping[str, str]:
    return MappingProxyType(dict(values or {}))


@dataclass(frozen=True, slots=True)
class PromRow:
    """One dcgm-exporter series and the point it becomes."""

    source: str
    """The series name (``__name__``) as dcgm-exporter prints it and remote-write carries it."""
    source_type: str
    """``gauge`` or ``counter``, as dcgm-exporter's ``# TYPE`` line says."""
    source_unit: str
    """The unit dcgm-exporter reports in (``%``, ``MiB``, ``mJ``, ``MHz``, ...)."""
    name: str
    """Our metric name: the agent catalog's where it measures the same thing."""
    instrument: Instrument
    unit: str
    scale: float
    """Our value = the source value x ``scale`` (percent -> ratio: 0.01, MiB -> bytes: 2**20)."""
    description: str
    attributes: Mapping[str, str] = dataclasses.field(default_factory=_frozen)
    default: bool = False
    """Enabled in dcgm-exporter's ``etc/default-counters.csv``."""
    pod_metric: str | None = None
    """Where dcgm-exporter (time-sharing, per-process) gives a per-pod value beside the device's:
    the agent's per-process metric that value becomes."""

    @property
    def kind(self) -> str:
        """The OTLP data kind the agent sends this instrument as (``gauge`` or ``sum``)."""
        return "gauge" if self.instrument is Instrument.GAUGE else "sum"

    @property
    def monotonic(self) -> bool:
        """A monotonic sum (a counter)."""
        return self.instrument is Instrument.COUNTER


GAUGE, COUNTER, UPDOWN = Instrument.GAUGE, Instrument.COUNTER, Instrument.UPDOWNCOUNTER
PERCENT, MIB, MHZ = 0.01, float(1 << 20), 1e6
GPU_TYPE = {"hw.type": "gpu"}
NS = "gpuwarden.gpu."

# fmt: off
DCGM_ROWS: tuple[PromRow, ...] = (
    # --- utilisation -----------------------------------------------------------------------------
    PromRow("DCGM_FI_DEV_GPU_UTIL", "gauge", "%", "hw.gpu.utilization", GAUGE, "1", PERCENT,
            "Fraction of the sample period in which one or more kernels ran.",
            _frozen({"hw.gpu.task": "general"}), default=True,
            pod_metric="gpuwarden.gpu.process.utilization"),
    PromRow("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "%", NS + "memory_controller.utilization",
            GAUGE, "1", PERCENT, "Fraction of the sample period device memory was read or written.",
            default=True),
    PromRow("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "ratio", NS + "activity", GAUGE, "1", 1.0,
            "Fraction of time the graphics/compute engine was active (DCP).",
            _frozen({"gpuwarden.gpu.unit": "graphics_engine"}), default=True),
    PromRow("DCGM_FI_PROF_SM_ACTIVE", "gauge", "ratio", NS + "activity", GAUGE, "1", 1.0,
            "Fraction of cycles an SM had at least one warp assigned, over all SMs (DCP).",
            _frozen({"gpuwarden.gpu.unit": "sm"})),
    PromRow("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "ratio", NS + "activity", GAUGE, "1", 1.0,
            "Fraction of cycles the tensor (HMMA) pipe was active (DCP).",
            _frozen({"gpuwarden.gpu.unit": "tensor_pipe"}), default=True),
    PromRow("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "ratio", NS + "activity", GAUGE, "1", 1.0,
            "Fraction of cycles the device memory interface was sending or receiving (DCP).",
            _frozen({"gpuwarden.gpu.unit": "dram"}), default=True),
    PromRow("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "ratio", NS + "activity", GAUGE, "1", 1.0,
            "Fraction of cycles the FP64 pipes were active (DCP).",
            _frozen({"gpuwarden.gpu.unit": "fp64_pipe"})),
    PromRow("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "ratio", NS + "activity", GAUGE, "1", 1.0,
            "Fraction of cycles the FP32 pipes were active (DCP).",
            _frozen({"gpuwarden.gpu.unit": "fp32_pipe"})),
    PromRow("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "ratio", NS + "activity", GAUGE, "1", 1.0,
            "Fraction of cycles the FP16 pipes were active (DCP).",
            _frozen({"gpuwarden.gpu.unit": "fp16_pipe"})),
    PromRow("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "ratio", NS + "sm.occupancy", GAUGE, "1", 1.0,
            "Resident warps per SM relative to the maximum, over all SMs (DCP)."),
    PromRow("DCGM_FI_DEV_ENC_UTIL", "gauge", "%", NS + "codec.utilization", GAUGE, "1", PERCENT,
            "Video encoder utilisation.", _frozen({"gpuwarden.gpu.codec": "encoder"}),
            default=True),
    PromRow("DCGM_FI_DEV_DEC_UTIL", "gauge", "%", NS + "codec.utilization", GAUGE, "1", PERCENT,
            "Video decoder utilisation.", _frozen({"gpuwarden.gpu.codec": "decoder"}),
            default=True),
    # --- memory ----------------------------------------------------------------------------------
    PromRow("DCGM_FI_DEV_FB_USED", "gauge", "MiB", "hw.gpu.memory.usage", UPDOWN, "By", MIB,
            "GPU memory in use.", default=True,
            pod_metric="gpuwarden.gpu.process.memory.usage"),
    PromRow("DCGM_FI_DEV_FB_TOTAL", "gauge", "MiB", "hw.gpu.memory.limit", UPDOWN, "By", MIB,
            "Total GPU memory (else used + free + reserved, see below)."),
    PromRow("DCGM_FI_DEV_FB_FREE", "gauge", "MiB", NS + "memory.free", UPDOWN, "By", MIB,
            "GPU memory free.", default=True),
    PromRow("DCGM_FI_DEV_FB_RESERVED", "gauge", "MiB", NS + "memory.reserved", UPDOWN, "By", MIB,
            "GPU memory reserved by the driver and firmware.", default=True),
    # --- power and energy ------------------------------------------------------------------------
    PromRow("DCGM_FI_DEV_POWER_USAGE", "gauge", "W", "hw.power", GAUGE, "W", 1.0,
            "Power draw.", _frozen(GPU_TYPE), default=True),
    PromRow("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "mJ", "hw.energy", COUNTER, "J",
            1e-3, "Energy since the driver was loaded.", _frozen(GPU_TYPE), default=True),
    # --- temperature and clocks ------------------------------------------------------------------
    PromRow("DCGM_FI_DEV_GPU_TEMP", "gauge", "C", "hw.temperature", GAUGE, "Cel", 1.0,
            "GPU die temperature.", _frozen({**GPU_TYPE, "hw.sensor_location": "gpu"}),
            default=True),
    PromRow("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "C", "hw.temperature", GAUGE, "Cel", 1.0,
            "GPU memory (HBM) temperature.", _frozen({**GPU_TYPE, "hw.sensor_location": "memory"}),
            default=True),
    PromRow("DCGM_FI_DEV_SM_CLOCK", "gauge", "MHz", NS + "clock.frequency", GAUGE, "Hz", MHZ,
            "Current SM clock.", _frozen({"gpuwarden.clock.domain": "sm"}), default=True),
    PromRow("DCGM_FI_DEV_MEM_CLOCK", "gauge", "MHz", NS + "clock.frequency", GAUGE, "Hz", MHZ,
            "Current memory clock.", _frozen({"gpuwarden.clock.domain": "memory"}), default=True),
    # --- PCIe and NVLink -------------------------------------------------------------------------
    PromRow("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "B/s", NS + "pcie.throughput", GAUGE, "By/s",
            1.0, "PCIe transmit throughput, headers included (DCP).",
            _frozen({"network.io.direction": "transmit"}), default=True),
    PromRow("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "B/s", NS + "pcie.throughput", GAUGE, "By/s",
            1.0, "PCIe receive throughput, headers included (DCP).",
            _frozen({"network.io.direction": "receive"}), default=True),
    PromRow("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "1", NS + "pcie.link.generation", GAUGE, "1",
            1.0, "Current PCIe link generation."),
    PromRow("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "lanes", NS + "pcie.link.width", GAUGE,
            "{lane}", 1.0, "Current PCIe link width."),
    PromRow("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "1", NS + "pcie.replays", COUNTER,
            "{replay}", 1.0, "PCIe retries.", default=True),
    PromRow("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "B/s", NS + "nvlink.throughput", GAUGE,
            "By/s", 1.0, "NVLink transmit throughput, all links, headers included (DCP).",
            _frozen({"network.io.direction": "transmit"})),
    PromRow("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "B/s", NS + "nvlink.throughput", GAUGE,
            "By/s", 1.0, "NVLink receive throughput, all links, headers included (DCP).",
            _frozen({"network.io.direction": "receive"})),
    PromRow("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "KiB/s / 1000",
            NS + "nvlink.bandwidth", GAUGE, "By/s", 1_024_000.0,
            "NVLink data throughput of both directions, all links (a rate, though typed counter).",
            default=True),
    # --- errors and health -----------------------------------------------------------------------
    PromRow("DCGM_FI_DEV_XID_ERRORS", "gauge", "1", NS + "xid.last", GAUGE, "1", 1.0,
            "Code of the last XID error.", default=True),
    PromRow("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "1", "hw.errors", COUNTER, "{error}", 1.0,
            "Single-bit (corrected) volatile ECC errors.",
            _frozen({**GPU_TYPE, "error.type": "corrected"})),
    PromRow("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "1", "hw.errors", COUNTER, "{error}", 1.0,
            "Double-bit (uncorrected) volatile ECC errors.",
            _frozen({**GPU_TYPE, "error.type": "uncorrected"})),
    PromRow("DCGM_FI_DEV_RETIRED_SBE", "counter", "1", NS + "memory.retired_pages", GAUGE,
            "{page}", 1.0, "Pages retired for single-bit errors.",
            _frozen({"gpuwarden.retire.cause": "single_bit"})),
    PromRow("DCGM_FI_DEV_RETIRED_DBE", "counter", "1", NS + "memory.retired_pages", GAUGE,
            "{page}", 1.0, "Pages retired for double-bit errors.",
            _frozen({"gpuwarden.retire.cause": "double_bit"})),
    PromRow("DCGM_FI_DEV_RETIRED_PENDING", "counter", "1", NS + "memory.retire_pending", GAUGE,
            "{page}", 1.0, "Pages pending retirement."),
    PromRow("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "1", NS + "memory.remapped_rows",
            GAUGE, "{row}", 1.0, "Rows remapped because of correctable errors.",
            _frozen({"gpuwarden.remap.cause": "correctable"}), default=True),
    PromRow("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "1",
            NS + "memory.remapped_rows", GAUGE, "{row}", 1.0,
            "Rows remapped because of uncorrectable errors.",
            _frozen({"gpuwarden.remap.cause": "uncorrectable"}), default=True),
    PromRow("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "1", NS + "memory.remap_pending", GAUGE, "1",
            1.0, "1 if a row remap is pending (needs a GPU reset), else 0."),
    PromRow("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "1", NS + "memory.remap_failure", GAUGE, "1",
            1.0, "1 if a row remap failed, else 0.", default=True),
)
# fmt: on

BY_SOURCE: Mapping[str, PromRow] = MappingProxyType({row.source: row for row in DCGM_ROWS})

#: Label names dcgm-exporter uses, old spellings after new (``UUID``/``uuid`` with
#: ``--use-old-namespace``; ``Hostname`` in the releases, ``hostname`` after commit d5e5f51).
HOST_LABELS = ("hostname", "Hostname")
UUID_LABELS = ("UUID", "uuid")
MODEL_LABELS = ("modelName", "model_name")
POD_LABELS = ("pod", "pod_name")
NAMESPACE_LABELS = ("namespace", "pod_namespace")
CONTAINER_LABELS = ("container", "container_name")
POD_UID_LABEL, HPC_JOB_LABEL = "pod_uid", "hpc_job"
MIG_ID_LABEL, MIG_PROFILE_LABEL = "GPU_I_ID", "GPU_I_PROFILE"

#: How dcgm-exporter's labels become our attributes (rendered under the table).
LABELS: tuple[tuple[str, str], ...] = (
    ("`Hostname` (releases 3.x to 4.5.3-4.8.2), `hostname` (main since 2026-05, #655)",
     "resource `host.name`: the node, as our agent names it"),
    ("`UUID` (`uuid` with `--use-old-namespace`)",
     "`hw.id` on every point: the GPU's UUID, as the agent sends it"),
    ("`gpu`", "`gpuwarden.gpu.index` on `gpuwarden.gpu.info`"),
    ("`modelName`, `pci_bus_id`",
     "`hw.model`, `gpuwarden.gpu.pci_bus_id` on `gpuwarden.gpu.info` (with `hw.vendor=NVIDIA`)"),
    ("`GPU_I_ID`, `GPU_I_PROFILE` (MIG)",
     "`hw.id` = `<UUID>/gi-<GPU_I_ID>`, `hw.parent` = `UUID`, `gpuwarden.gpu.mig_profile`; "
     "the parent GPU gets its own `gpuwarden.gpu.info`"),
    ("`pod_uid`",
     "`gpuwarden.job.scheduler=kubernetes`, `k8s.pod.uid`: the job `k8s:<uid>`, as the "
     "Kubernetes job source keys pods"),
    ("`pod`, `namespace` (without `pod_uid`)",
     "`gpuwarden.job.scheduler=kubernetes`, `gpuwarden.job.id=<namespace>/<pod>`: the "
     "Kubernetes job source's id of the pod"),
    ("`container`", "`k8s.container.name` (beside `k8s.pod.name`, `k8s.namespace.name`)"),
    ("`hpc_job`", "`gpuwarden.job.scheduler=slurm`, `gpuwarden.job.id=<hpc_job>`"),
    ("`device`, `DCGM_FI_DRIVER_VERSION`, `err_code`, `err_msg`, `instance`, `job`, the rest",
     "dropped"),
)  # fmt: skip


def render_markdown() -> str:
    """The table as the generated section of ``docs/metrics.md``."""
    lines = [
        "## Bring your own telemetry: dcgm-exporter series",
        "",
        "Generated from `collector/ingest/prom_catalog.py` by "
        "`python -m gpuwarden.collector.ingest.prom_catalog docs/metrics.md`; a test keeps it in "
        "step with the code. Series that a Prometheus remote-writes to the collector become the "
        "points our agent sends for the same facts (`collector/ingest/prom_map.py`), so the "
        "store, accounting and detection treat them alike. *default*: enabled in "
        "dcgm-exporter's `etc/default-counters.csv`; the others need a custom counters file. "
        "Metrics in **bold** are not in the agent's catalog above (only dcgm-exporter gives "
        "them).",
        "",
        "| dcgm-exporter series | type | unit | becomes | instrument | unit | x | attributes "
        "| default |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    agent = metric_names()
    for row in DCGM_ROWS:
        name = f"`{row.name}`" if row.name in agent else f"**`{row.name}`**"
        attrs = ", ".join(f"`{k}={v}`" for k, v in row.attributes.items())
        lines.append(
            f"| `{row.source}` | {row.source_type} | {row.source_unit} | {name} | "
            f"{row.instrument} | `{row.unit}` | {row.scale:.10g} | {attrs} | "
            f"{'yes' if row.default else ''} |"
        )
    lines += [
        "",
        "| dcgm-exporter label | becomes |",
        "|---|---|",
        *(f"| {label} | {becomes} |" for label, becomes in LABELS),
        "",
        "One GPU seen by several pods (time-slicing: dcgm-exporter repeats every GPU series once "
        "per pod) is one GPU: its values are kept once per time, and each pod becomes a "
        "`gpuwarden.gpu.process.memory.usage` point on it (the pod's own memory where "
        "dcgm-exporter gives per-pod `DCGM_FI_DEV_FB_USED`, else the GPU's used memory split "
        "evenly), which is how accounting and detection see jobs on GPUs. Without "
        "`DCGM_FI_DEV_FB_TOTAL`, `hw.gpu.memory.limit` is used + free + reserved. A counter also "
        "maps under its name with `_total` (an OpenTelemetry Collector's "
        "`prometheusremotewrite` exporter appends it). Set the collector's `step_seconds` to "
        "the Prometheus scrape interval (or a multiple of it): accounting reads a pod's hold on "
        "a GPU per store slot; a slot that no scrape lands in is held by the pods seen on both "
        "sides of it when the gap is short (at most `max(30 s, 3 ×` the GPU's sampling "
        "spacing`)`), and by no job when it is longer. "
        "Model-server series (vLLM, Triton, TGI) map as in [model-metrics.md](model-metrics.md).",
        "",
    ]
    return "\n".join(lines)


BEGIN = "<!-- BEGIN generated: prom_catalog -->\n"
END = "<!-- END generated: prom_catalog -->\n"


def spliced(document: str) -> str:
    """``document`` with its generated section replaced (appended when it has none)."""
    section = BEGIN + render_markdown() + END
    head, found, rest = document.partition(BEGIN)
    if not found:
        return document.rstrip("\n") + "\n\n" + section
    return head + section + rest.partition(END)[2]


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated section of the Markdown file named in ``argv``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gpuwarden.collector.ingest.prom_catalog docs/metrics.md")
        return 2
    path = Path(args[0])
    path.write_text(spliced(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
