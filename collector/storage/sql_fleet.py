"""What the fleet did, in SQL: jobs, model deployments, events and accounting rollups."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.storage.dialect import DIALECTS, Dialect
from gpuwarden.collector.storage.records import (
    ROLLUP_DIMENSIONS,
    AccountingRow,
    Event,
    EventKind,
    ModelDeployment,
    RollupDimension,
    RollupTotal,
    dump_allocations,
    dump_json,
    load_allocations,
    load_json,
    load_labels,
)
from gpuwarden.collector.storage.sql_base import SqlBase
from gpuwarden.collector.storage.sql_codec import ALL, Codec, field_names, one_of

_JOBS = Codec(
    "jobs",
    Job,
    field_names(Job),
    to_sql={"state": JobState, "allocations": dump_allocations, "labels": dump_json},
    from_sql={"state": JobState, "allocations": load_allocations, "labels": load_labels},
)
_MODELS = Codec(
    "models",
    ModelDeployment,
    field_names(ModelDeployment),
    to_sql={"labels": dump_json},
    from_sql={"labels": load_labels},
)
_EVENTS = Codec(
    "events",
    Event,
    field_names(Event),
    to_sql={"kind": EventKind, "attributes": dump_json},
    from_sql={"kind": EventKind, "attributes": load_json},
)
_ACCOUNTING = Codec(
    "accounting",
    AccountingRow,
    field_names(AccountingRow),
    to_sql={"job_key": lambda key: key or ""},  # '' in the key column: no job
    from_sql={"job_key": lambda key: key or None},
)
# The cluster is the last stamp of every insert: this store's own (``SqlBase.cluster``).
#: the tables whose clusters ``cluster_names`` lists (each indexed by cluster first; not the
#: accounting table, the largest: a cluster that only ever wrote accounting rows is in ``jobs``)
_CLUSTER_TABLES = ("incidents", "remediation_actions", "models", "events", "jobs")
_UPSERT_JOB = {d: _JOBS.upsert_sql(("first_seen", "updated_at", "cluster"), d) for d in DIALECTS}
_UPSERT_MODEL = {d: _MODELS.upsert_sql(("updated_at", "cluster"), d) for d in DIALECTS}
_INSERT_EVENT = _EVENTS.insert_sql(("recorded_at", "cluster"), "ON CONFLICT DO NOTHING")
_ACCOUNTING_KEY = ("cluster", "period_start", "job_key", "gpu_uuid")
_REPLACE_ACCOUNTING = {
    d: _ACCOUNTING.replace_sql(("written_at", "cluster"), _ACCOUNTING_KEY, d) for d in DIALECTS
}
_ROLLUP_GROUP: dict[str, str] = {d: d for d in ROLLUP_DIMENSIONS} | {
    "job_key": "NULLIF(job_key, '')"
}
UNRECORDED_CURRENCY = "(unrecorded)"
"""The currency of rows written before the collector kept it (never guessed)."""


def _rollup_sums(d: Dialect) -> str:
    incomplete = d.count_where("energy_joules IS NULL OR cost IS NULL OR carbon_grams IS NULL")
    currencies = d.distinct_list(f"COALESCE(currency, '{UNRECORDED_CURRENCY}')")
    return (
        f"COUNT(*), {incomplete},"
        " SUM(gpu_seconds_allocated), SUM(gpu_seconds_busy), SUM(gpu_seconds_idle),"
        " SUM(gpu_seconds_unknown), SUM(energy_joules), SUM(cost), SUM(carbon_grams),"
        f" {currencies}"
    )


_ROLLUP_SUMS = {d: _rollup_sums(d) for d in DIALECTS}


class FleetRecords(SqlBase):
    """The ``Storage`` methods of jobs, models, events and accounting."""

    # Jobs ------------------------------------------------------------------------------------

    def upsert_jobs(self, jobs: Sequence[Job]) -> int:
        now = self._clock()
        params = [_JOBS.params(job, now, now, self.cluster) for job in jobs]
        with self._write() as conn:
            return conn.executemany(_UPSERT_JOB[self.dialect], params).rowcount

    def jobs(
        self, *, since: float | None = None, states: Collection[JobState] | None = None
    ) -> list[Job]:
        scope, scoped = self._scope()
        sql = f"SELECT * FROM jobs WHERE {scope} AND (end_time IS NULL OR end_time >= ?)"  # noqa: S608 - a constant condition
        params: list[Any] = [*scoped, ALL if since is None else since]
        if states is not None:
            sql += f" AND {one_of('state', len(states))}"
            params += [JobState(s) for s in states]
        return [_JOBS.load(row) for row in self._read(sql + " ORDER BY key", params)]

    def job(self, key: str) -> Job | None:
        return self._one(_JOBS, "SELECT * FROM jobs WHERE key = ?", key)

    # Models and events -----------------------------------------------------------------------

    def upsert_model(self, model: ModelDeployment) -> bool:
        params = _MODELS.params(model, self._clock(), self.cluster)
        with self._write() as conn:
            return conn.execute(_UPSERT_MODEL[self.dialect], params).rowcount > 0

    def models(self, *, cluster: str | None = None) -> list[ModelDeployment]:
        scope, scoped = self._scope(cluster)
        rows = self._read(f"SELECT * FROM models WHERE {scope} ORDER BY name", scoped)  # noqa: S608 - a constant condition
        return [_MODELS.load(row) for row in rows]

    def cluster_names(self) -> list[str]:
        union = " UNION ".join(f"SELECT DISTINCT cluster FROM {t}" for t in _CLUSTER_TABLES)  # noqa: S608 - constant names
        return sorted(str(row[0]) for row in self._read(union, ()))

    def model(self, name: str) -> ModelDeployment | None:
        return self._one(_MODELS, "SELECT * FROM models WHERE name = ?", name)

    def record_event(self, event: Event) -> bool:
        params = _EVENTS.params(event, self._clock(), self.cluster)
        with self._write() as conn:
            return conn.execute(_INSERT_EVENT, params).rowcount > 0

    def events(
        self,
        *,
        since: float | None = None,
        kinds: Collection[EventKind] | None = None,
        subject: str | None = None,
        cluster: str | None = None,
    ) -> list[Event]:
        scope, scoped = self._scope(cluster)
        sql = f"SELECT * FROM events WHERE {scope} AND time >= ?"  # noqa: S608 - a constant condition
        params: list[Any] = [*scoped, ALL if since is None else since]
        if kinds is not None:
            sql += f" AND {one_of('kind', len(kinds))}"
            params += [EventKind(k) for k in kinds]
        if subject is not None:
            sql += " AND subject = ?"
            params.append(subject)
        return [_EVENTS.load(row) for row in self._read(sql + " ORDER BY time, event_id", params)]

    # Accounting ------------------------------------------------------------------------------

    def write_rollups(self, rows: Sequence[AccountingRow]) -> int:
        now = self._clock()
        scopes = sorted({(self.cluster, row.period_start, row.gpu_uuid) for row in rows})
        params = [_ACCOUNTING.params(row, now, self.cluster) for row in rows]
        with self._write() as conn:
            self._check_fence(conn)
            conn.executemany(
                "DELETE FROM accounting WHERE cluster = ? AND period_start = ? AND gpu_uuid = ?",
                scopes,
            )
            # The DELETE made room; OR REPLACE lets a duplicate key within the batch win last.
            conn.executemany(_REPLACE_ACCOUNTING[self.dialect], params)
        return len(rows)

    def accounting_rows(
        self, *, since: float, until: float, cluster: str | None = None
    ) -> list[AccountingRow]:
        scope, scoped = self._scope(cluster)
        rows = self._read(
            f"SELECT * FROM accounting WHERE {scope} AND period_start >= ? AND period_start < ?"  # noqa: S608 - a constant condition
            " ORDER BY period_start, gpu_uuid, job_key",
            (*scoped, since, until),
        )
        return [_ACCOUNTING.load(row) for row in rows]

    def rollups(
        self,
        *,
        since: float,
        until: float,
        by: Sequence[RollupDimension] = (),
        cluster: str | None = None,
    ) -> list[RollupTotal]:
        if any(d not in _ROLLUP_GROUP for d in by) or len(set(by)) != len(by):
            raise ValueError(f"by must name distinct dimensions of {ROLLUP_DIMENSIONS}: {by!r}")
        # Only whitelisted column expressions are spliced in; the values are bound.
        groups = ", ".join(_ROLLUP_GROUP[d] for d in by)
        sums = _ROLLUP_SUMS[self.dialect]
        sql = f"SELECT {groups}{', ' if by else ''}{sums} FROM accounting"  # noqa: S608
        scope, scoped = self._scope(cluster)
        sql += f" WHERE {scope} AND period_start >= ? AND period_start < ?"
        if by:
            order = ", ".join(self.dialect.nulls_first(_ROLLUP_GROUP[d]) for d in by)
            sql += f" GROUP BY {groups} ORDER BY {order}"
        n = len(by)
        return [
            # The sums are selected in the order of RollupTotal's fields.
            _one_currency(
                RollupTotal(MappingProxyType(dict(zip(by, row[:n], strict=True))), *row[n:])
            )
            for row in self._read(sql, (*scoped, since, until))
            if row[n] > 0  # without GROUP BY, an empty range still gives one all-NULL row
        ]


def _one_currency(total: RollupTotal) -> RollupTotal:
    """Costs in several currencies have no sum: ``cost`` None, ``currency`` lists them."""
    if total.currency is None or "," not in total.currency:
        return total
    listed = ",".join(sorted(total.currency.split(",")))
    return replace(total, cost=None, currency=listed)
