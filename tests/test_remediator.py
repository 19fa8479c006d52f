"""The remediation policy and remediator, end to end over a real SQLite store, with in-process
fake actuators and notifiers (fakes that implement the protocols, not mocks)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import pytest

from gpuwarden.collector.alerts.model import Alert, DeliveryResult
from gpuwarden.collector.alerts.runbooks import Links
from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.notify.dispatcher import AlertDispatcher
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.remediate.actuators.base import (
    ActionRequest,
    ActionResult,
    Actuator,
    Outcome,
)
from gpuwarden.collector.remediate.approvals import (
    ApprovalError,
    Approvals,
    TokenProblem,
    TokenSigner,
)
from gpuwarden.collector.remediate.policy import (
    PolicyConfig,
    PolicyError,
    RemediationSettings,
    idempotency_key,
    target_problem,
)
from gpuwarden.collector.remediate.remediator import ActionState, Remediator
from gpuwarden.collector.remediate.states import ActionStateError
from gpuwarden.collector.remediate.transitions import approve_action
from gpuwarden.collector.rules.model import ActionMode, ActionSpec, Rule, Selector, Severity
from gpuwarden.collector.storage.records import Incident, IncidentState
from tests.storage_backends import Backend, SqlStorage

SECRET = b"k" * 40


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Crash(BaseException):
    """Stands for the process dying (kill -9): not an Exception, so nothing catches it."""


@dataclass
class FakeActuator:
    """Acts on an in-memory world; optionally crashes before or after acting."""

    outcome: Outcome = Outcome.DONE
    undo: Mapping[str, Any] = field(default_factory=dict)
    crash: str | None = None  # "before" or "after" the effect
    kinds: frozenset[str] = frozenset({"requeue", "scale_up", "degrade", "drain", "webhook"})
    calls: list[ActionRequest] = field(default_factory=list)
    rollbacks: list[ActionRequest] = field(default_factory=list)
    world: dict[str, int] = field(default_factory=dict)  # target -> times acted on

    @property
    def real_calls(self) -> list[ActionRequest]:
        return [c for c in self.calls if not c.dry_run]

    def execute(self, request: ActionRequest) -> ActionResult:
        self.calls.append(request)
        if request.dry_run:
            return ActionResult(Outcome.DRY_RUN, f"validated {request.kind} {request.target}")
        if self.crash == "before":
            raise Crash
        if self.outcome in (Outcome.DONE, Outcome.ALREADY_DONE):
            self.world[request.target] = self.world.get(request.target, 0) + 1
        if self.crash == "after":
            raise Crash
        return ActionResult(self.outcome, f"{request.kind} {self.outcome}", undo=self.undo)

    def rollback(self, request: ActionRequest, result: ActionResult) -> ActionResult:
        self.rollbacks.append(request)
        assert dict(result.undo) == dict(self.undo)
        return ActionResult(Outcome.DONE, "restored")


@dataclass
class ProbingActuator(FakeActuator):
    """Also answers the remediator's reconciliation probe from its world."""

    def probe(self, request: ActionRequest) -> ActionResult | None:
        if self.world.get(request.target):
            return ActionResult(Outcome.ALREADY_DONE, "target already in the wanted state")
        return None


@dataclass
class RecordingNotifier:
    name: str = "pagerduty"
    sent: list[tuple[Alert, str]] = field(default_factory=list)

    def send(self, alert: Alert, route: str) -> DeliveryResult:
        self.sent.append((alert, route))
        return DeliveryResult.ok()


def pages_dispatcher(storage: SqlStorage, clock: FakeClock, *notifiers: Any) -> AlertDispatcher:
    """The durable dispatcher as the remediator's outbox; without rules or routing it sends no
    incident alerts, only the pages handed to it."""
    return AlertDispatcher(
        storage,
        [],
        {n.name: n for n in notifiers},
        AlertingSettings(),
        Links(base_url="http://127.0.0.1:4318"),
        clock=clock,
    )


def make_rule(
    rule_id: str = "idle-gpu",
    kind: str = "requeue",
    mode: ActionMode = ActionMode.AUTO,
    parameters: Mapping[str, Any] | None = None,
    detector: str = "idle_gpu",
) -> Rule:
    return Rule(
        id=rule_id,
        detector=detector,
        selector=Selector(),
        parameters=MappingProxyType({}),
        severity=Severity.WARNING,
        owner="ml-platform",
        runbook=f"{rule_id}.md",
        actions=(ActionSpec(kind, mode, MappingProxyType(dict(parameters or {}))),),
        routes=("slack:#gpu-waste",),
    )


