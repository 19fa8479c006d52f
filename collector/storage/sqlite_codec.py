"""How a record maps to its SQLite table, for :class:`~.sqlite.SqliteStorage`'s parts."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ALL = float("-inf")  # "since" when the caller gave none: every value compares >= it
R = TypeVar("R")
_Convert = Callable[[Any], Any]


def same(value: Any) -> Any:
    """The value unchanged (a column without a conversion)."""
    return value


def field_names(cls: type[DataclassInstance], *, without: str | None = None) -> tuple[str, ...]:
    """The dataclass' field names (the table's columns), but ``without``."""
    return tuple(f.name for f in fields(cls) if f.name != without)


def marks(count: int) -> str:
    """``count`` SQL placeholders."""
    return ", ".join("?" * count)


@dataclass(frozen=True, slots=True)
class Codec(Generic[R]):
    """How a record maps to its table: one column per field, named like the field.

    Deriving the columns from the dataclass means a new field without a migration fails loudly
    on the first write ("no column named ...") instead of being dropped.
    """

    table: str
    make: Callable[..., R]
    columns: tuple[str, ...]  # written, in this order
    row_id: str | None = None  # an id assigned by the database: read, never written
    to_sql: dict[str, _Convert] | None = None
    from_sql: dict[str, _Convert] | None = None

    def params(self, record: R, *stamps: object) -> tuple[object, ...]:
        encode = self.to_sql or {}
        values = (encode.get(c, same)(getattr(record, c)) for c in self.columns)
        return (*values, *stamps)

    def load(self, row: sqlite3.Row) -> R:
        decode = self.from_sql or {}
        names = self.columns if self.row_id is None else (*self.columns, self.row_id)
        return self.make(**{c: decode.get(c, same)(row[c]) for c in names})

    def insert_sql(self, stamps: Sequence[str] = (), suffix: str = "", verb: str = "INSERT") -> str:
        # Identifiers come from the sqlite modules' constants; values are always bound.
        names = (*self.columns, *stamps)
        columns = ", ".join(names)
        return f"{verb} INTO {self.table} ({columns}) VALUES ({marks(len(names))}) {suffix}"

    def upsert_sql(self, stamps: Sequence[str]) -> str:
        """Upsert by the first column, writing (and counting in ``rowcount``) only changes.

        Of the ``stamps`` only ``updated_at`` is rewritten (``first_seen`` keeps its value).
        """
        old = ", ".join(self.columns[1:])
        new = ", ".join(f"excluded.{c}" for c in self.columns[1:])
        return self.insert_sql(
            stamps,
            f"ON CONFLICT ({self.columns[0]}) DO UPDATE SET ({old}, updated_at)"
            f" = ({new}, excluded.updated_at) WHERE ({old}) IS NOT ({new})",
        )
