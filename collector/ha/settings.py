"""The ``ha:`` section of the collector's configuration (active/standby)."""

from __future__ import annotations

import os
import socket
from typing import Annotated

import msgspec

from gpuwarden.agent.schema import ConfigError


class HaSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Active/standby: several collectors on one PostgreSQL database, one leader at a time.

    Attributes:
        enabled: take part in the leader election (needs a ``postgresql://`` database: SQLite
            is one process's, and without ``ha`` that process simply leads).
        replica_id: this collector's name in the lease and the audit log (default
            ``<hostname>:<pid>``, :meth:`replica`).
        lease_seconds: how long a lease lasts without renewal: a standby takes over at most
            this long (plus one renewal interval) after the leader stopped renewing.
        renew_seconds: how often the leader renews, and a standby tries to take over
            (default: a third of the lease, so two renewals may fail before it expires).
    """

    enabled: bool = False
    replica_id: str | None = None
    lease_seconds: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    renew_seconds: Annotated[float, msgspec.Meta(gt=0)] | None = None

    def __post_init__(self) -> None:
        if self.renew_seconds is not None and self.renew_seconds >= self.lease_seconds:
            raise ConfigError(
                f"renew_seconds: {self.renew_seconds} must be below lease_seconds "
                f"({self.lease_seconds}), or the lease expires between renewals"
            )
        if self.replica_id is not None and not self.replica_id.strip():
            raise ConfigError("replica_id: empty")

    @property
    def renew_interval_seconds(self) -> float:
        """The renewal interval (``renew_seconds``, default a third of the lease)."""
        return self.renew_seconds if self.renew_seconds is not None else self.lease_seconds / 3

    def replica(self, hostname: str | None = None, pid: int | None = None) -> str:
        """The replica's id: ``replica_id``, else ``<hostname>:<pid>``."""
        if self.replica_id is not None:
            return self.replica_id
        host = socket.gethostname() if hostname is None else hostname
        return f"{host}:{os.getpid() if pid is None else pid}"
