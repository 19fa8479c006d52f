"""A small translator of dcgm-exporter series onto the agent's metrics, for the receiver's tests.

A fake of the real mapping table (issue 17, point 2): three DCGM fields with their units
converted, the GPU named by ``UUID`` and the node by ``Hostname``; every other series is skipped
and counted, as the real one does for names it has no row for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.prom_columns import SeriesMapping
from gpuwarden.collector.remote_write.wire import Series

MIB = 1 << 20

#: DCGM field → (our metric, unit, kind, monotonic, factor to our unit)
FIELDS: dict[str, tuple[str, str, str, bool, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("hw.gpu.utilization", "1", "gauge", False, 0.01),
    "DCGM_FI_DEV_FB_USED": ("hw.gpu.memory.usage", "By", "gauge", False, float(MIB)),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("hw.energy", "J", "sum", True, 0.001),
}


@dataclass(frozen=True, slots=True)
class Translated:
    """The translator's answer (the contract of ``ingest.prom_map.translate``)."""

    points: list[NumberPoint]
    skipped: int


def translate(series: Sequence[Series]) -> Translated:
    """Our points for the series :data:`FIELDS` maps; the others are skipped."""
    points: list[NumberPoint] = []
    skipped = 0
    resources: dict[str, dict[str, str | int | float | bool]] = {}
    for one in series:
        labels = dict(one.labels)
        row = FIELDS.get(labels.get("__name__", ""))
        host = labels.get("Hostname") or labels.get("hostname")
        if row is None or host is None or "UUID" not in labels:
            skipped += 1
            continue
        metric, unit, kind, monotonic, factor = row
        resource = resources.setdefault(host, {"host.name": host})
        attributes: dict[str, str | int | float | bool] = {"hw.id": labels["UUID"]}
        points += [
            NumberPoint(
                resource, metric, unit, kind, monotonic, attributes, t * 1_000_000, v * factor
            )
            for t, v in zip(one.timestamps_ms, one.values, strict=True)
        ]
    return Translated(points, skipped)


class SeriesTranslator:
    """:func:`translate` as a ``prom_columns.SeriesMapper`` too: the same mapping one label set
    at a time, so the receiver stores through its columns."""

    def __init__(self) -> None:
        self.resources: dict[str, dict[str, str | int | float | bool]] = {}

    def map_series(self, labels: tuple[tuple[str, str], ...], /) -> SeriesMapping | None:
        found = dict(labels)
        row = FIELDS.get(found.get("__name__", ""))
        host = found.get("Hostname") or found.get("hostname")
        if row is None or host is None or "UUID" not in found:
            return None
        metric, unit, kind, monotonic, factor = row
        resource = self.resources.setdefault(host, {"host.name": host})
        counter = kind == "sum" and monotonic
        return SeriesMapping(resource, metric, unit, counter, {"hw.id": found["UUID"]}, factor)

    def __call__(self, series: Sequence[Series]) -> Translated:
        return translate(series)
