"""The storage schema, as an ordered list of migrations, and the function that applies them.

Each migration is applied in its own transaction together with its row in
``schema_migrations(version, name, applied_at)``: a failed migration leaves the database at the
previous version, never half-way. Migrations are append-only: once released, a migration is never
edited; a change is a new migration with the next version.

One list serves both backends. The SQL is written once in SQLite's spelling; for PostgreSQL
:func:`render_postgresql` maps its column types (``<name>_id INTEGER PRIMARY KEY`` → an
identity column, ``INTEGER`` → ``BIGINT``, ``REAL`` → ``DOUBLE PRECISION``, ``TEXT`` →
``TEXT COLLATE "C"`` so strings sort by bytes as in SQLite). The one thing written twice is
what cannot be translated: the audit log's append-only triggers (``Migration.sqlite`` /
``Migration.postgresql``).

Conventions of the schema (both backends have the same tables and columns):

* times are ``REAL`` Unix seconds; ``NULL`` means unknown, never 0;
* JSON columns hold canonical text (sorted keys) written by
  :mod:`~gpuwarden.collector.storage.records`;
* booleans are ``INTEGER`` 0/1 with a ``CHECK``;
* vocabularies owned by later work (remediation states, policy verdicts) are not ``CHECK``-ed,
  so that adding a state does not need a table rebuild.

Needs SQLite 3.24 or later (``INSERT ... ON CONFLICT DO UPDATE``).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.collector.storage.base import SchemaVersionError
from gpuwarden.collector.storage.dialect import SQLITE, Dialect


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step: ``version`` counts up from 1 without gaps.

    ``sql`` is for both backends; ``sqlite`` and ``postgresql`` run after it on that backend
    only (statements one engine's syntax cannot share).
    """

    version: int
    name: str
    sql: str
    sqlite: str = ""
    postgresql: str = ""

    def script(self, dialect: Dialect) -> str:
        """The whole step in ``dialect``'s SQL."""
        if dialect.postgresql:
            return f"{render_postgresql(self.sql)}\n{self.postgresql}"
        return f"{self.sql}\n{self.sqlite}"


#: SQLite type → PostgreSQL type, applied in this order (longest first).
_POSTGRESQL_TYPES = (
    (
        re.compile(r"\b(\w+_id\s+)INTEGER PRIMARY KEY( AUTOINCREMENT)?\b"),
        r"\1BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    ),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bTEXT\b"), 'TEXT COLLATE "C"'),
)


def render_postgresql(sql: str) -> str:
    """The shared schema SQL with PostgreSQL's column types (see the module docstring).

    An ``<name>_id INTEGER PRIMARY KEY`` is SQLite's rowid alias, assigned by the database (and
    never reused with ``AUTOINCREMENT``); an identity column is both on PostgreSQL. Other
    integer keys (``schema_migrations.version``) are written by us and stay plain.
    """
    for pattern, replacement in _POSTGRESQL_TYPES:
        sql = pattern.sub(replacement, sql)
    return sql


