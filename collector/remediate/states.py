"""The remediator's vocabulary: action states, verification, actuator extensions, results.

Shared by the remediator, the human transitions (:mod:`.transitions`), the API and the CLI.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from gpuwarden.collector.remediate.actuators.base import ActionRequest, ActionResult
from gpuwarden.collector.storage.base import ActionRecord
from gpuwarden.collector.storage.records import Incident, IncidentState

ACTOR = "gpuwarden"
BREAKER_SCOPE = "global"
INTENT = "intent"  # audit result of the entry written before an actuator call


class ActionState(enum.StrEnum):
    """States of a remediation action (``remediation_actions.state``)."""

    PROPOSED = "proposed"
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    REJECTED = "rejected"
    DEFERRED = "deferred"
    HALTED = "halted"
    DRY_RUN = "dry_run"
    EXECUTING = "executing"
    VERIFYING = "verifying"
    VERIFIED = "verified"
    RESTORED = "restored"
    ROLLED_BACK = "rolled_back"
    ESCALATED = "escalated"
    REFUSED = "refused"
    NOT_FOUND = "not_found"
    OBSOLETE = "obsolete"  # the incident resolved before the action could run
    EXPIRED = "expired"  # awaited approval until its incident resolved or its job ended
    UNKNOWN = "unknown"  # the collector died mid-call and the result could not be confirmed


#: States a human may approve from, and reject from.
APPROVABLE = frozenset({ActionState.AWAITING_APPROVAL, ActionState.HALTED})
REJECTABLE = APPROVABLE | {ActionState.DEFERRED, ActionState.APPROVED}


class ActionStateError(Exception):
    """A human asked for a transition the action's state does not allow."""


class Verification(enum.StrEnum):
    """Whether the action helped, judged after its settle time."""

    RECOVERED = "recovered"
    NOT_RECOVERED = "not_recovered"
    UNKNOWN = "unknown"


class Verifier(Protocol):
    """Judges an action after its settle time."""

    def verify(self, action: ActionRecord, incident: Incident | None) -> Verification:
        """Whether the incident the action was for has recovered."""
        ...


class IncidentVerifier:
    """Recovered when the incident resolved or its last detection cycle was clear."""

    def verify(self, action: ActionRecord, incident: Incident | None) -> Verification:
        """See the class docstring; a missing incident is ``UNKNOWN``."""
        del action
        if incident is None:
            return Verification.UNKNOWN
        if incident.state is IncidentState.RESOLVED or incident.consecutive_clears > 0:
            return Verification.RECOVERED
        return Verification.NOT_RECOVERED


@runtime_checkable
class Probe(Protocol):
    """Optional actuator extension: tells whether the target is already in the wanted state.

    Used only to reconcile an action the collector died executing. ``None``: cannot tell.
    """

    def probe(self, request: ActionRequest) -> ActionResult | None:
        """``DONE``/``ALREADY_DONE`` when the action's effect is in place; ``FAILED`` when the
        probe is sure it is not (the call never took effect): the action then runs again."""
        ...


@runtime_checkable
class Redeliverable(Protocol):
    """Optional actuator extension: sending the same request again is safe, because the target
    drops a repeat of its idempotency key (a webhook receiver keeping the ``Idempotency-Key``).

    Used only to reconcile an action whose outcome nobody recorded (the collector died during
    the call, or a standby took over): it is sent once more and the target's answer
    (``ALREADY_DONE`` for a repeat) is recorded, instead of ``unknown`` and a page.
    """

    def redeliverable(self, request: ActionRequest) -> bool:
        """Whether ``request`` may be sent again (the target dedupes its key)."""
        ...


@runtime_checkable
class Targeted(Protocol):
    """Optional actuator extension, needed when several actuators take one kind: whether this
    actuator owns ``target`` (e.g. ``slurm:...`` jobs versus ``k8s:...`` jobs)."""

    def accepts(self, target: str) -> bool:
        """Whether ``target`` belongs to this actuator's system."""
        ...


@dataclass(frozen=True, slots=True)
class TickResult:
    """What one remediation pass did (counts of rows moved)."""

    decided: int = 0
    executed: int = 0
    verified: int = 0
    reconciled: int = 0
    expired: int = 0
