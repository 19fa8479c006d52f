"""The collector's persistence: round trips, upserts, roll-ups, incidents, the append-only audit
log, schema migrations, SQLite settings, threads, concurrent writers, and a real SIGKILL of a
writing process -- on SQLite and on a real PostgreSQL (``tests.storage_backends``)."""

from __future__ import annotations

import math
import os
import selectors
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import psycopg
import pytest

from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.storage.base import (
    ActionRecord,
    ApprovalRecord,
    BreakerRecord,
    PageRecord,
    SchemaVersionError,
    Storage,
    StorageError,
)
from gpuwarden.collector.storage.migrations import (
    LATEST_VERSION,
    MIGRATIONS,
    Migration,
    check_order,
    migrate,
    schema_version,
    split_statements,
)
from gpuwarden.collector.storage.postgres import PostgresStorage
from gpuwarden.collector.storage.postgres_base import migrate_postgresql
from gpuwarden.collector.storage.records import (
    AccountingRow,
    AuditEntry,
    Event,
    EventKind,
    Incident,
    IncidentState,
    ModelDeployment,
)
from gpuwarden.collector.storage.sqlite import SqliteStorage
from tests.storage_backends import Backend, SqlStorage, backend_for


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["sqlite-memory", "sqlite-file", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> Iterator[Storage]:
    if request.param == "sqlite-memory":
        with SqliteStorage(":memory:", clock=clock) as in_memory:
            yield in_memory
        return
    engine = request.param.split("-")[0]
    with backend_for(engine, request, tmp_path).open(clock) as opened:
        yield opened


def raw(path: Path) -> closing[sqlite3.Connection]:
    return closing(sqlite3.connect(path))


def make_job(key: str = "slurm:c1:42", **changes: Any) -> Job:
    job = Job(
        key=key,
        scheduler="slurm",
        job_id=key.rsplit(":", 1)[-1],
        state=JobState.RUNNING,
        name="train-llm",
        owner="alice",
        team="research",
        gpus=3,
        allocations=(
            GpuAllocation("node1", (0, 1), ("GPU-a", "GPU-b")),
            GpuAllocation("node2", (3,), ()),
        ),
        submit_time=100.0,
        start_time=110.5,
        end_time=None,
        priority=7,
        model="llama-70b",
        price_tier="spot",
        restarts=1,
        labels=MappingProxyType({"project": "x", "queue": "gpu"}),
    )
    return replace(job, **changes)


def row(gpu: str = "GPU-a", job: str | None = "slurm:c1:42", **changes: Any) -> AccountingRow:
    base = AccountingRow(
        period_start=3600.0,
        period_seconds=60.0,
        job_key=job,
        team="research",
        model="llama-70b",
        node="node1",
        gpu_uuid=gpu,
        price_tier="spot",
        gpu_seconds_allocated=60.0,
        gpu_seconds_busy=45.0,
        gpu_seconds_idle=10.0,
        energy_joules=18_000.0,
        cost=0.05,
        carbon_grams=2.0,
        gpu_seconds_unknown=5.0,
    )
    return replace(base, **changes)


def incident(fingerprint: str = "idle:node1:GPU-a", **changes: Any) -> Incident:
    base = Incident(
        fingerprint=fingerprint,
        rule_id="gpu-idle",
        severity="warning",
        first_seen=500.0,
        last_seen=560.0,
        evidence=MappingProxyType({"utilization": [0.0, 0.01], "node": "node1", "gone": None}),
        consecutive_breaches=3,
    )
    return replace(base, **changes)


def audit_entry(time_seconds: float = 700.0, **changes: Any) -> AuditEntry:
    base = AuditEntry(
        time=time_seconds,
        actor="gpuwarden",
        action="slurm.requeue",
        target="slurm:c1:42",
        reason="idle for 30 minutes",
        verdict="allowed",
        dry_run=True,
        result="ok",
        inputs=MappingProxyType({"idle_seconds": 1800, "threshold": 0.05}),
        incident_fingerprint="idle:node1:GPU-a",
        idempotency_key="idle:node1:GPU-a|requeue|slurm:c1:42",
    )
    return replace(base, **changes)


@pytest.mark.parametrize("cls", [SqliteStorage, PostgresStorage])
def test_the_backends_implement_the_protocol(cls: type[SqlStorage]) -> None:
    def as_storage(store: SqliteStorage | PostgresStorage) -> Storage:
        return store  # mypy checks every method's signature against the Protocol

    with SqliteStorage(":memory:") as opened:
        assert as_storage(opened) is opened
    # The audit log has no way to change or remove an entry.
    mutators = [n for n in dir(cls) if "audit" in n and not n.startswith("_")]
    assert sorted(mutators) == ["append_audit", "audit", "audit_entry"]


# Jobs ----------------------------------------------------------------------------------------


def test_job_round_trip(store: Storage) -> None:
    job = make_job()
    bare = Job(key="k8s:uid-1", scheduler="kubernetes", job_id="uid-1", state=JobState.PENDING)
    assert store.upsert_jobs([job, bare]) == 2
    assert store.job(job.key) == job
    assert store.job(bare.key) == bare
    assert store.jobs() == [bare, job]  # ordered by key
    assert store.job("api:missing") is None


def test_upsert_jobs_replaces_by_key_and_counts_only_changes(
    backend: Backend, clock: FakeClock
) -> None:
    with backend.open(clock) as store:
        assert store.upsert_jobs([make_job("a"), make_job("b")]) == 2
        clock.now = 2000.0
        assert store.upsert_jobs([make_job("a"), make_job("b")]) == 0  # unchanged: not rewritten
        done = make_job("b", state=JobState.COMPLETED, end_time=900.0, labels={"q": "z"})
        assert store.upsert_jobs([make_job("a"), done, make_job("c")]) == 2
        assert store.jobs() == [make_job("a"), done, make_job("c")]
        assert store.upsert_jobs([]) == 0
    stamps = backend.query("SELECT key, first_seen, updated_at FROM jobs ORDER BY key")
    assert stamps == [("a", 1000.0, 1000.0), ("b", 1000.0, 2000.0), ("c", 2000.0, 2000.0)]


def test_jobs_filters_by_end_time_and_state(store: Storage) -> None:
    running = make_job("r")
    ended_early = make_job("e", state=JobState.COMPLETED, end_time=100.0)
    ended_late = make_job("l", state=JobState.FAILED, end_time=300.0)
    store.upsert_jobs([running, ended_early, ended_late])
    assert store.jobs(since=200.0) == [ended_late, running]
    assert store.jobs(since=300.0) == [ended_late, running]
    assert store.jobs(states={JobState.COMPLETED, JobState.FAILED}) == [ended_early, ended_late]
    assert store.jobs(since=200.0, states=[JobState.RUNNING]) == [running]
    assert store.jobs(states=()) == []


# Models and events ---------------------------------------------------------------------------


def test_model_round_trip_and_upsert(store: Storage) -> None:
    model = ModelDeployment(
        name="llama-70b",
        version="v1",
        replicas=4,
        slo_latency_p99_seconds=0.8,
        slo_error_ratio=0.001,
        fallback_model="llama-8b",
        labels=MappingProxyType({"team": "serving"}),
    )
    small = ModelDeployment(name="llama-8b", version="v3", replicas=2)
    assert store.upsert_model(model) is True
    assert store.upsert_model(small) is True
    assert store.upsert_model(model) is False
    deployed = replace(model, version="v2", slo_latency_p99_seconds=None)
    assert store.upsert_model(deployed) is True
    assert store.models() == [deployed, small]
    assert store.model("llama-8b") == small
    assert store.model("nope") is None


def test_events_round_trip_dedup_and_filters(store: Storage) -> None:
    deploy = Event(100.0, EventKind.DEPLOY, "llama-70b", MappingProxyType({"version": "v2"}))
    notice = Event(50.0, EventKind.PREEMPTION_NOTICE, "slurm:c1:42", {"deadline": 170.0})
    rollback = Event(200.0, EventKind.ROLLBACK, "llama-70b")
    assert [store.record_event(e) for e in (deploy, notice, rollback)] == [True, True, True]
    assert store.record_event(replace(deploy, attributes={"version": "other"})) is False
    assert store.events() == [notice, deploy, rollback]
    assert store.events(since=100.0) == [deploy, rollback]
    assert store.events(kinds=[EventKind.DEPLOY, EventKind.ROLLBACK]) == [deploy, rollback]
    assert store.events(subject="slurm:c1:42") == [notice]
    assert store.events(kinds=()) == []
    with pytest.raises(ValueError, match="bogus"):
        store.record_event(Event(1.0, "bogus", "x"))  # type: ignore[arg-type]
    assert len(store.events()) == 3


# Accounting ----------------------------------------------------------------------------------


def test_accounting_round_trip(store: Storage) -> None:
    rows = [
        row("GPU-a"),
        row("GPU-b", job=None, team=None, model=None, energy_joules=None, cost=None),
        row("GPU-a", period_start=3660.0),
    ]
    assert store.write_rollups(rows) == 3
    assert store.accounting_rows(since=0.0, until=1e12) == [rows[0], rows[1], rows[2]]
    assert store.accounting_rows(since=3600.0, until=3660.0) == rows[:2]


def test_rewriting_a_period_replaces_it(store: Storage) -> None:
    first = [row("GPU-a", job=None), row("GPU-b"), row("GPU-a", period_start=3660.0)]
    store.write_rollups(first)
    store.write_rollups(first)
    assert len(store.accounting_rows(since=0.0, until=1e12)) == 3
    # Recomputed with late data: GPU-a was in fact held by two jobs in 3600..3660.
    recomputed = [
        row("GPU-a", job="slurm:c1:1", gpu_seconds_allocated=30.0),
        row("GPU-a", job="slurm:c1:2", gpu_seconds_allocated=30.0),
    ]
    store.write_rollups(recomputed)
    assert store.accounting_rows(since=0.0, until=1e12) == [
        *recomputed,  # the unallocated row of GPU-a is gone
        row("GPU-b"),  # another GPU of the same period is untouched
        row("GPU-a", period_start=3660.0),  # the same GPU in another period too
    ]
    # A duplicate key within one batch: the last one wins.
    store.write_rollups([row("GPU-c", cost=1.0), row("GPU-c", cost=2.0)])
    (stored,) = [r for r in store.accounting_rows(since=0, until=1e12) if r.gpu_uuid == "GPU-c"]
    assert stored.cost == 2.0


def test_rollups_sum_by_dimensions(store: Storage) -> None:
    store.write_rollups(
        [
            row("GPU-a", job="j1", team="research"),
            row("GPU-b", job="j2", team="research", energy_joules=None, carbon_grams=None),
            row("GPU-c", job=None, team=None, energy_joules=None, cost=None, carbon_grams=None),
            row("GPU-a", job="j1", team="research", period_start=7200.0),
        ]
    )
    (total,) = store.rollups(since=0.0, until=7200.0)
    assert total.group == {}
    assert (total.rows, total.rows_incomplete) == (3, 2)
    assert total.gpu_seconds_allocated == 180.0
    assert (total.gpu_seconds_busy, total.gpu_seconds_idle, total.gpu_seconds_unknown) == (
        135.0,
        30.0,
        15.0,
    )
    assert total.energy_joules == 18_000.0  # the rows that have it
    assert total.cost == pytest.approx(0.10)

    by_team = store.rollups(since=0.0, until=7200.0, by=["team"])
    assert [(t.group, t.rows) for t in by_team] == [({"team": None}, 1), ({"team": "research"}, 2)]
    assert by_team[0].energy_joules is None  # missing stays missing, never 0
    assert by_team[0].cost is None

    by_job_period = store.rollups(since=0.0, until=1e12, by=("job_key", "gpu_uuid"))
    assert [dict(t.group) for t in by_job_period] == [
        {"job_key": None, "gpu_uuid": "GPU-c"},
        {"job_key": "j1", "gpu_uuid": "GPU-a"},
        {"job_key": "j2", "gpu_uuid": "GPU-b"},
    ]
    assert by_job_period[1].gpu_seconds_allocated == 120.0
    assert store.rollups(since=10_000.0, until=20_000.0) == []
    assert store.rollups(since=10_000.0, until=20_000.0, by=["node"]) == []


@pytest.mark.parametrize("by", [["gpu"], ["team", "team"], ["team; DROP TABLE jobs"]])
def test_rollups_refuse_unknown_dimensions(store: Storage, by: list[str]) -> None:
    with pytest.raises(ValueError, match="dimensions"):
        store.rollups(since=0.0, until=1.0, by=by)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"gpu_uuid": ""}, "gpu_uuid"),
        ({"job_key": ""}, "job_key"),
        ({"period_seconds": 0.0}, "period_seconds"),
        ({"period_seconds": math.nan}, "period_seconds"),
        ({"gpu_seconds_busy": math.nan}, "gpu_seconds_busy"),
        ({"energy_joules": math.inf}, "energy_joules"),
    ],
)
def test_accounting_row_rejects_bad_values(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replace(row(), **changes)


# Incidents -----------------------------------------------------------------------------------


def test_incident_open_update_resolve_reopen(store: Storage) -> None:
    first_id = store.open_incident(incident())
    assert first_id is not None
    opened = store.incident(first_id)
    assert opened == replace(incident(), incident_id=first_id)
    assert store.open_incident(incident(last_seen=600.0)) is None  # deduplicated
    other_id = store.open_incident(incident("xid:node2:GPU-z", severity="critical"))

    resolved = replace(
        opened,
        state=IncidentState.RESOLVED,
        last_seen=900.0,
        resolved_time=960.0,
        consecutive_breaches=0,
        consecutive_clears=5,
        evidence={"utilization": [0.4]},
        rule_id="ignored",  # fixed at open
    )
    assert store.update_incident(resolved) is True
    assert store.incident(first_id) == replace(resolved, rule_id="gpu-idle")
    assert store.open_incident_for("idle:node1:GPU-a") is None

    again_id = store.open_incident(incident(first_seen=2000.0, last_seen=2000.0))
    assert again_id not in (None, first_id, other_id)
    assert [i.incident_id for i in store.incidents()] == [first_id, other_id, again_id]
    assert [i.incident_id for i in store.incidents(state=IncidentState.OPEN)] == [
        other_id,
        again_id,
    ]
    assert [i.incident_id for i in store.incidents(state=IncidentState.RESOLVED)] == [first_id]
    assert store.open_incident_for("idle:node1:GPU-a") == store.incident(again_id or -1)
    assert store.update_incident(replace(resolved, incident_id=9999)) is False
    assert store.incident(9999) is None


def test_incident_methods_refuse_misuse(store: Storage) -> None:
    with pytest.raises(ValueError, match="new incident"):
        store.open_incident(incident(incident_id=3))
    with pytest.raises(ValueError, match="new incident"):
        store.open_incident(incident(state=IncidentState.RESOLVED))
    with pytest.raises(ValueError, match="incident_id"):
        store.update_incident(incident())
    with pytest.raises(ValueError, match="NaN"):
        store.open_incident(incident(evidence={"value": math.nan}))
    assert store.incidents() == []


# Audit ---------------------------------------------------------------------------------------


def test_audit_round_trip_order_and_limit(store: Storage) -> None:
    entries = [
        audit_entry(700.0),
        audit_entry(650.0, dry_run=False, result="failed", incident_fingerprint=None),
        audit_entry(800.0, verdict="needs_approval", idempotency_key=None, inputs={}),
    ]
    ids = [store.append_audit(e) for e in entries]
    assert ids == sorted(ids)
    assert len(set(ids)) == 3
    stored = [replace(e, entry_id=i) for e, i in zip(entries, ids, strict=True)]
    assert store.audit() == stored  # append order, not time order
    assert store.audit(since=700.0) == [stored[0], stored[2]]
    assert store.audit(limit=2) == stored[:2]
    assert store.audit(limit=0) == []
    assert store.audit_entry(ids[1]) == stored[1]
    assert store.audit_entry(-1) is None
    with pytest.raises(ValueError, match="entry_id"):
        store.append_audit(stored[0])
    with pytest.raises(ValueError, match="limit"):
        store.audit(limit=-1)


def test_audit_log_refuses_update_and_delete_in_the_database(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with SqliteStorage(path) as store:
        store.append_audit(audit_entry())
    with raw(path) as conn:
        with pytest.raises(sqlite3.IntegrityError, match="append-only: UPDATE refused"):
            conn.execute("UPDATE audit_log SET result = 'ok, honest'")
        with pytest.raises(sqlite3.IntegrityError, match="append-only: DELETE refused"):
            conn.execute("DELETE FROM audit_log")
        conn.rollback()
        assert conn.execute("SELECT result FROM audit_log").fetchall() == [("ok",)]


def test_postgresql_audit_log_refuses_update_delete_and_truncate(fresh_database: str) -> None:
    with PostgresStorage(fresh_database) as store:
        store.append_audit(audit_entry())
    backend = Backend("postgresql", fresh_database)
    for statement, verb in [
        ("UPDATE audit_log SET result = 'ok, honest'", "UPDATE"),
        ("DELETE FROM audit_log", "DELETE"),
        ("TRUNCATE audit_log", "TRUNCATE"),
    ]:
        with pytest.raises(psycopg.errors.IntegrityConstraintViolation, match=f"{verb} refused"):
            backend.execute(statement)
    assert backend.query("SELECT result FROM audit_log") == [("ok",)]


# Migrations ----------------------------------------------------------------------------------


def applied(backend: Backend) -> list[tuple[int, float]]:
    return backend.query("SELECT version, applied_at FROM schema_migrations ORDER BY version")


def tables(backend: Backend) -> set[str]:
    if backend.name == "sqlite":
        return {name for (name,) in backend.query("SELECT name FROM sqlite_master")}
    sql = "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
    return {name for (name,) in backend.query(sql)}


def migrate_to(backend: Backend, migrations: list[Migration]) -> list[int]:
    """Bring ``backend``'s database to the end of ``migrations`` (an older gpuwarden)."""
    if backend.name == "sqlite":
        with closing(sqlite3.connect(backend.location, isolation_level=None)) as conn:
            return migrate(conn, now=1.0, location=backend.location, migrations=migrations)
    with psycopg.connect(backend.location, autocommit=True) as pg:
        return migrate_postgresql(pg, now=1.0, location=backend.location, migrations=migrations)


def test_migrates_an_empty_database_and_reopening_is_a_no_op(
    backend: Backend, clock: FakeClock
) -> None:
    with backend.open(clock) as store:
        assert store.applied_migrations == list(range(1, LATEST_VERSION + 1))
        store.upsert_jobs([make_job()])
    assert applied(backend) == [(v, 1000.0) for v in range(1, LATEST_VERSION + 1)]
    assert {
        *("jobs", "models", "events", "accounting", "incidents", "audit_log"),
        *("remediation_actions", "approvals", "breaker_state", "schema_migrations"),
        "notifications",
        "pages",
        "silences",
        "agent_rounds",
    } <= tables(backend)
    clock.now = 5000.0
    with backend.open(clock) as store:
        assert store.applied_migrations == []
        assert store.jobs() == [make_job()]
    assert applied(backend) == [(v, 1000.0) for v in range(1, LATEST_VERSION + 1)]


def test_upgrades_a_database_at_an_older_version(backend: Backend, clock: FakeClock) -> None:
    assert migrate_to(backend, list(MIGRATIONS[:1])) == [1]
    backend.execute("INSERT INTO models VALUES ('m', 'v1', 1, NULL, NULL, NULL, '{}', 1.0)")
    with backend.open(clock) as store:
        assert store.applied_migrations == list(range(2, LATEST_VERSION + 1))
        assert store.models() == [ModelDeployment("m", "v1", 1)]
        assert store.open_incident(incident()) is not None
    assert applied(backend) == [(1, 1.0)] + [(v, 1000.0) for v in range(2, LATEST_VERSION + 1)]


def test_costs_written_before_the_currency_was_kept_keep_their_value(
    backend: Backend, clock: FakeClock
) -> None:
    assert migrate_to(backend, list(MIGRATIONS[:4])) == [1, 2, 3, 4]
    backend.execute(
        "INSERT INTO accounting (period_start, period_seconds, job_key, gpu_uuid, node,"
        " gpu_seconds_allocated, gpu_seconds_busy, gpu_seconds_idle, gpu_seconds_unknown,"
        " cost_usd, written_at) VALUES (60, 60, 'j', 'GPU-a', 'n', 60, 60, 0, 0, 0.07, 1)"
    )
    with backend.open(clock) as store:
        assert store.applied_migrations == list(range(5, LATEST_VERSION + 1))
        (row,) = store.accounting_rows(since=0, until=120)
        assert (row.cost, row.currency) == (0.07, None)  # never guessed: USD or not
        store.write_rollups([replace(row, period_start=0, cost=0.05, currency="EUR")])
        (total,) = store.rollups(since=0, until=120)
        # an unknown and a known currency: no sum
        assert (total.cost, total.currency) == (None, "(unrecorded),EUR")


def test_refuses_a_database_from_a_newer_program(backend: Backend) -> None:
    backend.open().close()
    future = LATEST_VERSION + 1
    backend.execute(f"INSERT INTO schema_migrations VALUES ({future}, 'from the future', 0)")  # noqa: S608
    with pytest.raises(SchemaVersionError) as caught:
        backend.open()
    message = str(caught.value)
    assert backend.location in message
    assert f"version {future} is newer" in message
    assert f"({LATEST_VERSION})" in message
    assert (caught.value.database_version, caught.value.supported_version) == (
        future,
        LATEST_VERSION,
    )
    assert applied(backend)[-1][0] == future  # untouched


def test_a_failing_migration_leaves_the_previous_version(tmp_path: Path) -> None:
    broken = Migration(2, "broken", "CREATE TABLE half (a);\nINSERT INTO missing VALUES (1);")
    with closing(sqlite3.connect(tmp_path / "db", isolation_level=None)) as conn:
        with pytest.raises(sqlite3.OperationalError, match="missing"):
            migrate(conn, now=1.0, location="db", migrations=[MIGRATIONS[0], broken])
        assert schema_version(conn) == 1
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchall() == []
        assert not conn.in_transaction


def test_a_failing_postgresql_migration_leaves_the_previous_version(fresh_database: str) -> None:
    broken = Migration(
        2, "broken", "CREATE TABLE half (a INTEGER);\nINSERT INTO missing VALUES (1);"
    )
    backend = Backend("postgresql", fresh_database)
    with (
        psycopg.connect(fresh_database, autocommit=True) as conn,
        pytest.raises(psycopg.errors.UndefinedTable, match="missing"),
    ):
        migrate_postgresql(conn, now=1.0, location="db", migrations=[MIGRATIONS[0], broken])
    assert applied(backend) == [(1, 1.0)]
    assert "half" not in tables(backend)
    assert "jobs" in tables(backend)


def test_split_statements_keeps_triggers_and_literals_whole() -> None:
    script = """
        -- a comment; with a semicolon
        CREATE TABLE t (a TEXT DEFAULT 'x;y');
        CREATE TRIGGER t_no_delete BEFORE DELETE ON t
        BEGIN
            SELECT RAISE(ABORT, 'no; never');
        END;
        -- trailing comment
    """
    statements = split_statements(script)
    assert len(statements) == 2
    assert statements[0].endswith("CREATE TABLE t (a TEXT DEFAULT 'x;y');")
    assert statements[1].startswith("CREATE TRIGGER")
    assert statements[1].endswith("END;")
    with pytest.raises(ValueError, match="incomplete"):
        split_statements("CREATE TABLE t (a);\nCREATE TABLE u (b)")


def test_migrations_are_numbered_from_one_without_gaps() -> None:
    check_order(MIGRATIONS)
    assert len(MIGRATIONS) == LATEST_VERSION
    with pytest.raises(ValueError, match=r"1\.\.n"):
        check_order([Migration(1, "a", ""), Migration(3, "c", "")])


@pytest.mark.parametrize(
    ("record", "table"),
    [
        (Job, "jobs"),
        (ModelDeployment, "models"),
        (Event, "events"),
        (AccountingRow, "accounting"),
        (Incident, "incidents"),
        (AuditEntry, "audit_log"),
    ],
)
def test_every_record_field_has_a_column(backend: Backend, record: type, table: str) -> None:
    backend.open().close()
    if backend.name == "sqlite":
        columns = {r[1] for r in backend.query(f"PRAGMA table_info({table})")}
    else:
        columns = {
            r[0]
            for r in backend.query(
                f"SELECT column_name FROM information_schema.columns WHERE table_name = '{table}'"  # noqa: S608 - a constant of the test
            )
        }
    assert {f.name for f in fields(record)} <= columns


# SQLite settings, errors, threads --------------------------------------------------------------


def test_wal_and_connection_settings(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with SqliteStorage(path) as store:
        conn = store._connection()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            conn.execute(
                "INSERT INTO approvals (action_id, token_sha256, created_at, expires_at)"
                " VALUES (42, 'abc', 0, 1)"
            )
    with raw(path) as conn:  # WAL is a property of the file: a new connection sees it
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with SqliteStorage(path, synchronous="FULL", busy_timeout_seconds=0.25) as store:
        assert store._connection().execute("PRAGMA synchronous").fetchone()[0] == 2
        assert store._connection().execute("PRAGMA busy_timeout").fetchone()[0] == 250


def test_open_errors_are_clear(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StorageError, match=r"garbage\.db: cannot open"):
        SqliteStorage(garbage)
    with pytest.raises(StorageError, match="cannot open"):
        SqliteStorage(tmp_path / "missing-dir" / "state.db")
    with pytest.raises(ValueError, match="synchronous"):
        SqliteStorage(":memory:", synchronous="OFF")  # type: ignore[arg-type]


def test_closed_store_refuses_calls_and_close_is_idempotent(backend: Backend) -> None:
    store = backend.open()
    store.close()
    store.close()
    with pytest.raises(StorageError, match="closed"):
        store.jobs()
    with pytest.raises(StorageError, match="closed"):
        store.append_audit(audit_entry())


def test_threads_and_a_second_connection_share_the_database(backend: Backend) -> None:
    with backend.open() as store, backend.open() as other:
        errors: list[Exception] = []

        def work(worker: int) -> None:
            try:
                target = other if worker % 2 else store
                for n in range(25):
                    target.upsert_jobs([make_job(f"api:{worker}:{n}")])
                    target.append_audit(audit_entry(float(n), target=f"{worker}:{n}"))
                    target.jobs(states=[JobState.RUNNING])
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        assert len(store.jobs()) == 8 * 25
        assert {e.target for e in other.audit()} == {
            f"{w}:{n}" for w in range(8) for n in range(25)
        }


# Crash safety --------------------------------------------------------------------------------

BATCH = 10
CHILD = f"""
import sys, time
from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.storage.records import AccountingRow, AuditEntry
from gpuwarden.collector.storage.postgres import PostgresStorage
from gpuwarden.collector.storage.sqlite import SqliteStorage

where = sys.argv[1]
store = PostgresStorage(where) if where.startswith("postgresql:") else SqliteStorage(where)
commits = 0
deadline = time.monotonic() + 120  # never outlive a test run that lost track of us
i = 0
while time.monotonic() < deadline:
    store.upsert_jobs(
        [Job(f"api:{{i}}:{{n}}", "api", f"{{i}}.{{n}}", JobState.RUNNING) for n in range({BATCH})]
    )
    commits += 1
    print(commits, flush=True)
    store.write_rollups([
        AccountingRow(float(i), 1.0, f"api:{{i}}:{{n}}", "t", None, "node", f"GPU-{{n}}",
                      None, 1.0, 0.5, 0.5, energy_joules=float(n))
        for n in range({BATCH})
    ])
    commits += 1
    print(commits, flush=True)
    store.append_audit(AuditEntry(float(i), "gpuwarden", "noop", str(i), "test", "allowed",
                                  True, "ok", inputs={{"i": i}}))
    commits += 1
    print(commits, flush=True)
    i += 1
"""


def read_until(proc: subprocess.Popen[bytes], at_least: int, timeout_seconds: float) -> bytes:
    """Read the child's stdout until it has reported ``at_least`` commits (or fail, with stderr)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout_seconds
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            lines = data.split(b"\n")[:-1]
            if lines and int(lines[-1]) >= at_least:
                return data
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"child reported only {len(lines)} commits"
            if selector.select(remaining):
                chunk = os.read(fd, 65536)
                assert chunk, f"child exited early: {proc.stderr.read() if proc.stderr else ''!r}"
                data += chunk


def test_sigkill_mid_write_keeps_every_committed_transaction(backend: Backend) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, backend.location],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        data = read_until(proc, at_least=300, timeout_seconds=60)
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    reported = [int(line) for line in (data + rest).split()]
    assert reported == list(range(1, len(reported) + 1))
    committed = len(reported)

    if backend.name == "sqlite":
        assert backend.query("PRAGMA integrity_check") == [("ok",)]
    with backend.open() as store:
        assert store.applied_migrations == []
        job_batches: dict[int, int] = {}
        for job in store.jobs():
            batch = int(job.key.split(":")[1])
            job_batches[batch] = job_batches.get(batch, 0) + 1
        periods: dict[float, int] = {}
        for stored_row in store.accounting_rows(since=0.0, until=1e12):
            periods[stored_row.period_start] = periods.get(stored_row.period_start, 0) + 1
        audits = [int(e.target) for e in store.audit()]
    # Each kind is a gap-free prefix of complete transactions (no half-written batch) ...
    assert sorted(job_batches) == list(range(len(job_batches)))
    assert set(job_batches.values()) <= {BATCH}
    assert list(periods) == [float(i) for i in range(len(periods))]
    assert set(periods.values()) <= {BATCH}
    assert audits == list(range(len(audits)))
    # ... holding every reported commit, plus at most the one in flight when the kill landed.
    stored = len(job_batches) + len(periods) + len(audits)
    assert committed <= stored <= committed + 1


def test_pages_are_stored_then_updated_in_place(backend: Backend, clock: FakeClock) -> None:
    with backend.open(clock) as store:
        page_id = store.add_page(PageRecord("slack:#c", {"summary": "s"}, created_at=1.0))
        (page,) = store.pages(status="pending")
        assert page == PageRecord("slack:#c", {"summary": "s"}, 1.0, page_id=page_id)
        store.save_page(replace(page, status="delivered", sent_at=2.0, alert={"summary": "t"}))
        assert store.pages(status="pending") == []
        (done,) = store.pages()
        assert (done.status, done.sent_at, dict(done.alert)) == ("delivered", 2.0, {"summary": "t"})
        with pytest.raises(ValueError, match="new page"):
            store.add_page(done)


# Several writers at once: what must happen once is decided by the database ---------------------

WRITERS = 4


def race(backend: Backend, attempt: Callable[[SqlStorage, int], object]) -> list[object]:
    """``attempt(store, writer)`` by ``WRITERS`` threads, each on its own connection (as
    collector processes sharing one database), released together by a barrier."""
    stores = [backend.open() for _ in range(WRITERS)]
    barrier = threading.Barrier(WRITERS)
    results: list[object] = [None] * WRITERS
    errors: list[BaseException] = []

    def work(writer: int) -> None:
        try:
            barrier.wait(timeout=60)
            results[writer] = attempt(stores[writer], writer)
        except BaseException as exc:  # noqa: BLE001 - collected, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(WRITERS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for opened in stores:
            opened.close()
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    return results


def an_action(store: Storage, key: str = "idle:node1:GPU-a|requeue|slurm:c1:42") -> ActionRecord:
    incident_id = store.open_incident(incident(fingerprint=f"fp:{key}"))
    assert incident_id is not None
    return ActionRecord(
        incident_id,
        key,
        "slurm.requeue",
        "slurm:c1:42",
        "approve",
        False,
        "awaiting_approval",
        1.0,
        1.0,
    )


def test_one_approval_is_redeemed_once_by_concurrent_redeemers(backend: Backend) -> None:
    with backend.open() as store:
        action_id = store.insert_action(an_action(store))
        assert action_id is not None
        tokens = [f"{n:064x}" for n in range(10)]
        for token in tokens:
            store.insert_approval(ApprovalRecord(action_id, token, 1.0, expires_at=1e12))
    for token in tokens:

        def redeem(store: SqlStorage, writer: int, token: str = token) -> bool:
            return store.use_approval(token, now=2.0, used_by=f"w{writer}")

        wins = race(backend, redeem)
        assert wins.count(True) == 1, wins
        with backend.open() as store:
            stored = store.approval(token)
        assert stored is not None
        assert stored.used_by == f"w{wins.index(True)}"


def test_a_duplicate_idempotency_key_is_refused(backend: Backend) -> None:
    with backend.open() as store:
        record = an_action(store)
    ids = race(
        backend,
        lambda s, w: s.insert_action(record, audit_entry(target=f"w{w}", idempotency_key="k")),
    )
    assert len([i for i in ids if i is not None]) == 1, ids
    with backend.open() as store:
        assert len(store.actions(incident_id=record.incident_id)) == 1
        assert len(store.audit()) == 1  # only the winner's audit entry
    # ... and by the database itself, not only by ON CONFLICT in our INSERT.
    refused = sqlite3.IntegrityError if backend.name == "sqlite" else psycopg.errors.UniqueViolation
    with pytest.raises(refused):
        backend.execute(
            "INSERT INTO remediation_actions (incident_id, idempotency_key, action, target, mode,"  # noqa: S608
            f" dry_run, state, params, created_at, updated_at) VALUES ({record.incident_id},"
            f" '{record.idempotency_key}', 'a', 't', 'auto', 0, 'proposed', '{{}}', 1, 1)"
        )


def test_concurrent_writers_open_one_incident_and_trip_the_breaker_once(backend: Backend) -> None:
    opened = race(backend, lambda s, w: s.open_incident(incident(last_seen=float(w))))
    assert len([i for i in opened if i is not None]) == 1, opened
    tripped = BreakerRecord("global", "open", 5.0, reason="blast radius", tripped_at=5.0)
    moved = race(
        backend,
        lambda s, w: s.set_breaker(
            replace(tripped, reason=f"w{w}"),
            expect_state="closed",
            audit=audit_entry(target=f"w{w}", action="breaker.trip"),
        ),
    )
    assert moved.count(True) == 1, moved
    with backend.open() as store:
        assert [e.target for e in store.audit()] == [f"w{moved.index(True)}"]
        breaker = store.breaker("global")
    assert breaker is not None
    assert breaker.reason == f"w{moved.index(True)}"


def test_a_reader_following_the_audit_log_misses_no_entry(backend: Backend) -> None:
    """Ids must rise in commit order: a reader (the audit's PagerDuty mirror) that reads past
    its cursor while other connections append must, in the end, have seen every entry."""
    writers_done = threading.Event()
    finished: list[int] = []

    def attempt(store: SqlStorage, writer: int) -> list[int]:
        if writer == 0:  # the reader
            seen: list[int] = []
            while True:
                last_round = writers_done.is_set()
                batch = store.audit(after_id=seen[-1] if seen else 0)
                seen += [e.entry_id for e in batch if e.entry_id is not None]
                if last_round:
                    return seen
        ids = [store.append_audit(audit_entry(target=f"w{writer}:{n}")) for n in range(30)]
        finished.append(writer)
        if len(finished) == WRITERS - 1:
            writers_done.set()
        return ids

    results = race(backend, attempt)
    seen = results[0]
    appended = [i for batch in results[1:] for i in batch]  # type: ignore[attr-defined]
    assert len(appended) == 30 * (WRITERS - 1)
    assert seen == sorted(appended)
