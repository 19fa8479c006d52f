"""After the settle time: did the action help? Verified, or rolled back and escalated; a
temporary action (``degrade``) is undone ("restored") once its incident is resolved."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from gpuwarden.collector.remediate.actuators.base import ActionResult, Outcome
from gpuwarden.collector.remediate.execute import Actuators, call_actuator, request_for
from gpuwarden.collector.remediate.ledger import Ledger
from gpuwarden.collector.remediate.paging import Pager
from gpuwarden.collector.remediate.policy import TEMPORARY_KINDS
from gpuwarden.collector.remediate.states import ActionState, Verification, Verifier
from gpuwarden.collector.remediate.transitions import audit_entry
from gpuwarden.collector.storage.base import ActionRecord, Storage
from gpuwarden.collector.storage.records import Incident, IncidentState

log = logging.getLogger(__name__)


class Verifications:
    """Judges executed actions once settled, and rolls back or restores them.

    Args:
        storage: where the rows live.
        ledger: moves the rows.
        verifier: judges an action after its settle time.
        actuators: the actuators by kind (their ``rollback``).
        pager: escalations.
        clock: wall clock.
    """

    def __init__(
        self,
        storage: Storage,
        ledger: Ledger,
        *,
        verifier: Verifier,
        actuators: Actuators,
        pager: Pager,
        clock: Callable[[], float],
    ) -> None:
        self._storage = storage
        self._ledger = ledger
        self._verifier = verifier
        self._actuators = actuators
        self._pager = pager
        self._clock = clock

    def settled(self) -> list[ActionRecord]:
        """Rows past their settle time, and verified temporary actions waiting to be undone."""
        now = self._clock()
        rows = self._storage.actions(states=[ActionState.VERIFYING, ActionState.VERIFIED])
        return sorted(
            (
                r
                for r in rows
                if (r.state == ActionState.VERIFYING and (r.verify_at or 0.0) <= now)
                or (r.state == ActionState.VERIFIED and r.action in TEMPORARY_KINDS)
            ),
            key=lambda r: r.action_id or 0,
        )

    def verify(self, row: ActionRecord) -> bool:
        """Judge a settled row; restore a verified temporary action once resolved."""
        incident = self._storage.incident(row.incident_id)
        now = self._clock()
        if row.state == ActionState.VERIFIED:  # a temporary action waiting for the resolve
            if incident is not None and incident.state is IncidentState.RESOLVED:
                return self._undo(row, incident, ActionState.RESTORED, "incident resolved")
            return False
        outcome = self._verifier.verify(row, incident)
        if outcome is Verification.RECOVERED:
            new = self._ledger.moved(row, ActionState.VERIFIED)
            entry = audit_entry(now, row, verdict="verify", result=outcome, reason="recovered")
            if not self._storage.update_action(new, expect_state=row.state, audit=entry):
                return False
            resolved = incident is not None and incident.state is IncidentState.RESOLVED
            if row.action in TEMPORARY_KINDS and incident is not None and resolved:
                self._undo(new, incident, ActionState.RESTORED, "incident resolved")
            return True
        why = f"{row.action} {row.target} did not help ({outcome}) after the settle time"
        if incident is None:
            new = self._ledger.moved(row, ActionState.ESCALATED, last_error=why)
            entry = audit_entry(now, row, verdict="verify", result=outcome, reason=why)
            return self._storage.update_action(new, expect_state=row.state, audit=entry)
        if row.params.get("undo"):
            done = self._undo(row, incident, ActionState.ROLLED_BACK, why)
        else:
            new = self._ledger.moved(row, ActionState.ESCALATED, last_error=why)
            entry = audit_entry(now, row, verdict="verify", result=outcome, reason=why)
            done = self._storage.update_action(new, expect_state=row.state, audit=entry)
        if done:
            self._pager.escalate(row, incident, why)
        return done

    def _undo(self, row: ActionRecord, incident: Incident, to: ActionState, why: str) -> bool:
        actuator = self._actuators.for_row(row)
        undo = row.params.get("undo")
        original = ActionResult(
            Outcome(str(row.params.get("outcome", Outcome.DONE))),
            str(row.params.get("detail", "")),
            undo=dict(undo) if isinstance(undo, Mapping) else {},
        )
        request = request_for(row, dry_run=False)
        if actuator is None:
            result = ActionResult(Outcome.FAILED, f"no actuator for {row.action}")
        else:
            result = call_actuator(lambda: actuator.rollback(request, original))
        now = self._clock()
        state = to if result.ok else ActionState.ESCALATED
        reason = f"{why}; rollback: {result.outcome}: {result.detail}"
        new = self._ledger.moved(row, state, last_error=None if result.ok else reason)
        entry = audit_entry(
            now, row, verdict=f"rollback ({to})", result=result.outcome, reason=reason
        )
        if not self._storage.update_action(new, expect_state=row.state, audit=entry):
            return False
        log.warning("action %s: %s", row.action_id, reason)
        if not result.ok and to is ActionState.RESTORED:
            self._pager.escalate(new, incident, reason)
        return True
