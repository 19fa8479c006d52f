"""A local stand-in for dcgm-exporter: its Prometheus exposition for a scripted fleet of GPUs.

The page is what dcgm-exporter 3.x/4.x prints (``internal/pkg/rendermetrics/render_metrics.go``,
github.com/NVIDIA/dcgm-exporter): one ``# HELP``/``# TYPE`` pair per field of the default counters
file (``etc/default-counters.csv``, help text verbatim), then one sample per GPU with the labels
``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, (MIG: ``GPU_I_PROFILE``,
``GPU_I_ID``), ``Hostname`` (``hostname`` after commit d5e5f51: ``hostname_label``), the label
fields (``DCGM_FI_DRIVER_VERSION``) and the pod attributes in Go's sorted map order
(``container``, ``namespace``, ``pod``, and ``pod_uid`` with ``--kubernetes-enable-pod-uid``).
Integer fields print as ``%d``, double fields as ``%f`` (``gpu_collector.go: toString``);
``DCGM_FI_DEV_XID_ERRORS`` carries ``err_code``/``err_msg``. A GPU shared by several pods
(``--kubernetes-virtual-gpus``, time-slicing) prints one sample per pod; a GPU no pod holds
prints one without pod labels.

:class:`DcgmFleet` is the data (nodes x GPUs, each GPU's values and pods) with a small API to set
them; :func:`serve_fleet` serves every node's page on its own loopback port (one exporter per
node, as a DaemonSet runs it) at ``/metrics``, and ``POST /values`` sets values over HTTP for a
test that runs the server in another process. Energy is a counter: :meth:`DcgmFleet.advance`
integrates each GPU's power over the time that passed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

from aiohttp import web

DRIVER_VERSION = "550.54.15"
MODEL = "NVIDIA H100 80GB HBM3"
XID_TEXT = {0: "No Error", 13: "Graphics Engine Exception", 31: "GPU memory page fault",
            43: "GPU stopped processing", 48: "Double Bit ECC Error",
            79: "GPU has fallen off the bus"}  # fmt: skip
"""A few of ``internal/pkg/collector/xid_errors.go``'s texts; others print ``Unknown Error``."""

# (field, Prometheus type, help, printed as a double) in default-counters.csv order
FIELDS: tuple[tuple[str, str, str, bool], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", False),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", False),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", False),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", False),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", True),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ).", False),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", False),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", False),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", False),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", False),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", False),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", False),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", False),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", False),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", False),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
     "Total number of NVLink bandwidth counters for all lanes.", False),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", False),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors", False),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors", False),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", False),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
     True),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
     "Ratio of cycles the tensor (HMMA) pipe is active.", True),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data.", True),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
     "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
     "payloads - in bytes per second.", False),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
     "The rate of data received over the PCIe bus - including both protocol headers and data "
     "payloads - in bytes per second.", False),
)  # fmt: skip
FIELD_NAMES = frozenset(f[0] for f in FIELDS)

IDLE = {"DCGM_FI_DEV_SM_CLOCK": 345.0, "DCGM_FI_DEV_MEM_CLOCK": 2619.0,
        "DCGM_FI_DEV_MEMORY_TEMP": 33.0, "DCGM_FI_DEV_GPU_TEMP": 31.0,
        "DCGM_FI_DEV_POWER_USAGE": 72.5, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 0.0,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0, "DCGM_FI_DEV_GPU_UTIL": 0.0,
        "DCGM_FI_DEV_MEM_COPY_UTIL": 0.0, "DCGM_FI_DEV_ENC_UTIL": 0.0,
        "DCGM_FI_DEV_DEC_UTIL": 0.0, "DCGM_FI_DEV_XID_ERRORS": 0.0,
        "DCGM_FI_DEV_FB_FREE": 80_553.0, "DCGM_FI_DEV_FB_USED": 0.0,
        "DCGM_FI_DEV_FB_RESERVED": 526.0, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 0.0,
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0.0, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0.0, "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.0, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.0,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.0, "DCGM_FI_PROF_PCIE_TX_BYTES": 0.0,
        "DCGM_FI_PROF_PCIE_RX_BYTES": 0.0}  # fmt: skip
"""An idle H100's page (values as dcgm-exporter shows an idle GPU)."""


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod the kubelet's pod-resources API names as holding a GPU."""

    name: str
    namespace: str = "default"
    container: str = "main"
    uid: str | None = None


@dataclass
class Gpu:
    """One GPU of a node: identity, current field values, the pods that hold it."""

    index: int
    uuid: str
    values: dict[str, float] = field(default_factory=lambda: dict(IDLE))
    pods: list[Pod] = field(default_factory=list)
    model: str = MODEL

    @property
    def pci_bus_id(self) -> str:
        return f"00000000:{0x18 + 0x10 * self.index:02X}:00.0"


