"""What the record families (:mod:`.sql_fleet`, :mod:`.sql_remediation`, :mod:`.sql_delivery`)
need from a SQL backend: one write transaction, one read, the id of an inserted row, and its
dialect. :class:`~.sqlite_base.SqliteBase` and :class:`~.postgres_base.PostgresBase` provide
them; the families' SQL is written once, with ``?`` parameters, for both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self

from gpuwarden.collector.storage.base import StorageError
from gpuwarden.collector.storage.clusters import scope_sql
from gpuwarden.collector.storage.dialect import Dialect
from gpuwarden.collector.storage.sql_codec import Codec, R, Row


class Cursor(Protocol):
    """The part of a DB-API cursor the families use."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...


class Connection(Protocol):
    """The part of a DB-API connection the families use (``?`` parameters on both)."""

    def execute(self, sql: str, params: Sequence[Any] = ..., /) -> Cursor: ...

    def executemany(self, sql: str, params: Sequence[Sequence[Any]], /) -> Cursor: ...


class Closable(Protocol):
    """A DB-API connection, as far as closing it goes."""

    def close(self) -> None: ...


class FencedError(StorageError):
    """A claim was refused: the writer's lease epoch is no longer the current one."""


@dataclass(frozen=True, slots=True)
class Fence:
    """What a leader's claims must match: the lease row's name, holder and epoch."""

    name: str
    holder: str
    epoch: int


class SqlBase:
    """The backend's connection, seen by the record families; closing it is the same on both
    backends (one connection behind ``_lock``, ``None`` once closed)."""

    dialect: Dialect
    location: str
    cluster: str
    """The collector's cluster: every row it writes carries it, every read is scoped to it
    unless the read names another cluster or :data:`~.clusters.ALL_CLUSTERS`."""
    _clock: Callable[[], float]
    _lock: threading.Lock
    _conn: Closable | None
    fence: Fence | None = None
    """Set by the HA leader while it leads (:mod:`.sql_lease`); ``None``: claims are not
    checked (the single-process case)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; later calls raise :class:`StorageError`. Idempotent."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _write(self) -> AbstractContextManager[Connection]:
        """One write transaction: committed when the block ends, rolled back if it raises."""
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """The rows of one read-only statement."""
        raise NotImplementedError

    def _insert(self, conn: Connection, sql: str, params: Sequence[Any], row_id: str) -> int | None:
        """Run an ``INSERT`` of one row; the ``row_id`` the database gave it, or ``None`` when
        the statement inserted nothing (``ON CONFLICT DO NOTHING``)."""
        raise NotImplementedError

    def _before_audit(self, conn: Connection) -> None:
        """Called in a write transaction before it appends to the audit log: a backend where
        writers run concurrently serialises the appends here, so that entry ids rise in commit
        order and a reader following ``after_id`` never skips a late-committing entry."""

    def _scope(self, cluster: str | None = None) -> tuple[str, tuple[str, ...]]:
        """The ``WHERE`` condition of a read of ``cluster`` (``None``: this store's own)."""
        return scope_sql(self.cluster if cluster is None else cluster)

    def _check_fence(self, conn: Connection) -> None:
        """Refuse the transaction's claim unless the fence's epoch is current (see above)."""
        fence = self.fence
        if fence is None:
            return
        row = conn.execute(
            "SELECT epoch FROM leader_lease WHERE name = ? AND holder = ? AND epoch = ?"  # noqa: S608 - a constant
            f" AND expires_at > {self.dialect.now_seconds}{self.dialect.lock_for_share}",
            (fence.name, fence.holder, fence.epoch),
        ).fetchone()
        if row is None:
            raise FencedError(
                f"{self.location}: refused: {fence.holder} no longer leads "
                f"(epoch {fence.epoch} is not the current lease)"
            )

    def _one(self, codec: Codec[R], sql: str, key: object) -> R | None:
        """The record of ``sql`` (``... WHERE <key column> = ?``) in this store's cluster."""
        rows = self._read(f"{sql} AND cluster = ?", (key, self.cluster))
        return codec.load(rows[0]) if rows else None
