"""The collector's persistent state behind one interface: jobs, models, events, accounting,
incidents and the remediation audit log.

:class:`Storage` is what the rest of the collector depends on. The default implementation is
:class:`gpuwarden.collector.storage_sqlite.SqliteStorage` (also the test fake, with ``":memory:"``);
a PostgreSQL backend for several collector shards implements the same protocol over the same
schema (see :mod:`gpuwarden.collector.storage_migrations`).

Contract for every implementation:

* each method is atomic (one transaction) and durable when it returns;
* methods are safe to call from several threads at once;
* reads return fresh objects; records are frozen, so nothing a caller holds changes under it;
* the audit log is append-only: there is no API to change or remove an entry, and the backend
  refuses ``UPDATE``/``DELETE`` on it at the database level too.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from gpuwarden.collector.model import Job, JobState
from gpuwarden.collector.records import (
    AccountingRow,
    AuditEntry,
    Event,
    EventKind,
    Incident,
    IncidentState,
    ModelDeployment,
    RollupDimension,
    RollupTotal,
)


class StorageError(Exception):
    """The store cannot be used (cannot open, wrong schema, closed)."""


class SchemaVersionError(StorageError):
    """The database was written by a newer gpuwarden than this one."""

    def __init__(self, location: str, database_version: int, supported_version: int) -> None:
        super().__init__(
            f"{location}: database schema version {database_version} is newer than the "
            f"newest this gpuwarden knows ({supported_version}); upgrade gpuwarden, or point it "
            f"at another database (a newer database is never downgraded)"
        )
        self.database_version = database_version
        self.supported_version = supported_version


class Storage(Protocol):
    """Persistent state of one collector (or of several sharing a PostgreSQL database)."""

    # Jobs ------------------------------------------------------------------------------------

    def upsert_jobs(self, jobs: Sequence[Job]) -> int:
        """Insert or replace jobs by ``key``; return how many were new or changed."""
        ...

    def jobs(
        self, *, since: float | None = None, states: Collection[JobState] | None = None
    ) -> list[Job]:
        """Jobs ordered by key; ``since``: only those not ended before it (end unknown or later)."""
        ...

    def job(self, key: str) -> Job | None:
        """One job by its scheduler-qualified key."""
        ...

    # Models and events -----------------------------------------------------------------------

    def upsert_model(self, model: ModelDeployment) -> bool:
        """Insert or replace the deployment of ``model.name``; return whether anything changed."""
        ...

    def models(self) -> list[ModelDeployment]:
        """Every model deployment, ordered by name."""
        ...

    def model(self, name: str) -> ModelDeployment | None:
        """One model deployment by name."""
        ...

    def record_event(self, event: Event) -> bool:
        """Store an event; ``False`` when this ``(time, kind, subject)`` was already stored."""
        ...

    def events(
        self,
        *,
        since: float | None = None,
        kinds: Collection[EventKind] | None = None,
        subject: str | None = None,
    ) -> list[Event]:
        """Events at or after ``since``, oldest first, optionally of some kinds or one subject."""
        ...

    # Accounting ------------------------------------------------------------------------------

    def write_rollups(self, rows: Sequence[AccountingRow]) -> int:
        """Store accounting rows; return how many rows the batch holds.

        A batch is authoritative for every ``(period_start, gpu_uuid)`` it mentions: stored rows
        of that GPU and period are replaced by the batch's, so re-writing a period is idempotent
        and a recomputed period replaces the old one even when the GPU changed jobs.
        """
        ...

    def accounting_rows(self, *, since: float, until: float) -> list[AccountingRow]:
        """Rows with ``since <= period_start < until``, by period, GPU, then job."""
        ...

    def rollups(
        self, *, since: float, until: float, by: Sequence[RollupDimension] = ()
    ) -> list[RollupTotal]:
        """Rows with ``since <= period_start < until`` summed per group of ``by`` (in order)."""
        ...

    # Incidents -------------------------------------------------------------------------------

    def open_incident(self, incident: Incident) -> int | None:
        """Insert an open incident; its id, or ``None`` if ``fingerprint`` already has one open."""
        ...

    def update_incident(self, incident: Incident) -> bool:
        """Save state, severity, times, evidence and counters of ``incident.incident_id``.

        ``fingerprint``, ``rule_id`` and ``first_seen`` are fixed at open. ``False`` when no
        incident has that id.
        """
        ...

    def incident(self, incident_id: int) -> Incident | None:
        """One incident by id."""
        ...

    def open_incident_for(self, fingerprint: str) -> Incident | None:
        """The open incident with this fingerprint, if any."""
        ...

    def incidents(self, *, state: IncidentState | None = None) -> list[Incident]:
        """Incidents (optionally in one state), ordered by id."""
        ...

    # Audit -----------------------------------------------------------------------------------

    def append_audit(self, entry: AuditEntry) -> int:
        """Append to the audit log; return the new entry's id (rising in append order)."""
        ...

    def audit(self, *, since: float | None = None, limit: int | None = None) -> list[AuditEntry]:
        """Entries with ``time >= since`` in append order, at most ``limit`` of them."""
        ...

    def audit_entry(self, entry_id: int) -> AuditEntry | None:
        """One audit entry by id."""
        ...

    def close(self) -> None:
        """Release the backend's resources; the store cannot be used afterwards. Idempotent."""
        ...
