"""The WindowStore's value types: series identity, query results and ingest counts."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

import numpy as np
import numpy.typing as npt

AttrValue = str | int | float | bool
AttrItems = tuple[tuple[str, AttrValue], ...]
SeriesKey = tuple[str, AttrItems]
"""A series' identity: metric name and its attribute items sorted by key (incl. ``host.name``)."""

Resolution = Literal["recent", "long"]

HOST_NAME = "host.name"


def series_key(metric: str, attributes: Mapping[str, AttrValue]) -> SeriesKey:
    """The identity of the series ``metric`` with these attributes (include ``host.name``)."""
    return (metric, tuple(sorted(attributes.items())))


def label_text(value: AttrValue) -> str:
    """An attribute value as selectors compare it (booleans as ``true``/``false``, like OTel)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class NoLongRingError(LookupError):
    """A long-resolution read of a metric whose series keep no long ring (``long_metrics``)."""

    def __init__(self, metric: str) -> None:
        super().__init__(
            f"{metric}: read at long resolution, but the store keeps no long ring for it; "
            "declare it in the reading detector's long reads (detect.catalog.LONG_READS) "
            "or add it to the collector's long_metrics"
        )
        self.metric = metric


class LatestOnlyError(LookupError):
    """A read over a time range of a metric whose series keep their latest value only, no
    recent ring (``recent_metrics``): the history was never kept, so no answer is right."""

    def __init__(self, metric: str) -> None:
        super().__init__(
            f"{metric}: read over a time range, but the store keeps only its latest value; "
            "declare it in the reader's recent reads (detect.catalog.RECENT_READS, or the "
            "reader's RANGE_READS) or add it to the collector's recent_metrics"
        )
        self.metric = metric


class Kind(enum.StrEnum):
    """How a series' points are stored."""

    GAUGE = "gauge"
    """Values as sent (OTLP gauges and non-monotonic sums)."""
    COUNTER = "counter"
    """Monotonic cumulative sums, stored as per-slot increases; they read as per-second rates."""
    HISTOGRAM = "histogram"
    """Explicit-bucket histograms, stored as per-slot bucket-count increases."""


@dataclass(frozen=True, slots=True)
class SeriesInfo:
    """What a detector needs to know about one series; equal and hashable by ``key``.

    Attributes are kept once, as the sorted items of ``key``; ``attributes`` builds a read-only
    mapping on each access, which keeps a resident series small.
    """

    key: SeriesKey
    unit: str = field(compare=False)
    kind: Kind = field(compare=False)

    @property
    def metric(self) -> str:
        """The metric name."""
        return self.key[0]

    @property
    def attributes(self) -> Mapping[str, AttrValue]:
        """Point attributes plus the resource's ``host.name``."""
        return MappingProxyType(dict(self.key[1]))

    def matches(self, selector: Mapping[str, str] | None) -> bool:
        """True when every selector label equals the attribute's text (absent never matches)."""
        if not selector:
            return True
        items = dict(self.key[1])
        for name, wanted in selector.items():
            value = items.get(name)
            if value is None or label_text(value) != wanted:
                return False
        return True


@dataclass(frozen=True, slots=True, eq=False)
class SeriesMatrix:
    """A series x time window: one row per series, one column per slot, NaN for missing data.

    ``times`` holds each slot's start in Unix seconds; slot ``i`` covers
    ``[times[i], times[i] + step_seconds)``. ``values`` is a copy the caller may modify.
    """

    times: npt.NDArray[np.float64]
    values: npt.NDArray[np.floating]
    series: tuple[SeriesInfo, ...]
    step_seconds: int
    resolution: Resolution


@dataclass(frozen=True, slots=True, eq=False)
class LatestValues:
    """Each series' value at the newest slot it has data in (NaN when that is out of the window).

    ``times`` is the newest point's time in Unix seconds (NaN when the slot has rolled out). A
    counter's first point has no rate yet, so its value is NaN.
    """

    series: tuple[SeriesInfo, ...]
    times: npt.NDArray[np.float64]
    values: npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True, eq=False)
class SeriesBlock:
    """Points of one gauge or counter series at once (``WindowStore.ingest_series``).

    ``attributes`` are the point attributes without ``host.name`` (that is ``host``), as an
    OTLP point carries them; ``times_ns`` and ``values`` are equally long.
    """

    metric: str
    host: str | None
    attributes: Mapping[str, AttrValue]
    unit: str
    counter: bool
    times_ns: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class IngestCounts:
    """What became of one ingest call's points.

    ``accepted + rejected + counter_out_of_order`` is the number of points offered.
    ``counter_out_of_order`` are counter (or histogram) points at or before their series' newest
    point: replays and late arrivals whose increase the newer point already carries, so they are
    ignored without being an error. ``counter_resets`` and ``new_series`` are facts about the
    accepted points.
    """

    accepted: int = 0
    rejected_old: int = 0
    rejected_nonfinite: int = 0
    rejected_future: int = 0
    rejected_limit: int = 0
    counter_out_of_order: int = 0
    counter_resets: int = 0
    new_series: int = 0

    @property
    def rejected(self) -> int:
        """Points not stored for a reason the sender should hear about (OTLP partial success)."""
        return (
            self.rejected_old + self.rejected_nonfinite + self.rejected_future + self.rejected_limit
        )


@dataclass(frozen=True, slots=True, eq=False)
class BucketCounts:
    """Observations of one histogram series over a time range.

    ``counts[i]`` is the number of observations in bucket ``i``: ``(bounds[i-1], bounds[i]]``,
    the last bucket being ``(bounds[-1], +Inf)``, as in OTLP explicit-bucket histograms.
    """

    bounds: tuple[float, ...]
    counts: npt.NDArray[np.float64]
    sum_value: float

    @property
    def count(self) -> float:
        """Total observations."""
        return float(self.counts.sum())
