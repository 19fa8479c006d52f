"""OTLP points as the agent sends them: GPU info and utilisation, host CPU, GPU processes,
hardware status and fault counters (the same shapes ``tests/test_detect_*`` feed the service)."""

from __future__ import annotations

from bench.truth.model import Gpu
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.store.types import AttrValue

MODEL = "NVIDIA H100 80GB HBM3"
GIB = float(2**30)
CPUS = 8


def _point(
    metric: str, node: str, t: float, value: float, attrs: dict[str, AttrValue], *,
    kind: str = "gauge", monotonic: bool = False, unit: str = "1",
) -> NumberPoint:  # fmt: skip
    resource: dict[str, AttrValue] = {"host.name": node}
    return NumberPoint(resource, metric, unit, kind, monotonic, attrs, int(t * 1e9), value)


def gpu_points(
    gpu: Gpu, t: float, util: float | None, memory: float | None = None
) -> list[NumberPoint]:
    """The GPU's info point, its utilisation ratio and memory bytes (None: not sent)."""
    info: dict[str, AttrValue] = {
        "hw.id": gpu.uuid, "hw.model": MODEL, "gpuwarden.gpu.index": gpu.index,
    }  # fmt: skip
    out = [_point("gpuwarden.gpu.info", gpu.node, t, 1.0, info)]
    if util is not None:
        out.append(_point("hw.gpu.utilization", gpu.node, t, util, {"hw.id": gpu.uuid}))
    if memory is not None:
        out.append(_point("hw.gpu.memory.usage", gpu.node, t, memory, {"hw.id": gpu.uuid}))
    return out


def cpu_points(node: str, t: float, seconds: dict[str, float]) -> list[NumberPoint]:
    """Cumulative CPU seconds by mode (``user``, ``iowait``, ``idle``) as the agent reports."""
    return [
        _point("system.cpu.time", node, t, v, {"cpu.mode": mode}, kind="sum", monotonic=True)
        for mode, v in seconds.items()
    ]


def process_point(gpu: Gpu, t: float, pid: int, memory: float, job_id: str | None) -> NumberPoint:
    """One GPU process's memory; ``job_id`` is the Slurm job it belongs to (None: unknown)."""
    attrs: dict[str, AttrValue] = {"hw.id": gpu.uuid, "process.pid": pid}
    if job_id is not None:
        attrs |= {"gpuwarden.job.scheduler": "slurm", "gpuwarden.job.id": job_id}
    return _point("gpuwarden.gpu.process.memory.usage", gpu.node, t, memory, attrs)


def status_points(gpu: Gpu, t: float, state: str) -> list[NumberPoint]:
    """``hw.status`` of the GPU: 1 for its state (ok, degraded, failed), 0 for the others."""
    return [
        _point("hw.status", gpu.node, t, 1.0 if s == state else 0.0,
               {"hw.id": gpu.uuid, "hw.type": "gpu", "hw.state": s}, kind="sum")
        for s in ("ok", "degraded", "failed")
    ]  # fmt: skip


def xid_point(gpu: Gpu, t: float, code: int, count: float) -> NumberPoint:
    """The cumulative count of XID ``code`` on the GPU."""
    attrs: dict[str, AttrValue] = {"hw.id": gpu.uuid, "gpuwarden.gpu.xid": str(code)}
    return _point("gpuwarden.gpu.xid.errors", gpu.node, t, count, attrs,
                  kind="sum", monotonic=True, unit="{error}")  # fmt: skip


def ecc_point(gpu: Gpu, t: float, count: float) -> NumberPoint:
    """The cumulative count of uncorrected ECC errors on the GPU."""
    attrs: dict[str, AttrValue] = {"hw.id": gpu.uuid, "error.type": "uncorrected", "hw.type": "gpu"}
    return _point("hw.errors", gpu.node, t, count, attrs, kind="sum", monotonic=True,
                  unit="{error}")  # fmt: skip
