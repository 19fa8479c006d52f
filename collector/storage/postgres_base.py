"""The PostgreSQL connection of :class:`~.postgres.PostgresStorage`: opening, one lock,
transactions, migrations. The one module (with :mod:`.postgres`) that imports ``psycopg``.

Threads: like the SQLite backend, one connection guarded by one lock, held for one transaction
(every method is one short transaction; the collector's callers are its asyncio loop's executor
and a few worker threads). Several collector *processes* may share the database: everything that
must happen once is decided by the database inside one statement (unique constraints with
``ON CONFLICT``, ``UPDATE ... WHERE state = ?`` / ``WHERE used_at IS NULL``), which PostgreSQL's
row locks make safe at READ COMMITTED: a second writer waits for the first and re-checks the
``WHERE`` against the committed row. Audit appends also take a table lock that only appenders
contend on, so entry ids rise in commit order (a reader following ``after_id`` skips nothing).

Parameters: the shared SQL is written with ``?``; this module turns them into psycopg's ``%s``
and binds on the client side (:class:`psycopg.ClientCursor`), so a parameter compared with
``IS NULL`` needs no type (server-side binding cannot infer the type of a lone ``NULL``).

A connection that broke (server restart, failover) is replaced at the next call; the call that
saw it break raises, and is not retried (a lost ``COMMIT`` acknowledgement cannot be replayed
blindly).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import psycopg

from gpuwarden.collector.storage.base import SchemaVersionError, StorageError
from gpuwarden.collector.storage.clusters import DEFAULT_CLUSTER, check_cluster
from gpuwarden.collector.storage.dialect import POSTGRESQL
from gpuwarden.collector.storage.migrations import (
    CREATE_VERSIONS,
    MIGRATIONS,
    Migration,
    check_order,
    render_postgresql,
)
from gpuwarden.collector.storage.sql_base import Connection, SqlBase
from gpuwarden.collector.storage.sql_codec import Row
from gpuwarden.collector.storage.urls import is_postgresql_url, redact_url

#: ``pg_advisory_lock`` key held while migrating, so two collectors starting on one new
#: database apply each migration once ("gpuwarden" in ASCII, as an int64).
MIGRATION_LOCK_KEY = 0x67707577617264


class PgRow:
    """A result row by column name or position, like ``sqlite3.Row``."""

    __slots__ = ("_names", "_values")

    def __init__(self, names: dict[str, int], values: Sequence[Any]) -> None:
        self._names = names
        self._values = values

    def __getitem__(self, key: Any, /) -> Any:
        return self._values[self._names[key] if isinstance(key, str) else key]

    def __len__(self) -> int:
        return len(self._values)


def _rows(cursor: Any) -> Callable[[Sequence[Any]], PgRow]:
    names = {column.name: i for i, column in enumerate(cursor.description or ())}
    return lambda values: PgRow(names, values)


@lru_cache(maxsize=512)
def _pyformat(sql: str) -> str:
    """The shared SQL's ``?`` parameters as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _Qmark:
    """A psycopg connection speaking the shared SQL's ``?`` parameters."""

    def __init__(self, conn: psycopg.Connection[PgRow]) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> psycopg.Cursor[PgRow]:
        return self._conn.execute(_pyformat(sql), tuple(params))

    def executemany(self, sql: str, params: Sequence[Sequence[Any]], /) -> psycopg.Cursor[PgRow]:
        cursor = self._conn.cursor()
        cursor.executemany(_pyformat(sql), [tuple(p) for p in params])
        return cursor


def connect(
    url: str, *, password: str | None, connect_timeout_seconds: int
) -> psycopg.Connection[PgRow]:
    """Open an autocommit, client-side-binding connection.

    Raises:
        StorageError: one line: the server cannot be reached or refuses us.
    """
    extra: dict[str, Any] = {"connect_timeout": connect_timeout_seconds}
    if password is not None:
        extra["password"] = password
    try:
        return psycopg.connect(
            url,
            autocommit=True,  # transactions are explicit: conn.transaction()
            cursor_factory=psycopg.ClientCursor,
            row_factory=_rows,
            application_name="gpuwarden-collector",
            **extra,
        )
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())  # libpq's message spans lines
        raise StorageError(f"{redact_url(url)}: cannot connect to PostgreSQL: {reason}") from None


