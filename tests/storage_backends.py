"""The storage backends the storage tests run on: SQLite (a file) and a real PostgreSQL.

``Backend`` opens stores on one database (again and again: reopening is part of what is
tested) and runs raw SQL on it with its own connection, the way an operator or another process
would. The ``backend`` fixture gives each test a fresh database on each engine; PostgreSQL is
started only for the tests that run on it (``tests.postgres_server``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gpuwarden.collector.storage.postgres import PostgresStorage
from gpuwarden.collector.storage.sqlite import SqliteStorage

BACKENDS = ("sqlite", "postgresql")
SqlStorage = SqliteStorage | PostgresStorage


@dataclass(frozen=True)
class Backend:
    """One database on one engine: ``name`` is ``sqlite`` or ``postgresql``."""

    name: str
    location: str  # the SQLite file, or the PostgreSQL URL

    def open(self, clock: Callable[[], float] = time.time) -> SqlStorage:
        if self.name == "sqlite":
            return SqliteStorage(self.location, clock=clock)
        return PostgresStorage(self.location, clock=clock)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of ``sql``, on a connection of our own."""
        if self.name == "sqlite":
            with closing(sqlite3.connect(self.location)) as conn:
                return conn.execute(sql).fetchall()
        with psycopg.connect(self.location, autocommit=True) as conn:
            return conn.execute(sql.encode()).fetchall()

    def execute(self, sql: str) -> None:
        """Run ``sql`` (one or several statements) and commit, on a connection of our own."""
        if self.name == "sqlite":
            with closing(sqlite3.connect(self.location, isolation_level=None)) as conn:
                conn.executescript(sql)
            return
        with psycopg.connect(self.location, autocommit=True) as conn:
            conn.execute(sql.encode())


def backend_for(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh database on ``name``'s engine (PostgreSQL's server starts on first use)."""
    if name == "sqlite":
        return Backend("sqlite", str(tmp_path / "state.db"))
    url: str = request.getfixturevalue("fresh_database")
    return Backend("postgresql", url)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh database, once on SQLite and once on PostgreSQL."""
    return backend_for(request.param, request, tmp_path)


def opened(backend: Backend, clock: Callable[[], float] = time.time) -> Iterator[SqlStorage]:
    """A store on ``backend``, closed after the test (for fixtures to ``yield from``)."""
    with backend.open(clock) as store:
        yield store
