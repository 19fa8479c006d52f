"""The default :class:`~gpuwarden.collector.storage.base.Storage`: one SQLite file in WAL mode.

Threads: one connection opened with ``check_same_thread=False`` and guarded by one lock, held for
the length of one transaction. The collector calls the store from its asyncio loop (through a
thread executor) and from worker threads; SQLite has one writer at a time anyway, and every
method is one short transaction, so a second connection per thread would buy little and cost a
connection life-cycle per thread.

Transactions: the connection is in autocommit mode; writes run in ``BEGIN IMMEDIATE`` ...
``COMMIT`` (IMMEDIATE takes the write lock up front, so a second process waits for it under
``busy_timeout`` instead of failing half-way), reads are single statements.

Durability: ``journal_mode=WAL`` with ``synchronous=NORMAL`` by default. A commit is in the WAL
file (the OS page cache) when the method returns, so it survives the process being killed
(``kill -9``, OOM killer, a crash); the WAL is fsync'd at checkpoints only, so an operating-system
crash or power loss can lose the last transactions, never the database's consistency.
``synchronous="FULL"`` fsyncs the WAL on every commit and survives those too, at the price of one
fsync per write.
"""

from __future__ import annotations

from gpuwarden.collector.storage.sql_delivery import DeliveryRecords
from gpuwarden.collector.storage.sql_fleet import FleetRecords
from gpuwarden.collector.storage.sql_lease import LeaseRecords
from gpuwarden.collector.storage.sql_silences import SilenceRecords
from gpuwarden.collector.storage.sqlite_base import (
    MEMORY,
    MIN_SQLITE_VERSION,
    SqliteBase,
    Synchronous,
)

__all__ = ["MEMORY", "MIN_SQLITE_VERSION", "SqliteStorage", "Synchronous"]


class SqliteStorage(FleetRecords, LeaseRecords, DeliveryRecords, SilenceRecords, SqliteBase):
    """Collector state in one SQLite database (``":memory:"`` for tests and demos).

    The methods' contracts are :class:`~gpuwarden.collector.storage.base.Storage`'s. The
    connection (opening, lock, transactions) is ``SqliteBase``'s; the methods come by record
    family from mixin bases shared with the PostgreSQL backend: ``FleetRecords`` (jobs,
    models, events, accounting),
    ``LeaseRecords`` (the HA leader lease, over ``RemediationRecords``: incidents, audit,
    actions, approvals, breaker) and
    ``DeliveryRecords`` (notifications, pages, cursors) and ``SilenceRecords`` (operators'
    silences).

    Args:
        path: the database file (created, with its schema, if missing), or ``":memory:"``.
        clock: wall clock for bookkeeping columns (``updated_at``, ``applied_at``...).
        cluster: the collector's cluster (:mod:`.clusters`): the rows it writes carry it, and
            reads see only its rows unless they name another cluster or every one.
        synchronous: ``"NORMAL"`` (default: survives process kill, not OS crash) or ``"FULL"``.
        busy_timeout_seconds: how long a write waits for another process's write lock.

    Raises:
        StorageError: the file cannot be opened, is not a database, or cannot use WAL.
        SchemaVersionError: the database was written by a newer gpuwarden.
    """
