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

import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.storage.base import (
    ActionRecord,
    ApprovalRecord,
    BreakerRecord,
    NotificationRecord,
    PageRecord,
    StorageError,
)
from gpuwarden.collector.storage.migrations import migrate
from gpuwarden.collector.storage.records import (
    ROLLUP_DIMENSIONS,
    AccountingRow,
    AuditEntry,
    Event,
    EventKind,
    Incident,
    IncidentState,
    ModelDeployment,
    RollupDimension,
    RollupTotal,
    dump_allocations,
    dump_json,
    load_allocations,
    load_json,
    load_labels,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


Synchronous = Literal["NORMAL", "FULL"]
MEMORY = ":memory:"
MIN_SQLITE_VERSION = (3, 24, 0)
_SYNCHRONOUS_PRAGMA: dict[str, str] = {
    "NORMAL": "PRAGMA synchronous = NORMAL",
    "FULL": "PRAGMA synchronous = FULL",
}
_ALL = float("-inf")  # "since" when the caller gave none: every value compares >= it
R = TypeVar("R")
_Convert = Callable[[Any], Any]


def _same(value: Any) -> Any:
    return value


def _names(cls: type[DataclassInstance], *, without: str | None = None) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.name != without)


def _marks(count: int) -> str:
    return ", ".join("?" * count)


@dataclass(frozen=True, slots=True)
class _Codec(Generic[R]):
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
        values = (encode.get(c, _same)(getattr(record, c)) for c in self.columns)
        return (*values, *stamps)

    def load(self, row: sqlite3.Row) -> R:
        decode = self.from_sql or {}
        names = self.columns if self.row_id is None else (*self.columns, self.row_id)
        return self.make(**{c: decode.get(c, _same)(row[c]) for c in names})

    def insert_sql(self, stamps: Sequence[str] = (), suffix: str = "", verb: str = "INSERT") -> str:
        # Identifiers come from this module's constants; values are always bound.
        names = (*self.columns, *stamps)
        columns = ", ".join(names)
        return f"{verb} INTO {self.table} ({columns}) VALUES ({_marks(len(names))}) {suffix}"

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


