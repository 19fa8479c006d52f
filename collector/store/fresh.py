"""What detectors read: the window store with stale series unknown.

A series whose newest point is older than the store's ``staleness_seconds`` says nothing about
now: a stopped agent's last utilisation is neither busy nor idle. :class:`FreshReads` is the
store as the detection view hands it out: every read that ends now (``matrix``,
``increase_matrix``, ``increase``, ``bucket_counts``, ``quantile``, ``latest``) returns a stale
series as NaN (or ``None``), so a detector's coverage check sees no data and its verdict is
UNKNOWN, which leaves incidents as they are. A series is stale for a read over ``[start, end)``
when its newest point is older than ``min(end, now) - staleness_seconds``: reads of past windows
(a baseline a day ago) still see a series that has gone quiet since.

The inventory (``IDENTITY_METRICS``) is not a reading and stays whole: it says which GPUs exist
and when a node was last heard from, which the ``node_silent`` and preemption detectors need.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.store.types import (
    BucketCounts,
    LatestValues,
    Resolution,
    SeriesKey,
    SeriesMatrix,
)
from gpuwarden.collector.store.window import WindowStore

IDENTITY_METRICS = frozenset({"gpuwarden.gpu.info"})
"""Series that describe what exists, not how it is: never hidden for being old."""


class FreshReads(WindowStore):
    """A read view of ``store`` in which stale series are unknown (see the module docstring).

    It is a ``WindowStore`` to its readers (``DetectionContext.store`` is one, and detector
    helpers take one) and shares the store's state: everything it does not override is read
    from the store itself, so the view never holds a copy that could drift. It is for reading;
    ingest through the store.

    Args:
        store: the store to read.
        clock: Unix seconds, the "now" stale is judged against (default: the store's clock).
    """

    _store: WindowStore
    _now: Callable[[], float] | None

    def __init__(self, store: WindowStore, clock: Callable[[], float] | None = None) -> None:
        # No super().__init__(): the view has no state of its own but these two.
        object.__setattr__(self, "_store", store)
        object.__setattr__(self, "_now", clock)

    def __getattr__(self, name: str) -> Any:
        """Everything not defined here is the store's (its parameters, lock and tables)."""
        return getattr(object.__getattribute__(self, "_store"), name)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"FreshReads is a read view: set {name} on the store")

    @property
    def store(self) -> WindowStore:
        """The store read, with nothing hidden."""
        return self._store

    def now(self) -> float:
        """The time stale is judged against."""
        now = self._now
        return float(now() if now is not None else self._store._clock())

    def _cutoff(self, end: float) -> float:
        return min(end, self.now()) - self._store.staleness_seconds

    def _hide(self, result: SeriesMatrix, metric: str, end: float) -> SeriesMatrix:
        if metric in IDENTITY_METRICS or not result.series:
            return result
        seen = self._store.last_seen_of([info.key for info in result.series])
        stale = ~(seen >= self._cutoff(end))  # NaN (evicted meanwhile) is stale too
        if stale.any():
            result.values[stale] = np.nan
        return result

    def matrix(
        self,
        metric: str,
        *,
        selector: Mapping[str, str] | None = None,
        start: float,
        end: float,
        resolution: Resolution = "recent",
    ) -> SeriesMatrix:
        """``WindowStore.matrix`` with stale series' rows NaN."""
        got = self._store.matrix(
            metric, selector=selector, start=start, end=end, resolution=resolution
        )
        return self._hide(got, metric, end)

    def increase_matrix(
        self, metric: str, *, selector: Mapping[str, str] | None = None, start: float, end: float
    ) -> SeriesMatrix:
        """``WindowStore.increase_matrix`` with stale series' rows NaN."""
        got = self._store.increase_matrix(metric, selector=selector, start=start, end=end)
        return self._hide(got, metric, end)

    def _stale_key(self, key: SeriesKey, end: float) -> bool:
        if key[0] in IDENTITY_METRICS:
            return False
        seen = self._store.last_seen_of((key,))[0]
        return not seen >= self._cutoff(end)  # NaN (not held) is stale too

    def increase(self, key: SeriesKey, start: float, end: float) -> float | None:
        """``WindowStore.increase``; ``None`` (no data) for a stale series."""
        if self._stale_key(key, end):
            return None
        return self._store.increase(key, start, end)

    def bucket_counts(self, key: SeriesKey, start: float, end: float) -> BucketCounts | None:
        """``WindowStore.bucket_counts``; ``None`` (no data) for a stale series."""
        if self._stale_key(key, end):
            return None
        return self._store.bucket_counts(key, start, end)

    def bucket_bins(
        self, key: SeriesKey, start: float, bin_seconds: float, bins: int
    ) -> npt.NDArray[np.float64]:
        """``WindowStore.bucket_bins``, each bin judged as ``bucket_counts`` judges it: NaN
        when the series was stale at the bin's end."""
        got = self._store.bucket_bins(key, start, bin_seconds, bins)
        if key[0] in IDENTITY_METRICS or not got.size:
            return got
        seen = self._store.last_seen_of((key,))[0]
        ends = start + bin_seconds * np.arange(1, got.shape[0] + 1)
        stale = ~(seen >= np.minimum(ends, self.now()) - self._store.staleness_seconds)
        got[stale] = np.nan
        return got

    def quantile(self, key: SeriesKey, q: float, start: float, end: float) -> float:
        """``WindowStore.quantile``; NaN for a stale series."""
        if self._stale_key(key, end):
            if not 0.0 <= q <= 1.0:
                raise ValueError(f"quantile {q} is outside [0, 1]")
            return math.nan
        return self._store.quantile(key, q, start, end)

    def latest(
        self,
        metric: str,
        selector: Mapping[str, str] | None = None,
        *,
        max_age_seconds: float | None = None,
    ) -> LatestValues:
        """``WindowStore.latest`` judged against this view's clock (identity never stale)."""
        if metric in IDENTITY_METRICS:
            return self._store.latest(metric, selector, max_age_seconds=math.inf)
        got = self._store.latest(metric, selector, max_age_seconds=math.inf)
        bound = self._store.staleness_seconds if max_age_seconds is None else max_age_seconds
        fresh = got.times >= self.now() - bound
        return LatestValues(
            series=got.series,
            times=got.times,
            values=np.where(fresh, got.values, np.nan).astype(np.float32),
        )
