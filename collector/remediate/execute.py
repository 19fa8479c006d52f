"""Running a decided action through its actuator: dry runs, real calls, their outcomes, and
the reconciliation of calls a crash interrupted.

**At most once.** The ``executing`` row and its ``intent`` audit entry are committed *before*
the actuator is called. If the process dies after that commit, the restarted remediator finds the
row ``executing`` and older than ``stale_execution_seconds`` and never calls ``execute`` again:
it asks the actuator (an optional ``probe``, see :class:`Probe`) whether the target is in the
wanted state — confirmed → ``verifying`` as if the call had returned —, sends it once more
when the target drops a repeated idempotency key (:class:`Redeliverable`: the webhook actuator),
otherwise marks the row ``unknown`` and pages a human once. A standby that becomes the leader
adopts every row left ``executing`` at once (:meth:`Executor.adopt_orphans`): the old leader's
fence refuses its later writes, so nobody else will finish them. A crash before the commit
leaves no row (or the previous state), so the decision is simply taken again. The price of this
choice is a page after a crash in the window of one actuator call (unless the target dedupes);
the alternative (re-executing blindly) could requeue a job twice.

Dry-run (the default) validates through the actuator (``dry_run=True``) and records ``dry_run``
with the reason "would <kind> <target>"; those rows neither count for the breaker nor cool down
real actions. Switching dry-run off turns the incident's ``dry_run`` rows into real decisions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuwarden.collector.remediate.actuators.base import (
    ActionRequest,
    ActionResult,
    Actuator,
    Outcome,
)
from gpuwarden.collector.remediate.ledger import Ledger, Step
from gpuwarden.collector.remediate.paging import Pager
from gpuwarden.collector.remediate.policy import Decision, Policy, PolicyConfig, Verdict
from gpuwarden.collector.remediate.states import (
    INTENT,
    ActionState,
    Probe,
    Redeliverable,
    Targeted,
)
from gpuwarden.collector.remediate.transitions import audit_entry
from gpuwarden.collector.storage.base import ActionRecord, Storage
from gpuwarden.collector.storage.records import Incident
from gpuwarden.collector.storage.sql_base import FencedError

log = logging.getLogger(__name__)


class Actuators:
    """The actuators by action kind; each row is served by at most one.

    Raises:
        ValueError: several actuators take one kind and not all implement :class:`Targeted`.
    """

    def __init__(self, actuators: Iterable[Actuator]) -> None:
        self._by_kind: dict[str, list[Actuator]] = {}
        for actuator in actuators:
            for kind in actuator.kinds:
                self._by_kind.setdefault(kind, []).append(actuator)
        for kind, several in self._by_kind.items():
            if len(several) > 1 and not all(isinstance(a, Targeted) for a in several):
                raise ValueError(
                    f"{len(several)} actuators execute {kind!r}: each needs accepts(target) "
                    "(e.g. Slurm for slurm:... jobs, Kubernetes for k8s:... jobs)"
                )

    def __contains__(self, kind: object) -> bool:
        return kind in self._by_kind

    def for_row(self, row: ActionRecord) -> Actuator | None:
        """The actuator for the row's kind and target, or ``None``."""
        several = self._by_kind.get(row.action, [])
        if len(several) == 1:
            return several[0]
        return next((a for a in several if isinstance(a, Targeted) and a.accepts(row.target)), None)

    def of(self, row: ActionRecord) -> Actuator:
        """The actuator for the row's kind and target.

        Raises:
            LookupError: there is none.
        """
        found = self.for_row(row)
        if found is None:
            raise LookupError(f"no actuator for {row.action} on {row.target}")
        return found


def call_actuator(call: Callable[[], ActionResult]) -> ActionResult:
    """``call()``, with an exception turned into a ``FAILED`` result."""
    try:
        return call()
    except Exception as exc:  # an actuator bug must not stop the remediator
        log.exception("actuator raised")
        return ActionResult(Outcome.FAILED, f"actuator raised {type(exc).__name__}")


def parameters_of(row: ActionRecord) -> dict[str, Any]:
    """The rule's parameters recorded with the row."""
    raw = row.params.get("parameters", {})
    return dict(raw) if isinstance(raw, Mapping) else {}


def request_for(row: ActionRecord, *, dry_run: bool) -> ActionRequest:
    """What the actuator is asked to do for ``row``."""
    parameters = parameters_of(row)
    return ActionRequest(row.action, row.target, row.idempotency_key, dry_run, parameters)