class PostgresBase(SqlBase):
    """One connection guarded by one lock; ``_write`` is one transaction."""

    dialect = POSTGRESQL

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        cluster: str = DEFAULT_CLUSTER,
        password: str | None = None,
        connect_timeout_seconds: int = 10,
    ) -> None:
        if not is_postgresql_url(url):
            raise ValueError(f"not a postgresql:// URL: {redact_url(url)!r}")
        self.location = redact_url(url)
        self._url = url
        self._password = password
        self._timeout = connect_timeout_seconds
        self._clock = clock
        self.cluster = check_cluster(cluster)
        self._lock = threading.Lock()
        conn = connect(url, password=password, connect_timeout_seconds=connect_timeout_seconds)
        try:
            self.applied_migrations = migrate_postgresql(conn, now=clock(), location=self.location)
        except psycopg.Error as exc:
            conn.close()
            raise StorageError(f"{self.location}: cannot migrate the database: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        self._conn: psycopg.Connection[PgRow] | None = conn

    def _connection(self) -> psycopg.Connection[PgRow]:
        if self._conn is None:
            raise StorageError(f"{self.location}: the store is closed")
        if self._conn.broken:
            self._conn.close()
            self._conn = connect(
                self._url, password=self._password, connect_timeout_seconds=self._timeout
            )
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self._lock, self._unavailable():
            conn = self._connection()
            with conn.transaction():
                yield _Qmark(conn)

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        with self._lock, self._unavailable():
            rows: list[Row] = list(_Qmark(self._connection()).execute(sql, params).fetchall())
            return rows

    @contextmanager
    def _unavailable(self) -> Iterator[None]:
        """A lost or refused connection is :class:`StorageError` (the store cannot be used
        now), as a locked or missing SQLite file is; SQL errors stay psycopg's."""
        try:
            yield
        except psycopg.OperationalError as exc:
            reason = " ".join(str(exc).split())
            raise StorageError(f"{self.location}: PostgreSQL unavailable: {reason}") from exc

    def _insert(self, conn: Connection, sql: str, params: Sequence[Any], row_id: str) -> int | None:
        row = conn.execute(f"{sql} RETURNING {row_id}", params).fetchone()
        return None if row is None else int(row[0])

    def _before_audit(self, conn: Connection) -> None:
        conn.execute("LOCK TABLE audit_log IN SHARE ROW EXCLUSIVE MODE")


def schema_version_postgresql(conn: psycopg.Connection[Any]) -> int:
    """The newest applied migration, 0 for an empty database."""
    row = conn.execute("SELECT to_regclass('schema_migrations')").fetchone()
    if row is None or row[0] is None:
        return 0
    (version,) = conn.execute(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations"
    ).fetchone() or (0,)
    return int(version)


def migrate_postgresql(
    conn: psycopg.Connection[Any],
    *,
    now: float,
    location: str,
    migrations: Sequence[Migration] = MIGRATIONS,
) -> list[int]:
    """:func:`~.migrations.migrate` for PostgreSQL: the same list, each migration in its own
    transaction with its version row; an advisory lock makes concurrent starters take turns.

    Raises:
        SchemaVersionError: the database is newer than ``migrations`` (named by ``location``).
    """
    check_order(migrations)
    latest = migrations[-1].version if migrations else 0
    applied: list[int] = []
    conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
    try:
        conn.execute(render_postgresql(CREATE_VERSIONS))
        for migration in migrations:
            with conn.transaction():
                current = schema_version_postgresql(conn)
                if current > latest:
                    raise SchemaVersionError(location, current, latest)
                if migration.version <= current:
                    continue
                conn.execute(migration.script(POSTGRESQL).encode())  # several statements
                conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
                    (migration.version, migration.name, now),
                )
            applied.append(migration.version)
        current = schema_version_postgresql(conn)
        if current > latest:
            raise SchemaVersionError(location, current, latest)
    finally:
        if not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied
