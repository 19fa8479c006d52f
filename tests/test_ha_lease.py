"""The leader lease and its fence, on SQLite and on a real PostgreSQL: one holder at a time,
the epoch rises at each takeover, a deposed holder's claims are refused by the database, and
the audit log says who led when."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuwarden.collector.config import ConfigError, load_collector_config
from gpuwarden.collector.ha.leadership import Change, LeaseElection
from gpuwarden.collector.storage.base import ActionRecord
from gpuwarden.collector.storage.postgres import PostgresStorage
from gpuwarden.collector.storage.records import Incident, IncidentState
from gpuwarden.collector.storage.sql_base import Fence, FencedError
from gpuwarden.collector.storage.sql_lease import LEADER_ACTION
from tests.storage_backends import Backend

# the holder stopped renewing 10 s ago (both columns move back; a SET reads the old values)
EXPIRE = "UPDATE leader_lease SET acquired_at = acquired_at - 10, expires_at = acquired_at - 9.999"


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _action(incident_id: int, state: str) -> ActionRecord:
    return ActionRecord(
        incident_id=incident_id,
        idempotency_key=f"fp:webhook:node-{incident_id}",
        action="webhook",
        target="node-1",
        mode="auto",
        dry_run=False,
        state=state,
        attempts=1,
        params={},
        created_at=1.0,
        updated_at=1.0,
    )


def _incident(store: object) -> int:
    incident = Incident(
        fingerprint="fp",
        rule_id="r",
        state=IncidentState.OPEN,
        severity="page",
        first_seen=1.0,
        last_seen=1.0,
        evidence={},
    )
    incident_id = store.open_incident(incident)  # type: ignore[attr-defined]
    assert incident_id is not None
    return int(incident_id)


def test_one_holder_epoch_rises_and_audit_names_both(backend: Backend) -> None:
    with backend.open() as a, backend.open() as b:
        first = a.claim_lease("collector", "a:1", 30.0, held_epoch=None)
        assert (first.holder, first.epoch) == ("a:1", 1)
        seen_by_b = b.claim_lease("collector", "b:2", 30.0, held_epoch=None)
        assert (seen_by_b.holder, seen_by_b.epoch) == ("a:1", 1)  # b stays a standby
        renewed = a.claim_lease("collector", "a:1", 30.0, held_epoch=1)
        assert (renewed.holder, renewed.epoch) == ("a:1", 1)
        assert renewed.expires_at >= first.expires_at
        backend.execute(EXPIRE)  # a stopped
        taken = b.claim_lease("collector", "b:2", 30.0, held_epoch=None)
        assert (taken.holder, taken.epoch) == ("b:2", 2)
        again = a.claim_lease("collector", "a:1", 30.0, held_epoch=1)  # a wakes up
        assert (again.holder, again.epoch) == ("b:2", 2)
        assert b.release_lease("collector", "b:2", 2)
        assert not b.release_lease("collector", "b:2", 2)
        entries = [e for e in a.audit() if e.action == LEADER_ACTION]
    assert [e.reason for e in entries] == [
        "leader acquired by a:1 epoch 1",
        "leader lost by a:1 epoch 1: lease not renewed in time",
        "leader acquired by b:2 epoch 2",
        "leader released by b:2 epoch 2",
    ]


def test_a_deposed_leader_cannot_claim(backend: Backend) -> None:
    with backend.open() as old, backend.open() as new:
        incident_id = _incident(old)
        old.claim_lease("collector", "old", 30.0, held_epoch=None)
        old.fence = Fence("collector", "old", 1)
        action_id = old.insert_action(_action(incident_id, "proposed"))
        assert action_id is not None
        backend.execute(EXPIRE)
        new.claim_lease("collector", "new", 30.0, held_epoch=None)
        stored = old.action(action_id)
        assert stored is not None
        claim = replace(stored, state="executing")
        with pytest.raises(FencedError):
            old.update_action(claim, expect_state="proposed")
        with pytest.raises(FencedError):
            old.set_cursor("audit-mirror", 3)
        assert old.action(action_id).state == "proposed"  # type: ignore[union-attr]
        # a person's move is no claim: the old leader's web still takes an approval's state
        approved = replace(stored, state="approved")
        assert old.update_action(approved, expect_state="proposed")
        new.fence = Fence("collector", "new", 2)
        executing = replace(stored, state="executing")
        assert new.update_action(executing, expect_state="approved")


def test_election_leads_renews_and_lets_go(backend: Backend) -> None:
    ticks = Ticks()
    adopted: list[str] = []
    with backend.open() as a, backend.open() as b:
        one = LeaseElection(
            a, "a", 10.0, monotonic=ticks, on_acquired=[lambda: adopted.append("a")]
        )
        two = LeaseElection(
            b, "b", 10.0, monotonic=ticks, on_acquired=[lambda: adopted.append("b")]
        )
        assert one.step() is Change.ACQUIRED
        assert two.step() is Change.NONE
        assert one.leading()
        assert one.confirmed()
        assert not two.leading()
        assert not two.confirmed()
        assert two.status().describe().startswith("standby; leader is a since ")
        ticks.now += 10.0  # no renewal for a whole lease: a stops leading by its own clock
        assert not one.leading()
        assert two.step() is Change.NONE  # the row has not expired (the database's clock)
        ticks.now += 1.0
        assert one.step() is Change.ACQUIRED  # its epoch lapsed locally: a new epoch
        assert one.status().epoch == 2
        backend.execute(EXPIRE)  # a paused
        assert two.step() is Change.ACQUIRED  # ... and taken over while one was paused
        assert one.leading()  # one's own clock has not noticed yet
        assert not one.confirmed()  # the database has: one calls and sends nothing
        assert one.step() is Change.LOST
        two.release()
        assert not two.leading()
        assert one.step() is Change.ACQUIRED  # released: no wait for an expiry
        assert one.status().epoch == 4
        assert adopted == ["a", "a", "b", "a"]


def test_ha_needs_postgresql_and_a_renewal_within_the_lease() -> None:
    with pytest.raises(ConfigError, match="postgresql"):
        load_collector_config(None, {"ha": {"enabled": True}})
    url = "postgresql://gpuwarden@db.example:5432/gpuwarden"
    config = load_collector_config(None, {"database": url, "ha": {"enabled": True}})
    assert config.ha.lease_seconds == 10.0
    assert config.ha.renew_interval_seconds == pytest.approx(10.0 / 3)
    assert config.ha.replica(hostname="c7", pid=42) == "c7:42"
    named = {"enabled": True, "replica_id": "collector-a", "renew_seconds": 2}
    assert load_collector_config(None, {"database": url, "ha": named}).ha.replica() == "collector-a"
    with pytest.raises(ConfigError, match="renew_seconds"):
        load_collector_config(None, {"database": url, "ha": {"renew_seconds": 10}})
    with pytest.raises(ConfigError, match="did you mean 'lease_seconds'"):
        load_collector_config(None, {"database": url, "ha": {"lease_secs": 5}})


def test_the_lease_renews_on_its_own_connection_while_the_main_one_is_busy(
    fresh_database: str,
) -> None:
    """PostgreSQL (``ha`` needs it): SQLite has one writer at a time anyway."""
    with PostgresStorage(fresh_database) as main, PostgresStorage(fresh_database) as lease:
        election = LeaseElection(main, "a", 10.0, lease_store=lease)
        with main._write():  # a long transaction of the service holds the main connection
            assert election.step() is Change.ACQUIRED  # would wait for it on one connection
            assert election.confirmed()
        assert main.fence == Fence("collector", "a", 1)  # the claims' connection is fenced
        assert lease.fence is None
