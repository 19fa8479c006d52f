"""From an open incident to recorded decisions: the rule's proposed actions, one per target
(idempotency key), each put to the policy and moved to the state its verdict names; a verdict
to act hands the row to the :class:`~.execute.Executor`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from gpuwarden.collector.alerts.redact import redact
from gpuwarden.collector.policy.evaluate import Outcome
from gpuwarden.collector.policy.guard import PolicyGuard
from gpuwarden.collector.remediate.execute import Actuators, Executor
from gpuwarden.collector.remediate.ledger import Ledger, Step
from gpuwarden.collector.remediate.paging import Pager
from gpuwarden.collector.remediate.policy import (
    NOTIFY_ONLY_KINDS,
    Decision,
    Policy,
    PolicyConfig,
    PolicyState,
    Verdict,
    idempotency_key,
)
from gpuwarden.collector.remediate.states import ACTOR, BREAKER_SCOPE, INTENT, ActionState
from gpuwarden.collector.remediate.transitions import audit_entry
from gpuwarden.collector.rules.model import ActionMode, ActionSpec, Rule, Subject
from gpuwarden.collector.rules.vocabulary import ACTIONS
from gpuwarden.collector.storage.base import ActionRecord, BreakerRecord, Storage
from gpuwarden.collector.storage.records import AuditEntry, Incident, IncidentState

log = logging.getLogger(__name__)

_GUARDED = frozenset(
    {Verdict.EXECUTE, Verdict.DRY_RUN, Verdict.TRIP_BREAKER, Verdict.AWAIT_APPROVAL}
)
"""Verdicts the policies are asked about: the action would run, be dry-run, or ask a human."""


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


class Decider:
    """Decides the rules' actions and records each verdict.

    Args:
        storage: where the rows, incidents and breaker live.
        ledger: writes the rows with their audit entries.
        rules: the loaded rules by id.
        policy: the decisions.
        config: the policy settings.
        actuators: the actuators by kind (an action nobody executes is only proposed).
        executor: runs the actions the policy lets run (or dry-run).
        pager: approval requests, escalations and breaker pages.
        fleet_size: number of targets in the fleet for the blast-radius ratio.
        clock: wall clock.
        guard: the policies (``policies/``) asked before an action runs, is dry-run or waits
            for approval (``None``: no policies).
    """

    def __init__(
        self,
        storage: Storage,
        ledger: Ledger,
        rules: Mapping[str, Rule],
        *,
        policy: Policy,
        config: PolicyConfig,
        actuators: Actuators,
        executor: Executor,
        pager: Pager,
        fleet_size: Callable[[], int | None],
        clock: Callable[[], float],
        guard: PolicyGuard | None = None,
    ) -> None:
        self._guard = guard
        self._storage = storage
        self._ledger = ledger
        self._rules = rules
        self._policy = policy
        self._config = config
        self._actuators = actuators
        self._executor = executor
        self._pager = pager
        self._fleet_size = fleet_size
        self._clock = clock

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
                dry_run=self._config.dry_run,
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

    def due(self) -> list[ActionRecord]:
        """Approved and deferred rows whose time has come (and dry runs, once real)."""
        now = self._clock()
        states = [ActionState.APPROVED, ActionState.DEFERRED]
        if not self._config.dry_run:
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

    def advance(self, row: ActionRecord) -> bool:
        """Re-decide an approved, deferred or (now real) dry-run action."""
        incident = self._storage.incident(row.incident_id)
        rule = self._rules.get(str(row.params.get("rule_id")))
        spec = _spec(rule, row.action)
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

    def _policy_state(self, row: ActionRecord, target: str | None) -> PolicyState:
        now = self._clock()
        breaker = self._storage.breaker(BREAKER_SCOPE)
        since = now - self._config.breaker_window_seconds
        if breaker is not None and breaker.state == "closed":
            since = max(since, breaker.updated_at)  # a reset starts a fresh window
        count, targets = self._storage.count_logged(since=since, result=INTENT, dry_run=False)
        cooldown = None
        if target:
            cooldown = self._storage.cooldown_until(
                row.action, target, dry_run=self._config.dry_run
            )
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
        if acts and target and self._actuators.for_row(row) is None:
            decision = Decision(Verdict.PROPOSE, f"no actuator for {spec.kind} on {target}")
        else:
            decision = self._policy.decide(
                kind=spec.kind,
                mode=spec.mode,
                target=target,
                approved=approved,
                parameters=spec.parameters,
                state=state,
            )
        if self._guard is not None and decision.verdict in _GUARDED:
            decision, state = _ask_policies(self._guard, decision, row, spec, incident, state)
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
            Verdict.POLICY_REFUSED: self._to_refused,
            Verdict.POLICY_DEFERRED: self._to_deferred,
            Verdict.DRY_RUN: self._executor.dry_run,
            Verdict.EXECUTE: self._executor.execute,
        }[decision.verdict]
        return handler(Step(row, decision, incident, inputs, state))

    # One handler per verdict ------------------------------------------------------------------

    def _to_proposed(self, step: Step) -> bool:
        row, decision, _incident, inputs, _state = step
        new = self._ledger.moved(row, ActionState.PROPOSED)
        return self._ledger.save(row, new, decision, ActionState.PROPOSED, inputs)

    def _to_refused(self, step: Step) -> bool:
        row, decision, incident, inputs, _state = step
        log.warning(
            "refused %s for incident %s (%s): %s",
            row.action,
            incident.incident_id,
            decision.verdict.value,
            decision.reason,
        )
        new = self._ledger.moved(row, ActionState.REFUSED, last_error=decision.reason)
        return self._ledger.save(row, new, decision, ActionState.REFUSED, inputs)

    def _to_awaiting(self, step: Step) -> bool:
        row, decision, incident, inputs, _state = step
        new = self._ledger.moved(row, ActionState.AWAITING_APPROVAL)
        if not self._ledger.save(row, new, decision, ActionState.AWAITING_APPROVAL, inputs):
            return False
        stored = self._storage.action_for(row.incident_id, row.idempotency_key)
        if stored is not None and stored.action_id is not None:
            self._pager.request_approval(stored, incident)
        return True

    def _to_halted(self, step: Step) -> bool:
        row, decision, _incident, inputs, _state = step
        new = self._ledger.moved(row, ActionState.HALTED, last_error=decision.reason)
        return self._ledger.save(row, new, decision, ActionState.HALTED, inputs)

    def _to_deferred(self, step: Step) -> bool:
        row, decision, _incident, inputs, state = step
        if row.state == ActionState.DEFERRED and row.next_attempt_at == state.cooldown_until:
            return False  # nothing new to say
        new = self._ledger.moved(row, ActionState.DEFERRED, next_attempt_at=state.cooldown_until)
        return self._ledger.save(row, new, decision, ActionState.DEFERRED, inputs)

    def _to_escalated(self, step: Step) -> bool:
        row, decision, incident, inputs, _state = step
        new = self._ledger.moved(row, ActionState.ESCALATED, last_error=decision.reason)
        if not self._ledger.save(row, new, decision, ActionState.ESCALATED, inputs):
            return False
        self._pager.escalate(new, incident, decision.reason)
        return True

    def _trip(self, step: Step) -> bool:
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
            self._pager.page_breaker(decision.reason, incident)
        halted = Decision(Verdict.BREAKER_OPEN, decision.reason)
        return self._to_halted(Step(row, halted, incident, inputs, state))


def _spec(rule: Rule | None, kind: str) -> ActionSpec | None:
    if rule is None:
        return None
    return next((spec for spec in rule.actions if spec.kind == kind), None)


def _ask_policies(
    guard: PolicyGuard,
    decision: Decision,
    row: ActionRecord,
    spec: ActionSpec,
    incident: Incident,
    state: PolicyState,
) -> tuple[Decision, PolicyState]:
    """The decision once the policies had their say (a refusal, a deferral to the end of
    quiet hours, or an approval they require); the reason names the policy."""
    facts = guard.facts(
        kind=spec.kind,
        target=row.target or None,
        parameters=spec.parameters,
        evidence=incident.evidence,
        first_seen=incident.first_seen,
        human_approved="approved_by" in row.params,
    )
    ruling = guard.review(facts)
    said = f"policy {ruling.policy}: {ruling.reason}"
    if ruling.outcome is Outcome.REFUSE:
        return Decision(Verdict.POLICY_REFUSED, said), state
    if decision.verdict is Verdict.AWAIT_APPROVAL:
        return decision, state  # a human decides anyway; only a refusal comes first
    if ruling.outcome is Outcome.DEFER:
        return Decision(Verdict.POLICY_DEFERRED, said), replace(state, cooldown_until=ruling.until)
    if ruling.outcome is Outcome.REQUIRE_APPROVAL:
        return Decision(Verdict.AWAIT_APPROVAL, said), state
    return decision, state