_CORE = """
CREATE TABLE jobs (
    key           TEXT PRIMARY KEY,     -- scheduler-qualified: slurm:<cluster>:<id>, k8s:<uid>
    scheduler     TEXT NOT NULL,
    job_id        TEXT NOT NULL,
    state         TEXT NOT NULL,        -- JobState value
    name          TEXT,
    owner         TEXT,
    team          TEXT,
    gpus          INTEGER NOT NULL,
    allocations   TEXT NOT NULL,        -- JSON [{"indices": [...], "node": ..., "uuids": [...]}]
    submit_time   REAL,
    start_time    REAL,
    end_time      REAL,
    priority      INTEGER,
    model         TEXT,
    price_tier    TEXT,
    restarts      INTEGER NOT NULL,
    labels        TEXT NOT NULL,        -- JSON object of strings
    first_seen    REAL NOT NULL,        -- when this collector first stored the job
    updated_at    REAL NOT NULL         -- last time a field changed
);
CREATE INDEX jobs_end_time ON jobs (end_time);
CREATE INDEX jobs_state ON jobs (state);

CREATE TABLE models (
    name                     TEXT PRIMARY KEY,
    version                  TEXT NOT NULL,
    replicas                 INTEGER NOT NULL,
    slo_latency_p99_seconds  REAL,
    slo_error_ratio          REAL,
    fallback_model           TEXT,      -- a model name; not a foreign key: may be known later
    labels                   TEXT NOT NULL,
    updated_at               REAL NOT NULL
);

CREATE TABLE events (
    event_id     INTEGER PRIMARY KEY,
    time         REAL NOT NULL,
    kind         TEXT NOT NULL,         -- EventKind value
    subject      TEXT NOT NULL,         -- model name, job key, node or GPU UUID
    attributes   TEXT NOT NULL,         -- JSON object
    recorded_at  REAL NOT NULL,
    UNIQUE (time, kind, subject)        -- re-reporting an event is a no-op
);
CREATE INDEX events_time ON events (time);

-- One GPU's share of one period for one job; job_key '' = allocated to no job (a NULL would
-- make the primary key non-unique). Re-writing a (period_start, gpu_uuid) replaces its rows.
CREATE TABLE accounting (
    period_start           REAL NOT NULL,
    period_seconds         REAL NOT NULL CHECK (period_seconds > 0),
    job_key                TEXT NOT NULL,
    gpu_uuid               TEXT NOT NULL,
    team                   TEXT,
    model                  TEXT,
    node                   TEXT NOT NULL,
    price_tier             TEXT,
    gpu_seconds_allocated  REAL NOT NULL,
    gpu_seconds_busy       REAL NOT NULL,
    gpu_seconds_idle       REAL NOT NULL,
    gpu_seconds_unknown    REAL NOT NULL,  -- allocated, without a utilisation sample
    energy_joules          REAL,
    cost_usd               REAL,
    carbon_grams           REAL,
    written_at             REAL NOT NULL,
    PRIMARY KEY (period_start, job_key, gpu_uuid)
);
CREATE INDEX accounting_period_gpu ON accounting (period_start, gpu_uuid);
"""