def open_incident(
    storage: SqlStorage,
    clock: FakeClock,
    *,
    rule_id: str = "idle-gpu",
    job: str = "slurm:test:101",
    extra: Mapping[str, Any] | None = None,
) -> Incident:
    evidence = {"job": job, "node": "gpu-01", "subject": job, "wasted_usd": 1.5}  # about the job
    incident = Incident(
        fingerprint=f"fp-{rule_id}-{job}",
        rule_id=rule_id,
        severity="warning",
        first_seen=clock.now,
        last_seen=clock.now,
        evidence={**evidence, **(extra or {})},
        consecutive_breaches=1,
    )
    incident_id = storage.open_incident(incident)
    assert incident_id is not None
    return replace(incident, incident_id=incident_id)


@dataclass
class World:
    storage: SqlStorage
    clock: FakeClock
    actuator: FakeActuator
    pager: RecordingNotifier
    slack: RecordingNotifier
    backend: Backend

    @property
    def outbox(self) -> AlertDispatcher:
        return pages_dispatcher(self.storage, self.clock, self.pager, self.slack)

    def sent(self, scheme: str) -> list[tuple[Alert, str]]:
        """What reached ``scheme`` once the dispatcher has run a pass."""
        self.outbox.tick()
        return (self.pager if scheme == "pagerduty" else self.slack).sent

    def remediator(
        self,
        rules: list[Rule] | None = None,
        actuator: Actuator | None = None,
        storage: SqlStorage | None = None,
        **config: Any,
    ) -> Remediator:
        store = storage or self.storage
        return Remediator(
            store,
            rules or [make_rule()],
            [actuator or self.actuator],
            config=PolicyConfig(**config),
            outbox=pages_dispatcher(store, self.clock, self.pager, self.slack),
            escalation_routes=("pagerduty:gpu-oncall",),
            approvals=Approvals(store, TokenSigner(SECRET, clock=self.clock), clock=self.clock),
            links=Links(base_url="http://127.0.0.1:4318"),
            clock=self.clock,
        )

    def audit_results(self) -> list[str]:
        return [e.result for e in self.storage.audit()]


@pytest.fixture
def world(backend: Backend) -> Iterator[World]:
    """On SQLite and on PostgreSQL: idempotency, compare-and-set and restarts are the
    database's."""
    clock = FakeClock()
    storage = backend.open(clock)
    yield World(
        storage,
        clock,
        FakeActuator(),
        RecordingNotifier("pagerduty"),
        RecordingNotifier("slack"),
        backend,
    )
    storage.close()


# Policy ------------------------------------------------------------------------------------------


def test_cooldown_is_never_shorter_than_the_settle_time() -> None:
    config = PolicyConfig(cooldown_seconds={"requeue": 10.0, "scale_up": 900.0})
    assert config.settle("requeue") >= 121  # Slurm keeps a requeued job pending ~121 s
    assert config.cooldown("requeue") == config.settle("requeue")
    assert config.cooldown("scale_up") == 900.0


@pytest.mark.parametrize(
    "target", [None, "", "  ", "all", "ALL", "*", "job-*", "a,b", " slurm:c:1", "node 1"]
)
def test_empty_or_all_targets_are_refused(target: str | None) -> None:
    assert target_problem(target) is not None


@pytest.mark.parametrize("target", ["slurm:c:101", "k8s:3f2a-11", "serving/llm-large", "gpu-01"])
def test_single_targets_are_accepted(target: str) -> None:
    assert target_problem(target) is None


def test_idempotency_key_is_sha256_of_fingerprint_action_and_target() -> None:
    key = idempotency_key("fp", "requeue", "slurm:c:1")
    assert len(key) == 64
    assert key == idempotency_key("fp", "requeue", "slurm:c:1")
    others = {
        idempotency_key("fp2", "requeue", "slurm:c:1"),
        idempotency_key("fp", "drain", "slurm:c:1"),
        idempotency_key("fp", "requeue", "slurm:c:2"),
    }
    assert key not in others
    assert len(others) == 3


def test_an_unknown_action_kind_in_a_rule_is_a_clear_error(world: World) -> None:
    with pytest.raises(PolicyError, match=r"rule idle-gpu: actions\[0\]\.kind: unknown .*'reboot'"):
        world.remediator([make_rule(kind="reboot")])


def test_bad_policy_settings_are_clear_errors() -> None:
    with pytest.raises(PolicyError, match=r"x\.breaker_max_fleet_ratio: expected a number <= 1"):
        RemediationSettings.from_mapping({"breaker_max_fleet_ratio": 1.5}, "x")
    with pytest.raises(PolicyError, match=r"cooldown_seconds\.reboot: unknown action kind"):
        PolicyConfig(cooldown_seconds={"reboot": 1.0})


