"""The window store's state: its parameters, its series table, histograms and request shapes.

:class:`~gpuwarden.collector.store.window.WindowStore` is this plus its ingest paths
(``window_ingest``: points and decoded columns; ``window_payload``: OTLP bodies and the shaped
fast path) and its reads (``window_reads``); its module docstring describes the store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.ingest.otlp_shape import RequestShape
from gpuwarden.collector.store.histograms import HistogramSeries
from gpuwarden.collector.store.rows import SeriesTable
from gpuwarden.collector.store.types import AttrValue, SeriesKey

NS = 1_000_000_000
DEFAULT_STALENESS_SECONDS = 60.0
"""Six of the agent's default 10 s rounds (``CollectorConfig.staleness_seconds`` says why)."""


@dataclass(slots=True, eq=False)
class Shaped:
    """A sender's request shape and the rows its points resolved to."""

    shape: RequestShape
    rows: npt.NDArray[np.int64]
    unique: bool
    generation: int
    resources: tuple[Mapping[str, AttrValue], ...]
    point_resources: tuple[Mapping[str, AttrValue], ...]
    nbytes: int


class WindowState:
    """What every part of ``WindowStore`` shares, under one lock (see ``WindowStore``)."""

    def __init__(
        self,
        *,
        step_seconds: int = 10,
        recent_seconds: int = 6 * 3600,
        long_step_seconds: int = 60,
        long_seconds: int = 14 * 86400,
        max_series: int = 1_000_000,
        stale_after_seconds: float | None = None,
        staleness_seconds: float = DEFAULT_STALENESS_SECONDS,
        max_future_seconds: float = 300.0,
        initial_capacity: int = 1024,
        long_metrics: Collection[str] | None = None,
        recent_metrics: Collection[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Create an empty store.

        Args:
            step_seconds: recent resolution.
            recent_seconds: recent window, a multiple of ``long_step_seconds``.
            long_step_seconds: long resolution, a multiple of ``step_seconds``.
            long_seconds: long window, a multiple of ``long_step_seconds``, >= ``recent_seconds``.
            max_series: cap on number and histogram series together.
            stale_after_seconds: ``evict_stale`` drops series without a point this long
                (default: the recent window; their long history goes with them).
            staleness_seconds: a series whose newest point is older than this is stale: its
                value is unknown now (``latest`` reads it as NaN, detectors' views hide it,
                ``/metrics`` leaves it out), though its history stays readable until evicted.
            max_future_seconds: points further ahead of ``clock()`` are rejected.
            initial_capacity: rows allocated up front (doubled as needed).
            long_metrics: the metrics whose series keep a long ring (None: every metric); a
                long-resolution read of another metric raises ``NoLongRingError``.
            recent_metrics: the metrics whose series keep a recent ring (None: every metric;
                ``long_metrics`` are added: the long ring is made of the recent one); the
                others keep their latest value only, and a read over a time range of one
                raises ``LatestOnlyError``.
            clock: Unix time in seconds.
        """
        if min(step_seconds, recent_seconds, long_step_seconds, long_seconds, max_series) <= 0:
            raise ValueError("steps, windows and max_series must be positive")
        if not staleness_seconds > 0:
            raise ValueError("staleness_seconds must be positive")
        if long_step_seconds % step_seconds or recent_seconds % long_step_seconds:
            raise ValueError(
                "long_step_seconds must be a multiple of step_seconds, and "
                "recent_seconds a multiple of long_step_seconds"
            )
        if long_seconds % long_step_seconds or long_seconds < recent_seconds:
            raise ValueError(
                "long_seconds must be a multiple of long_step_seconds and at least recent_seconds"
            )
        self.step_seconds = step_seconds
        self.long_step_seconds = long_step_seconds
        self.recent_seconds = recent_seconds
        """How far back the recent ring (full resolution, and the histograms) reaches."""
        self.long_seconds = long_seconds
        """How far back the long ring (``long_step_seconds`` means) reaches."""
        self._step_ns = step_seconds * NS
        self._ratio = long_step_seconds // step_seconds
        self._max_series = max_series
        self._stale_after_seconds = (
            float(recent_seconds) if stale_after_seconds is None else stale_after_seconds
        )
        self.staleness_seconds = float(staleness_seconds)
        """A series without a point for this long is stale (unknown now, see ``latest``)."""
        self._max_future_seconds = max_future_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._table = SeriesTable(
            n_slots=recent_seconds // step_seconds,
            n_long_slots=long_seconds // long_step_seconds,
            capacity=max(1, min(initial_capacity, max_series)),
            max_rows=max_series,
            long_metrics=None if long_metrics is None else frozenset(long_metrics),
            recent_metrics=_recent_set(recent_metrics, long_metrics),
        )
        self._histograms: dict[SeriesKey, HistogramSeries] = {}
        self._shapes: dict[bytes, Shaped] = {}
        self._shape_bytes = 0
        self._shape_senders: dict[int, int] = {}  # a heuristic: hash collisions are harmless
        self.shape_hits = 0
        """Requests read through a shape, without parsing (``ingest_payload``)."""

    @property
    def long_metrics(self) -> frozenset[str] | None:
        """The metrics whose series keep a long ring (None: every metric)."""
        return self._table.long_metrics

    def keeps_long(self, metric: str) -> bool:
        """Whether ``metric``'s series keep a long ring (may be read at long resolution)."""
        return self._table.keeps_long(metric)

    @property
    def recent_metrics(self) -> frozenset[str] | None:
        """The metrics whose series keep a recent ring (None: every metric); the others keep
        their latest value only."""
        return self._table.recent_metrics

    def keeps_recent(self, metric: str) -> bool:
        """Whether ``metric``'s series keep a recent ring (may be read over a time range)."""
        return self._table.keeps_recent(metric)

    def _series_count(self) -> int:
        return len(self._table.rows_by_key) + len(self._histograms)


def _recent_set(
    recent: Collection[str] | None, long: Collection[str] | None
) -> frozenset[str] | None:
    """The metrics kept in the recent ring: ``recent`` and ``long`` (None: every metric)."""
    if recent is None:
        return None
    if long is None:  # every metric long: every metric needs its recent ring
        return None
    return frozenset(recent) | frozenset(long)