_JOBS = _Codec(
    "jobs",
    Job,
    _names(Job),
    to_sql={"state": JobState, "allocations": dump_allocations, "labels": dump_json},
    from_sql={"state": JobState, "allocations": load_allocations, "labels": load_labels},
)
_MODELS = _Codec(
    "models",
    ModelDeployment,
    _names(ModelDeployment),
    to_sql={"labels": dump_json},
    from_sql={"labels": load_labels},
)
_EVENTS = _Codec(
    "events",
    Event,
    _names(Event),
    to_sql={"kind": EventKind, "attributes": dump_json},
    from_sql={"kind": EventKind, "attributes": load_json},
)
_ACCOUNTING = _Codec(
    "accounting",
    AccountingRow,
    _names(AccountingRow),
    to_sql={"job_key": lambda key: key or ""},  # '' in the key column: no job
    from_sql={"job_key": lambda key: key or None},
)
_INCIDENTS = _Codec(
    "incidents",
    Incident,
    _names(Incident, without="incident_id"),
    row_id="incident_id",
    to_sql={"state": IncidentState, "evidence": dump_json},
    from_sql={"state": IncidentState, "evidence": load_json},
)
_AUDIT = _Codec(
    "audit_log",
    AuditEntry,
    _names(AuditEntry, without="entry_id"),
    row_id="entry_id",
    to_sql={"dry_run": int, "inputs": dump_json},
    from_sql={"dry_run": bool, "inputs": load_json},
)
_ACTIONS = _Codec(
    "remediation_actions",
    ActionRecord,
    _names(ActionRecord, without="action_id"),
    row_id="action_id",
    to_sql={"dry_run": int, "params": dump_json},
    from_sql={"dry_run": bool, "params": load_json},
)
_APPROVALS = _Codec(
    "approvals",
    ApprovalRecord,
    _names(ApprovalRecord, without="approval_id"),
    row_id="approval_id",
)
_BREAKERS = _Codec("breaker_state", BreakerRecord, _names(BreakerRecord))
_NOTIFICATIONS = _Codec(
    "notifications",
    NotificationRecord,
    _names(NotificationRecord),
    to_sql={"delivered": int},
    from_sql={"delivered": bool},
)
_SAVE_NOTIFICATION = _NOTIFICATIONS.insert_sql(verb="INSERT OR REPLACE")
_PAGES = _Codec(
    "pages",
    PageRecord,
    _names(PageRecord, without="page_id"),
    row_id="page_id",
    to_sql={"alert": dump_json},
    from_sql={"alert": load_json},
)
_PAGE_MUTABLE = ("status", "attempts", "next_attempt_at", "sent_at", "last_error", "alert")
_ACTION_MUTABLE = (
    "dry_run",
    "state",
    "attempts",
    "params",
    "updated_at",
    "next_attempt_at",
    "cooldown_until",
    "verify_at",
    "last_error",
)
_UPDATE_ACTION = (
    f"UPDATE remediation_actions SET ({', '.join(_ACTION_MUTABLE)})"  # noqa: S608
    f" = ({_marks(len(_ACTION_MUTABLE))}) WHERE action_id = ? AND state = ?"
)
_INSERT_ACTION = _ACTIONS.insert_sql((), "ON CONFLICT DO NOTHING")
_INSERT_APPROVAL = _APPROVALS.insert_sql()
_SET_BREAKER = _BREAKERS.insert_sql(
    (),
    "ON CONFLICT (scope) DO UPDATE SET (state, updated_at, reason, tripped_at)"
    " = (excluded.state, excluded.updated_at, excluded.reason, excluded.tripped_at)"
    " WHERE breaker_state.state = ?",
)
_UPSERT_JOB = _JOBS.upsert_sql(("first_seen", "updated_at"))
_UPSERT_MODEL = _MODELS.upsert_sql(("updated_at",))
_INSERT_EVENT = _EVENTS.insert_sql(("recorded_at",), "ON CONFLICT DO NOTHING")
_REPLACE_ACCOUNTING = _ACCOUNTING.insert_sql(("written_at",), verb="INSERT OR REPLACE")
_INSERT_INCIDENT = _INCIDENTS.insert_sql(("updated_at",), "ON CONFLICT DO NOTHING")
_INSERT_AUDIT = _AUDIT.insert_sql()
_ROLLUP_GROUP: dict[str, str] = {d: d for d in ROLLUP_DIMENSIONS} | {
    "job_key": "NULLIF(job_key, '')"
}
_ROLLUP_SUMS = (
    "COUNT(*), SUM(energy_joules IS NULL OR cost_usd IS NULL OR carbon_grams IS NULL),"
    " SUM(gpu_seconds_allocated), SUM(gpu_seconds_busy), SUM(gpu_seconds_idle),"
    " SUM(gpu_seconds_unknown), SUM(energy_joules), SUM(cost_usd), SUM(carbon_grams)"
)