class DcgmFleet:
    """Nodes x GPUs and what each node's dcgm-exporter would print about them."""

    def __init__(
        self,
        nodes: Iterable[str] = ("node-a", "node-b"),
        gpus_per_node: int = 4,
        *,
        hostname_label: str = "Hostname",
        pod_uid: bool = False,
    ) -> None:
        self.hostname_label = hostname_label
        self.pod_uid = pod_uid
        self.nodes: dict[str, list[Gpu]] = {
            node: [
                Gpu(i, f"GPU-{node}-{i:04d}-0000-0000-000000000000") for i in range(gpus_per_node)
            ]
            for node in nodes
        }

    def gpu(self, node: str, index: int) -> Gpu:
        """One GPU (``KeyError``/``IndexError`` for one the fleet does not have)."""
        return self.nodes[node][index]

    def set(self, node: str, index: int, values: dict[str, float]) -> None:
        """Set fields of one GPU (names as dcgm-exporter prints them)."""
        unknown = set(values) - FIELD_NAMES
        if unknown:
            raise KeyError(f"not a default dcgm-exporter field: {sorted(unknown)}")
        self.gpu(node, index).values.update(values)

    def assign(self, node: str, index: int, *pods: Pod) -> None:
        """The pods holding one GPU (several: time-slicing; none: free)."""
        self.gpu(node, index).pods = list(pods)

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: every GPU's energy counter grows by its power (W -> mJ)."""
        for gpus in self.nodes.values():
            for gpu in gpus:
                power = gpu.values["DCGM_FI_DEV_POWER_USAGE"]
                gpu.values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] += power * seconds * 1000

    def render(self, node: str) -> str:
        """The node's ``/metrics`` page."""
        lines: list[str] = []
        for name, kind, help_text, double in FIELDS:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for gpu in self.nodes[node]:
                value = gpu.values[name]
                text = f"{value:f}" if double else f"{round(value):d}"
                lines.extend(
                    f"{name}{{{self._labels(node, gpu, attrs)}}} {text}"
                    for attrs in self._attribute_sets(gpu, name, value)
                )
        return "\n".join(lines) + "\n"

    def _attribute_sets(self, gpu: Gpu, name: str, value: float) -> list[dict[str, str]]:
        extra: dict[str, str] = {}
        if name == "DCGM_FI_DEV_XID_ERRORS":
            extra = {"err_code": str(round(value)),
                     "err_msg": XID_TEXT.get(round(value), "Unknown Error")}  # fmt: skip
        if not gpu.pods:
            return [extra]
        out = []
        for pod in gpu.pods:
            attrs = {**extra, "container": pod.container, "namespace": pod.namespace,
                     "pod": pod.name}  # fmt: skip
            if self.pod_uid and pod.uid:
                attrs["pod_uid"] = pod.uid
            out.append(attrs)
        return out

    def _labels(self, node: str, gpu: Gpu, attrs: dict[str, str]) -> str:
        labels = [
            ("gpu", str(gpu.index)),
            ("UUID", gpu.uuid),
            ("pci_bus_id", gpu.pci_bus_id),
            ("device", f"nvidia{gpu.index}"),
            ("modelName", gpu.model),
            (self.hostname_label, node),
            ("DCGM_FI_DRIVER_VERSION", DRIVER_VERSION),
            *sorted(attrs.items()),  # Go's template ranges over a map in key order
        ]
        return ",".join(f'{k}="{_escaped(v)}"' for k, v in labels)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass(frozen=True, slots=True)
class Exporters:
    """The running exporters: node -> its ``/metrics`` URL."""

    urls: dict[str, str]


def make_app(fleet: DcgmFleet, node: str) -> web.Application:
    """One node's exporter: ``GET /metrics``; ``POST /values`` with ``{"gpu": i, "values": {..},
    "advance_seconds": s}`` sets values (and lets time pass) from another process."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            text=fleet.render(node), content_type="text/plain", charset="utf-8",
            headers={"X-Fleet-Node": node},
        )  # fmt: skip

    async def values(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if "values" in body:
                fleet.set(node, int(body["gpu"]), {k: float(v) for k, v in body["values"].items()})
            if "advance_seconds" in body:
                fleet.advance(float(body["advance_seconds"]))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise web.HTTPBadRequest(text=json.dumps({"error": str(exc)})) from None
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/values", values)
    return app


@contextlib.asynccontextmanager
async def serve_fleet(fleet: DcgmFleet) -> AsyncIterator[Exporters]:
    """Every node's exporter on its own free loopback port, for the ``async with`` body."""
    runners: list[web.AppRunner] = []
    urls: dict[str, str] = {}
    try:
        for node in fleet.nodes:
            runner = web.AppRunner(make_app(fleet, node))
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]  # bound by the OS: no race for a free port
            urls[node] = f"http://127.0.0.1:{port}/metrics"
        yield Exporters(urls)
    finally:
        for runner in runners:
            await runner.cleanup()