# Dry run, auto, cooldown ---------------------------------------------------------------------


def test_dry_run_is_the_default_and_records_would_requeue(world: World) -> None:
    remediator = world.remediator()
    assert remediator.config.dry_run
    incident = open_incident(world.storage, world.clock)
    remediator.tick()
    remediator.tick()
    assert world.actuator.real_calls == []
    assert [c.dry_run for c in world.actuator.calls] == [True]  # validated once, not per tick
    entries = world.storage.audit()
    assert len(entries) == 1
    (entry,) = entries
    assert entry.dry_run
    assert entry.result == "dry_run"
    assert entry.reason.startswith("would requeue slurm:test:101")
    assert entry.incident_fingerprint == incident.fingerprint
    (row,) = world.storage.actions()
    assert row.state == ActionState.DRY_RUN


def test_auto_executes_exactly_once_and_a_second_trigger_in_the_cooldown_does_nothing(
    world: World,
) -> None:
    remediator = world.remediator(dry_run=False)
    first = open_incident(world.storage, world.clock)
    for _ in range(3):
        remediator.tick()
        world.clock.now += 10
    assert len(world.actuator.real_calls) == 1
    assert world.actuator.world == {"slurm:test:101": 1}
    assert world.audit_results() == ["intent", "done"]
    # The incident resolves and the same job is idle again, inside the cooldown.
    world.storage.update_incident(replace(first, state=IncidentState.RESOLVED))
    open_incident(world.storage, world.clock)
    remediator.tick()
    remediator.tick()
    assert len(world.actuator.real_calls) == 1
    second = world.storage.actions(states=[ActionState.DEFERRED])
    assert len(second) == 1
    assert world.storage.audit()[-1].verdict == "cooldown"
    # After the cooldown the same decision goes through: the cooldown was the only reason.
    world.clock.now = (second[0].next_attempt_at or 0) + 1
    remediator.tick()
    assert len(world.actuator.real_calls) == 2


def test_the_cooldown_survives_a_restart(world: World) -> None:
    first = open_incident(world.storage, world.clock)
    world.remediator(dry_run=False).tick()
    world.storage.update_incident(replace(first, state=IncidentState.RESOLVED))
    open_incident(world.storage, world.clock)
    world.storage.close()
    with world.backend.open(world.clock) as reopened:
        fresh = FakeActuator()
        world.remediator(storage=reopened, actuator=fresh, dry_run=False).tick()
        assert fresh.real_calls == []
        assert reopened.actions(states=[ActionState.DEFERRED])


def test_switching_dry_run_off_makes_dry_run_decisions_real(world: World) -> None:
    open_incident(world.storage, world.clock)
    world.remediator().tick()
    assert world.actuator.real_calls == []
    world.remediator(dry_run=False).tick()
    assert len(world.actuator.real_calls) == 1


def test_a_refused_target_is_recorded_and_never_executed(world: World) -> None:
    open_incident(world.storage, world.clock, job="all")
    world.remediator(dry_run=False).tick()
    assert world.actuator.calls == []
    (row,) = world.storage.actions()
    assert row.state == ActionState.REFUSED
    assert "all" in (row.last_error or "")


# Crash safety --------------------------------------------------------------------------------


def test_a_crash_between_intent_and_execution_never_executes_twice(world: World) -> None:
    crashing = FakeActuator(crash="before")
    open_incident(world.storage, world.clock)
    with pytest.raises(Crash):
        world.remediator(actuator=crashing, dry_run=False).tick()
    assert crashing.world == {}  # it died before acting
    (row,) = world.storage.actions()
    assert row.state == ActionState.EXECUTING
    assert world.audit_results() == ["intent"]  # the intent was durable before the call
    world.storage.close()

    with world.backend.open(world.clock) as reopened:
        healthy = ProbingActuator()
        restarted = world.remediator(storage=reopened, actuator=healthy, dry_run=False)
        restarted.tick()  # too recent to call stale: a live writer may still be executing it
        assert reopened.actions()[0].state == ActionState.EXECUTING
        world.clock.now += restarted.config.stale_execution_seconds + 1
        restarted.tick()
        restarted.tick()
        assert healthy.calls == []  # never executed again
        (row,) = reopened.actions()
        assert row.state == ActionState.UNKNOWN
        assert world.pager.sent == []  # stored, not sent from the remediator
        pages_dispatcher(reopened, world.clock, world.pager).tick()
        pages = [a for a, _ in world.pager.sent]
        assert len(pages) == 1
        assert "result unknown" in pages[0].summary


