"""Each agent round stored once: which rounds of each agent instance the collector stored.

An agent numbers its spooled rounds (``Gpuwarden-Agent-Rounds``, :mod:`gpuwarden.agent.rounds`)
and resends a batch whose answer it did not get: after a timeout, a lost connection, or its own
``kill -9`` in the middle of replaying its spool. The collector keeps, per (caller, instance), a
high-water mark and a window of the 63 rounds below it (:class:`SeenWindow`) in its storage, so a
round it stored is acknowledged and not stored again, across collector restarts too.

Why a high-water mark is enough, with a small window for safety: the agent sends its spool in
order, one request at a time, and drops a round only for good (a permanent rejection, or the
spool evicting it), so a round reaches the collector for the first time only after every older
round that will ever arrive. The window keeps a round that arrives late but within 63 of the
newest from being taken for a duplicate (two requests of one instance racing through two
collectors behind one database). A round older than the window is taken as stored: that is the
limit of the guarantee (see ``docs/operations.md``).

Requests of one instance are stored one at a time: a second one arriving while the first is
still being stored (the agent gave up waiting and sent a smaller batch) is answered 503, and
its retry finds what the first one stored.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpuwarden.agent.rounds import INSTANCE_HEADER, ROUNDS_HEADER, Round, decode_rounds
from gpuwarden.agent.rounds import valid_instance as _valid_instance
from gpuwarden.collector.ingest.otlp_transport import OtlpError
from gpuwarden.collector.storage.base import RoundsRecord, Storage

WINDOW = 63
"""Rounds below the high-water mark tracked one by one (a signed 64-bit column holds them)."""
_MASK = (1 << WINDOW) - 1
MAX_TRACKED = 100_000
"""Instances whose window is cached in memory (cleared beyond; storage still has them)."""


@dataclass(frozen=True, slots=True)
class AgentRounds:
    """The rounds one request carries, from its headers: the instance and each round's extent."""

    instance: str
    rounds: tuple[Round, ...]

    @property
    def nbytes(self) -> int:
        """The uncompressed body length the rounds add up to."""
        return sum(r.nbytes for r in self.rounds)


def agent_rounds(headers: Mapping[str, str]) -> AgentRounds | None:
    """The request's rounds, or None without the headers; raises ``OtlpError`` (400) when they
    are malformed or only one of the two is present."""
    instance = headers.get(INSTANCE_HEADER)
    value = headers.get(ROUNDS_HEADER)
    if instance is None and value is None:
        return None
    if instance is None or value is None:
        raise OtlpError(400, f"{INSTANCE_HEADER} and {ROUNDS_HEADER} go together")
    if not _valid_instance(instance):
        raise OtlpError(400, f"{INSTANCE_HEADER} must be 32 lowercase hex digits")
    try:
        rounds = decode_rounds(value)
    except ValueError as exc:
        raise OtlpError(400, f"{ROUNDS_HEADER}: {exc}") from None
    return AgentRounds(instance, rounds)


@dataclass(frozen=True, slots=True)
class SeenWindow:
    """The rounds stored: ``high_water`` (0: none) and bit ``i`` of ``below`` for round
    ``high_water - 1 - i``; rounds older than the window count as stored."""

    high_water: int = 0
    below: int = 0

    def seen(self, seq: int) -> bool:
        """Whether round ``seq`` was stored (or is too old to tell, which counts as stored)."""
        if seq >= self.high_water:
            return seq == self.high_water and seq > 0
        offset = self.high_water - 1 - seq
        return offset >= WINDOW or bool(self.below >> offset & 1)

    def add(self, seq: int) -> SeenWindow:
        """The window with round ``seq`` stored too."""
        if seq > self.high_water:
            shift = seq - self.high_water
            below = 0
            if self.high_water > 0 and shift <= WINDOW:
                below = ((self.below << shift) | (1 << (shift - 1))) & _MASK
            return SeenWindow(seq, below)
        offset = self.high_water - 1 - seq
        if seq == self.high_water or offset >= WINDOW:
            return self
        return SeenWindow(self.high_water, self.below | (1 << offset))


@dataclass
class RoundsLedger:
    """The windows of every agent instance, cached in memory over the storage's records.

    With ``read_through`` (a database shared by several collectors: active/standby behind
    agents that fail over) the window is read from storage for every request: another replica
    may have stored rounds of the instance since this one cached it, and a cached window would
    take a resent round for a new one. One primary-key read per agent request.
    """

    read_through: bool = False
    _windows: dict[tuple[str, str], SeenWindow] = field(default_factory=dict)
    _busy: set[tuple[str, str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def claim(self, caller: str, instance: str) -> Iterator[None]:
        """Hold ``(caller, instance)`` for one request; raises ``OtlpError`` (503) when another
        request of it is being stored (never waits: the event loop may be the caller)."""
        key = (caller, instance)
        with self._lock:
            if key in self._busy:
                raise OtlpError(503, "an earlier request of this agent is still being stored")
            self._busy.add(key)
        try:
            yield
        finally:
            with self._lock:
                self._busy.discard(key)

    def window(self, storage: Storage, caller: str, instance: str) -> SeenWindow:
        """The rounds of ``(caller, instance)`` stored so far (storage read on a cache miss)."""
        key = (caller, instance)
        with self._lock:
            known = None if self.read_through else self._windows.get(key)
        if known is not None:
            return known
        record = storage.rounds_record(caller, instance)
        found = (
            SeenWindow() if record is None else SeenWindow(record.high_water, record.stored_below)
        )
        with self._lock:
            if len(self._windows) >= MAX_TRACKED:
                self._windows.clear()  # a cache: the storage keeps every record
            self._windows[key] = found
        return found

    def save(
        self, storage: Storage, caller: str, instance: str, window: SeenWindow, *, now: float
    ) -> None:
        """Remember ``window`` for ``(caller, instance)``, in memory and in storage."""
        storage.save_rounds_record(
            RoundsRecord(caller, instance, window.high_water, window.below, now)
        )
        with self._lock:
            self._windows[(caller, instance)] = window