class Executor:
    """Runs decided actions through their actuators and records what came back.

    Args:
        storage: where the rows live.
        ledger: writes the rows with their audit entries.
        policy: the attempts allowed per action.
        config: settle and cooldown times, stale-execution age.
        actuators: the actuators by kind.
        pager: escalations.
        clock: wall clock.
    """

    def __init__(
        self,
        storage: Storage,
        ledger: Ledger,
        *,
        policy: Policy,
        config: PolicyConfig,
        actuators: Actuators,
        pager: Pager,
        clock: Callable[[], float],
    ) -> None:
        self._storage = storage
        self._ledger = ledger
        self._policy = policy
        self._config = config
        self._actuators = actuators
        self._pager = pager
        self._clock = clock
        self._orphans: set[int] = set()
        self.leading: Callable[[], bool] = lambda: True
        """Checked before the intent and between the committed intent and the actuator call
        (active/standby): a leader paused past its lease leaves the row ``executing`` for the
        new leader, which adopts it."""

    def stale(self) -> list[ActionRecord]:
        """Rows left ``executing`` longer than any call may take (a crash interrupted them),
        and those an earlier leader left (:meth:`adopt_orphans`)."""
        limit = self._clock() - self._config.stale_execution_seconds
        rows = self._storage.actions(states=[ActionState.EXECUTING])
        return [row for row in rows if row.updated_at <= limit or row.action_id in self._orphans]

    def adopt_orphans(self) -> int:
        """Take every row ``executing`` now as interrupted: called when this replica has just
        become the leader, whose fence refuses any later write of the old leader, so no one
        will finish them. Their reconciliation runs at the next pass, without waiting
        ``stale_execution_seconds``. Returns how many there are."""
        rows = self._storage.actions(states=[ActionState.EXECUTING])
        self._orphans = {row.action_id for row in rows if row.action_id is not None}
        return len(self._orphans)

    def dry_run(self, step: Step) -> bool:
        """Validate through the actuator and record "would <kind> <target>"."""
        row, decision, _incident, inputs, _state = step
        request = request_for(row, dry_run=True)
        result = call_actuator(lambda: self._actuators.of(row).execute(request))
        reason = f"would {row.action} {row.target}: {result.outcome}: {result.detail}"
        now = self._clock()
        new = self._ledger.moved(
            row,
            ActionState.DRY_RUN,
            dry_run=True,
            cooldown_until=now + self._config.cooldown(row.action) if result.ok else None,
            last_error=None if result.ok else result.detail,
        )
        log.info("dry run: would %s %s (%s)", row.action, row.target, result.outcome)
        return self._ledger.save(row, new, decision, ActionState.DRY_RUN, inputs, reason)

    def execute(self, step: Step) -> bool:
        """Commit the intent, call the actuator, record the result."""
        row, decision, incident, inputs, _state = step
        if not self.leading():  # a standby (an approval on its web): the leader runs it
            raise FencedError(f"{row.action} {row.target}: not the leader; left to the leader")
        # 1. The intent, committed before anything happens (see the module docstring).
        intent = self._ledger.moved(
            row, ActionState.EXECUTING, dry_run=False, attempts=row.attempts + 1
        )
        if not self._ledger.save(row, intent, decision, INTENT, inputs):
            return False  # another writer took it
        stored = self._storage.action_for(row.incident_id, row.idempotency_key)
        if stored is None:  # pragma: no cover - just written
            return False
        # 2. The call (not when the lease ran out meanwhile: the new leader reconciles the row).
        if not self.leading():
            raise FencedError(f"action {stored.action_id}: no longer the leader; not called")
        request = request_for(stored, dry_run=False)
        log.info("executing %s on %s (action %s)", row.action, row.target, stored.action_id)
        result = call_actuator(lambda: self._actuators.of(row).execute(request))
        # 3. The result.
        return self.record_result(stored, result, incident, inputs)

    def record_result(
        self,
        row: ActionRecord,
        result: ActionResult,
        incident: Incident,
        inputs: Mapping[str, Any] | None,
    ) -> bool:
        """Move an ``executing`` row by the actuator's result; page when it needs a human."""
        now = self._clock()
        params = {
            **row.params,
            "outcome": str(result.outcome),
            "detail": result.detail,
            "undo": dict(result.undo),
        }
        decision = Decision(Verdict.EXECUTE, f"{row.action} {row.target}: {result.detail}")
        escalate = None
        moved = self._ledger.moved
        if result.outcome is Outcome.DRY_RUN:
            # The actuator can only simulate this target: nothing changed, nothing to verify.
            new = moved(row, ActionState.DRY_RUN, params=params, dry_run=True)
        elif result.ok:
            new = moved(
                row,
                ActionState.VERIFYING,
                params=params,
                verify_at=now + self._config.settle(row.action),
                cooldown_until=now + self._config.cooldown(row.action),
                last_error=None,
            )
        elif result.outcome is Outcome.NOT_FOUND:
            new = moved(row, ActionState.NOT_FOUND, params=params, last_error=result.detail)
        elif result.outcome is Outcome.REFUSED or row.attempts >= self._max_attempts(row):
            new = moved(row, ActionState.ESCALATED, params=params, last_error=result.detail)
            escalate = f"{row.action} {row.target} {result.outcome}: {result.detail}"
        else:  # FAILED with attempts left: retry after the settle time (backoff)
            new = moved(
                row,
                ActionState.DEFERRED,
                params=params,
                next_attempt_at=now + self._config.settle(row.action),
                last_error=result.detail,
            )
        saved = self._ledger.save(row, new, decision, str(result.outcome), inputs)
        if saved and escalate is not None:
            self._pager.escalate(new, incident, escalate)
        return saved

    def reconcile(self, row: ActionRecord) -> bool:
        """An ``executing`` row nobody finished: confirm through a probe, else ``unknown``."""
        actuator: object = self._actuators.for_row(row)
        incident = self._storage.incident(row.incident_id)
        probed: ActionResult | None = None
        if isinstance(actuator, Probe):
            probe = actuator.probe
            probed = call_actuator(lambda: probe(request_for(row, dry_run=False)) or _NONE)
        if probed is not None and probed.ok and probed.outcome is not Outcome.DRY_RUN:
            log.warning("action %s: reconciled after restart: %s", row.action_id, probed.detail)
            if incident is None:  # pragma: no cover - foreign key
                return False
            return self.record_result(row, probed, incident, {"reconciled": True})
        now = self._clock()
        self._orphans.discard(row.action_id or 0)
        if isinstance(actuator, Redeliverable) and actuator.redeliverable(
            request_for(row, dry_run=False)
        ):
            # The target drops a repeat of the idempotency key: send once more, through the
            # normal path (the attempt counts), and record what it answers.
            reason = "collector stopped during the call; sent again (the target drops repeats)"
            retry = self._ledger.moved(
                row, ActionState.DEFERRED, next_attempt_at=now, last_error=reason
            )
            entry = audit_entry(now, row, verdict="reconcile", result="redeliver", reason=reason)
            log.warning("action %s: %s", row.action_id, reason)
            return self._storage.update_action(retry, expect_state=row.state, audit=entry)
        if probed is not None and probed is not _NONE and probed.outcome is Outcome.FAILED:
            # The target shows the action never happened (the collector died before the call
            # took effect): run it again, once more, through the normal path.
            reason = f"collector stopped before the call took effect: {probed.detail}"
            retry = self._ledger.moved(
                row, ActionState.DEFERRED, next_attempt_at=now, last_error=reason
            )
            entry = audit_entry(now, row, verdict="reconcile", result="retry", reason=reason)
            log.warning("action %s: %s; running it again", row.action_id, reason)
            return self._storage.update_action(retry, expect_state=row.state, audit=entry)
        reason = "collector stopped during the call; result unknown; not executed again"
        new = self._ledger.moved(row, ActionState.UNKNOWN, last_error=reason)
        entry = audit_entry(
            now, row, verdict="reconcile", result=ActionState.UNKNOWN, reason=reason
        )
        if not self._storage.update_action(new, expect_state=row.state, audit=entry):
            return False
        log.error("action %s (%s %s): %s", row.action_id, row.action, row.target, reason)
        if incident is not None:
            self._pager.escalate(new, incident, reason)
        return True

    def _max_attempts(self, row: ActionRecord) -> int:
        return self._policy.max_attempts(parameters_of(row))


_NONE = ActionResult(Outcome.FAILED, "probe could not tell")