_INCIDENTS_AND_REMEDIATION = """
CREATE TABLE incidents (
    incident_id           INTEGER PRIMARY KEY,
    fingerprint           TEXT NOT NULL,
    rule_id               TEXT NOT NULL,
    state                 TEXT NOT NULL CHECK (state IN ('open', 'resolved')),
    severity              TEXT NOT NULL,
    first_seen            REAL NOT NULL,
    last_seen             REAL NOT NULL,
    resolved_time         REAL,
    evidence              TEXT NOT NULL,  -- JSON object
    consecutive_breaches  INTEGER NOT NULL DEFAULT 0,  -- hysteresis: cycles in a row firing
    consecutive_clears    INTEGER NOT NULL DEFAULT 0,  -- ... and not firing
    updated_at            REAL NOT NULL
);
-- Deduplication in the database, so that shards sharing one database open an incident once.
CREATE UNIQUE INDEX incidents_one_open ON incidents (fingerprint) WHERE state = 'open';
CREATE INDEX incidents_state ON incidents (state, last_seen);

-- Append-only: the triggers (per backend, below) refuse UPDATE and DELETE.
CREATE TABLE audit_log (
    entry_id              INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: rises forever
    time                  REAL NOT NULL,
    actor                 TEXT NOT NULL,  -- 'gpuwarden' or the approving human
    action                TEXT NOT NULL,  -- what
    target                TEXT NOT NULL,
    reason                TEXT NOT NULL,  -- why
    verdict               TEXT NOT NULL,  -- policy verdict
    dry_run               INTEGER NOT NULL CHECK (dry_run IN (0, 1)),
    result                TEXT NOT NULL,
    inputs                TEXT NOT NULL,  -- JSON object: the facts the decision used
    incident_fingerprint  TEXT,
    idempotency_key       TEXT
);
CREATE INDEX audit_log_time ON audit_log (time);
CREATE INDEX audit_log_key ON audit_log (idempotency_key);

-- For the remediation issue: one row per (incident, fingerprint+action+target); a retry updates
-- the row (attempts, state), a second decision for the same incident finds it (idempotency).
CREATE TABLE remediation_actions (
    action_id        INTEGER PRIMARY KEY,
    incident_id      INTEGER NOT NULL REFERENCES incidents (incident_id),
    idempotency_key  TEXT NOT NULL,   -- fingerprint + action + target
    action           TEXT NOT NULL,
    target           TEXT NOT NULL,
    mode             TEXT NOT NULL,   -- auto | approve | notify
    dry_run          INTEGER NOT NULL CHECK (dry_run IN (0, 1)),
    state            TEXT NOT NULL,   -- proposed, awaiting_approval, running, verifying, ...
    attempts         INTEGER NOT NULL DEFAULT 0,
    params           TEXT NOT NULL,   -- JSON object
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    next_attempt_at  REAL,
    cooldown_until   REAL,            -- no new action of this kind on this target before it
    verify_at        REAL,            -- when to check that the action helped
    last_error       TEXT,
    UNIQUE (incident_id, idempotency_key)
);
CREATE INDEX remediation_actions_target ON remediation_actions (target, action, cooldown_until);
CREATE INDEX remediation_actions_state ON remediation_actions (state);

CREATE TABLE approvals (
    approval_id   INTEGER PRIMARY KEY,
    action_id     INTEGER NOT NULL REFERENCES remediation_actions (action_id),
    token_sha256  TEXT NOT NULL UNIQUE,  -- hex digest; the token itself is never stored
    created_at    REAL NOT NULL,
    expires_at    REAL NOT NULL,
    used_at       REAL,
    used_by       TEXT
);

-- The blast-radius circuit breaker(s): 'global', or a narrower scope.
CREATE TABLE breaker_state (
    scope       TEXT PRIMARY KEY,
    state       TEXT NOT NULL,       -- closed | open | half_open
    reason      TEXT,
    tripped_at  REAL,
    updated_at  REAL NOT NULL
);
"""

_AUDIT_APPEND_ONLY_SQLITE = """
CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only: UPDATE refused');
END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only: DELETE refused');
END;
"""

# The same refusal on PostgreSQL, TRUNCATE included (it fires no row trigger).
_AUDIT_APPEND_ONLY_POSTGRESQL = """
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'integrity_constraint_violation';
END;
$$;
CREATE TRIGGER audit_log_no_update_or_delete BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
"""

_NOTIFICATIONS = """
-- What each route was told about each incident, so a restart neither re-pages nor forgets
-- to send a resolve; undelivered notices are retried from here.
CREATE TABLE notifications (
    incident_id     INTEGER NOT NULL REFERENCES incidents (incident_id),
    route           TEXT NOT NULL,
    status          TEXT NOT NULL,      -- firing | resolved: what the route should know
    delivered       INTEGER NOT NULL,   -- 1 once the route accepted that status
    first_at        REAL NOT NULL,      -- when this status was first due
    sent_at         REAL,               -- last accepted push
    attempts        INTEGER NOT NULL,   -- failed pushes of this status
    next_attempt_at REAL,
    last_error      TEXT,
    silence_id      TEXT,               -- Alertmanager silence while an action settles
    silenced_until  REAL,
    group_key       TEXT,               -- told as part of this grouped alert
    acked_at        REAL,               -- acknowledged (automation acts on it for real)
    PRIMARY KEY (incident_id, route)
);
CREATE INDEX notifications_pending ON notifications (delivered, status);

-- Where a reader of an append-only log got to (e.g. the audit's PagerDuty mirror).
CREATE TABLE cursors (
    name        TEXT PRIMARY KEY,
    position    INTEGER NOT NULL,
    updated_at  REAL NOT NULL
);
"""

