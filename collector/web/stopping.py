"""The collector is stopping: body reads in progress end now instead of at their timeout.

At SIGTERM aiohttp stops listening and answers the requests in progress, for up to its
``shutdown_timeout``. A request whose body has not all arrived by then waited out
``body_timeout_seconds`` (30 s) in :func:`~.guard.body_guard` and was answered 408: the stop
took 34 s instead of about 4 (``tests/test_sigterm_load.py``). Now the shutdown hook marks the
app stopping and ends every body wait at once; such a request is answered 503 with
``Retry-After`` (nothing was stored: the agent sends it again, to this collector once it is back
or to another endpoint), and one that starts waiting after the mark gets at most
:data:`STOPPING_BODY_SECONDS`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

STOPPING_BODY_SECONDS = 1.0
"""How long a body read that starts after the stop began may wait."""


class Stopping:
    """Whether the app is stopping, and the body waits to end when it starts."""

    def __init__(self) -> None:
        self.started = False
        self._waits: set[asyncio.Timeout] = set()

    def timeout(self, seconds: float) -> float:
        """A body wait's timeout: ``seconds``, or less once stopping."""
        return min(seconds, STOPPING_BODY_SECONDS) if self.started else seconds

    @contextmanager
    def waiting(self, wait: asyncio.Timeout) -> Iterator[None]:
        """Register a body wait for as long as it runs, so :meth:`start` can end it."""
        self._waits.add(wait)
        try:
            yield
        finally:
            self._waits.discard(wait)

    def start(self) -> None:
        """Mark stopping and end every registered wait now (each raises ``TimeoutError``)."""
        self.started = True
        now = asyncio.get_running_loop().time()
        for wait in list(self._waits):
            wait.reschedule(now)
