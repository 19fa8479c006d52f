"""The SQLite connection of :class:`~.sqlite.SqliteStorage`: opening, one lock, transactions.

See :mod:`~gpuwarden.collector.storage.sqlite` for the threading, transaction and durability
choices.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from gpuwarden.collector.storage.base import (
    StorageError,
)
from gpuwarden.collector.storage.clusters import DEFAULT_CLUSTER, check_cluster
from gpuwarden.collector.storage.dialect import SQLITE
from gpuwarden.collector.storage.migrations import migrate
from gpuwarden.collector.storage.sql_base import Connection, SqlBase
from gpuwarden.collector.storage.sql_codec import Row

Synchronous = Literal["NORMAL", "FULL"]
MEMORY = ":memory:"
MIN_SQLITE_VERSION = (3, 24, 0)
_SYNCHRONOUS_PRAGMA: dict[str, str] = {
    "NORMAL": "PRAGMA synchronous = NORMAL",
    "FULL": "PRAGMA synchronous = FULL",
}


class SqliteBase(SqlBase):
    """One connection guarded by one lock; ``_write`` is one ``BEGIN IMMEDIATE`` transaction."""

    dialect = SQLITE

    def __init__(
        self,
        path: Path | str,
        *,
        clock: Callable[[], float] = time.time,
        cluster: str = DEFAULT_CLUSTER,
        synchronous: Synchronous = "NORMAL",
        busy_timeout_seconds: float = 5.0,
    ) -> None:
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise StorageError(
                f"SQLite {sqlite3.sqlite_version} is too old; gpuwarden needs 3.24 or later"
            )
        if synchronous not in _SYNCHRONOUS_PRAGMA:
            raise ValueError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self.location = str(path)
        self._clock = clock
        self.cluster = check_cluster(cluster)
        self._lock = threading.Lock()
        try:
            conn = sqlite3.connect(
                self.location,
                timeout=busy_timeout_seconds,  # sets SQLite's busy_timeout
                isolation_level=None,  # autocommit: we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # shared by threads, guarded by self._lock
            )
        except sqlite3.Error as exc:
            raise StorageError(f"{self.location}: cannot open the database: {exc}") from exc
        try:
            self._configure(conn, synchronous)
            self.applied_migrations = migrate(conn, now=clock(), location=self.location)
        except sqlite3.Error as exc:
            conn.close()
            raise StorageError(f"{self.location}: cannot open the database: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        self._conn: sqlite3.Connection | None = conn

    def _configure(self, conn: sqlite3.Connection, synchronous: str) -> None:
        conn.row_factory = sqlite3.Row
        (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if self.location != MEMORY and str(mode).lower() != "wal":
            raise StorageError(
                f"{self.location}: SQLite refused WAL mode (journal_mode={mode}); put the "
                "database on a local filesystem (WAL needs shared memory, not NFS)"
            )
        conn.execute(_SYNCHRONOUS_PRAGMA[synchronous])
        conn.execute("PRAGMA foreign_keys = ON")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StorageError(f"{self.location}: the store is closed")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        with self._lock:
            rows: list[Row] = self._connection().execute(sql, params).fetchall()
            return rows

    def _insert(self, conn: Connection, sql: str, params: Sequence[Any], row_id: str) -> int | None:
        cursor = conn.execute(sql, params)
        if not isinstance(cursor, sqlite3.Cursor):  # pragma: no cover - SQLite's own connection
            raise TypeError("a SqliteBase transaction runs on a sqlite3 connection")
        return cursor.lastrowid if cursor.rowcount > 0 else None
