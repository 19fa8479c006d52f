"""The fleet's GPUs as the web layer shows them: latest readings, state and current job.

Read by the JSON API (``/v1/gpus``), ``/metrics`` and the status page alike, so the three agree.
No routes here: a read view over the :class:`CollectorService`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpuwarden.collector.accounting.gpu_time import main_holders
from gpuwarden.collector.service import CollectorService


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One per-GPU number, exposed as ``gpuwarden_gpu_<key>``, from the store's ``metric``.

    ``defaults``: attributes that, when a series has them, must have this value (``hw.temperature``
    of the die, not of the memory); a series without them matches, as older agents send none.
    """

    key: str
    metric: str
    documentation: str
    defaults: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def prometheus_name(self) -> str:
        """The family's name."""
        return f"gpuwarden_gpu_{self.key}"


_GPU = MappingProxyType({"hw.type": "gpu"})
# fmt: off
GPU_READINGS: tuple[GpuReading, ...] = (
    GpuReading("utilization_ratio", "hw.gpu.utilization",
               "Fraction of the last sample period in which a kernel ran.",
               MappingProxyType({"hw.gpu.task": "general"})),
    GpuReading("memory_used_bytes", "hw.gpu.memory.usage", "GPU memory in use."),
    GpuReading("memory_total_bytes", "hw.gpu.memory.limit", "Total GPU memory."),
    GpuReading("power_watts", "hw.power", "GPU power draw.", _GPU),
    GpuReading("temperature_celsius", "hw.temperature", "GPU die temperature.",
               MappingProxyType({**_GPU, "hw.sensor_location": "gpu"})),
)
# fmt: on


@dataclass(frozen=True, slots=True)
class GpuStatus:
    """A GPU as the collector sees it now: identity, latest readings, state and current job.

    ``readings`` maps a :data:`GPU_READINGS` key to its latest value (absent: no sample within
    the store's ``staleness_seconds``: a silent GPU's last value is not its value now);
    ``states`` maps each ``hw.state`` to its one-hot value (fresh ones only); ``job_key``,
    ``team`` and ``model_name`` describe the job holding the GPU at the latest slot (None:
    none, or unknown).
    """

    node: str
    uuid: str
    index: int | None
    model: str
    parent_uuid: str | None
    readings: Mapping[str, float]
    states: Mapping[str, float]
    job_key: str | None
    team: str | None
    model_name: str | None
    last_seen: float | None = None
    """Unix seconds of the GPU's newest reading or status, fresh or stale (None: none held)."""

    @property
    def state(self) -> str | None:
        """The current ``hw.state`` (the one whose one-hot value is 1), if reported."""
        current = [name for name, value in sorted(self.states.items()) if value >= 0.5]
        return current[0] if current else None


def _matches(attrs: Mapping[str, object], defaults: Mapping[str, str]) -> bool:
    return all(str(attrs.get(k, wanted)) == wanted for k, wanted in defaults.items())


def _latest_by_gpu(
    service: CollectorService,
    metric: str,
    defaults: Mapping[str, str],
    seen: dict[tuple[str, str], float],
) -> Iterator[tuple[tuple[str, str], Mapping[str, object], float]]:
    """Fresh values of ``metric`` by GPU (stale ones are NaN in ``latest``: left out); every
    series' last-seen time goes into ``seen``, stale or not."""
    latest = service.store.latest(metric)
    rows = zip(latest.series, latest.values.tolist(), latest.times.tolist(), strict=True)
    for info, value, t in rows:
        attrs = info.attributes
        if not _matches(attrs, defaults):
            continue
        key = (str(attrs.get("host.name", "")), str(attrs.get("hw.id", "")))
        if math.isfinite(t):
            seen[key] = max(seen.get(key, t), t)
        if math.isfinite(value):
            yield key, attrs, value


def _owners(service: CollectorService, now: float) -> dict[tuple[str, str], str]:
    """(node, uuid) → the job holding the largest share of the GPU in the latest slot
    (whether or not its sample for that slot has arrived yet)."""
    step = service.store.step_seconds
    times, gpus = service.timelines(now - step, now)
    owners, _ = main_holders(gpus, service.registry.known(), times, step, now)
    return {(g.node, g.uuid): job for g, job in zip(gpus, owners, strict=True) if job}


def gpu_statuses(service: CollectorService, now: float) -> list[GpuStatus]:
    """Every GPU (and MIG device) with its latest readings and current job, by node and UUID.

    Blocking (store reads and the ownership of the latest slot): call it from a worker thread.
    MIG devices report the job of their parent GPU.
    """
    readings: dict[tuple[str, str], dict[str, float]] = {}
    seen: dict[tuple[str, str], float] = {}
    for reading in GPU_READINGS:
        for key, _, value in _latest_by_gpu(service, reading.metric, reading.defaults, seen):
            readings.setdefault(key, {})[reading.key] = value
    states: dict[tuple[str, str], dict[str, float]] = {}
    for key, attrs, value in _latest_by_gpu(service, "hw.status", {"hw.type": "gpu"}, seen):
        if "hw.state" in attrs:
            states.setdefault(key, {})[str(attrs["hw.state"])] = value
    owners = _owners(service, now)
    out: dict[tuple[str, str], GpuStatus] = {}
    for ref in service.gpus():
        key = (ref.node, ref.uuid)
        if key in out:  # a changed info series (new driver, new index): one GPU all the same
            continue
        job_key = owners.get(key) or owners.get((ref.node, ref.parent_uuid or ""))
        job = service.registry.get(job_key) if job_key else None
        out[key] = GpuStatus(
            node=ref.node,
            uuid=ref.uuid,
            index=ref.index,
            model=ref.model,
            parent_uuid=ref.parent_uuid,
            readings=MappingProxyType(readings.get(key, {})),
            states=MappingProxyType(states.get(key, {})),
            job_key=job_key,
            team=job.team if job else None,
            model_name=job.model if job else None,
            last_seen=seen.get(key),
        )
    return [out[key] for key in sorted(out)]
