"""Where accepted points go. For now an in-memory series log; the collector issue adds the store."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint

SeriesKey = tuple[str, str, tuple[tuple[str, str | int | float | bool], ...]]


class MetricsSink(Protocol):
    """Anything that takes accepted points from the receiver."""

    def accept(self, points: Iterable[NumberPoint], source: str) -> int:
        """Take one request's points from the authenticated ``source``; return how many it
        rejected (reported back to the sender as an OTLP partial success)."""
        ...

    def accept_histograms(self, points: Sequence[HistogramPoint], source: str) -> int:
        """Take one request's histogram points; return how many it rejected."""
        ...


@dataclass
class SourceStats:
    """Per-source ingest counters."""

    requests: int = 0
    points: int = 0
    last_time_unix_nano: int = 0
    hosts: set[str] = field(default_factory=set)


class SeriesLog:
    """Keeps the last ``max_points`` points of every series, keyed by host, metric and attributes.

    Bounded twice: points per series and number of series (new series beyond the cap are counted
    and dropped), so a misbehaving source cannot exhaust memory.
    """

    def __init__(self, *, max_points: int = 100_000, max_series: int = 200_000) -> None:
        self._max_points = max_points
        self._max_series = max_series
        self._series: dict[SeriesKey, deque[tuple[int, float]]] = {}
        self._units: dict[str, str] = {}
        self._lock = threading.Lock()
        self.sources: dict[str, SourceStats] = {}
        self.dropped_series_points = 0

    def accept(self, points: Iterable[NumberPoint], source: str) -> int:
        """Append points in arrival order; points beyond the series cap are dropped."""
        with self._lock:
            stats = self.sources.setdefault(source, SourceStats())
            stats.requests += 1
            dropped = 0
            for point in points:
                host = str(point.resource.get("host.name", ""))
                key = (host, point.metric, tuple(sorted(point.attributes.items())))
                series = self._series.get(key)
                if series is None:
                    if len(self._series) >= self._max_series:
                        self.dropped_series_points += 1
                        dropped += 1
                        continue
                    series = self._series[key] = deque(maxlen=self._max_points)
                    self._units[point.metric] = point.unit
                series.append((point.time_unix_nano, point.value))
                stats.points += 1
                stats.hosts.add(host)
                stats.last_time_unix_nano = max(stats.last_time_unix_nano, point.time_unix_nano)
            return dropped

    def accept_histograms(self, points: Sequence[HistogramPoint], source: str) -> int:
        """Keeps numbers only: every histogram point is rejected."""
        return len(points)

    def series(
        self, metric: str | None = None, host: str | None = None
    ) -> dict[SeriesKey, list[tuple[int, float]]]:
        """A copy of the matching series."""
        with self._lock:
            return {
                key: list(points)
                for key, points in self._series.items()
                if (metric is None or key[1] == metric) and (host is None or key[0] == host)
            }

    def latest(self, metric: str, host: str | None = None) -> dict[SeriesKey, float]:
        """The last value of every matching series."""
        return {key: pts[-1][1] for key, pts in self.series(metric, host).items() if pts}

    def metric_names(self) -> set[str]:
        """Every metric name received so far."""
        with self._lock:
            return {key[1] for key in self._series}

    def unit(self, metric: str) -> str | None:
        """The unit a metric arrived with."""
        with self._lock:
            return self._units.get(metric)

    def hosts(self) -> set[str]:
        """Every ``host.name`` seen."""
        with self._lock:
            return {key[0] for key in self._series}