_PAGES = """
-- Alerts handed to the alert dispatcher for one route each (the remediator's approval requests,
-- escalations and breaker pages): stored first, then delivered and retried from here.
CREATE TABLE pages (
    page_id         INTEGER PRIMARY KEY,
    route           TEXT NOT NULL,
    alert           TEXT NOT NULL,      -- JSON object: the alert
    created_at      REAL NOT NULL,
    status          TEXT NOT NULL,      -- pending | delivered | lost
    attempts        INTEGER NOT NULL,   -- failed pushes
    next_attempt_at REAL,
    sent_at         REAL,
    last_error      TEXT
);
CREATE INDEX pages_status ON pages (status);
"""

_ACCOUNTING_CURRENCY = """
-- A cost is in the price table's currency, not always US dollars: the column says "cost" and
-- each row keeps its currency (NULL on rows written before: the collector did not record it).
ALTER TABLE accounting RENAME COLUMN cost_usd TO cost;
ALTER TABLE accounting ADD COLUMN currency TEXT;
"""

_SILENCES = """
-- Operators' silences: while one matches an incident, its notifications are held (recorded as
-- suppressed); with actions = 1 its automated actions are held too. Expiring one early sets
-- ends_at to that moment and names who did it.
CREATE TABLE silences (
    silence_id  INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused
    matchers    TEXT NOT NULL,      -- JSON object: rule, job, node, model, team -> glob
    starts_at   REAL NOT NULL,
    ends_at     REAL NOT NULL CHECK (ends_at > starts_at),
    created_by  TEXT NOT NULL,      -- the authenticated caller, never a request field
    comment     TEXT NOT NULL,
    actions     INTEGER NOT NULL CHECK (actions IN (0, 1)),
    expired_by  TEXT                -- who ended it early
);
CREATE INDEX silences_ends_at ON silences (ends_at);
"""

_AGENT_ROUNDS = """
-- Which spooled rounds of each agent instance the collector stored (see ingest/rounds_seen.py):
-- a round numbered at most high_water is stored if it is high_water itself, if it is older than
-- the 63-round window, or if its bit is set in stored_below (bit i: round high_water - 1 - i).
-- Keyed by the authenticated caller too, so one token cannot mark another's rounds as stored.
CREATE TABLE agent_rounds (
    caller        TEXT NOT NULL,
    instance      TEXT NOT NULL,        -- Gpuwarden-Agent-Instance: 32 hex digits
    high_water    INTEGER NOT NULL,     -- the highest round stored
    stored_below  INTEGER NOT NULL,     -- 63-bit window below high_water (non-negative)
    updated_at    REAL NOT NULL,
    PRIMARY KEY (caller, instance)
);
"""


_SCOPED_TABLES = (
    "jobs",
    "models",
    "events",
    "accounting",
    "incidents",
    "audit_log",
    "remediation_actions",
    "breaker_state",
    "notifications",
    "cursors",
    "pages",
    "silences",
)

# Every cluster-scoped table gets the column (rows written before are the 'default' cluster's);
# keys that two clusters could both use (node names, job ids, fingerprints, breaker scopes,
# cursor names) include it. Approvals and agent rounds need none: an approval is scoped by its
# action, an agent instance is a random 128-bit id.
_CLUSTERS = (
    "\n".join(
        f"ALTER TABLE {table} ADD COLUMN cluster TEXT NOT NULL DEFAULT 'default';"
        for table in _SCOPED_TABLES
    )
    + """
DROP INDEX incidents_one_open;
CREATE UNIQUE INDEX incidents_one_open ON incidents (cluster, fingerprint) WHERE state = 'open';
DROP INDEX incidents_state;
CREATE INDEX incidents_state ON incidents (cluster, state, last_seen);
CREATE INDEX audit_log_cluster_time ON audit_log (cluster, time);
DROP INDEX remediation_actions_target;
CREATE INDEX remediation_actions_target
    ON remediation_actions (cluster, target, action, cooldown_until);
DROP INDEX notifications_pending;
CREATE INDEX notifications_pending ON notifications (cluster, delivered, status);
DROP INDEX pages_status;
CREATE INDEX pages_status ON pages (cluster, status);
"""
)

