"""Early shedding of ingest under overload: how long a request waits before it is worked on,
and whether its client is still there.

An overloaded collector does not queue requests in a list it could measure: they wait in the
kernel's socket buffers while the event loop runs the previous batch of handlers, so each batch
grows with the time the last one took. Counting in-flight slots never sees that queue (measured
on an older commit: 0 x 503 while 70-80 % of the agents' requests timed out and answers went out
up to 60 s late). What it does show is the event loop's lag: :class:`LoopLag` schedules a timer
every ``period_seconds`` and records how late it fired; a timer overdue right now counts too.
That lag is the time a request arriving now waits before its handler runs (within a loop
iteration), the same signal as Node's ``toobusy``; the largest measured in the last second
counts, so requests that waited through a stall are still shed when they are handled a few
iterations later. The receiver answers 503 with ``Retry-After``
when it exceeds ``CollectorConfig.max_queue_wait_seconds``: a 503 costs a fraction of storing a
round, so the next batch is smaller and the lag falls again.

A request whose client has gone (the agent timed out and closed its connection) is not worked
on at all: :func:`client_gone` reads whether the transport is closed, or, before aiohttp has
noticed, whether the peer has shut its side of the socket (``POLLRDHUP`` on Linux).
"""

from __future__ import annotations

import asyncio
import math
import select
from collections import deque
from collections.abc import AsyncIterator, Callable

from aiohttp import web

LAG_PERIOD_SECONDS = 0.1
"""How often the lag timer is scheduled: ten cheap callbacks a second."""

LAG_WINDOW_SECONDS = 1.0
"""How long a measured lag counts: requests that waited through a stall may be handled a few
loop iterations after the timer that measured it, and the next timer may already be on time."""

MAX_RETRY_AFTER_SECONDS = 30
"""Bound on the ``Retry-After`` a shed request is given (the lag, rounded up, at least 2)."""

_RDHUP = getattr(select, "POLLRDHUP", 0)
_GONE_EVENTS = _RDHUP | select.POLLHUP | select.POLLERR


class LoopLag:
    """How far behind its timers the event loop runs, in seconds (0 until started): the
    largest lag measured within the last ``window_seconds``, or the pending timer's delay."""

    def __init__(
        self,
        period_seconds: float = LAG_PERIOD_SECONDS,
        window_seconds: float = LAG_WINDOW_SECONDS,
    ) -> None:
        self.period_seconds = period_seconds
        self.window_seconds = window_seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._recent: deque[tuple[float, float]] = deque()  # (fired at, lag), oldest first

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start measuring on ``loop`` (the running loop)."""
        self._loop = loop
        self._schedule()

    def stop(self) -> None:
        """Stop the timer."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._loop = None

    def seconds(self) -> float:
        """The lag now: the largest measured within the window, or how overdue the pending
        timer is, whichever is larger."""
        if self._loop is None:
            return 0.0
        now = self._loop.time()
        measured = max(
            (lag for fired, lag in list(self._recent) if fired >= now - self.window_seconds),
            default=0.0,
        )
        return max(measured, now - self._due)

    def _schedule(self) -> None:
        if self._loop is None:  # stopped
            return
        self._due = self._loop.time() + self.period_seconds
        self._handle = self._loop.call_at(self._due, self._fire)

    def _fire(self) -> None:
        if self._loop is None:
            return
        now = self._loop.time()
        self._recent.append((now, max(0.0, now - self._due)))
        while self._recent and self._recent[0][0] < now - self.window_seconds:
            self._recent.popleft()
        self._schedule()


def lag_monitor(lag: LoopLag) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` entry that measures ``lag`` while the app serves."""

    async def context(_app: web.Application) -> AsyncIterator[None]:
        lag.start(asyncio.get_running_loop())
        yield
        lag.stop()

    return context


def retry_after_seconds(wait_seconds: float) -> int:
    """The ``Retry-After`` for a request shed after ``wait_seconds`` of lag: the lag rounded up,
    at least 2 (the slot limits' answer) and at most :data:`MAX_RETRY_AFTER_SECONDS`."""
    return int(min(MAX_RETRY_AFTER_SECONDS, max(2, math.ceil(wait_seconds))))


def client_gone(request: web.BaseRequest) -> bool:
    """Whether the client of ``request`` has closed its connection (so no answer can reach it).

    aiohttp drops the transport once it has read the close; before that, a peer that shut its
    side shows as ``POLLRDHUP`` (or a hang-up or error) on the socket, which a read would turn
    into the close. A client that only half-closes after its request is treated as gone, as
    aiohttp itself does on reading the end of the stream.
    """
    transport = request.transport
    if transport is None or transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None or not _GONE_EVENTS:
        return False
    poller = select.poll()
    try:
        poller.register(sock.fileno(), _GONE_EVENTS)
        return any(events & _GONE_EVENTS for _, events in poller.poll(0))
    except (OSError, ValueError):  # a socket closed meanwhile
        return True
