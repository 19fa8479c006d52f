"""The pace at which the whole collector creates series: a fleet's first contact is spread.

Creating a series costs far more than storing a point of one (its key, its rows, the request's
shape). When a whole fleet meets an empty collector at once (a first deployment, a new cluster,
a store that was lost), 1,250 nodes ask for 430,000 series within one 10 s interval: more work
than a core does in that time, so every request queued behind the others for seconds
(``bench/capacity.py --gpus 10000``: p99 3.9-4.7 s in the first 20 s, before this).

:class:`CreationPace` is one token bucket of new series for the whole collector, refilling at
``per_second`` and holding one second's worth. While it is empty, a request from a node that has
no series in the store yet is answered 503 with ``Retry-After`` (:class:`CreationPacedError`)
before it is decoded: the agent keeps the round in its spool and sends it again, so nothing is
lost; the nodes already in the store, and the series of a known node (a new process, a new
GPU), are never refused by it. So a fleet's first contact takes ``series / per_second`` seconds
(43 s for 10,000 GPUs at the default 10,000 a second) and ingest keeps its latency meanwhile.
A warm start restores the nodes' series, so a restart creates none and is never paced.

The per-sender budget (``max_new_series_per_source_hour``) is another limit, on a runaway sender.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable

from gpuwarden.collector.ingest.otlp_transport import OtlpError

MAX_RETRY_AFTER_SECONDS = 30
"""Bound on the ``Retry-After`` given to a paced request."""


class CreationPacedError(OtlpError):
    """A new node's request while the collector creates series as fast as it may: 503."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(
            503, "collector creating series at its limit (max_new_series_per_second), retry later"
        )
        self.retry_after = retry_after


class CreationPace:
    """A token bucket of new series shared by every sender (see the module).

    Args:
        per_second: series created per second, on average; the bucket holds one second's worth.
        clock: seconds (monotonic is best; tests pass a fake one).
        jitter: a random number in [0, 1) (tests pass a fixed one): it spreads the retries of
            the nodes paced together over the next seconds.
    """

    def __init__(
        self,
        per_second: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        if per_second <= 0:
            raise ValueError(f"per_second must be positive, not {per_second}")
        self.per_second = float(per_second)
        self._clock = clock
        self._jitter = jitter
        self._tokens = self.per_second
        self._then = clock()
        self._lock = threading.Lock()
        self.paced = 0
        """Requests answered 503 by the pace."""

    def _refill(self) -> float:
        now = self._clock()
        elapsed = max(0.0, now - self._then)
        self._tokens = min(self.per_second, self._tokens + elapsed * self.per_second)
        self._then = now
        return self._tokens

    def behind(self) -> bool:
        """Whether the bucket is empty: a new node's request would be paced."""
        with self._lock:
            return self._refill() <= 0

    def spend(self, series: int) -> None:
        """Take ``series`` created series out of the bucket (it may go below zero: a request's
        series are created whole, and the next new nodes wait for the deficit)."""
        if series <= 0:
            return
        with self._lock:
            self._refill()
            self._tokens -= series

    def refuse(self) -> CreationPacedError:
        """Count a paced request; the error to answer it with. Its ``Retry-After`` is drawn at
        random from 1 to :data:`MAX_RETRY_AFTER_SECONDS`: the new nodes paced together come
        back spread out, not all in the next second (a 503 is cheap, but a whole fleet of them
        every second is not)."""
        with self._lock:
            self.paced += 1
        return CreationPacedError(1 + math.floor(self._jitter() * MAX_RETRY_AFTER_SECONDS))