def test_a_crash_after_execution_is_reconciled_by_the_probe(world: World) -> None:
    crashing = ProbingActuator(crash="after")
    open_incident(world.storage, world.clock)
    with pytest.raises(Crash):
        world.remediator(actuator=crashing, dry_run=False).tick()
    world.storage.close()
    with world.backend.open(world.clock) as reopened:
        healthy = ProbingActuator(world=crashing.world)  # the same cluster
        restarted = world.remediator(storage=reopened, actuator=healthy, dry_run=False)
        world.clock.now += restarted.config.stale_execution_seconds + 1
        restarted.tick()
        assert healthy.calls == []
        assert healthy.world == {"slurm:test:101": 1}  # acted on exactly once
        assert reopened.actions()[0].state == ActionState.VERIFYING
        assert pages_dispatcher(reopened, world.clock, world.pager).tick().paged == 0
        assert world.pager.sent == []


# Blast radius --------------------------------------------------------------------------------


def test_200_simultaneous_findings_act_at_most_the_cap_and_page_once(world: World) -> None:
    remediator = world.remediator(dry_run=False, breaker_max_actions=5)
    for i in range(200):
        open_incident(world.storage, world.clock, job=f"slurm:test:{i}")
    remediator.tick()
    assert len(world.actuator.real_calls) == 5
    breaker = world.storage.breaker("global")
    assert breaker is not None
    assert breaker.state == "open"
    pages = [a for a, route in world.sent("pagerduty") if a.rule_id == "remediation-breaker"]
    assert len(pages) == 1
    assert len(world.storage.actions(states=[ActionState.HALTED])) == 195
    # Halted until a human resets it: more passes and new findings do nothing.
    world.clock.now += 60
    open_incident(world.storage, world.clock, job="slurm:test:late")
    remediator.tick()
    assert len(world.actuator.real_calls) == 5
    assert len(world.sent("pagerduty")) == 1
    # A reset resumes automation for new incidents; halted ones stay halted.
    assert remediator.reset_breaker(actor="alice")
    assert not remediator.reset_breaker(actor="alice")
    open_incident(world.storage, world.clock, job="slurm:test:after-reset")
    remediator.tick()
    assert len(world.actuator.real_calls) == 6
    assert world.actuator.real_calls[-1].target == "slurm:test:after-reset"
    assert world.storage.audit()[0].result == "intent"
    assert any(e.action == "reset_breaker" and e.actor == "alice" for e in world.storage.audit())


def test_the_breaker_caps_the_share_of_the_fleet(world: World) -> None:
    remediator = Remediator(
        world.storage,
        [make_rule()],
        [world.actuator],
        config=PolicyConfig(dry_run=False, breaker_max_actions=100, breaker_max_fleet_ratio=0.1),
        outbox=world.outbox,
        escalation_routes=("pagerduty:gpu-oncall",),
        fleet_size=lambda: 30,
        clock=world.clock,
    )
    for i in range(10):
        open_incident(world.storage, world.clock, job=f"slurm:test:{i}")
    remediator.tick()
    assert len(world.actuator.real_calls) == 3  # 10 % of 30 targets
    assert len(world.sent("pagerduty")) == 1


def test_dry_run_actions_do_not_trip_the_breaker(world: World) -> None:
    remediator = world.remediator(breaker_max_actions=2)
    for i in range(10):
        open_incident(world.storage, world.clock, job=f"slurm:test:{i}")
    remediator.tick()
    assert len(world.actuator.calls) == 10
    assert world.storage.breaker("global") is None


# Verification, rollback, attempts ------------------------------------------------------------


def degrade_world(world: World) -> tuple[Remediator, Incident]:
    world.actuator.undo = {"route": "serving/llm", "weights": [100, 0]}
    rule = make_rule("slo-burn-fast", "degrade", detector="slo_burn")
    remediator = world.remediator([rule], dry_run=False)
    incident = open_incident(
        world.storage, world.clock, rule_id="slo-burn-fast", extra={"deployment": "serving/llm"}
    )
    remediator.tick()
    assert [c.target for c in world.actuator.real_calls] == ["serving/llm"]
    return remediator, incident


def test_degrade_is_verified_after_the_settle_time_and_restored_once_resolved(
    world: World,
) -> None:
    remediator, incident = degrade_world(world)
    settle = remediator.config.settle("degrade")
    world.clock.now += settle - 1
    remediator.tick()
    assert world.storage.actions()[0].state == ActionState.VERIFYING  # not before the settle time
    recovering = replace(incident, consecutive_clears=1, consecutive_breaches=0)
    world.storage.update_incident(recovering)
    world.clock.now += 2
    remediator.tick()
    assert world.storage.actions()[0].state == ActionState.VERIFIED
    assert world.actuator.rollbacks == []
    world.storage.update_incident(replace(recovering, state=IncidentState.RESOLVED))
    remediator.tick()
    assert world.storage.actions()[0].state == ActionState.RESTORED
    assert len(world.actuator.rollbacks) == 1
    assert world.sent("pagerduty") == []


