"""How the remediator records a step: the action row and its audit entry, written together.

A new row is inserted; an existing one is moved by compare-and-set on the state it was read in
(``update_action(..., expect_state=...)``), so two writers never both move it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

from gpuwarden.collector.remediate.policy import Decision, PolicyState
from gpuwarden.collector.remediate.states import ActionState
from gpuwarden.collector.remediate.transitions import audit_entry
from gpuwarden.collector.storage.base import ActionRecord, Storage
from gpuwarden.collector.storage.records import Incident


class Step(NamedTuple):
    """One decision being recorded: the row, the verdict, and what it was based on."""

    row: ActionRecord
    decision: Decision
    incident: Incident
    inputs: Mapping[str, Any]
    state: PolicyState


class Ledger:
    """Writes action rows with their audit entries.

    Args:
        storage: where the rows and the audit live.
        clock: wall clock (the ``updated_at`` of moved rows).
    """

    def __init__(self, storage: Storage, clock: Callable[[], float]) -> None:
        self._storage = storage
        self._clock = clock

    def save(
        self,
        row: ActionRecord,
        new: ActionRecord,
        decision: Decision,
        result: str,
        inputs: Mapping[str, Any] | None,
        reason: str | None = None,
    ) -> bool:
        """Insert a new row or compare-and-set an existing one, with its audit entry."""
        entry = audit_entry(
            new.updated_at,
            new,
            verdict=decision.verdict,
            result=result,
            reason=reason or decision.reason,
            inputs=inputs,
        )
        if row.action_id is None:
            action_id = self._storage.insert_action(new, audit=entry)
            return action_id is not None
        return self._storage.update_action(new, expect_state=row.state, audit=entry)

    def moved(self, row: ActionRecord, state: ActionState, **changes: Any) -> ActionRecord:
        """``row`` in ``state``, updated now, with ``changes`` (not yet written)."""
        return replace(row, state=state, updated_at=self._clock(), **changes)
