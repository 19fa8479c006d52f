"""Who leads a group of collectors: a lease row in PostgreSQL with an epoch as fencing token.

Without ``ha`` (SQLite, or one PostgreSQL collector) there is no election: the process runs
every loop, as it always did.

**Why a lease row and not an advisory lock.** A session-level ``pg_advisory_lock`` on a
dedicated connection would also elect one leader, but it says nothing to the *other*
connection that writes the leader's claims: a leader whose lock connection died (or whose
process was paused while the server still saw the socket open) could go on committing. The
lease row carries an epoch that rises at every change of holder; while it leads, this replica
sets the storage's fence (:class:`~gpuwarden.collector.storage.sql_base.Fence`), and every
side-effecting claim checks, in its own transaction, that the row still names this replica and
epoch and has not expired (``storage.sql_lease``). A takeover is an ``UPDATE`` of that row, so it
either waits for a claim in flight to commit (the new leader then sees the claim) or makes it
fail. Expiry is judged on the database's clock only, so replicas' clocks do not matter.

Locally, a leader stops leading (:meth:`LeaseElection.leading` turns false) once its last
successful renewal is ``lease_seconds`` old by its monotonic clock, even when it cannot reach
the database to learn it lost: by then a standby may have taken over.

Failover time: a standby tries every ``renew_seconds`` (a third of the lease by default), so it
leads at most ``lease_seconds + renew_seconds`` after the leader's last renewal (about 13 s with
the defaults), and at once when the leader stopped cleanly (:meth:`LeaseElection.release`).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuwarden.collector.storage.base import StorageError
from gpuwarden.collector.storage.sql_base import Fence
from gpuwarden.collector.storage.sql_lease import LeaseRecord, LeaseRecords

log = logging.getLogger(__name__)

LEASE_NAME = "collector"
"""The one lease of a collector group (the database's detection, remediation, paging)."""


def lease_name(cluster: str) -> str:
    """The lease of ``cluster``'s collectors: each cluster on a shared database has its own
    leader (``cluster:`` in the config, :mod:`gpuwarden.collector.storage.clusters`)."""
    return f"{LEASE_NAME}/{cluster}"


@dataclass(frozen=True, slots=True)
class LeaderStatus:
    """What ``/readyz``, ``/status`` and ``gpuwarden_leader`` say about leadership."""

    replica: str
    leading: bool
    leader: str | None
    """The replica holding the lease (``None``: nobody now)."""
    since: float | None
    """Unix seconds (the database's clock) when ``leader`` took the lease."""
    epoch: int

    @property
    def role(self) -> str:
        """``leader`` or ``standby``."""
        return "leader" if self.leading else "standby"

    def describe(self) -> str:
        """One line: ``leader (epoch 3)`` or ``standby; leader is b:12 since <t>``."""
        if self.leading:
            return f"leader (epoch {self.epoch})"
        if self.leader is None or self.since is None:
            return "standby; no leader now"
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since))
        return f"standby; leader is {self.leader} since {when}"


class Leadership(Protocol):
    """Whether this replica runs the leader-only work now."""

    def leading(self) -> bool:
        """True while this replica may run detection, remediation and notifications."""
        ...

    def status(self) -> LeaderStatus:
        """Who leads, for the pages and probes."""
        ...


class Change(enum.Enum):
    """What one election step changed."""

    NONE = "none"
    ACQUIRED = "acquired"
    LOST = "lost"