def test_degrade_that_did_not_help_is_rolled_back_and_escalated(world: World) -> None:
    remediator, _ = degrade_world(world)
    world.clock.now += remediator.config.settle("degrade") + 1
    remediator.tick()
    remediator.tick()
    assert world.storage.actions()[0].state == ActionState.ROLLED_BACK
    assert len(world.actuator.rollbacks) == 1
    pages = [(a, r) for a, r in world.sent("pagerduty")]
    assert len(pages) == 1
    assert pages[0][0].severity == "page"
    assert "did not help" in pages[0][0].summary
    assert pages[0][0].runbook_url.endswith("/runbook")


def test_a_requeue_that_did_not_help_escalates_without_rollback(world: World) -> None:
    remediator = world.remediator(dry_run=False)
    open_incident(world.storage, world.clock)
    remediator.tick()
    world.clock.now += remediator.config.settle("requeue") + 1
    remediator.tick()
    assert world.storage.actions()[0].state == ActionState.ESCALATED
    assert world.actuator.rollbacks == []
    assert len(world.sent("pagerduty")) == 1


def test_failures_are_retried_up_to_max_attempts_then_escalated(world: World) -> None:
    failing = FakeActuator(outcome=Outcome.FAILED)
    remediator = world.remediator(actuator=failing, dry_run=False, max_attempts=2)
    open_incident(world.storage, world.clock)
    remediator.tick()
    assert world.storage.actions()[0].state == ActionState.DEFERRED
    for _ in range(3):
        world.clock.now += remediator.config.settle("requeue") + 1
        remediator.tick()
    assert len(failing.real_calls) == 2
    (row,) = world.storage.actions()
    assert (row.state, row.attempts) == (ActionState.ESCALATED, 2)
    assert len(world.sent("pagerduty")) == 1


def test_a_rule_parameter_max_attempts_wins(world: World) -> None:
    failing = FakeActuator(outcome=Outcome.FAILED)
    rule = make_rule(parameters={"max_attempts": 1})
    remediator = world.remediator([rule], actuator=failing, dry_run=False, max_attempts=5)
    open_incident(world.storage, world.clock)
    remediator.tick()
    assert world.storage.actions()[0].state == ActionState.ESCALATED


def test_an_actuator_that_raises_does_not_stop_the_pass(world: World) -> None:
    class Broken(FakeActuator):
        def execute(self, request: ActionRequest) -> ActionResult:
            raise RuntimeError("bug")

    remediator = world.remediator(actuator=Broken(), dry_run=False)
    open_incident(world.storage, world.clock)
    remediator.tick()
    (row,) = world.storage.actions()
    assert row.state == ActionState.DEFERRED
    assert "RuntimeError" in (row.last_error or "")


# Approval ------------------------------------------------------------------------------------


def test_approve_mode_waits_for_a_human_and_survives_a_restart(world: World) -> None:
    rule = make_rule(mode=ActionMode.APPROVE)
    open_incident(world.storage, world.clock)
    world.remediator([rule], dry_run=False).tick()
    assert world.actuator.calls == []
    (row,) = world.storage.actions()
    assert row.state == ActionState.AWAITING_APPROVAL
    (request, route) = world.sent("slack")[0]
    assert route == "#gpu-waste"
    assert request.actions[0].approval_url is not None
    assert request.actions[0].approval_url.startswith("http://127.0.0.1:4318/approve/v1.")
    world.storage.close()
    with world.backend.open(world.clock) as reopened:
        restarted = world.remediator([rule], storage=reopened, dry_run=False)
        restarted.tick()
        assert world.actuator.calls == []
        assert row.action_id is not None
        done = restarted.approve(row.action_id, actor="alice")
        assert done.state == ActionState.VERIFYING
        assert len(world.actuator.real_calls) == 1
        entries = reopened.audit()
        assert [e.actor for e in entries if e.verdict == "human_approved"] == ["alice"]


def test_one_approval_request_per_action_and_target(world: World) -> None:
    # Four idle GPUs of one job: four incidents, one requeue to approve, one message.
    rule = make_rule(mode=ActionMode.APPROVE)
    first = open_incident(world.storage, world.clock)
    for gpu in range(1, 4):
        other = replace(first, fingerprint=f"fp-gpu-{gpu}", incident_id=None)
        assert world.storage.open_incident(other) is not None
    world.remediator([rule], dry_run=False).tick()
    rows = world.storage.actions()
    assert len(rows) == 4
    assert {r.state for r in rows} == {ActionState.AWAITING_APPROVAL}
    assert len(world.sent("slack")) == 1


