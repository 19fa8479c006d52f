"""Failed authentications per source address, so that one source cannot hammer the tokens.

After ``limit`` failures from one address within ``window_seconds`` (counted from its first
failure in the window), the address is answered 429 with ``Retry-After`` until the window ends,
without its credential being looked at. Memory is bounded: at most ``max_sources`` addresses
are remembered, the least recently failing forgotten first (so a flood from many addresses can
make the table forget one, never grow without end). Behind a reverse proxy every client shares
the proxy's address: raise the limit there, or let the proxy throttle.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable


class FailureThrottle:
    """Counts failed authentications per address in fixed windows (clock injected)."""

    def __init__(
        self,
        limit: int,
        window_seconds: float,
        max_sources: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 0 or window_seconds <= 0 or max_sources <= 0:
            raise ValueError("need limit >= 0, window_seconds > 0 and max_sources > 0")
        self._limit = limit
        self._window = window_seconds
        self._max = max_sources
        self._clock = clock
        self._failures: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def retry_after(self, source: str) -> int:
        """Whole seconds until ``source`` may try again (0: it may now; 0 always when off)."""
        if not self._limit:
            return 0
        entry = self._failures.get(source)
        if entry is None:
            return 0
        start, count = entry
        left = start + self._window - self._clock()
        if left <= 0:
            del self._failures[source]
            return 0
        return math.ceil(left) if count >= self._limit else 0

    def failed(self, source: str) -> None:
        """Record one failed authentication from ``source``."""
        if not self._limit:
            return
        now = self._clock()
        start, count = self._failures.pop(source, (now, 0))
        if now - start >= self._window:
            start, count = now, 0
        self._failures[source] = (start, count + 1)  # most recent last
        while len(self._failures) > self._max:
            self._failures.popitem(last=False)
