"""How a record maps to its table, for the SQL backends' parts (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from gpuwarden.collector.storage.dialect import Dialect

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ALL = float("-inf")  # "since" when the caller gave none: every value compares >= it
R = TypeVar("R")
_Convert = Callable[[Any], Any]


class Row(Protocol):
    """A result row, by column name or position (``sqlite3.Row``, the PostgreSQL backend's)."""

    def __getitem__(self, key: Any, /) -> Any: ...  # a name, a position or a slice


def same(value: Any) -> Any:
    """The value unchanged (a column without a conversion)."""
    return value


def field_names(cls: type[DataclassInstance], *, without: str | None = None) -> tuple[str, ...]:
    """The dataclass' field names (the table's columns), but ``without``."""
    return tuple(f.name for f in fields(cls) if f.name != without)


def marks(count: int) -> str:
    """``count`` SQL placeholders."""
    return ", ".join("?" * count)


def one_of(column: str, count: int) -> str:
    """``column IN (?, ...)`` with ``count`` placeholders; an empty list matches nothing
    (PostgreSQL has no empty ``IN ()``, SQLite's matches nothing)."""
    return f"{column} IN ({marks(count)})" if count else "1 = 0"


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

    def load(self, row: Row) -> R:
        decode = self.from_sql or {}
        names = self.columns if self.row_id is None else (*self.columns, self.row_id)
        return self.make(**{c: decode.get(c, same)(row[c]) for c in names})

    def insert_sql(self, stamps: Sequence[str] = (), suffix: str = "", verb: str = "INSERT") -> str:
        # Identifiers come from the record modules' constants; values are always bound.
        names = (*self.columns, *stamps)
        columns = ", ".join(names)
        return f"{verb} INTO {self.table} ({columns}) VALUES ({marks(len(names))}) {suffix}"

    def upsert_sql(self, stamps: Sequence[str], dialect: Dialect) -> str:
        """Upsert by the first column within the row's cluster (a stamp), writing (and
        counting in ``rowcount``) only changes.

        Of the ``stamps`` only ``updated_at`` is rewritten (``first_seen`` keeps its value).
        """
        old = ", ".join(self.columns[1:])
        new = ", ".join(f"excluded.{c}" for c in self.columns[1:])
        changed = dialect.changed(self.table, self.columns[1:])
        return self.insert_sql(
            stamps,
            f"ON CONFLICT (cluster, {self.columns[0]}) DO UPDATE SET ({old}, updated_at)"
            f" = ({new}, excluded.updated_at) WHERE {changed}",
        )

    def replace_sql(self, stamps: Sequence[str], key: Sequence[str], dialect: Dialect) -> str:
        """Insert, replacing the stored row with the same ``key`` columns."""
        suffix = dialect.replace_suffix(key, (*self.columns, *stamps))
        return self.insert_sql(stamps, suffix, verb=dialect.replace_verb)