def test_credentials_never_reach_logs_or_the_audit(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rule = make_rule(mode=ActionMode.APPROVE, parameters={})
    remediator = world.remediator([rule], dry_run=False)
    open_incident(world.storage, world.clock, extra={"api_token": "tok-SECRET-123"})
    remediator.tick()
    url = world.sent("slack")[0][0].actions[0].approval_url
    assert url is not None
    token = url.rsplit("/", 1)[1]
    approvals = Approvals(world.storage, TokenSigner(SECRET, clock=world.clock), clock=world.clock)
    claim = approvals.redeem(token, used_by="alice")
    remediator.approve(claim.action_id, actor="alice")
    world.clock.now += 1000
    remediator.tick()
    assert world.actuator.real_calls
    entries = world.storage.audit()
    assert any(e.inputs.get("evidence", {}).get("api_token") == "[redacted]" for e in entries)
    ours = ("audit_log", "remediation_actions", "approvals", "breaker_state")
    dump = "\n".join(
        f"{table}: {row!r}"
        for table in ours
        for row in world.backend.query(f"SELECT * FROM {table}")  # noqa: S608 - our table names
    )
    assert "audit_log: " in dump
    for secret in ("tok-SECRET-123", token, SECRET.decode()):
        assert secret not in caplog.text
        assert secret not in dump
    alerts = " ".join(str(a) for a, _ in world.sent("slack") + world.sent("pagerduty"))
    assert "tok-SECRET-123" not in alerts  # the approval link is meant for the alert; secrets not
    assert caplog.records  # the flow did log


def test_approving_a_dry_run_does_not_approve_the_real_action(world: World) -> None:
    rule = make_rule(mode=ActionMode.APPROVE)
    open_incident(world.storage, world.clock)
    world.remediator([rule]).tick()
    (row,) = world.storage.actions()
    assert row.action_id is not None
    assert world.remediator([rule]).approve(row.action_id, actor="alice").state == "dry_run"
    real = world.remediator([rule], dry_run=False)
    real.tick()
    assert world.actuator.real_calls == []
    assert world.storage.actions()[0].state == ActionState.AWAITING_APPROVAL
    real.approve(row.action_id, actor="alice")
    assert len(world.actuator.real_calls) == 1


def resolve(storage: SqlStorage, incident: Incident, when: float) -> None:
    resolved = replace(incident, state=IncidentState.RESOLVED, resolved_time=when)
    assert storage.update_incident(resolved)


def test_an_unapproved_action_expires_when_its_incident_resolves(world: World) -> None:
    rule = make_rule(mode=ActionMode.APPROVE)
    remediator = world.remediator([rule], dry_run=False)
    incident = open_incident(world.storage, world.clock)
    remediator.tick()
    (row,) = world.storage.actions()
    assert row.state == ActionState.AWAITING_APPROVAL
    action_id = row.action_id
    assert action_id is not None
    world.clock.now += 300
    assert remediator.tick().expired == 0  # still open: still waiting
    assert world.storage.actions()[0].state == ActionState.AWAITING_APPROVAL

    resolve(world.storage, incident, world.clock.now)
    world.clock.now += 60
    assert remediator.tick().expired == 1
    (row,) = world.storage.actions()
    assert row.state == ActionState.EXPIRED
    assert row.updated_at == world.clock.now
    (entry,) = [e for e in world.storage.audit() if e.result == ActionState.EXPIRED]
    assert entry.verdict == "expire"
    assert entry.reason == f"incident {incident.incident_id} resolved"
    assert entry.target == "slurm:test:101"
    assert remediator.tick().expired == 0  # once

    with pytest.raises(
        ActionStateError, match=r"expired \(incident \d+ resolved\); cannot be approved"
    ):
        remediator.approve(action_id, actor="alice")
    with pytest.raises(ActionStateError, match="expired"):
        approve_action(world.storage, action_id, actor="alice", now=world.clock.now)
    with pytest.raises(ActionStateError, match="cannot be rejected"):
        remediator.reject(action_id, actor="alice")
    assert world.actuator.calls == []
    assert world.storage.actions()[0].state == ActionState.EXPIRED


def test_expiry_revokes_the_approval_link(world: World) -> None:
    rule = make_rule(mode=ActionMode.APPROVE)
    remediator = world.remediator([rule], dry_run=False)
    incident = open_incident(world.storage, world.clock)
    remediator.tick()
    url = world.sent("slack")[0][0].actions[0].approval_url
    assert url is not None
    token = url.rsplit("/", 1)[1]
    approvals = Approvals(world.storage, TokenSigner(SECRET, clock=world.clock), clock=world.clock)
    assert approvals.peek(token).action_id == world.storage.actions()[0].action_id
    resolve(world.storage, incident, world.clock.now)
    world.clock.now += 1
    remediator.tick()
    for call in (approvals.peek, lambda t: approvals.redeem(t, used_by="bob")):
        with pytest.raises(ApprovalError, match="no longer awaits approval") as caught:
            call(token)
        assert caught.value.reason is TokenProblem.EXPIRED
    assert world.actuator.calls == []


def test_an_unapproved_action_expires_when_its_job_ended(world: World) -> None:
    rule = make_rule(mode=ActionMode.APPROVE)
    remediator = world.remediator([rule], dry_run=False)
    open_incident(world.storage, world.clock)
    job = Job("slurm:test:101", "slurm", "101", JobState.RUNNING)
    world.storage.upsert_jobs([job])
    remediator.tick()
    remediator.tick()
    assert world.storage.actions()[0].state == ActionState.AWAITING_APPROVAL
    world.storage.upsert_jobs([replace(job, state=JobState.COMPLETED, end_time=world.clock.now)])
    assert remediator.tick().expired == 1
    assert world.storage.actions()[0].state == ActionState.EXPIRED
    reasons = [e.reason for e in world.storage.audit() if e.result == ActionState.EXPIRED]
    assert reasons == ["job slurm:test:101 completed"]


def test_an_action_whose_job_is_unknown_waits_while_its_incident_is_open(world: World) -> None:
    # The incident's job never reached the registry: unknown is not taken as gone.
    rule = make_rule(mode=ActionMode.APPROVE)
    remediator = world.remediator([rule], dry_run=False)
    open_incident(world.storage, world.clock, job="slurm:test:999")
    for _ in range(3):
        world.clock.now += 3600
        assert remediator.tick().expired == 0
    assert world.storage.actions()[0].state == ActionState.AWAITING_APPROVAL


def test_remediation_settings_parse_with_clear_errors() -> None:
    settings = RemediationSettings.from_mapping(
        {
            "dry_run": False,
            "breaker_max_actions": 4,
            "cooldown_seconds": {"requeue": 600},
            "escalation_routes": ["pagerduty:gpu-oncall"],
            "external_url": "https://gpuwarden.example",
        },
        "collector.yaml: remediation",
    )
    assert settings.policy.dry_run is False
    assert settings.policy.breaker_max_actions == 4
    assert settings.policy.cooldown("requeue") == 600.0
    assert settings.escalation_routes == ("pagerduty:gpu-oncall",)
    assert RemediationSettings.from_mapping({}, "x").policy.dry_run  # dry-run by default
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"dry_runn": True},
            r"collector\.yaml: remediation: unknown key 'dry_runn'; did you mean 'dry_run'\?",
        ),
        ({"dry_run": "no"}, r"remediation\.dry_run: expected true or false, got 'no'"),
        ({"breaker_max_actions": 0}, r"remediation\.breaker_max_actions: expected an integer >= 1"),
        ({"max_attempts": "3"}, r"remediation\.max_attempts: expected an integer, got '3'"),
        (
            {"settle_seconds": {"drain": -1}},
            r"remediation\.settle_seconds\.drain: expected a number >= 0",
        ),
        ({"cooldown_seconds": {"reboot": 5}}, r"cooldown_seconds\.reboot: unknown action kind"),
        ({"escalation_routes": "pagerduty"}, r"escalation_routes: expected a list of routes"),
    ]
    for data, words in cases:
        with pytest.raises(PolicyError, match=words):
            RemediationSettings.from_mapping(data, "collector.yaml: remediation")


