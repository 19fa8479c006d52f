"""Remediation's records in SQL: incidents, the audit log, actions, approvals, breakers.

An action's or breaker's audit entry is written in the same transaction as the change.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from gpuwarden.collector.storage.base import (
    ActionRecord,
    ApprovalRecord,
    BreakerRecord,
    StorageError,
)
from gpuwarden.collector.storage.records import (
    AuditEntry,
    Incident,
    IncidentState,
    dump_json,
    load_json,
)
from gpuwarden.collector.storage.sql_base import Connection, SqlBase
from gpuwarden.collector.storage.sql_codec import ALL, Codec, field_names, marks, one_of, same

_INCIDENTS = Codec(
    "incidents",
    Incident,
    field_names(Incident, without="incident_id"),
    row_id="incident_id",
    to_sql={"state": IncidentState, "evidence": dump_json},
    from_sql={"state": IncidentState, "evidence": load_json},
)
_AUDIT = Codec(
    "audit_log",
    AuditEntry,
    field_names(AuditEntry, without="entry_id"),
    row_id="entry_id",
    to_sql={"dry_run": int, "inputs": dump_json},
    from_sql={"dry_run": bool, "inputs": load_json},
)
_ACTIONS = Codec(
    "remediation_actions",
    ActionRecord,
    field_names(ActionRecord, without="action_id"),
    row_id="action_id",
    to_sql={"dry_run": int, "params": dump_json},
    from_sql={"dry_run": bool, "params": load_json},
)
_APPROVALS = Codec(
    "approvals",
    ApprovalRecord,
    field_names(ApprovalRecord, without="approval_id"),
    row_id="approval_id",
)
_BREAKERS = Codec("breaker_state", BreakerRecord, field_names(BreakerRecord))
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
    f" = ({marks(len(_ACTION_MUTABLE))}) WHERE action_id = ? AND state = ? AND cluster = ?"
)
# The cluster is the last stamp of every insert: this store's own (``SqlBase.cluster``).
_INSERT_ACTION = _ACTIONS.insert_sql(("cluster",), "ON CONFLICT DO NOTHING")
_INSERT_APPROVAL = _APPROVALS.insert_sql()
_SET_BREAKER = _BREAKERS.insert_sql(
    ("cluster",),
    "ON CONFLICT (cluster, scope) DO UPDATE SET (state, updated_at, reason, tripped_at)"
    " = (excluded.state, excluded.updated_at, excluded.reason, excluded.tripped_at)"
    " WHERE breaker_state.state = ?",
)
_INSERT_INCIDENT = _INCIDENTS.insert_sql(("updated_at", "cluster"), "ON CONFLICT DO NOTHING")
_INSERT_AUDIT = _AUDIT.insert_sql(("cluster",))


FENCED_STATE = "executing"
"""An action moving to this state is the leader's claim to call the actuator: with a fence set
(:mod:`.sql_lease`) it commits only while the writer's lease epoch is current. Moves made by
people (approve, reject) on any replica are not claims and are not fenced."""


class RemediationRecords(SqlBase):
    """The ``Storage`` methods of incidents, audit, actions, approvals and the breaker."""

    # Incidents -------------------------------------------------------------------------------

    def open_incident(self, incident: Incident) -> int | None:
        if incident.incident_id is not None or incident.state is not IncidentState.OPEN:
            raise ValueError("open_incident takes a new incident (no id) in state 'open'")
        params = _INCIDENTS.params(incident, self._clock(), self.cluster)
        with self._write() as conn:
            return self._insert(conn, _INSERT_INCIDENT, params, "incident_id")

    def update_incident(self, incident: Incident) -> bool:
        i = incident
        if i.incident_id is None:
            raise ValueError("update_incident needs incident.incident_id")
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE incidents SET state = ?, severity = ?, last_seen = ?, resolved_time = ?,"
                " evidence = ?, consecutive_breaches = ?, consecutive_clears = ?, updated_at = ?"
                " WHERE incident_id = ? AND cluster = ?",
                (
                    *(IncidentState(i.state), i.severity, i.last_seen, i.resolved_time),
                    *(dump_json(i.evidence), i.consecutive_breaches, i.consecutive_clears),
                    *(self._clock(), i.incident_id, self.cluster),
                ),
            )
            return cursor.rowcount > 0

    def incident(self, incident_id: int) -> Incident | None:
        return self._one(_INCIDENTS, "SELECT * FROM incidents WHERE incident_id = ?", incident_id)

    def open_incident_for(self, fingerprint: str) -> Incident | None:
        sql = "SELECT * FROM incidents WHERE fingerprint = ? AND state = 'open'"
        return self._one(_INCIDENTS, sql, fingerprint)

    def incidents(
        self, *, state: IncidentState | None = None, cluster: str | None = None
    ) -> list[Incident]:
        scope, scoped = self._scope(cluster)
        sql = f"SELECT * FROM incidents WHERE {scope} AND (? IS NULL OR state = ?)"  # noqa: S608 - a constant condition
        value = None if state is None else IncidentState(state)
        rows = self._read(sql + " ORDER BY incident_id", (*scoped, value, value))
        return [_INCIDENTS.load(row) for row in rows]

    def incident_counts(self, *, state: IncidentState | None = None) -> dict[str, int]:
        value = None if state is None else IncidentState(state)
        rows = self._read(
            "SELECT cluster, COUNT(*) FROM incidents WHERE ? IS NULL OR state = ? GROUP BY cluster",
            (value, value),
        )
        return {str(row[0]): int(row[1]) for row in rows}

    # Audit -----------------------------------------------------------------------------------

    def append_audit(self, entry: AuditEntry) -> int:
        if entry.entry_id is not None:
            raise ValueError("append_audit takes a new entry (entry_id=None)")
        with self._write() as conn:
            entry_id = self._append(conn, entry)
        if entry_id is None:  # pragma: no cover - a successful INSERT always sets it
            raise StorageError("audit_log insert returned no id")
        return entry_id

    def audit(
        self, *, since: float | None = None, limit: int | None = None, after_id: int = 0
    ) -> list[AuditEntry]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        rows = self._read(
            "SELECT * FROM audit_log WHERE cluster = ? AND time >= ? AND entry_id > ?"
            " ORDER BY entry_id LIMIT ?",
            (
                self.cluster,
                ALL if since is None else since,
                after_id,
                self.dialect.no_limit if limit is None else limit,
            ),
        )
        return [_AUDIT.load(row) for row in rows]

    def audit_entry(self, entry_id: int) -> AuditEntry | None:
        return self._one(_AUDIT, "SELECT * FROM audit_log WHERE entry_id = ?", entry_id)

    def count_logged(
        self, *, since: float, result: str, dry_run: bool
    ) -> tuple[int, frozenset[str]]:
        rows = self._read(
            "SELECT target FROM audit_log"
            " WHERE cluster = ? AND time >= ? AND result = ? AND dry_run = ?",
            (self.cluster, since, result, int(dry_run)),
        )
        return len(rows), frozenset(str(row[0]) for row in rows)

    # Remediation actions, approvals, breaker ---------------------------------------------------

    def insert_action(self, record: ActionRecord, audit: AuditEntry | None = None) -> int | None:
        if record.action_id is not None:
            raise ValueError("insert_action takes a new action (action_id=None)")
        with self._write() as conn:
            if record.state == FENCED_STATE:
                self._check_fence(conn)
            params = _ACTIONS.params(record, self.cluster)
            action_id = self._insert(conn, _INSERT_ACTION, params, "action_id")
            if action_id is None:
                return None
            if audit is not None:
                self._append(conn, audit)
            return action_id

    def update_action(
        self, record: ActionRecord, *, expect_state: str, audit: AuditEntry | None = None
    ) -> bool:
        if record.action_id is None:
            raise ValueError("update_action needs record.action_id")
        encode = _ACTIONS.to_sql or {}
        values = [encode.get(c, same)(getattr(record, c)) for c in _ACTION_MUTABLE]
        with self._write() as conn:
            if record.state == FENCED_STATE:
                self._check_fence(conn)
            cursor = conn.execute(
                _UPDATE_ACTION, (*values, record.action_id, expect_state, self.cluster)
            )
            if cursor.rowcount <= 0:
                return False
            if audit is not None:
                self._append(conn, audit)
            return True

    def action(self, action_id: int) -> ActionRecord | None:
        sql = "SELECT * FROM remediation_actions WHERE action_id = ?"
        return self._one(_ACTIONS, sql, action_id)

    def action_for(self, incident_id: int, idempotency_key: str) -> ActionRecord | None:
        rows = self._read(
            "SELECT * FROM remediation_actions"
            " WHERE incident_id = ? AND idempotency_key = ? AND cluster = ?",
            (incident_id, idempotency_key, self.cluster),
        )
        return _ACTIONS.load(rows[0]) if rows else None

    def actions(
        self,
        *,
        states: Collection[str] | None = None,
        incident_id: int | None = None,
        limit: int | None = None,
        cluster: str | None = None,
    ) -> list[ActionRecord]:
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        scope, scoped = self._scope(cluster)
        sql = f"SELECT * FROM remediation_actions WHERE {scope} AND (? IS NULL OR incident_id = ?)"  # noqa: S608 - a constant condition
        params: list[Any] = [*scoped, incident_id, incident_id]
        if states is not None:
            sql += f" AND {one_of('state', len(states))}"
            params += [str(state) for state in states]
        sql += " ORDER BY action_id DESC LIMIT ?"
        params.append(self.dialect.no_limit if limit is None else limit)
        return [_ACTIONS.load(row) for row in self._read(sql, params)]

    def cooldown_until(self, action: str, target: str, *, dry_run: bool) -> float | None:
        rows = self._read(
            "SELECT MAX(cooldown_until) FROM remediation_actions"
            " WHERE cluster = ? AND action = ? AND target = ? AND dry_run = ?",
            (self.cluster, action, target, int(dry_run)),
        )
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    def insert_approval(self, record: ApprovalRecord) -> int:
        if record.approval_id is not None:
            raise ValueError("insert_approval takes a new approval (approval_id=None)")
        with self._write() as conn:
            params = _APPROVALS.params(record)
            approval_id = self._insert(conn, _INSERT_APPROVAL, params, "approval_id")
        if approval_id is None:  # pragma: no cover - a successful INSERT always sets it
            raise StorageError("approvals insert returned no id")
        return approval_id

    def approval(self, token_sha256: str) -> ApprovalRecord | None:
        sql = (
            "SELECT approvals.* FROM approvals JOIN remediation_actions"
            " ON remediation_actions.action_id = approvals.action_id WHERE token_sha256 = ?"
        )
        return self._one(_APPROVALS, sql, token_sha256)

    def use_approval(self, token_sha256: str, *, now: float, used_by: str) -> bool:
        # An approval has no cluster of its own: it is its action's.
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE approvals SET used_at = ?, used_by = ? WHERE token_sha256 = ?"
                " AND used_at IS NULL AND expires_at > ? AND action_id IN"
                " (SELECT action_id FROM remediation_actions WHERE cluster = ?)",
                (now, used_by, token_sha256, now, self.cluster),
            )
            return cursor.rowcount > 0

    def revoke_approvals(self, action_id: int, *, now: float) -> int:
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE approvals SET expires_at = ? WHERE action_id = ?"
                " AND used_at IS NULL AND expires_at > ? AND action_id IN"
                " (SELECT action_id FROM remediation_actions WHERE cluster = ?)",
                (now, action_id, now, self.cluster),
            )
            return cursor.rowcount

    # Breaker ---------------------------------------------------------------------------------

    def breaker(self, scope: str) -> BreakerRecord | None:
        return self._one(_BREAKERS, "SELECT * FROM breaker_state WHERE scope = ?", scope)

    def set_breaker(
        self, record: BreakerRecord, *, expect_state: str, audit: AuditEntry | None = None
    ) -> bool:
        with self._write() as conn:
            current = conn.execute(
                "SELECT state FROM breaker_state WHERE scope = ? AND cluster = ?",
                (record.scope, self.cluster),
            ).fetchone()
            if (current[0] if current is not None else "closed") != expect_state:
                return False
            # The upsert re-checks the state: on a backend with concurrent writers another
            # transaction may have moved the breaker between the SELECT and here.
            params = (*_BREAKERS.params(record, self.cluster), expect_state)
            cursor = conn.execute(_SET_BREAKER, params)
            if cursor.rowcount <= 0:
                return False
            if audit is not None:
                self._append(conn, audit)
            return True

    def _append(self, conn: Connection, entry: AuditEntry) -> int | None:
        """Append ``entry`` to the audit log inside the transaction of ``conn``."""
        self._before_audit(conn)
        return self._insert(conn, _INSERT_AUDIT, _AUDIT.params(entry, self.cluster), "entry_id")
