"""What a new leader does with what the old one left, and what a leader past its lease may no
longer do, on SQLite and on a real PostgreSQL (the remediator's own world, ``test_remediator``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpuwarden.collector.alerts.model import Alert, AlertStatus
from gpuwarden.collector.notify.senders import Senders
from gpuwarden.collector.remediate.actuators.base import ActionRequest, ActionResult, Outcome
from gpuwarden.collector.remediate.remediator import ActionState
from gpuwarden.collector.storage.sql_base import FencedError
from tests.test_remediator import (
    Crash,
    FakeActuator,
    RecordingNotifier,
    World,
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
    remediator.tick()  # the row's failure is isolated and logged
    assert world.actuator.real_calls == []
    (row,) = world.storage.actions()
    assert row.state == ActionState.EXECUTING  # left for the new leader to reconcile


def test_a_leader_past_its_lease_sends_nothing() -> None:
    pager = RecordingNotifier("pagerduty")
    senders = Senders({"pagerduty": pager})
    alert = Alert("fp", "rule", AlertStatus.FIRING, "page", "down", 1.0, "http://127.0.0.1/rb")
    assert senders.send(alert, "pagerduty:gpu").delivered
    senders.leading = lambda: False
    with pytest.raises(FencedError):
        senders.send(alert, "pagerduty:gpu")
    assert len(pager.sent) == 1
