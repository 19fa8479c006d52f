"""Collector state in PostgreSQL, for collectors that share one database (HA, several clusters).

The same schema and migrations as SQLite (:mod:`.migrations`, rendered for PostgreSQL), the
same record families (:mod:`.sql_fleet`, :mod:`.sql_remediation`, :mod:`.sql_delivery`), the
same guarantees enforced by the database: unique idempotency keys, single-use approvals
(a conditional ``UPDATE``), an append-only audit log (a trigger refuses ``UPDATE``, ``DELETE``
and ``TRUNCATE``). See :mod:`.postgres_base` for connections, threads and concurrency.
"""

from __future__ import annotations

from gpuwarden.collector.storage.postgres_base import PostgresBase
from gpuwarden.collector.storage.sql_delivery import DeliveryRecords
from gpuwarden.collector.storage.sql_fleet import FleetRecords
from gpuwarden.collector.storage.sql_lease import LeaseRecords
from gpuwarden.collector.storage.sql_silences import SilenceRecords

__all__ = ["PostgresStorage"]


class PostgresStorage(FleetRecords, LeaseRecords, DeliveryRecords, SilenceRecords, PostgresBase):
    """Collector state in a PostgreSQL database.

    The methods' contracts are :class:`~gpuwarden.collector.storage.base.Storage`'s.

    Args:
        url: ``postgresql://user@host:port/dbname`` (libpq also reads ``PGPASSWORD``,
            ``~/.pgpass`` and the other ``PG*`` variables itself).
        clock: wall clock for bookkeeping columns (``updated_at``, ``applied_at``...).
        cluster: the collector's cluster (:mod:`.clusters`): the rows it writes carry it, and
            reads see only its rows unless they name another cluster or every one.
        password: the password, when read from a file (never part of ``url``).
        connect_timeout_seconds: how long to wait for the server at connect.

    Raises:
        StorageError: the server cannot be reached, refuses the login, or the schema cannot
            be migrated (one line, the URL without a password).
        SchemaVersionError: the database was written by a newer gpuwarden.
    """