# SQLite cannot change a primary key or a table's UNIQUE constraint: the keyed tables are
# rebuilt (same columns in the same order, the cluster last as ALTER TABLE put it; nothing
# references them by foreign key).
_CLUSTER_KEYS_SQLITE = """
CREATE TABLE jobs_new (
    key           TEXT NOT NULL,
    scheduler     TEXT NOT NULL,
    job_id        TEXT NOT NULL,
    state         TEXT NOT NULL,
    name          TEXT,
    owner         TEXT,
    team          TEXT,
    gpus          INTEGER NOT NULL,
    allocations   TEXT NOT NULL,
    submit_time   REAL,
    start_time    REAL,
    end_time      REAL,
    priority      INTEGER,
    model         TEXT,
    price_tier    TEXT,
    restarts      INTEGER NOT NULL,
    labels        TEXT NOT NULL,
    first_seen    REAL NOT NULL,
    updated_at    REAL NOT NULL,
    cluster       TEXT NOT NULL DEFAULT 'default',
    PRIMARY KEY (cluster, key)
);
INSERT INTO jobs_new SELECT * FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_new RENAME TO jobs;
CREATE INDEX jobs_end_time ON jobs (cluster, end_time);
CREATE INDEX jobs_state ON jobs (cluster, state);

CREATE TABLE models_new (
    name                     TEXT NOT NULL,
    version                  TEXT NOT NULL,
    replicas                 INTEGER NOT NULL,
    slo_latency_p99_seconds  REAL,
    slo_error_ratio          REAL,
    fallback_model           TEXT,
    labels                   TEXT NOT NULL,
    updated_at               REAL NOT NULL,
    cluster                  TEXT NOT NULL DEFAULT 'default',
    PRIMARY KEY (cluster, name)
);
INSERT INTO models_new SELECT * FROM models;
DROP TABLE models;
ALTER TABLE models_new RENAME TO models;

CREATE TABLE events_new (
    event_id     INTEGER PRIMARY KEY,
    time         REAL NOT NULL,
    kind         TEXT NOT NULL,
    subject      TEXT NOT NULL,
    attributes   TEXT NOT NULL,
    recorded_at  REAL NOT NULL,
    cluster      TEXT NOT NULL DEFAULT 'default',
    UNIQUE (cluster, time, kind, subject)
);
INSERT INTO events_new SELECT * FROM events;
DROP TABLE events;
ALTER TABLE events_new RENAME TO events;
CREATE INDEX events_time ON events (cluster, time);

CREATE TABLE accounting_new (
    period_start           REAL NOT NULL,
    period_seconds         REAL NOT NULL CHECK (period_seconds > 0),
    job_key                TEXT NOT NULL,
    gpu_uuid               TEXT NOT NULL,
    team                   TEXT,
    model                  TEXT,
    node                   TEXT NOT NULL,
    price_tier             TEXT,
    gpu_seconds_allocated  REAL NOT NULL,
    gpu_seconds_busy       REAL NOT NULL,
    gpu_seconds_idle       REAL NOT NULL,
    gpu_seconds_unknown    REAL NOT NULL,
    energy_joules          REAL,
    cost                   REAL,
    carbon_grams           REAL,
    written_at             REAL NOT NULL,
    currency               TEXT,
    cluster                TEXT NOT NULL DEFAULT 'default',
    PRIMARY KEY (cluster, period_start, job_key, gpu_uuid)
);
INSERT INTO accounting_new SELECT * FROM accounting;
DROP TABLE accounting;
ALTER TABLE accounting_new RENAME TO accounting;
CREATE INDEX accounting_period_gpu ON accounting (cluster, period_start, gpu_uuid);
CREATE INDEX accounting_period ON accounting (period_start);

CREATE TABLE breaker_state_new (
    scope       TEXT NOT NULL,
    state       TEXT NOT NULL,
    reason      TEXT,
    tripped_at  REAL,
    updated_at  REAL NOT NULL,
    cluster     TEXT NOT NULL DEFAULT 'default',
    PRIMARY KEY (cluster, scope)
);
INSERT INTO breaker_state_new SELECT * FROM breaker_state;
DROP TABLE breaker_state;
ALTER TABLE breaker_state_new RENAME TO breaker_state;

CREATE TABLE cursors_new (
    name        TEXT NOT NULL,
    position    INTEGER NOT NULL,
    updated_at  REAL NOT NULL,
    cluster     TEXT NOT NULL DEFAULT 'default',
    PRIMARY KEY (cluster, name)
);
INSERT INTO cursors_new SELECT * FROM cursors;
DROP TABLE cursors;
ALTER TABLE cursors_new RENAME TO cursors;
"""