class SqliteStorage:
    """Collector state in one SQLite database (``":memory:"`` for tests and demos).

    The methods' contracts are :class:`~gpuwarden.collector.storage.base.Storage`'s.

    Args:
        path: the database file (created, with its schema, if missing), or ``":memory:"``.
        clock: wall clock for bookkeeping columns (``updated_at``, ``applied_at``...).
        synchronous: ``"NORMAL"`` (default: survives process kill, not OS crash) or ``"FULL"``.
        busy_timeout_seconds: how long a write waits for another process's write lock.

    Raises:
        StorageError: the file cannot be opened, is not a database, or cannot use WAL.
        SchemaVersionError: the database was written by a newer gpuwarden.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        clock: Callable[[], float] = time.time,
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

    def __enter__(self) -> SqliteStorage:
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

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._connection().execute(sql, params).fetchall()

    def _one(self, codec: _Codec[R], sql: str, key: object) -> R | None:
        rows = self._read(sql, (key,))
        return codec.load(rows[0]) if rows else None

    # Jobs ------------------------------------------------------------------------------------

    def upsert_jobs(self, jobs: Sequence[Job]) -> int:
        now = self._clock()
        params = [_JOBS.params(job, now, now) for job in jobs]
        with self._write() as conn:
            return conn.executemany(_UPSERT_JOB, params).rowcount

    def jobs(
        self, *, since: float | None = None, states: Collection[JobState] | None = None
    ) -> list[Job]:
        sql = "SELECT * FROM jobs WHERE (end_time IS NULL OR end_time >= ?)"
        params: list[Any] = [_ALL if since is None else since]
        if states is not None:
            sql += f" AND state IN ({_marks(len(states))})"
            params += [JobState(s) for s in states]
        return [_JOBS.load(row) for row in self._read(sql + " ORDER BY key", params)]

    def job(self, key: str) -> Job | None:
        return self._one(_JOBS, "SELECT * FROM jobs WHERE key = ?", key)

    # Models and events -----------------------------------------------------------------------

    def upsert_model(self, model: ModelDeployment) -> bool:
        params = _MODELS.params(model, self._clock())
        with self._write() as conn:
            return conn.execute(_UPSERT_MODEL, params).rowcount > 0

    def models(self) -> list[ModelDeployment]:
        return [_MODELS.load(row) for row in self._read("SELECT * FROM models ORDER BY name")]

    def model(self, name: str) -> ModelDeployment | None:
        return self._one(_MODELS, "SELECT * FROM models WHERE name = ?", name)

    def record_event(self, event: Event) -> bool:
        params = _EVENTS.params(event, self._clock())
        with self._write() as conn:
            return conn.execute(_INSERT_EVENT, params).rowcount > 0

    def events(
        self,
        *,
        since: float | None = None,
        kinds: Collection[EventKind] | None = None,
        subject: str | None = None,
    ) -> list[Event]:
        sql = "SELECT * FROM events WHERE time >= ?"
        params: list[Any] = [_ALL if since is None else since]
        if kinds is not None:
            sql += f" AND kind IN ({_marks(len(kinds))})"
            params += [EventKind(k) for k in kinds]
        if subject is not None:
            sql += " AND subject = ?"
            params.append(subject)
        return [_EVENTS.load(row) for row in self._read(sql + " ORDER BY time, event_id", params)]

    # Accounting ------------------------------------------------------------------------------

    def write_rollups(self, rows: Sequence[AccountingRow]) -> int:
        now = self._clock()
        scopes = sorted({(row.period_start, row.gpu_uuid) for row in rows})
        params = [_ACCOUNTING.params(row, now) for row in rows]
        with self._write() as conn:
            conn.executemany(
                "DELETE FROM accounting WHERE period_start = ? AND gpu_uuid = ?", scopes
            )
            # The DELETE made room; OR REPLACE lets a duplicate key within the batch win last.
            conn.executemany(_REPLACE_ACCOUNTING, params)
        return len(rows)

    def accounting_rows(self, *, since: float, until: float) -> list[AccountingRow]:
        rows = self._read(
            "SELECT * FROM accounting WHERE period_start >= ? AND period_start < ?"
            " ORDER BY period_start, gpu_uuid, job_key",
            (since, until),
        )
        return [_ACCOUNTING.load(row) for row in rows]

    def rollups(
        self, *, since: float, until: float, by: Sequence[RollupDimension] = ()
    ) -> list[RollupTotal]:
        if any(d not in _ROLLUP_GROUP for d in by) or len(set(by)) != len(by):
            raise ValueError(f"by must name distinct dimensions of {ROLLUP_DIMENSIONS}: {by!r}")
        # Only whitelisted column expressions are spliced in; the values are bound.
        groups = ", ".join(_ROLLUP_GROUP[d] for d in by)
        sql = f"SELECT {groups}{', ' if by else ''}{_ROLLUP_SUMS} FROM accounting"  # noqa: S608
        sql += " WHERE period_start >= ? AND period_start < ?"
        if by:
            sql += f" GROUP BY {groups} ORDER BY {groups}"
        n = len(by)
        return [
            # The sums are selected in the order of RollupTotal's fields.
            RollupTotal(MappingProxyType(dict(zip(by, row[:n], strict=True))), *row[n:])
            for row in self._read(sql, (since, until))
            if row[n] > 0  # without GROUP BY, an empty range still gives one all-NULL row
        ]

    # Incidents -------------------------------------------------------------------------------

    def open_incident(self, incident: Incident) -> int | None:
        if incident.incident_id is not None or incident.state is not IncidentState.OPEN:
            raise ValueError("open_incident takes a new incident (no id) in state 'open'")
        params = _INCIDENTS.params(incident, self._clock())
        with self._write() as conn:
            cursor = conn.execute(_INSERT_INCIDENT, params)
            return cursor.lastrowid if cursor.rowcount > 0 else None

    def update_incident(self, incident: Incident) -> bool:
        i = incident
        if i.incident_id is None:
            raise ValueError("update_incident needs incident.incident_id")
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE incidents SET state = ?, severity = ?, last_seen = ?, resolved_time = ?,"
                " evidence = ?, consecutive_breaches = ?, consecutive_clears = ?, updated_at = ?"
                " WHERE incident_id = ?",
                (
                    *(IncidentState(i.state), i.severity, i.last_seen, i.resolved_time),
                    *(dump_json(i.evidence), i.consecutive_breaches, i.consecutive_clears),
                    *(self._clock(), i.incident_id),
                ),
            )
            return cursor.rowcount > 0

    def incident(self, incident_id: int) -> Incident | None:
        return self._one(_INCIDENTS, "SELECT * FROM incidents WHERE incident_id = ?", incident_id)

    def open_incident_for(self, fingerprint: str) -> Incident | None:
        sql = "SELECT * FROM incidents WHERE fingerprint = ? AND state = 'open'"
        return self._one(_INCIDENTS, sql, fingerprint)

    def incidents(self, *, state: IncidentState | None = None) -> list[Incident]:
        sql = "SELECT * FROM incidents WHERE ? IS NULL OR state = ? ORDER BY incident_id"
        value = None if state is None else IncidentState(state)
        return [_INCIDENTS.load(row) for row in self._read(sql, (value, value))]

    # Audit -----------------------------------------------------------------------------------

    def append_audit(self, entry: AuditEntry) -> int:
        if entry.entry_id is not None:
            raise ValueError("append_audit takes a new entry (entry_id=None)")
        with self._write() as conn:
            entry_id = conn.execute(_INSERT_AUDIT, _AUDIT.params(entry)).lastrowid
        if entry_id is None:  # pragma: no cover - a successful INSERT always sets it
            raise StorageError("audit_log insert returned no id")
        return entry_id

    def audit(
        self, *, since: float | None = None, limit: int | None = None, after_id: int = 0
    ) -> list[AuditEntry]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        rows = self._read(
            "SELECT * FROM audit_log WHERE time >= ? AND entry_id > ? ORDER BY entry_id LIMIT ?",
            (_ALL if since is None else since, after_id, -1 if limit is None else limit),
        )
        return [_AUDIT.load(row) for row in rows]

    def audit_entry(self, entry_id: int) -> AuditEntry | None:
        return self._one(_AUDIT, "SELECT * FROM audit_log WHERE entry_id = ?", entry_id)

    def count_logged(
        self, *, since: float, result: str, dry_run: bool
    ) -> tuple[int, frozenset[str]]:
        rows = self._read(
            "SELECT target FROM audit_log WHERE time >= ? AND result = ? AND dry_run = ?",
            (since, result, int(dry_run)),
        )
        return len(rows), frozenset(str(row[0]) for row in rows)

    # Remediation actions, approvals, breaker ---------------------------------------------------

    def insert_action(self, record: ActionRecord, audit: AuditEntry | None = None) -> int | None:
        if record.action_id is not None:
            raise ValueError("insert_action takes a new action (action_id=None)")
        with self._write() as conn:
            cursor = conn.execute(_INSERT_ACTION, _ACTIONS.params(record))
            if cursor.rowcount <= 0:
                return None
            if audit is not None:
                conn.execute(_INSERT_AUDIT, _AUDIT.params(audit))
            return cursor.lastrowid

    def update_action(
        self, record: ActionRecord, *, expect_state: str, audit: AuditEntry | None = None
    ) -> bool:
        if record.action_id is None:
            raise ValueError("update_action needs record.action_id")
        encode = _ACTIONS.to_sql or {}
        values = [encode.get(c, _same)(getattr(record, c)) for c in _ACTION_MUTABLE]
        with self._write() as conn:
            cursor = conn.execute(_UPDATE_ACTION, (*values, record.action_id, expect_state))
            if cursor.rowcount <= 0:
                return False
            if audit is not None:
                conn.execute(_INSERT_AUDIT, _AUDIT.params(audit))
            return True

    def action(self, action_id: int) -> ActionRecord | None:
        sql = "SELECT * FROM remediation_actions WHERE action_id = ?"
        return self._one(_ACTIONS, sql, action_id)

    def action_for(self, incident_id: int, idempotency_key: str) -> ActionRecord | None:
        rows = self._read(
            "SELECT * FROM remediation_actions WHERE incident_id = ? AND idempotency_key = ?",
            (incident_id, idempotency_key),
        )
        return _ACTIONS.load(rows[0]) if rows else None

    def actions(
        self,
        *,
        states: Collection[str] | None = None,
        incident_id: int | None = None,
        limit: int | None = None,
    ) -> list[ActionRecord]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        sql = "SELECT * FROM remediation_actions WHERE (? IS NULL OR incident_id = ?)"
        params: list[Any] = [incident_id, incident_id]
        if states is not None:
            sql += f" AND state IN ({_marks(len(states))})"
            params += [str(state) for state in states]
        sql += " ORDER BY action_id DESC LIMIT ?"
        params.append(-1 if limit is None else limit)
        return [_ACTIONS.load(row) for row in self._read(sql, params)]

    def cooldown_until(self, action: str, target: str, *, dry_run: bool) -> float | None:
        rows = self._read(
            "SELECT MAX(cooldown_until) FROM remediation_actions"
            " WHERE action = ? AND target = ? AND dry_run = ?",
            (action, target, int(dry_run)),
        )
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    def insert_approval(self, record: ApprovalRecord) -> int:
        if record.approval_id is not None:
            raise ValueError("insert_approval takes a new approval (approval_id=None)")
        with self._write() as conn:
            approval_id = conn.execute(_INSERT_APPROVAL, _APPROVALS.params(record)).lastrowid
        if approval_id is None:  # pragma: no cover - a successful INSERT always sets it
            raise StorageError("approvals insert returned no id")
        return approval_id

    def approval(self, token_sha256: str) -> ApprovalRecord | None:
        sql = "SELECT * FROM approvals WHERE token_sha256 = ?"
        return self._one(_APPROVALS, sql, token_sha256)

    def use_approval(self, token_sha256: str, *, now: float, used_by: str) -> bool:
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE approvals SET used_at = ?, used_by = ? WHERE token_sha256 = ?"
                " AND used_at IS NULL AND expires_at > ?",
                (now, used_by, token_sha256, now),
            )
            return cursor.rowcount > 0

    # Notifications ---------------------------------------------------------------------------

    def save_notification(self, record: NotificationRecord) -> None:
        with self._write() as conn:
            conn.execute(_SAVE_NOTIFICATION, _NOTIFICATIONS.params(record))

    def notifications(
        self,
        *,
        incident_id: int | None = None,
        status: str | None = None,
        delivered: bool | None = None,
    ) -> list[NotificationRecord]:
        sql = (
            "SELECT * FROM notifications WHERE (? IS NULL OR incident_id = ?)"
            " AND (? IS NULL OR status = ?) AND (? IS NULL OR delivered = ?)"
            " ORDER BY incident_id, route"
        )
        flag = None if delivered is None else int(delivered)
        rows = self._read(sql, (incident_id, incident_id, status, status, flag, flag))
        return [_NOTIFICATIONS.load(row) for row in rows]

    def add_page(self, record: PageRecord) -> int:
        if record.page_id is not None:
            raise ValueError("add_page takes a new page (page_id=None)")
        with self._write() as conn:
            page_id = conn.execute(_PAGES.insert_sql(), _PAGES.params(record)).lastrowid
        if page_id is None:  # pragma: no cover - a successful INSERT always sets it
            raise StorageError("pages insert returned no id")
        return page_id

    def save_page(self, record: PageRecord) -> None:
        if record.page_id is None:
            raise ValueError("save_page takes a stored page")
        sets = ", ".join(f"{c} = ?" for c in _PAGE_MUTABLE)
        values = [
            dump_json(record.alert) if c == "alert" else getattr(record, c) for c in _PAGE_MUTABLE
        ]
        with self._write() as conn:
            conn.execute(f"UPDATE pages SET {sets} WHERE page_id = ?", (*values, record.page_id))  # noqa: S608 - column names are constants

    def pages(self, *, status: str | None = None) -> list[PageRecord]:
        rows = self._read(
            "SELECT * FROM pages WHERE (? IS NULL OR status = ?) ORDER BY page_id", (status, status)
        )
        return [_PAGES.load(row) for row in rows]

    def cursor(self, name: str) -> int:
        rows = self._read("SELECT position FROM cursors WHERE name = ?", (name,))
        return int(rows[0][0]) if rows else 0

    def set_cursor(self, name: str, position: int) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO cursors (name, position, updated_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET (position, updated_at)"
                " = (excluded.position, excluded.updated_at)",
                (name, position, self._clock()),
            )

    # Breaker ---------------------------------------------------------------------------------

    def breaker(self, scope: str) -> BreakerRecord | None:
        return self._one(_BREAKERS, "SELECT * FROM breaker_state WHERE scope = ?", scope)

    def set_breaker(
        self, record: BreakerRecord, *, expect_state: str, audit: AuditEntry | None = None
    ) -> bool:
        with self._write() as conn:
            current = conn.execute(
                "SELECT state FROM breaker_state WHERE scope = ?", (record.scope,)
            ).fetchone()
            if (current[0] if current is not None else "closed") != expect_state:
                return False
            conn.execute(_SET_BREAKER, (*_BREAKERS.params(record), expect_state))
            if audit is not None:
                conn.execute(_INSERT_AUDIT, _AUDIT.params(audit))
            return True
