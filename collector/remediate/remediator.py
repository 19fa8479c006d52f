"""The remediator: from open incidents to audited, verified, at-most-once actions.

Every step is a row in ``remediation_actions`` moved by compare-and-set (``update_action(...,
expect_state=...)``), with its audit entry written in the same transaction, so the state machine
survives a restart and two writers (two threads, two collector shards) never both move a row::

    new decision ─┬─ notify ───────────────► proposed
                  ├─ refused target ───────► refused
                  ├─ approve ──────────────► awaiting_approval ─┬─ reject ─► rejected
                  │                                             ├─ incident resolved, job ended
                  │                                             │   ─► expired (links revoked)
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

The parts, one job each: :mod:`.decide` (incident → actions → policy verdicts),
:mod:`.execute` (the actuator calls, at most once, and their outcomes), :mod:`.verify` (settle,
verify, roll back or restore), :mod:`.expire` (approval requests that outlived their incident or
job), :mod:`.paging` (approval requests and pages), :mod:`.ledger` (each row moved by
compare-and-set with its audit entry). :class:`Remediator` holds them together.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gpuwarden.collector.alerts.model import AlertOutbox
from gpuwarden.collector.alerts.runbooks import Links
from gpuwarden.collector.policy.guard import PolicyGuard
from gpuwarden.collector.remediate.actuators.base import Actuator
from gpuwarden.collector.remediate.approvals import Approvals
from gpuwarden.collector.remediate.decide import Decider, target_for
from gpuwarden.collector.remediate.execute import Actuators, Executor
from gpuwarden.collector.remediate.expire import Expiry
from gpuwarden.collector.remediate.ledger import Ledger
from gpuwarden.collector.remediate.paging import Pager
from gpuwarden.collector.remediate.policy import NOTIFY_ONLY_KINDS, Policy, PolicyConfig
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
    reject_action,
    reset_breaker,
)
from gpuwarden.collector.remediate.verify import Verifications
from gpuwarden.collector.rules.model import ActionMode, Rule
from gpuwarden.collector.storage.base import ActionRecord, Storage
from gpuwarden.collector.storage.records import Incident, IncidentState
from gpuwarden.collector.storage.sql_base import FencedError

__all__ = [  # the states, transitions and target_for moved out stay importable from here
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
        held: whether an operator's silence holds an incident's actions (``actions: true``):
            no action is decided for it while it does; it is decided once the silence ends.
        clock: wall clock.
        guard: the policies (``policies/``): asked before each action, and each pass for
            standing breaches (``None``: no policies).

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
        held: Callable[[Incident], bool] = lambda _incident: False,
        clock: Callable[[], float] = time.time,
        guard: PolicyGuard | None = None,
    ) -> None:
        self._storage = storage
        self._guard = guard
        self._held = held
        self._rules = {rule.id: rule for rule in rules}
        self.policy = Policy(config, self._rules.values())
        self.config = config
        table = Actuators(actuators)
        self._clock = clock
        self._lock = threading.RLock()
        ledger = Ledger(storage, clock)
        pager = Pager(
            storage,
            self._rules,
            outbox=outbox,
            escalation_routes=escalation_routes,
            approvals=approvals,
            links=links or Links(),
            clock=clock,
        )
        self._executor = Executor(
            storage,
            ledger,
            policy=self.policy,
            config=config,
            actuators=table,
            pager=pager,
            clock=clock,
        )
        self._decider = Decider(
            storage,
            ledger,
            self._rules,
            policy=self.policy,
            config=config,
            actuators=table,
            executor=self._executor,
            pager=pager,
            fleet_size=fleet_size,
            clock=clock,
            guard=guard,
        )
        self._verifications = Verifications(
            storage,
            ledger,
            verifier=verifier or IncidentVerifier(),
            actuators=table,
            pager=pager,
            clock=clock,
        )
        self._expiry = Expiry(storage, clock)
        missing = _unserved(self._rules.values(), table)
        if missing:
            log.warning("no actuator configured for %s: only proposed", ", ".join(missing))

    # The pass -------------------------------------------------------------------------------

    def tick(self) -> TickResult:
        """One pass: reconcile crashed executions, expire approval requests nobody needs any
        more, open and resolve standing policy breaches, decide new incidents, run due actions,
        verify settled ones. Each row's failure is logged and isolated."""
        with self._lock:
            reconciled = self._each(self._executor.stale(), self._reconcile)
            expired = self._each(self._expiry.awaiting(), self._expire)
            if self._guard is not None:  # standing breaches open incidents decided below
                self._each((self._guard,), self._sweep)
            decided = self._each(self._storage.incidents(state=IncidentState.OPEN), self.handle)
            executed = self._each(self._decider.due(), self._advance)
            verified = self._each(self._verifications.settled(), self._verify)
        return TickResult(decided, executed, verified, reconciled, expired)

    def _each(self, items: Iterable[Any], step: Callable[[Any], object]) -> int:
        done = 0
        for item in items:
            try:
                if step(item):
                    done += 1
            except FencedError:  # no longer the leader: the pass stops, the new leader goes on
                raise
            except Exception:  # one broad except per row: the others still get their turn
                # Name the row by id only: its evidence and parameters stay out of the logs.
                which = getattr(item, "action_id", None) or getattr(item, "incident_id", "?")
                log.exception("remediation step %s failed for id %s", step.__name__, which)
        return done

    def handle(self, incident: Incident) -> bool:
        """Decide the rule's actions for an open incident it has none for yet (not while an
        operator's silence holds its actions)."""
        if self._held(incident):
            return False
        return self._decider.handle(incident)

    def replace_rules(self, rules: Iterable[Rule]) -> None:
        """Act by ``rules`` from the next pass on (an admin reload).

        Raises:
            PolicyError: a rule names an unknown action kind or mode; nothing changed then.
        """
        rules = list(rules)
        Policy(self.config, rules)  # refuses a bad rule before anything changes
        with self._lock:
            # the decider and the pager hold this same mapping
            self._rules.clear()
            self._rules.update((rule.id, rule) for rule in rules)

    # The steps keep these names: ``_each`` logs a failed step by its name.

    def _reconcile(self, row: ActionRecord) -> bool:
        return self._executor.reconcile(row)

    def _expire(self, row: ActionRecord) -> bool:
        return self._expiry.expire(row)

    def _sweep(self, guard: PolicyGuard) -> bool:
        opened, resolved = guard.sweep()
        return bool(opened or resolved)

    def _advance(self, row: ActionRecord) -> bool:
        return self._decider.advance(row)

    def _verify(self, row: ActionRecord) -> bool:
        return self._verifications.verify(row)

    # Humans ---------------------------------------------------------------------------------

    def approve(self, action_id: int, *, actor: str) -> ActionRecord:
        """Approve and run now (through the policy: breaker, cooldown, dry-run still apply)."""
        with self._lock:
            row = approve_action(self._storage, action_id, actor=actor, now=self._clock())
            try:
                self._advance(row)
            except FencedError:  # approved on a standby: the leader runs it at its next pass
                log.info("action %s approved on a standby; the leader runs it", action_id)
            return self._storage.action(action_id) or row

    def act_only_while(self, leading: Callable[[], bool]) -> None:
        """Call no actuator unless ``leading()`` holds right before the call (active/standby)."""
        self._executor.leading = leading

    def adopt_orphans(self) -> int:
        """Called when this replica just became the leader: reconcile what the old one left
        executing (:meth:`Executor.adopt_orphans`) at the next pass."""
        with self._lock:
            return self._executor.adopt_orphans()

    def reject(self, action_id: int, *, actor: str) -> ActionRecord:
        """Reject an action that has not run."""
        with self._lock:
            return reject_action(self._storage, action_id, actor=actor, now=self._clock())

    def reset_breaker(self, *, actor: str) -> bool:
        """Close the breaker (see :func:`reset_breaker`)."""
        with self._lock:
            return reset_breaker(self._storage, actor=actor, now=self._clock())


def _unserved(rules: Iterable[Rule], actuators: Actuators) -> list[str]:
    """The rules' acting kinds no actuator executes, as ``kind (rule id)``."""
    return sorted(
        {
            f"{spec.kind} (rule {rule.id})"
            for rule in rules
            for spec in rule.actions
            if spec.mode is not ActionMode.NOTIFY
            and spec.kind not in NOTIFY_ONLY_KINDS
            and spec.kind not in actuators
        }
    )
