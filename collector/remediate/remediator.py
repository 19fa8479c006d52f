"""The remediator: from open incidents to audited, verified, at-most-once actions.

Every step is a row in ``remediation_actions`` moved by compare-and-set (``update_action(...,
expect_state=...)``), with its audit entry written in the same transaction, so the state machine
survives a restart and two writers (two threads, two collector shards) never both move a row::

    new decision ─┬─ notify ───────────────► proposed
                  ├─ refused target ───────► refused
                  ├─ approve ──────────────► awaiting_approval ─┬─ reject ─► rejected
                  │                                             └─ approve ─► approved ─┐
                  ├─ cooldown / failed try ► deferred (next_attempt_at) ────────────────┤
                  ├─ breaker open/tripped ─► halted ── human approve ─► approved ───────┤
                  └─ auto ──────────────────────────────────────────────────────────────┤
                                                                                         ▼
         (policy again: dry-run ► dry_run "would <kind>"; attempts used ► escalated)  executing
                                                                                         │ intent
             actuator.execute ─┬─ ok ──────► verifying ─(settle)─┬─ recovered ► verified │ written
                               ├─ not_found ► not_found          │   (degrade: restored  │ first
                               ├─ refused ──► refused + page     │    once resolved)     │
                               └─ failed ───► deferred | escalated└─ not ─► rolled_back + page

**At most once.** The ``executing`` row and its ``intent`` audit entry are committed *before*
the actuator is called. If the process dies after that commit, the restarted remediator finds the
row ``executing`` and older than ``stale_execution_seconds`` and never calls ``execute`` again:
it asks the actuator (an optional ``probe``, see :class:`Probe`) whether the target is in the
wanted state — confirmed → ``verifying`` as if the call had returned — otherwise marks the row
``unknown`` and pages a human once. A crash before the commit leaves no row (or the previous
state), so the decision is simply taken again. The price of this choice is a page after a crash
in the window of one actuator call; the alternative (re-executing) could requeue a job twice.

Dry-run (the default) validates through the actuator (``dry_run=True``) and records ``dry_run``
with the reason "would <kind> <target>"; those rows neither count for the breaker nor cool down
real actions. Switching dry-run off turns the incident's ``dry_run`` rows into real decisions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from gpuwarden.collector.alerts.model import Alert, AlertOutbox, AlertStatus, ProposedAction
from gpuwarden.collector.alerts.redact import redact
from gpuwarden.collector.alerts.runbooks import Links
from gpuwarden.collector.remediate.actuators.base import (
    ActionRequest,
    ActionResult,
    Actuator,
    Outcome,
)
from gpuwarden.collector.remediate.approvals import Approvals
from gpuwarden.collector.remediate.policy import (
    NOTIFY_ONLY_KINDS,
    TEMPORARY_KINDS,
    Decision,
    Policy,
    PolicyConfig,
    PolicyState,
    Verdict,
    idempotency_key,
)
from gpuwarden.collector.remediate.states import (
    ACTOR,
    APPROVABLE,
    BREAKER_SCOPE,
    INTENT,
    REJECTABLE,
    ActionState,
    ActionStateError,
    IncidentVerifier,
    Probe,
    Targeted,
    TickResult,
    Verification,
    Verifier,
)
from gpuwarden.collector.remediate.transitions import (
    approve_action,
    audit_entry,
    reject_action,
    reset_breaker,
)
from gpuwarden.collector.rules.model import ActionMode, ActionSpec, Rule, Subject
from gpuwarden.collector.rules.vocabulary import ACTIONS
from gpuwarden.collector.storage.base import ActionRecord, BreakerRecord, Storage
from gpuwarden.collector.storage.records import AuditEntry, Incident, IncidentState

__all__ = [  # the states and transitions moved out stay importable from here
    "ACTOR",
    "APPROVABLE",
    "BREAKER_SCOPE",
    "INTENT",
    "REJECTABLE",
    "ActionState",
    "ActionStateError",
    "IncidentVerifier",
    "Probe",
    "Remediator",
    "Targeted",
    "TickResult",
    "Verification",
    "Verifier",
    "approve_action",
    "reject_action",
    "reset_breaker",
    "target_for",
]

log = logging.getLogger(__name__)


def target_for(kind: str, incident: Incident) -> str | None:
    """The object an action of ``kind`` acts on, from the incident's evidence."""
    evidence = incident.evidence
    subject = ACTIONS[kind].target
    keys = (
        {
            Subject.JOB: ("job",),
            Subject.NODE: ("node",),
            Subject.DEPLOYMENT: ("deployment", "model"),
        }.get(subject, ("subject",))
        if subject is not None
        else ("subject",)
    )
    for key in keys:
        value = evidence.get(key)
        if value is not None:
            return str(value)
    return None