class LeaseElection:
    """The lease of one replica: :meth:`step` (blocking) renews or tries to take it.

    Args:
        storage: the shared database (its fence is set while this replica leads).
        replica: this replica's id.
        lease_seconds: how long a lease lasts without renewal.
        on_acquired: run (blocking) after this replica took the lease and before it leads,
            e.g. the remediator adopting the actions the old leader left ``executing``.
        monotonic: the local clock that ends a lease nobody could renew.
        lease_store: the connection that renews the lease (default: ``storage``'s). A
            dedicated one keeps renewals from waiting behind the main connection's long
            transactions (its lock is held for each); the fence stays on ``storage``, where
            the claims are written.
    """

    def __init__(
        self,
        storage: LeaseRecords,
        replica: str,
        lease_seconds: float,
        *,
        on_acquired: Sequence[Callable[[], object]] = (),
        monotonic: Callable[[], float] = time.monotonic,
        name: str = LEASE_NAME,
        lease_store: LeaseRecords | None = None,
    ) -> None:
        self._storage = storage
        self._lease = storage if lease_store is None else lease_store
        self._replica = replica
        self._lease_seconds = lease_seconds
        self._on_acquired = tuple(on_acquired)
        self._monotonic = monotonic
        self._name = name
        self._lock = threading.Lock()
        self._epoch: int | None = None  # held epoch, None while standby
        self._deadline = 0.0  # monotonic end of the held lease
        self._seen: LeaseRecord | None = None
        storage.fence = Fence(name, replica, -1)  # a standby's claims are refused

    @property
    def replica(self) -> str:
        """The replica's id in the lease and the audit."""
        return self._replica

    def leading(self) -> bool:
        """Holding an epoch whose lease has not run out by the local clock."""
        with self._lock:
            return self._epoch is not None and self._monotonic() < self._deadline

    def confirmed(self) -> bool:
        """:meth:`leading`, and the database agrees (the epoch is still current): asked right
        before an actuator call or a notification push, which no transaction can fence."""
        fence = self._storage.fence
        if not self.leading() or fence is None:
            return False
        try:
            return self._lease.fence_holds(fence)
        except StorageError:
            log.warning("leader lease: cannot confirm with the database; not acting now")
            return False

    def status(self) -> LeaderStatus:
        """From the last lease row this replica read."""
        with self._lock:
            seen = self._seen
            epoch = self._epoch
        leading = self.leading()
        if seen is None or not seen.held:
            return LeaderStatus(self._replica, leading, None, None, epoch or 0)
        return LeaderStatus(self._replica, leading, seen.holder, seen.acquired_at, seen.epoch)

    def step(self) -> Change:
        """Renew the lease, or take it when it expired; what changed (blocking)."""
        started = self._monotonic()
        with self._lock:
            held = self._epoch if started < self._deadline else None
        try:
            row = self._lease.claim_lease(
                self._name, self._replica, self._lease_seconds, held_epoch=held
            )
        except StorageError:
            log.exception("leader lease: the database did not answer")
            return self._expire_locally()
        mine = row.holder == self._replica and row.held
        with self._lock:
            self._seen = row
            was = self._epoch
        if mine and was == row.epoch:
            with self._lock:
                self._deadline = started + self._lease_seconds
            return Change.NONE
        if mine:
            return self._acquired(row, started)
        if was is not None:
            self._lose(f"{row.holder or 'nobody'} holds epoch {row.epoch}")
            return Change.LOST
        return Change.NONE

    def release(self) -> None:
        """Stop leading and give the lease up, so a standby takes over at once (blocking)."""
        with self._lock:
            epoch = self._epoch
        if epoch is None:
            return
        self._lose("stopping")
        try:
            self._lease.release_lease(self._name, self._replica, epoch)
        except StorageError:
            log.exception("leader lease: could not release epoch %d (it will expire)", epoch)

    def _acquired(self, row: LeaseRecord, started: float) -> Change:
        fence = Fence(self._name, self._replica, row.epoch)
        self._storage.fence = fence  # before the hooks: their writes are claims too
        for hook in self._on_acquired:
            hook()
        with self._lock:
            self._epoch = row.epoch
            self._deadline = started + self._lease_seconds
        log.warning("leader: %s leads, epoch %d", self._replica, row.epoch)
        return Change.ACQUIRED

    def _expire_locally(self) -> Change:
        with self._lock:
            lapsed = self._epoch is not None and self._monotonic() >= self._deadline
        if lapsed:
            self._lose("lease ran out without a renewal")
            return Change.LOST
        return Change.NONE

    def _lose(self, why: str) -> None:
        with self._lock:
            epoch, self._epoch = self._epoch, None
        self._storage.fence = Fence(self._name, self._replica, -1)  # refuse every claim
        log.warning("leader: %s no longer leads (epoch %s): %s", self._replica, epoch, why)