# PostgreSQL changes the keys in place (constraint names are PostgreSQL's defaults).
_CLUSTER_KEYS_POSTGRESQL = """
ALTER TABLE jobs DROP CONSTRAINT jobs_pkey, ADD PRIMARY KEY (cluster, key);
DROP INDEX jobs_end_time;
CREATE INDEX jobs_end_time ON jobs (cluster, end_time);
DROP INDEX jobs_state;
CREATE INDEX jobs_state ON jobs (cluster, state);
ALTER TABLE models DROP CONSTRAINT models_pkey, ADD PRIMARY KEY (cluster, name);
ALTER TABLE events DROP CONSTRAINT events_time_kind_subject_key,
    ADD UNIQUE (cluster, time, kind, subject);
DROP INDEX events_time;
CREATE INDEX events_time ON events (cluster, time);
ALTER TABLE accounting DROP CONSTRAINT accounting_pkey,
    ADD PRIMARY KEY (cluster, period_start, job_key, gpu_uuid);
DROP INDEX accounting_period_gpu;
CREATE INDEX accounting_period_gpu ON accounting (cluster, period_start, gpu_uuid);
CREATE INDEX accounting_period ON accounting (period_start);
ALTER TABLE breaker_state DROP CONSTRAINT breaker_state_pkey, ADD PRIMARY KEY (cluster, scope);
ALTER TABLE cursors DROP CONSTRAINT cursors_pkey, ADD PRIMARY KEY (cluster, name);
"""

_LEADER_LEASE = """
-- Active/standby (collector/ha): one row per lease. Whoever holds an unexpired row leads;
-- taking it over (after expires_at) adds 1 to epoch, the fencing token a leader's claims carry
-- (storage/sql_lease.py). Times are the database's clock, so replicas' clocks do not matter.
CREATE TABLE leader_lease (
    name         TEXT PRIMARY KEY,     -- 'collector': what is led
    holder       TEXT NOT NULL,        -- the replica id (ha.replica_id)
    epoch        INTEGER NOT NULL,     -- rises by one at each change of holder
    acquired_at  REAL NOT NULL,
    renewed_at   REAL NOT NULL,
    expires_at   REAL NOT NULL
);
"""

_ACCOUNTING_CHARGEBACK = """
-- Chargeback (gpuwarden report costs --format csv|json, budgets per project): each row keeps
-- its job's project label and its GPU's model, so totals by either survive job pruning and
-- a GPU leaving the inventory. NULL on rows written before: unknown, never guessed.
ALTER TABLE accounting ADD COLUMN project TEXT;
ALTER TABLE accounting ADD COLUMN gpu_model TEXT;
"""