@dataclass
class PrefixActuator(FakeActuator):
    prefix: str = "slurm:"

    def accepts(self, target: str) -> bool:
        return target.startswith(self.prefix)


def test_several_actuators_of_one_kind_are_chosen_by_target(world: World) -> None:
    slurm, k8s = PrefixActuator(prefix="slurm:"), PrefixActuator(prefix="k8s:")
    remediator = Remediator(
        world.storage,
        [make_rule()],
        [slurm, k8s],
        config=PolicyConfig(dry_run=False),
        clock=world.clock,
    )
    open_incident(world.storage, world.clock, job="k8s:3f2a")
    open_incident(world.storage, world.clock, job="slurm:test:9")
    open_incident(world.storage, world.clock, job="api:77")  # nobody's: proposed, not executed
    remediator.tick()
    assert [c.target for c in k8s.real_calls] == ["k8s:3f2a"]
    assert [c.target for c in slurm.real_calls] == ["slurm:test:9"]
    states = {r.target: r.state for r in world.storage.actions()}
    assert states["api:77"] == ActionState.PROPOSED
    with pytest.raises(ValueError, match=r"2 actuators execute '[a-z_]+': each needs accepts"):
        Remediator(
            world.storage, [make_rule()], [FakeActuator(), FakeActuator()], config=PolicyConfig()
        )


