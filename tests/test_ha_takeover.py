"""What a new leader does with what the old one left, and what a leader past its lease may no
longer do, on SQLite and on a real PostgreSQL (the remediator's own world, ``test_remediator``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpuwarden.collector.alerts.model import Alert, AlertStatus
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.notify.senders import Senders
from gpuwarden.collector.remediate.actuators.base import ActionRequest, ActionResult, Outcome
from gpuwarden.collector.remediate.remediator import ActionState
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import ActionMode
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.sql_base import Fence, FencedError
from tests.test_accounting_scenario import T0, service  # noqa: F401 - the fixture
from tests.test_remediator import (
    Crash,
    FakeActuator,
    RecordingNotifier,
    World,
    make_rule,
    open_incident,
    world,  # noqa: F401 - the fixture
)


@dataclass
class DedupingTarget(FakeActuator):
    """A webhook-like target: acts once per idempotency key, answers a repeat ALREADY_DONE,
    and says the request may be sent again (``Redeliverable``)."""

    keys: list[str] = field(default_factory=list)

    def redeliverable(self, request: ActionRequest) -> bool:
        return True

    def execute(self, request: ActionRequest) -> ActionResult:
        if not request.dry_run and request.idempotency_key in self.keys:
            self.calls.append(request)
            return ActionResult(Outcome.ALREADY_DONE, "seen this key")
        if not request.dry_run:
            self.keys.append(request.idempotency_key)
        return super().execute(request)


def test_a_new_leader_redelivers_an_orphaned_call_once_without_waiting(world: World) -> None:  # noqa: F811
    old_leader = DedupingTarget(crash="after")  # the call took effect, the leader died
    open_incident(world.storage, world.clock)
    with pytest.raises(Crash):
        world.remediator(actuator=old_leader, dry_run=False).tick()
    world.storage.close()
    with world.backend.open(world.clock) as shared:
        target = DedupingTarget(world=old_leader.world, keys=old_leader.keys)  # the same target
        new_leader = world.remediator(storage=shared, actuator=target, dry_run=False)
        new_leader.tick()  # not adopted: far younger than stale_execution_seconds
        assert shared.actions()[0].state == ActionState.EXECUTING
        assert new_leader.adopt_orphans() == 1  # what the lease takeover calls
        new_leader.tick()  # reconciled: sent again now
        new_leader.tick()  # the redelivery
        (row,) = shared.actions()
        results = [e.result for e in shared.audit()]
    assert target.world == {"slurm:test:101": 1}  # acted on exactly once
    assert [c.idempotency_key for c in target.real_calls] == [row.idempotency_key]
    assert row.state == ActionState.VERIFYING
    assert row.params["outcome"] == Outcome.ALREADY_DONE
    assert results == ["intent", "redeliver", "intent", "already_done"]


def test_a_leader_past_its_lease_calls_no_actuator(world: World) -> None:  # noqa: F811
    open_incident(world.storage, world.clock)
    remediator = world.remediator(dry_run=False)
    remediator.act_only_while(lambda: False)
    with pytest.raises(FencedError):  # the pass stops: the new leader goes on
        remediator.tick()
    assert world.storage.actions() == []  # not even an intent
    answers = iter([True, False])  # the lease runs out between the intent and the call
    remediator.act_only_while(lambda: next(answers))
    with pytest.raises(FencedError):
        remediator.tick()
    assert world.actuator.real_calls == []
    (row,) = world.storage.actions()
    assert row.state == ActionState.EXECUTING  # left for the new leader to adopt


def test_a_leader_past_its_lease_sends_nothing() -> None:
    pager = RecordingNotifier("pagerduty")
    senders = Senders({"pagerduty": pager})
    alert = Alert("fp", "rule", AlertStatus.FIRING, "page", "down", 1.0, "http://127.0.0.1/rb")
    assert senders.send(alert, "pagerduty:gpu").delivered
    senders.leading = lambda: False
    with pytest.raises(FencedError):
        senders.send(alert, "pagerduty:gpu")
    assert len(pager.sent) == 1


def test_a_detection_cycle_stops_once_the_lease_is_lost(service: CollectorService) -> None:  # noqa: F811
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    engine = DetectionEngine(
        service.detection_view, rules, storage=service.storage, clock=lambda: T0 + 4200
    )
    checks: list[int] = []

    def leading() -> bool:  # the lease is lost while the third rule is about to run
        checks.append(1)
        return len(checks) < 3

    engine.proceed = leading
    with pytest.raises(FencedError):
        engine.run_cycle(now=T0 + 4200)
    assert len(checks) == 3
    assert service.storage.incidents() == []  # nothing written by a deposed leader
    engine.proceed = lambda: True  # the same cycle on the leader opens the two incidents
    assert engine.run_cycle(now=T0 + 4200).opened == 2


def test_an_approval_on_a_standby_is_run_once_by_the_leader(world: World) -> None:  # noqa: F811
    rule = make_rule(mode=ActionMode.APPROVE)
    open_incident(world.storage, world.clock)
    leader = world.remediator([rule], dry_run=False)
    leader.tick()
    (row,) = world.storage.actions()
    assert row.action_id is not None
    with world.backend.open(world.clock) as standby_storage:
        standby = world.remediator([rule], storage=standby_storage, dry_run=False)
        standby_storage.fence = Fence("collector", "standby", -1)  # as LeaseElection sets it
        standby.act_only_while(lambda: False)  # the standby's web takes the approval
        approved = standby.approve(row.action_id, actor="alice")
        assert approved.state == ActionState.APPROVED  # not run here
        assert world.actuator.real_calls == []
    leader.tick()
    leader.tick()
    assert len(world.actuator.real_calls) == 1
    assert world.storage.actions()[0].state == ActionState.VERIFYING