_JOB_ELIGIBLE_TIME = """
-- When the scheduler could first start the job (Slurm's eligible time: after its begin time,
-- dependencies, holds); NULL where the scheduler does not say. Queue waits count from it.
ALTER TABLE jobs ADD COLUMN eligible_time REAL;
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "jobs, models, events, accounting", _CORE),
    Migration(
        2,
        "incidents, audit log, remediation actions, approvals, breaker",
        _INCIDENTS_AND_REMEDIATION,
        sqlite=_AUDIT_APPEND_ONLY_SQLITE,
        postgresql=_AUDIT_APPEND_ONLY_POSTGRESQL,
    ),
    Migration(3, "notification state per incident and route, log cursors", _NOTIFICATIONS),
    Migration(4, "pages: the remediator's alerts, stored until a route accepts them", _PAGES),
    Migration(5, "accounting: cost in the price table's currency", _ACCOUNTING_CURRENCY),
    Migration(6, "silences: operators hold an incident's notifications", _SILENCES),
    Migration(7, "agent rounds stored per agent instance: each request once", _AGENT_ROUNDS),
    Migration(8, "leader lease: one active collector, an epoch as fencing token", _LEADER_LEASE),
    Migration(
        9,
        "clusters: every scoped row names its collector's cluster; keys include it",
        _CLUSTERS,
        sqlite=_CLUSTER_KEYS_SQLITE,
        postgresql=_CLUSTER_KEYS_POSTGRESQL,
    ),
    Migration(10, "accounting: project and GPU model for chargeback", _ACCOUNTING_CHARGEBACK),
    Migration(11, "jobs: eligible time, for queue waits", _JOB_ELIGIBLE_TIME),
)
LATEST_VERSION = MIGRATIONS[-1].version

CREATE_VERSIONS = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     INTEGER PRIMARY KEY,
    name        TEXT NOT NULL,
    applied_at  REAL NOT NULL
)
"""


def split_statements(sql: str) -> list[str]:
    """Split a script into complete statements (``;`` inside literals and triggers are kept).

    ``sqlite3.Connection.executescript`` would do this, but it commits first, so a migration and
    its version row could not share one transaction.
    """
    statements: list[str] = []
    pending = ""
    *pieces, tail = sql.split(";")
    for piece in pieces:
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    pending += tail
    rest = [line for line in pending.splitlines() if line.strip() and not _comment(line)]
    if rest:
        raise ValueError(f"incomplete SQL statement at the end of the script: {rest[0].strip()!r}")
    return statements


def _comment(line: str) -> bool:
    return line.strip().startswith("--")


def schema_version(conn: sqlite3.Connection) -> int:
    """The newest applied migration, 0 for an empty database."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if exists is None:
        return 0
    (version,) = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
    return int(version)


def check_order(migrations: Sequence[Migration]) -> None:
    """Refuse a migration list whose versions do not count 1, 2, 3... (a programming error)."""
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migration versions must be 1..n in order, got {versions}")


def migrate(
    conn: sqlite3.Connection,
    *,
    now: float,
    location: str,
    migrations: Sequence[Migration] = MIGRATIONS,
) -> list[int]:
    """Bring the database up to the newest migration; return the versions applied now.

    ``conn`` must be in autocommit mode (``isolation_level=None``). Each migration runs in its own
    ``BEGIN IMMEDIATE`` transaction, and re-reads the version inside it, so two processes opening
    the same new database apply each migration once.

    Raises:
        SchemaVersionError: the database is newer than ``migrations`` (named by ``location``).
    """
    check_order(migrations)
    latest = migrations[-1].version if migrations else 0
    applied: list[int] = []
    conn.execute(CREATE_VERSIONS)
    for migration in migrations:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = schema_version(conn)
            if current > latest:
                raise SchemaVersionError(location, current, latest)
            if migration.version <= current:
                conn.execute("COMMIT")
                continue
            for statement in split_statements(migration.script(SQLITE)):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, now),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        applied.append(migration.version)
    current = schema_version(conn)
    if current > latest:
        raise SchemaVersionError(location, current, latest)
    return applied