class _Step(NamedTuple):
    """One decision being recorded: the row, the verdict, and what it was based on."""

    row: ActionRecord
    decision: Decision
    incident: Incident
    inputs: Mapping[str, Any]
    state: PolicyState


class Remediator:
    """Decides, executes, verifies and rolls back the rules' actions for open incidents.

    Args:
        storage: where every state lives.
        rules: the loaded rules (their ``actions``).
        actuators: one per system; each action kind is served by at most one.
        config: the policy settings (dry-run by default).
        outbox: where approval requests and pages go (the alert dispatcher stores, delivers and
            retries them); without one they are logged and not sent.
        escalation_routes: where breaker trips and escalations page (``pagerduty:...``).
        approvals: approval links for ``approve`` actions (without: CLI/API approval only).
        links: URLs for runbooks, incidents and approval links in messages.
        verifier: judges actions after their settle time (default :class:`IncidentVerifier`).
        fleet_size: number of targets in the fleet for the blast-radius ratio (``None``: unknown).
        clock: wall clock.

    Raises:
        PolicyError: a rule names an unknown action kind.
        ValueError: several actuators take one kind and not all implement :class:`Targeted`.
    """

    def __init__(
        self,
        storage: Storage,
        rules: Iterable[Rule],
        actuators: Iterable[Actuator],
        *,
        config: PolicyConfig,
        outbox: AlertOutbox | None = None,
        escalation_routes: Sequence[str] = (),
        approvals: Approvals | None = None,
        links: Links | None = None,
        verifier: Verifier | None = None,
        fleet_size: Callable[[], int | None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._storage = storage
        self._rules = {rule.id: rule for rule in rules}
        self.policy = Policy(config, self._rules.values())
        self.config = config
        self._actuators: dict[str, list[Actuator]] = {}
        for actuator in actuators:
            for kind in actuator.kinds:
                self._actuators.setdefault(kind, []).append(actuator)
        for kind, several in self._actuators.items():
            if len(several) > 1 and not all(isinstance(a, Targeted) for a in several):
                raise ValueError(
                    f"{len(several)} actuators execute {kind!r}: each needs accepts(target) "
                    "(e.g. Slurm for slurm:... jobs, Kubernetes for k8s:... jobs)"
                )
        self._outbox = outbox
        self._escalation_routes = tuple(escalation_routes)
        self._approvals = approvals
        self._links = links or Links()
        self._verifier = verifier or IncidentVerifier()
        self._fleet_size = fleet_size
        self._clock = clock
        self._lock = threading.RLock()
        missing = sorted(
            {
                f"{spec.kind} (rule {rule.id})"
                for rule in self._rules.values()
                for spec in rule.actions
                if spec.mode is not ActionMode.NOTIFY
                and spec.kind not in NOTIFY_ONLY_KINDS
                and spec.kind not in self._actuators
            }
        )
        if missing:
            log.warning("no actuator configured for %s: only proposed", ", ".join(missing))

    # The pass -------------------------------------------------------------------------------

    def tick(self) -> TickResult:
        """One pass: reconcile crashed executions, decide new incidents, run due actions,
        verify settled ones. Each row's failure is logged and isolated."""
        with self._lock:
            reconciled = self._each(self._stale_executions(), self._reconcile)
            decided = self._each(self._storage.incidents(state=IncidentState.OPEN), self.handle)
            executed = self._each(self._due_actions(), self._advance)
            verified = self._each(self._settled_actions(), self._verify)
        return TickResult(decided, executed, verified, reconciled)

    def _each(self, items: Iterable[Any], step: Callable[[Any], object]) -> int:
        done = 0
        for item in items:
            try:
                if step(item):
                    done += 1
            except Exception:  # one broad except per row: the others still get their turn
                # Name the row by id only: its evidence and parameters stay out of the logs.
                which = getattr(item, "action_id", None) or getattr(item, "incident_id", "?")
                log.exception("remediation step %s failed for id %s", step.__name__, which)
        return done

    def handle(self, incident: Incident) -> bool:
        """Decide the rule's actions for an open incident it has none for yet."""
        rule = self._rules.get(incident.rule_id)
        if rule is None or incident.incident_id is None:
            return False
        decided = False
        for spec in rule.actions:
            target = target_for(spec.kind, incident)
            key = idempotency_key(incident.fingerprint, spec.kind, target or "")
            if self._storage.action_for(incident.incident_id, key) is not None:
                continue  # idempotency: this incident already has this action on this target
            now = self._clock()
            row = ActionRecord(
                incident_id=incident.incident_id,
                idempotency_key=key,
                action=spec.kind,
                target=target or "",
                mode=spec.mode,
                dry_run=self.config.dry_run,
                state="new",
                created_at=now,
                updated_at=now,
                params={
                    "rule_id": rule.id,
                    "fingerprint": incident.fingerprint,
                    "parameters": dict(spec.parameters),
                },
            )
            self._decide(row, spec, incident, approved=False, target=target)
            decided = True
        return decided

    # Selection ------------------------------------------------------------------------------

    def _stale_executions(self) -> list[ActionRecord]:
        limit = self._clock() - self.config.stale_execution_seconds
        rows = self._storage.actions(states=[ActionState.EXECUTING])
        return [row for row in rows if row.updated_at <= limit]

    def _due_actions(self) -> list[ActionRecord]:
        now = self._clock()
        states = [ActionState.APPROVED, ActionState.DEFERRED]
        if not self.config.dry_run:
            states.append(ActionState.DRY_RUN)
        rows = self._storage.actions(states=states)
        due = [
            r
            for r in rows
            if (r.next_attempt_at is None or r.next_attempt_at <= now)
            # a real attempt the actuator could only simulate stays a dry run
            and not (r.state == ActionState.DRY_RUN and r.params.get("outcome") == "dry_run")
        ]
        return sorted(due, key=lambda r: r.action_id or 0)

    def _settled_actions(self) -> list[ActionRecord]:
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

    # Decisions ------------------------------------------------------------------------------

    def _advance(self, row: ActionRecord) -> bool:
        """Re-decide an approved, deferred or (now real) dry-run action."""
        incident = self._storage.incident(row.incident_id)
        rule = self._rules.get(str(row.params.get("rule_id")))
        spec = self._spec(rule, row.action)
        now = self._clock()
        if incident is None or spec is None or incident.state is not IncidentState.OPEN:
            entry = audit_entry(
                now, row, verdict="skip", result=ActionState.OBSOLETE, reason="incident resolved"
            )
            new = replace(row, state=ActionState.OBSOLETE, updated_at=now)
            return self._storage.update_action(new, expect_state=row.state, audit=entry)
        if row.state == ActionState.APPROVED:
            approved = True
        elif row.state == ActionState.DRY_RUN:  # approving a dry run approves no real action
            approved = row.mode == ActionMode.AUTO
        else:  # deferred: by cooldown or a failed attempt, possibly after an approval
            approved = row.mode == ActionMode.AUTO or "approved_by" in row.params
        return self._decide(row, spec, incident, approved=approved, target=row.target)

    def _spec(self, rule: Rule | None, kind: str) -> ActionSpec | None:
        if rule is None:
            return None
        return next((spec for spec in rule.actions if spec.kind == kind), None)

    def _policy_state(self, row: ActionRecord, target: str | None) -> PolicyState:
        now = self._clock()
        breaker = self._storage.breaker(BREAKER_SCOPE)
        since = now - self.config.breaker_window_seconds
        if breaker is not None and breaker.state == "closed":
            since = max(since, breaker.updated_at)  # a reset starts a fresh window
        count, targets = self._storage.count_logged(since=since, result=INTENT, dry_run=False)
        cooldown = None
        if target:
            cooldown = self._storage.cooldown_until(row.action, target, dry_run=self.config.dry_run)
        return PolicyState(
            now=now,
            breaker_open=breaker is not None and breaker.state == "open",
            actions_in_window=count,
            targets_in_window=targets,
            cooldown_until=cooldown,
            attempts=row.attempts,
            fleet_size=self._fleet_size(),
        )

    def _decide(
        self,
        row: ActionRecord,
        spec: ActionSpec,
        incident: Incident,
        *,
        approved: bool,
        target: str | None,
    ) -> bool:
        state = self._policy_state(row, target)
        acts = spec.kind not in NOTIFY_ONLY_KINDS and spec.mode is not ActionMode.NOTIFY
        if acts and target and self._actuator_or_none(row) is None:
            decision = Decision(Verdict.PROPOSE, f"no actuator for {spec.kind} on {target}")
        else:
            decision = self.policy.decide(
                kind=spec.kind,
                mode=spec.mode,
                target=target,
                approved=approved,
                parameters=spec.parameters,
                state=state,
            )
        inputs = {
            "rule_id": incident.rule_id,
            "incident_id": incident.incident_id,
            "mode": str(spec.mode),
            "parameters": dict(spec.parameters),
            "evidence": dict(incident.evidence),
            "attempt": row.attempts + 1,
            "breaker_window_actions": state.actions_in_window,
        }
        handler = {
            Verdict.PROPOSE: self._to_proposed,
            Verdict.REFUSE_TARGET: self._to_refused,
            Verdict.AWAIT_APPROVAL: self._to_awaiting,
            Verdict.BREAKER_OPEN: self._to_halted,
            Verdict.TRIP_BREAKER: self._trip,
            Verdict.COOLDOWN: self._to_deferred,
            Verdict.MAX_ATTEMPTS: self._to_escalated,
            Verdict.DRY_RUN: self._dry_run,
            Verdict.EXECUTE: self._execute,
        }[decision.verdict]
        return handler(_Step(row, decision, incident, inputs, state))

    def _save(
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

    def _moved(self, row: ActionRecord, state: ActionState, **changes: Any) -> ActionRecord:
        return replace(row, state=state, updated_at=self._clock(), **changes)

    def _to_proposed(self, step: _Step) -> bool:
        row, decision, _incident, inputs, _state = step
        new = self._moved(row, ActionState.PROPOSED)
        return self._save(row, new, decision, ActionState.PROPOSED, inputs)

    def _to_refused(self, step: _Step) -> bool:
        row, decision, incident, inputs, _state = step
        log.warning("refused %s for incident %s: %s", row.action, incident.incident_id, decision)
        new = self._moved(row, ActionState.REFUSED, last_error=decision.reason)
        return self._save(row, new, decision, ActionState.REFUSED, inputs)

    def _to_awaiting(self, step: _Step) -> bool:
        row, decision, incident, inputs, _state = step
        new = self._moved(row, ActionState.AWAITING_APPROVAL)
        if not self._save(row, new, decision, ActionState.AWAITING_APPROVAL, inputs):
            return False
        stored = self._storage.action_for(row.incident_id, row.idempotency_key)
        if stored is not None and stored.action_id is not None:
            self._request_approval(stored, incident)
        return True

    def _to_halted(self, step: _Step) -> bool:
        row, decision, _incident, inputs, _state = step
        new = self._moved(row, ActionState.HALTED, last_error=decision.reason)
        return self._save(row, new, decision, ActionState.HALTED, inputs)

    def _to_deferred(self, step: _Step) -> bool:
        row, decision, _incident, inputs, state = step
        if row.state == ActionState.DEFERRED and row.next_attempt_at == state.cooldown_until:
            return False  # nothing new to say
        new = self._moved(row, ActionState.DEFERRED, next_attempt_at=state.cooldown_until)
        return self._save(row, new, decision, ActionState.DEFERRED, inputs)

    def _to_escalated(self, step: _Step) -> bool:
        row, decision, incident, inputs, _state = step
        new = self._moved(row, ActionState.ESCALATED, last_error=decision.reason)
        if not self._save(row, new, decision, ActionState.ESCALATED, inputs):
            return False
        self._escalate(new, incident, decision.reason)
        return True

    def _trip(self, step: _Step) -> bool:
        row, decision, incident, inputs, state = step
        now = self._clock()
        record = BreakerRecord(
            BREAKER_SCOPE, "open", updated_at=now, reason=decision.reason, tripped_at=now
        )
        entry = AuditEntry(
            time=now,
            actor=ACTOR,
            action="trip_breaker",
            target=BREAKER_SCOPE,
            reason=decision.reason,
            verdict=Verdict.TRIP_BREAKER,
            dry_run=False,
            result="open",
            inputs=redact(inputs),
            incident_fingerprint=incident.fingerprint,
        )
        if self._storage.set_breaker(record, expect_state="closed", audit=entry):
            # Only the writer whose compare-and-set opened the breaker pages: one page per trip.
            log.error("remediation breaker tripped: %s; automation halted", decision.reason)
            self._page_breaker(decision.reason, incident)
        halted = Decision(Verdict.BREAKER_OPEN, decision.reason)
        return self._to_halted(_Step(row, halted, incident, inputs, state))

    def _dry_run(self, step: _Step) -> bool:
        row, decision, _incident, inputs, _state = step
        request = self._request(row, dry_run=True)
        result = self._call(lambda: self._actuator(row).execute(request))
        reason = f"would {row.action} {row.target}: {result.outcome}: {result.detail}"
        now = self._clock()
        new = self._moved(
            row,
            ActionState.DRY_RUN,
            dry_run=True,
            cooldown_until=now + self.config.cooldown(row.action) if result.ok else None,
            last_error=None if result.ok else result.detail,
        )
        log.info("dry run: would %s %s (%s)", row.action, row.target, result.outcome)
        return self._save(row, new, decision, ActionState.DRY_RUN, inputs, reason)

    def _execute(self, step: _Step) -> bool:
        row, decision, incident, inputs, _state = step
        # 1. The intent, committed before anything happens (see the module docstring).
        intent = self._moved(row, ActionState.EXECUTING, dry_run=False, attempts=row.attempts + 1)
        if not self._save(row, intent, decision, INTENT, inputs):
            return False  # another writer took it
        stored = self._storage.action_for(row.incident_id, row.idempotency_key)
        if stored is None:  # pragma: no cover - just written
            return False
        # 2. The call.
        request = self._request(stored, dry_run=False)
        log.info("executing %s on %s (action %s)", row.action, row.target, stored.action_id)
        result = self._call(lambda: self._actuator(row).execute(request))
        # 3. The result.
        return self._record_result(stored, result, incident, inputs)

    def _actuator_or_none(self, row: ActionRecord) -> Actuator | None:
        several = self._actuators.get(row.action, [])
        if len(several) == 1:
            return several[0]
        return next((a for a in several if isinstance(a, Targeted) and a.accepts(row.target)), None)

    def _actuator(self, row: ActionRecord) -> Actuator:
        found = self._actuator_or_none(row)
        if found is None:
            raise LookupError(f"no actuator for {row.action} on {row.target}")
        return found

    def _call(self, call: Callable[[], ActionResult]) -> ActionResult:
        try:
            return call()
        except Exception as exc:  # an actuator bug must not stop the remediator
            log.exception("actuator raised")
            return ActionResult(Outcome.FAILED, f"actuator raised {type(exc).__name__}")

    def _parameters(self, row: ActionRecord) -> dict[str, Any]:
        raw = row.params.get("parameters", {})
        return dict(raw) if isinstance(raw, Mapping) else {}

    def _max_attempts(self, row: ActionRecord) -> int:
        return self.policy.max_attempts(self._parameters(row))

    def _request(self, row: ActionRecord, *, dry_run: bool) -> ActionRequest:
        parameters = self._parameters(row)
        return ActionRequest(row.action, row.target, row.idempotency_key, dry_run, parameters)

    def _record_result(
        self,
        row: ActionRecord,
        result: ActionResult,
        incident: Incident,
        inputs: Mapping[str, Any] | None,
    ) -> bool:
        now = self._clock()
        params = {
            **row.params,
            "outcome": str(result.outcome),
            "detail": result.detail,
            "undo": dict(result.undo),
        }
        decision = Decision(Verdict.EXECUTE, f"{row.action} {row.target}: {result.detail}")
        escalate = None
        if result.outcome is Outcome.DRY_RUN:
            # The actuator can only simulate this target: nothing changed, nothing to verify.
            new = self._moved(row, ActionState.DRY_RUN, params=params, dry_run=True)
        elif result.ok:
            new = self._moved(
                row,
                ActionState.VERIFYING,
                params=params,
                verify_at=now + self.config.settle(row.action),
                cooldown_until=now + self.config.cooldown(row.action),
                last_error=None,
            )
        elif result.outcome is Outcome.NOT_FOUND:
            new = self._moved(row, ActionState.NOT_FOUND, params=params, last_error=result.detail)
        elif result.outcome is Outcome.REFUSED or row.attempts >= self._max_attempts(row):
            new = self._moved(row, ActionState.ESCALATED, params=params, last_error=result.detail)
            escalate = f"{row.action} {row.target} {result.outcome}: {result.detail}"
        else:  # FAILED with attempts left: retry after the settle time (backoff)
            new = self._moved(
                row,
                ActionState.DEFERRED,
                params=params,
                next_attempt_at=now + self.config.settle(row.action),
                last_error=result.detail,
            )
        saved = self._save(row, new, decision, str(result.outcome), inputs)
        if saved and escalate is not None:
            self._escalate(new, incident, escalate)
        return saved

    # After the call ---------------------------------------------------------------------------

    def _reconcile(self, row: ActionRecord) -> bool:
        """An ``executing`` row nobody finished: confirm through a probe, else ``unknown``."""
        actuator: object = self._actuator_or_none(row)
        incident = self._storage.incident(row.incident_id)
        probed: ActionResult | None = None
        if isinstance(actuator, Probe):
            probe = actuator.probe
            probed = self._call(lambda: probe(self._request(row, dry_run=False)) or _NONE)
        if probed is not None and probed.ok and probed.outcome is not Outcome.DRY_RUN:
            log.warning("action %s: reconciled after restart: %s", row.action_id, probed.detail)
            if incident is None:  # pragma: no cover - foreign key
                return False
            return self._record_result(row, probed, incident, {"reconciled": True})
        now = self._clock()
        if probed is not None and probed is not _NONE and probed.outcome is Outcome.FAILED:
            # The target shows the action never happened (the collector died before the call
            # took effect): run it again, once more, through the normal path.
            reason = f"collector stopped before the call took effect: {probed.detail}"
            retry = self._moved(row, ActionState.DEFERRED, next_attempt_at=now, last_error=reason)
            entry = audit_entry(now, row, verdict="reconcile", result="retry", reason=reason)
            log.warning("action %s: %s; running it again", row.action_id, reason)
            return self._storage.update_action(retry, expect_state=row.state, audit=entry)
        reason = "collector stopped during the call; result unknown; not executed again"
        new = self._moved(row, ActionState.UNKNOWN, last_error=reason)
        entry = audit_entry(
            now, row, verdict="reconcile", result=ActionState.UNKNOWN, reason=reason
        )
        if not self._storage.update_action(new, expect_state=row.state, audit=entry):
            return False
        log.error("action %s (%s %s): %s", row.action_id, row.action, row.target, reason)
        if incident is not None:
            self._escalate(new, incident, reason)
        return True

    def _verify(self, row: ActionRecord) -> bool:
        incident = self._storage.incident(row.incident_id)
        now = self._clock()
        if row.state == ActionState.VERIFIED:  # a temporary action waiting for the resolve
            if incident is not None and incident.state is IncidentState.RESOLVED:
                return self._undo(row, incident, ActionState.RESTORED, "incident resolved")
            return False
        outcome = self._verifier.verify(row, incident)
        if outcome is Verification.RECOVERED:
            new = self._moved(row, ActionState.VERIFIED)
            entry = audit_entry(now, row, verdict="verify", result=outcome, reason="recovered")
            if not self._storage.update_action(new, expect_state=row.state, audit=entry):
                return False
            resolved = incident is not None and incident.state is IncidentState.RESOLVED
            if row.action in TEMPORARY_KINDS and incident is not None and resolved:
                self._undo(new, incident, ActionState.RESTORED, "incident resolved")
            return True
        why = f"{row.action} {row.target} did not help ({outcome}) after the settle time"
        if incident is None:
            new = self._moved(row, ActionState.ESCALATED, last_error=why)
            entry = audit_entry(now, row, verdict="verify", result=outcome, reason=why)
            return self._storage.update_action(new, expect_state=row.state, audit=entry)
        if row.params.get("undo"):
            done = self._undo(row, incident, ActionState.ROLLED_BACK, why)
        else:
            new = self._moved(row, ActionState.ESCALATED, last_error=why)
            entry = audit_entry(now, row, verdict="verify", result=outcome, reason=why)
            done = self._storage.update_action(new, expect_state=row.state, audit=entry)
        if done:
            self._escalate(row, incident, why)
        return done

    def _undo(self, row: ActionRecord, incident: Incident, to: ActionState, why: str) -> bool:
        actuator = self._actuator_or_none(row)
        undo = row.params.get("undo")
        original = ActionResult(
            Outcome(str(row.params.get("outcome", Outcome.DONE))),
            str(row.params.get("detail", "")),
            undo=dict(undo) if isinstance(undo, Mapping) else {},
        )
        request = self._request(row, dry_run=False)
        if actuator is None:
            result = ActionResult(Outcome.FAILED, f"no actuator for {row.action}")
        else:
            result = self._call(lambda: actuator.rollback(request, original))
        now = self._clock()
        state = to if result.ok else ActionState.ESCALATED
        reason = f"{why}; rollback: {result.outcome}: {result.detail}"
        new = self._moved(row, state, last_error=None if result.ok else reason)
        entry = audit_entry(
            now, row, verdict=f"rollback ({to})", result=result.outcome, reason=reason
        )
        if not self._storage.update_action(new, expect_state=row.state, audit=entry):
            return False
        log.warning("action %s: %s", row.action_id, reason)
        if not result.ok and to is ActionState.RESTORED:
            self._escalate(new, incident, reason)
        return True

    # Humans ---------------------------------------------------------------------------------

    def approve(self, action_id: int, *, actor: str) -> ActionRecord:
        """Approve and run now (through the policy: breaker, cooldown, dry-run still apply)."""
        with self._lock:
            row = approve_action(self._storage, action_id, actor=actor, now=self._clock())
            self._advance(row)
            return self._storage.action(action_id) or row

    def reject(self, action_id: int, *, actor: str) -> ActionRecord:
        """Reject an action that has not run."""
        with self._lock:
            return reject_action(self._storage, action_id, actor=actor, now=self._clock())

    def reset_breaker(self, *, actor: str) -> bool:
        """Close the breaker (see :func:`reset_breaker`)."""
        with self._lock:
            return reset_breaker(self._storage, actor=actor, now=self._clock())

    # Messages -------------------------------------------------------------------------------

    def _request_approval(self, row: ActionRecord, incident: Incident) -> None:
        if self._approvals is None or row.action_id is None:
            return
        waiting = self._storage.actions(states=[ActionState.AWAITING_APPROVAL])
        if any(
            r.action == row.action and r.target == row.target and r.action_id != row.action_id
            for r in waiting
        ):
            # Another incident already asks a human for this very action (e.g. each idle GPU of
            # one job): one request is enough; this one stays approvable from the CLI and API.
            log.info("approval for %s %s already requested", row.action, row.target)
            return
        token = self._approvals.issue(row.action_id)
        action = ProposedAction(
            kind=row.action,
            target=row.target,
            mode=row.mode,
            state=row.state,
            approval_url=self._links.approval_url(token),
        )
        rule = self._rules.get(incident.rule_id)
        summary = f"approval needed: {row.action} {row.target} ({incident.rule_id})"
        self._send(self._alert(incident, summary, None, (action,)), rule.routes if rule else ())

    def _escalate(self, row: ActionRecord, incident: Incident, why: str) -> None:
        rule = self._rules.get(incident.rule_id)
        routes = (*(rule.routes if rule else ()), *self._escalation_routes)
        action = ProposedAction(row.action, row.target, row.mode, str(row.state))
        summary = f"remediation needs a human: {why}"
        self._send(self._alert(incident, summary, "page", (action,)), routes)

    def _page_breaker(self, reason: str, incident: Incident) -> None:
        alert = Alert(
            fingerprint="gpuwarden-remediation-breaker",
            rule_id="remediation-breaker",
            status=AlertStatus.FIRING,
            severity="page",
            summary=f"gpuwarden stopped automating: {reason}. Reset with "
            "`gpuwarden actions reset-breaker` once the fleet is understood.",
            starts_at=self._clock(),
            runbook_url=self._links.runbook_url(incident.rule_id),
            facts={"last incident": str(incident.incident_id)},
        )
        self._send(alert, self._escalation_routes)

    def _alert(
        self,
        incident: Incident,
        summary: str,
        severity: str | None,
        actions: Sequence[ProposedAction],
    ) -> Alert:
        rule = self._rules.get(incident.rule_id)
        incident_id = incident.incident_id or 0
        return Alert(
            fingerprint=incident.fingerprint,
            rule_id=incident.rule_id,
            status=AlertStatus.FIRING,
            severity=severity or incident.severity,
            summary=summary,
            starts_at=incident.first_seen,
            runbook_url=self._links.incident_runbook_url(incident_id),
            team=rule.owner if rule else None,
            incident_url=self._links.incident_url(incident_id),
            facts={k: str(v) for k, v in redact(incident.evidence).items() if v is not None},
            actions=tuple(actions),
        )

    def _send(self, alert: Alert, routes: Iterable[str]) -> None:
        """Hand ``alert`` to the outbox for ``routes``: stored now, delivered and retried by the
        alert dispatcher (never sent from here, so a slow or failing service cannot hold up
        remediation, and a page is not lost when the service is down)."""
        routes = tuple(routes)
        if not routes:
            return
        if self._outbox is None:
            log.warning("no alert outbox: %s for %s not sent", alert.summary, alert.rule_id)
            return
        try:
            self._outbox.enqueue(alert, routes)
        except Exception:  # paging must not stop remediation; the state is in the store
            log.exception("could not store the alert for %s", alert.rule_id)


_NONE = ActionResult(Outcome.FAILED, "probe could not tell")