def test_an_actuator_that_can_only_simulate_leaves_a_dry_run_not_a_verification(
    world: World,
) -> None:
    """A real decision whose actuator answers DRY_RUN (a target it does not manage for real)
    is recorded as a dry run: nothing changed, so nothing is verified or escalated."""
    world.actuator.outcome = Outcome.DRY_RUN
    remediator = world.remediator(dry_run=False)
    open_incident(world.storage, world.clock)
    for _ in range(3):
        remediator.tick()
        world.clock.now += 400  # past any settle time
    (row,) = world.storage.actions()
    assert row.state == ActionState.DRY_RUN
    assert world.audit_results() == ["intent", "dry_run"]


# Pages go through the durable dispatcher -------------------------------------------------------


@dataclass
class FlakyNotifier:
    """Answers retryable (the service is down) until ``up`` is set, then records."""

    name: str = "pagerduty"
    up: bool = False
    tries: int = 0
    sent: list[tuple[Alert, str]] = field(default_factory=list)

    def send(self, alert: Alert, route: str) -> DeliveryResult:
        self.tries += 1
        if not self.up:
            return DeliveryResult.retry("HTTP 503", retry_after_seconds=60.0)
        self.sent.append((alert, route))
        return DeliveryResult.ok()


def test_a_page_survives_a_failing_notifier_and_is_delivered_on_a_later_pass(world: World) -> None:
    pager = FlakyNotifier()
    outbox = pages_dispatcher(world.storage, world.clock, pager)
    remediator = Remediator(
        world.storage,
        [make_rule()],
        [world.actuator],
        config=PolicyConfig(dry_run=False, breaker_max_actions=2),
        outbox=outbox,
        escalation_routes=("pagerduty:gpu-oncall",),
        clock=world.clock,
    )
    for i in range(5):
        open_incident(world.storage, world.clock, job=f"slurm:test:{i}")
    remediator.tick()  # the breaker trips and pages
    assert pager.tries == 0  # handed to the outbox, not sent from the remediator
    first = outbox.tick()
    assert (first.paged, first.failed, pager.tries) == (0, 1, 1)
    (page,) = world.storage.pages()
    assert (page.status, page.attempts, page.last_error) == ("pending", 1, "HTTP 503")
    assert page.next_attempt_at == world.clock.now + 60.0  # its Retry-After, over the backoff
    world.clock.now += 30
    assert outbox.tick().paged == 0  # not due yet
    assert pager.tries == 1
    pager.up = True
    world.clock.now += 30
    assert outbox.tick().paged == 1
    ((alert, route),) = pager.sent
    assert (alert.rule_id, route) == ("remediation-breaker", "gpu-oncall")
    assert "stopped automating" in alert.summary
    assert world.storage.pages()[0].status == "delivered"
    assert outbox.tick().paged == 0  # delivered once
    assert len(pager.sent) == 1


def test_a_rejected_page_is_given_up_at_once_with_its_reason(world: World) -> None:
    @dataclass
    class Refusing:
        name: str = "slack"
        tries: int = 0

        def send(self, alert: Alert, route: str) -> DeliveryResult:
            self.tries += 1
            return DeliveryResult.reject("HTTP 400 invalid_blocks")

    slack = Refusing()
    outbox = pages_dispatcher(world.storage, world.clock, slack)
    remediator = Remediator(
        world.storage,
        [make_rule(mode=ActionMode.APPROVE)],
        [world.actuator],
        config=PolicyConfig(),
        outbox=outbox,
        approvals=Approvals(
            world.storage, TokenSigner(SECRET, clock=world.clock), clock=world.clock
        ),
        links=Links(base_url="http://127.0.0.1:4318"),
        clock=world.clock,
    )
    open_incident(world.storage, world.clock)
    remediator.tick()
    (pending,) = world.storage.pages()
    assert pending.alert["actions"][0]["approval_url"].startswith("http://127.0.0.1:4318/approve/")
    result = outbox.tick()
    assert (result.failed, result.lost, slack.tries) == (1, 1, 1)
    (page,) = world.storage.pages()
    assert (page.status, page.last_error) == ("lost", "HTTP 400 invalid_blocks")
    assert page.alert["actions"][0]["approval_url"] is None  # no live token kept once done
    world.clock.now += 3600
    outbox.tick()
    assert slack.tries == 1  # never tried again
