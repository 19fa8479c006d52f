"""The few places where SQLite and PostgreSQL SQL differ, as one small value per dialect.

Everything else (tables, columns, the statements of every ``Storage`` method) is written once,
in SQL both engines accept, with ``?`` parameters (the PostgreSQL connection rewrites them into
its own). A statement that needs a construct one engine lacks asks its :class:`Dialect` for it:

* an upsert that writes only changed rows compares row values with ``IS NOT`` (SQLite) or
  ``IS DISTINCT FROM`` (PostgreSQL), which also needs the target's columns qualified;
* ``INSERT OR REPLACE`` (SQLite) is ``ON CONFLICT (key) DO UPDATE`` (PostgreSQL);
* a list of distinct strings is ``GROUP_CONCAT`` or ``string_agg``; counting the rows where a
  condition holds is ``SUM(condition)`` or ``COUNT(*) FILTER``;
* SQLite sorts ``NULL`` first, PostgreSQL last unless told (``NULLS FIRST``);
* "no limit" is ``LIMIT -1`` or ``LIMIT NULL``;
* the database's own clock, and row locks (``FOR UPDATE`` / ``FOR SHARE``, PostgreSQL only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

DialectName = Literal["sqlite", "postgresql"]


@dataclass(frozen=True, slots=True)
class Dialect:
    """One engine's spelling of the constructs above."""

    name: DialectName

    @property
    def postgresql(self) -> bool:
        return self.name == "postgresql"

    @property
    def no_limit(self) -> int | None:
        """The ``LIMIT ?`` value that means every row."""
        return None if self.postgresql else -1

    def changed(self, table: str, columns: Sequence[str]) -> str:
        """In an upsert: the stored row's ``columns`` differ from the proposed row's."""
        new = ", ".join(f"excluded.{c}" for c in columns)
        if self.postgresql:
            old = ", ".join(f"{table}.{c}" for c in columns)
            return f"ROW({old}) IS DISTINCT FROM ROW({new})"
        return f"({', '.join(columns)}) IS NOT ({new})"

    def replace_suffix(self, key: Sequence[str], columns: Sequence[str]) -> str:
        """What follows ``INSERT INTO t (...) VALUES (...)`` to replace the row of ``key``
        (``""`` on SQLite, whose verb is ``INSERT OR REPLACE`` instead: :meth:`replace_verb`)."""
        if not self.postgresql:
            return ""
        rest = [c for c in columns if c not in key]
        new = ", ".join(f"excluded.{c}" for c in rest)
        return f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET ({', '.join(rest)}) = ROW({new})"

    @property
    def replace_verb(self) -> str:
        return "INSERT" if self.postgresql else "INSERT OR REPLACE"

    def distinct_list(self, expression: str) -> str:
        """The distinct values of ``expression`` in a group, comma-separated."""
        if self.postgresql:
            return f"string_agg(DISTINCT {expression}, ',')"
        return f"GROUP_CONCAT(DISTINCT {expression})"

    def count_where(self, condition: str) -> str:
        """How many rows of the group satisfy ``condition`` (an integer)."""
        if self.postgresql:
            return f"COUNT(*) FILTER (WHERE {condition})"
        return f"SUM({condition})"

    @property
    def now_seconds(self) -> str:
        """The database's clock as Unix seconds (a ``REAL``): the lease's one clock."""
        if self.postgresql:
            return "EXTRACT(EPOCH FROM clock_timestamp())::float8"
        return "((julianday('now') - 2440587.5) * 86400.0)"

    @property
    def lock_for_update(self) -> str:
        """Suffix of a ``SELECT`` that locks its row for this transaction's update (SQLite's
        write transaction, ``BEGIN IMMEDIATE``, already excludes every other writer)."""
        return " FOR UPDATE" if self.postgresql else ""

    @property
    def lock_for_share(self) -> str:
        """Suffix of a ``SELECT`` that keeps its row from being updated until commit."""
        return " FOR SHARE" if self.postgresql else ""

    def nulls_first(self, expression: str) -> str:
        """``expression`` in an ``ORDER BY``, sorting ``NULL`` first as SQLite does."""
        return f"{expression} NULLS FIRST" if self.postgresql else expression


SQLITE = Dialect("sqlite")
POSTGRESQL = Dialect("postgresql")
DIALECTS = (SQLITE, POSTGRESQL)
