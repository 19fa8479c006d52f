"""What humans do to actions (approve, reject, reset the breaker), and the audit entry every
transition writes, shared with the remediator."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpuwarden.collector.alerts.redact import redact
from gpuwarden.collector.remediate.states import (
    ACTOR,
    APPROVABLE,
    BREAKER_SCOPE,
    REJECTABLE,
    ActionState,
    ActionStateError,
)
from gpuwarden.collector.storage.base import ActionRecord, BreakerRecord, Storage
from gpuwarden.collector.storage.records import AuditEntry

log = logging.getLogger(__name__)


def audit_entry(
    now: float,
    row: ActionRecord,
    *,
    verdict: str,
    result: str,
    reason: str,
    actor: str = ACTOR,
    inputs: Mapping[str, Any] | None = None,
) -> AuditEntry:
    return AuditEntry(
        time=now,
        actor=actor,
        action=row.action,
        target=row.target,
        reason=reason,
        verdict=verdict,
        dry_run=row.dry_run,
        result=result,
        inputs=redact(inputs or {}),
        incident_fingerprint=str(row.params.get("fingerprint", "")) or None,
        idempotency_key=row.idempotency_key,
    )


def approve_action(storage: Storage, action_id: int, *, actor: str, now: float) -> ActionRecord:
    """A human approves an action (also from ``halted``); it runs at the next pass.

    Raises:
        ActionStateError: unknown action, or not waiting for approval.
    """
    return _human(storage, action_id, actor, now, APPROVABLE, ActionState.APPROVED, "approved")


def reject_action(storage: Storage, action_id: int, *, actor: str, now: float) -> ActionRecord:
    """A human rejects an action that has not run."""
    return _human(storage, action_id, actor, now, REJECTABLE, ActionState.REJECTED, "rejected")


def _human(
    storage: Storage,
    action_id: int,
    actor: str,
    now: float,
    allowed: frozenset[ActionState],
    to: ActionState,
    verb: str,
) -> ActionRecord:
    row = storage.action(action_id)
    if row is None:
        raise ActionStateError(f"no action {action_id}")
    if row.state == ActionState.EXPIRED:
        why = row.params.get("expired_because", "its incident resolved")
        raise ActionStateError(
            f"action {action_id} expired ({why}); cannot be {verb}: "
            "a new incident proposes it again"
        )
    if row.state not in allowed:
        raise ActionStateError(f"action {action_id} is {row.state}; cannot be {verb}")
    params = {**row.params, f"{verb}_by": actor}
    new = replace(row, state=to, updated_at=now, params=params, next_attempt_at=None)
    entry = audit_entry(now, row, verdict=f"human_{verb}", result=to, reason=f"{verb} by {actor}")
    entry = replace(entry, actor=actor)
    if not storage.update_action(new, expect_state=row.state, audit=entry):
        raise ActionStateError(f"action {action_id} changed meanwhile; look again")
    log.info("action %s %s by %s", action_id, verb, actor)
    return new


def reset_breaker(storage: Storage, *, actor: str, now: float) -> bool:
    """Close the breaker after a human looked; ``False`` when it was not open.

    Actions halted while it was open stay halted: each needs its own approval, so that a reset
    does not release a burst of queued actions.
    """
    record = BreakerRecord(BREAKER_SCOPE, "closed", updated_at=now, reason=f"reset by {actor}")
    entry = AuditEntry(
        time=now,
        actor=actor,
        action="reset_breaker",
        target=BREAKER_SCOPE,
        reason=f"reset by {actor}",
        verdict="human_reset",
        dry_run=False,
        result="closed",
    )
    done = storage.set_breaker(record, expect_state="open", audit=entry)
    if done:
        log.warning("remediation breaker reset by %s: automation resumes", actor)
    return done
