"""The collector's persistent state behind one interface: jobs, models, events, accounting,
incidents and the remediation audit log.

:class:`Storage` is what the rest of the collector depends on. The default implementation is
:class:`gpuwarden.collector.storage.sqlite.SqliteStorage` (also the test fake, with ``":memory:"``);
:class:`gpuwarden.collector.storage.postgres.PostgresStorage`, for collectors sharing one
database, implements the same protocol over the same schema and the same record SQL (see
:mod:`gpuwarden.collector.storage.migrations` and :mod:`gpuwarden.collector.storage.dialect`).

Contract for every implementation:

* each method is atomic (one transaction) and durable when it returns;
* methods are safe to call from several threads at once;
* reads return fresh objects; records are frozen, so nothing a caller holds changes under it;
* the audit log is append-only: there is no API to change or remove an entry, and the backend
  refuses ``UPDATE``/``DELETE`` on it at the database level too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.storage.records import (
    AccountingRow,
    AuditEntry,
    Event,
    EventKind,
    Incident,
    IncidentState,
    JsonObject,
    ModelDeployment,
    RollupDimension,
    RollupTotal,
)


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """One row of ``remediation_actions``: an action of one incident on one target.

    ``state`` belongs to the remediator (see :mod:`gpuwarden.collector.remediate.remediator`);
    ``params`` is a JSON object the remediator owns (rule parameters, the actuator's ``undo``...).
    ``action_id`` is assigned by the storage.
    """

    incident_id: int
    idempotency_key: str
    action: str
    target: str
    mode: str
    dry_run: bool
    state: str
    created_at: float
    updated_at: float
    attempts: int = 0
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    next_attempt_at: float | None = None
    cooldown_until: float | None = None
    verify_at: float | None = None
    last_error: str | None = None
    action_id: int | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """One approval link: only the SHA-256 of its token is stored, never the token."""

    action_id: int
    token_sha256: str
    created_at: float
    expires_at: float
    used_at: float | None = None
    used_by: str | None = None
    approval_id: int | None = None


@dataclass(frozen=True, slots=True)
class BreakerRecord:
    """A blast-radius breaker: ``closed`` lets automation act, ``open`` stops it."""

    scope: str
    state: str
    updated_at: float
    reason: str | None = None
    tripped_at: float | None = None


@dataclass(frozen=True, slots=True)
class NotificationRecord:
    """What one route was told about one incident (``status``) and whether it accepted it."""

    incident_id: int
    route: str
    status: str  # firing | resolved | lost | suppressed (held by an operator's silence)
    delivered: bool
    first_at: float
    sent_at: float | None = None
    attempts: int = 0
    next_attempt_at: float | None = None
    last_error: str | None = None
    silence_id: str | None = None
    """Our own Alertmanager alert's silence while an action settles; for a ``suppressed``
    notice, the id of the operator's silence that holds it."""
    silenced_until: float | None = None
    group_key: str | None = None
    acked_at: float | None = None


@dataclass(frozen=True, slots=True)
class SilenceRecord:
    """An operator's silence: while it is active (``starts_at <= now < ends_at``) the incidents
    its ``matchers`` match are not notified, and with ``actions`` not acted on either.

    ``matchers`` maps a fact (``rule``, ``job``, ``node``, ``model``, ``team``) to a shell-style
    glob; an incident matches when every matcher matches one of its values. ``created_by`` is the
    authenticated caller; expiring it early sets ``ends_at`` and ``expired_by``.
    ``silence_id`` is assigned by the storage.
    """

    matchers: Mapping[str, str]
    starts_at: float
    ends_at: float
    created_by: str
    comment: str
    actions: bool = False
    expired_by: str | None = None
    silence_id: int | None = None

    def active(self, now: float) -> bool:
        """Whether the silence holds at ``now``."""
        return self.starts_at <= now < self.ends_at


@dataclass(frozen=True, slots=True)
class RoundsRecord:
    """Which rounds of one agent instance (under one caller) the collector stored: the
    ``high_water`` mark and a 63-bit window below it (``ingest.rounds_seen.SeenWindow``)."""

    caller: str
    instance: str
    high_water: int
    stored_below: int
    updated_at: float


@dataclass(frozen=True, slots=True)
class PageRecord:
    """One alert handed to the alert dispatcher for one route (the remediator's pages), and how
    its delivery went: ``pending`` until the route accepts it (``delivered``) or the dispatcher
    gives up (``lost``). ``alert`` is the alert as JSON; ``page_id`` is assigned on insert."""

    route: str
    alert: JsonObject
    created_at: float
    status: str = "pending"  # pending | delivered | lost
    attempts: int = 0
    next_attempt_at: float | None = None
    sent_at: float | None = None
    last_error: str | None = None
    page_id: int | None = None


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
    """Persistent state of one collector (or of several sharing a PostgreSQL database).

    Every row belongs to a cluster (:mod:`~gpuwarden.collector.storage.clusters`): a store
    writes its own ``cluster``'s rows and reads only them, except the reads that take a
    ``cluster`` argument (another cluster's name, or ``ALL_CLUSTERS`` for every one).
    """

    cluster: str

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

    def models(self, *, cluster: str | None = None) -> list[ModelDeployment]:
        """Every model deployment of ``cluster`` (``None``: this store's; ``ALL_CLUSTERS``: every
        one), ordered by name."""
        ...

    def cluster_names(self) -> list[str]:
        """Every cluster with a row on the database (incidents, actions, models, events or jobs),
        sorted: the clusters an organisation-wide read goes through."""
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
        cluster: str | None = None,
    ) -> list[Event]:
        """Events at or after ``since``, oldest first, optionally of some kinds or one subject, of
        ``cluster`` (``None``: this store's; ``ALL_CLUSTERS``: every one)."""
        ...

    # Accounting ------------------------------------------------------------------------------

    def write_rollups(self, rows: Sequence[AccountingRow]) -> int:
        """Store accounting rows; return how many rows the batch holds.

        A batch is authoritative for every ``(period_start, gpu_uuid)`` it mentions: stored rows
        of that GPU and period are replaced by the batch's, so re-writing a period is idempotent
        and a recomputed period replaces the old one even when the GPU changed jobs.
        """
        ...

    def accounting_rows(
        self, *, since: float, until: float, cluster: str | None = None
    ) -> list[AccountingRow]:
        """Rows with ``since <= period_start < until``, by period, GPU, then job (of
        ``cluster``; ``None``: this store's)."""
        ...

    def rollups(
        self,
        *,
        since: float,
        until: float,
        by: Sequence[RollupDimension] = (),
        cluster: str | None = None,
    ) -> list[RollupTotal]:
        """Rows with ``since <= period_start < until`` summed per group of ``by`` (in order),
        of ``cluster`` (``None``: this store's; ``ALL_CLUSTERS``: every one)."""
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

    def incidents(
        self, *, state: IncidentState | None = None, cluster: str | None = None
    ) -> list[Incident]:
        """Incidents (optionally in one state) of ``cluster`` (``None``: this store's;
        ``ALL_CLUSTERS``: every one), ordered by id."""
        ...

    def incident_counts(self, *, state: IncidentState | None = None) -> dict[str, int]:
        """How many incidents (in ``state``, or in any) each cluster on the database has."""
        ...

    # Audit -----------------------------------------------------------------------------------

    def append_audit(self, entry: AuditEntry) -> int:
        """Append to the audit log; return the new entry's id (rising in append order)."""
        ...

    def audit(
        self, *, since: float | None = None, limit: int | None = None, after_id: int = 0
    ) -> list[AuditEntry]:
        """Entries at or after ``since`` and with an id above ``after_id``, oldest first."""
        ...

    def audit_entry(self, entry_id: int) -> AuditEntry | None:
        """One audit entry by id."""
        ...

    def count_logged(
        self, *, since: float, result: str, dry_run: bool
    ) -> tuple[int, frozenset[str]]:
        """Entries at or after ``since`` with this ``result`` and ``dry_run``: (count, targets)."""
        ...

    # Remediation actions, approvals, breaker ---------------------------------------------------

    def insert_action(self, record: ActionRecord, audit: AuditEntry | None = None) -> int | None:
        """Insert a new action (and its audit entry, in the same transaction).

        Returns its id, or ``None`` (and appends nothing) when ``(incident_id,
        idempotency_key)`` already has a row: the idempotency check is the database's.
        """
        ...

    def update_action(
        self, record: ActionRecord, *, expect_state: str, audit: AuditEntry | None = None
    ) -> bool:
        """Compare-and-set: save ``record``'s mutable fields if the stored state is still
        ``expect_state``, and append ``audit`` in the same transaction. ``False`` (nothing
        written) when another writer moved the action first."""
        ...

    def action(self, action_id: int) -> ActionRecord | None:
        """One action by id."""
        ...

    def action_for(self, incident_id: int, idempotency_key: str) -> ActionRecord | None:
        """The action of this incident with this idempotency key."""
        ...

    def actions(
        self,
        *,
        states: Collection[str] | None = None,
        incident_id: int | None = None,
        limit: int | None = None,
        cluster: str | None = None,
    ) -> list[ActionRecord]:
        """Actions (optionally in some states or of one incident), newest first, of ``cluster``
        (``None``: this store's; ``ALL_CLUSTERS``: every one)."""
        ...

    def cooldown_until(self, action: str, target: str, *, dry_run: bool) -> float | None:
        """The latest ``cooldown_until`` of ``action`` on ``target`` (real or dry-run rows)."""
        ...

    def insert_approval(self, record: ApprovalRecord) -> int:
        """Store an approval link's token hash; return its id."""
        ...

    def approval(self, token_sha256: str) -> ApprovalRecord | None:
        """The approval with this token hash."""
        ...

    def use_approval(self, token_sha256: str, *, now: float, used_by: str) -> bool:
        """Mark the approval used, once: ``False`` when unknown, already used or expired."""
        ...

    def revoke_approvals(self, action_id: int, *, now: float) -> int:
        """Expire the unused, unexpired approvals of ``action_id`` now; return how many."""
        ...

    def breaker(self, scope: str) -> BreakerRecord | None:
        """The breaker of ``scope``; ``None`` when it never changed (closed)."""
        ...

    def set_breaker(
        self, record: BreakerRecord, *, expect_state: str, audit: AuditEntry | None = None
    ) -> bool:
        """Compare-and-set the breaker (a missing row counts as ``closed``), appending
        ``audit`` in the same transaction; ``False`` when its state was not ``expect_state``."""
        ...

    def save_notification(self, record: NotificationRecord) -> None:
        """Insert or replace the state of (incident, route)."""
        ...

    def notifications(
        self,
        *,
        incident_id: int | None = None,
        status: str | None = None,
        delivered: bool | None = None,
    ) -> list[NotificationRecord]:
        """Notification states, optionally of one incident, one status, delivered or not."""
        ...

    def add_silence(self, record: SilenceRecord) -> int:
        """Store a new silence (``silence_id=None``); its id."""
        ...

    def silence(self, silence_id: int) -> SilenceRecord | None:
        """One silence, expired or not."""
        ...

    def silences(self, *, ending_after: float | None = None) -> list[SilenceRecord]:
        """Silences, oldest first: those whose ``ends_at`` is after ``ending_after`` (active or
        pending at that time), or every one."""
        ...

    def expire_silence(self, silence_id: int, *, now: float, actor: str) -> bool:
        """End a silence at ``now``, naming ``actor``; ``False`` when it had already ended (or
        does not exist)."""
        ...

    def add_page(self, record: PageRecord) -> int:
        """Store a new page (``page_id=None``); its id."""
        ...

    def save_page(self, record: PageRecord) -> None:
        """Update a stored page's delivery state."""
        ...

    def pages(self, *, status: str | None = None) -> list[PageRecord]:
        """Pages, oldest first, optionally of one status."""
        ...

    def cursor(self, name: str) -> int:
        """Where the reader ``name`` got to in an append-only log (0: the start)."""
        ...

    def set_cursor(self, name: str, position: int) -> None:
        """Move the reader ``name`` to ``position``."""
        ...

    # Agent rounds (each request stored once) ----------------------------------------------------

    def rounds_record(self, caller: str, instance: str) -> RoundsRecord | None:
        """What is known of the rounds ``caller``'s agent ``instance`` sent, if anything."""
        ...

    def save_rounds_record(self, record: RoundsRecord) -> None:
        """Insert or replace the record of ``(caller, instance)``; a record whose
        ``high_water`` is below the stored one is ignored (the mark never goes back)."""
        ...

    def close(self) -> None:
        """Release the backend's resources; the store cannot be used afterwards. Idempotent."""
        ...
