"""Approval tokens: signed, single-use, expiring, only their hash stored (on both backends)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.collector.remediate.approvals import (
    SECRET_ENV,
    ApprovalError,
    Approvals,
    TokenProblem,
    TokenSigner,
    load_secret,
    token_sha256,
)
from gpuwarden.collector.storage.base import ActionRecord
from gpuwarden.collector.storage.records import Incident
from tests.postgres_server import PostgresServer
from tests.storage_backends import Backend, SqlStorage

SECRET = b"s" * 40


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def storage(backend: Backend, clock: FakeClock) -> Iterator[SqlStorage]:
    """On SQLite and on PostgreSQL: single use is the database's (a conditional UPDATE)."""
    with backend.open(clock) as store:
        yield store


def make_action(storage: SqlStorage, now: float) -> int:
    incident_id = storage.open_incident(
        Incident(
            fingerprint="fp", rule_id="idle-gpu", severity="warning", first_seen=now, last_seen=now
        )
    )
    assert incident_id is not None
    action_id = storage.insert_action(
        ActionRecord(
            incident_id,
            "key",
            "requeue",
            "slurm:c:1",
            "approve",
            True,
            "awaiting_approval",
            now,
            now,
        )
    )
    assert action_id is not None
    return action_id


@pytest.fixture
def approvals(storage: SqlStorage, clock: FakeClock) -> Approvals:
    return Approvals(storage, TokenSigner(SECRET, clock=clock), ttl_seconds=600, clock=clock)


def test_a_token_approves_once(approvals: Approvals, storage: SqlStorage, clock: FakeClock) -> None:
    action_id = make_action(storage, clock.now)
    token = approvals.issue(action_id)
    claim = approvals.redeem(token, used_by="alice")
    assert claim.action_id == action_id
    with pytest.raises(ApprovalError) as again:
        approvals.redeem(token, used_by="mallory")
    assert again.value.reason is TokenProblem.USED
    record = storage.approval(token_sha256(token))
    assert record is not None
    assert (record.used_by, record.used_at) == ("alice", clock.now)


def test_peek_never_changes_state(
    approvals: Approvals, storage: SqlStorage, clock: FakeClock
) -> None:
    token = approvals.issue(make_action(storage, clock.now))
    for _ in range(3):
        approvals.peek(token)
    record = storage.approval(token_sha256(token))
    assert record is not None
    assert record.used_at is None
    approvals.redeem(token, used_by="alice")  # still usable after many looks


def test_tokens_expire(approvals: Approvals, storage: SqlStorage, clock: FakeClock) -> None:
    token = approvals.issue(make_action(storage, clock.now))
    clock.now += 601
    for call in (approvals.peek, lambda t: approvals.redeem(t, used_by="alice")):
        with pytest.raises(ApprovalError) as caught:
            call(token)
        assert caught.value.reason is TokenProblem.EXPIRED
    record = storage.approval(token_sha256(token))
    assert record is not None
    assert record.used_at is None


def test_storage_refuses_an_expired_approval_even_with_a_valid_token(
    storage: SqlStorage, clock: FakeClock
) -> None:
    signer_clock = FakeClock()  # a signer whose clock lags behind the store's
    approvals = Approvals(
        storage, TokenSigner(SECRET, clock=signer_clock), ttl_seconds=60, clock=clock
    )
    token = approvals.issue(make_action(storage, clock.now))
    clock.now += 120
    with pytest.raises(ApprovalError) as caught:
        approvals.redeem(token, used_by="alice")
    assert caught.value.reason is TokenProblem.USED  # "already used or expired"


def test_revoking_expires_the_unused_links_of_one_action(
    storage: SqlStorage, clock: FakeClock
) -> None:
    approvals = Approvals(storage, TokenSigner(SECRET, clock=clock), ttl_seconds=600, clock=clock)
    action = make_action(storage, clock.now)
    used, unused = approvals.issue(action), approvals.issue(action)
    approvals.redeem(used, used_by="alice")
    assert storage.revoke_approvals(action + 1, now=clock.now) == 0  # another action's: none
    assert storage.revoke_approvals(action, now=clock.now) == 1  # the used one stays as it was
    assert storage.revoke_approvals(action, now=clock.now) == 0
    with pytest.raises(ApprovalError, match="no longer awaits approval") as caught:
        approvals.peek(unused)
    assert caught.value.reason is TokenProblem.EXPIRED
    with pytest.raises(ApprovalError) as again:
        approvals.peek(used)
    assert again.value.reason is TokenProblem.USED


@pytest.mark.parametrize(
    ("mangle", "problem"),
    [
        (lambda t: t.replace("v1.", "v2.", 1), TokenProblem.MALFORMED),
        (lambda t: t + ".x", TokenProblem.MALFORMED),
        (lambda t: "x" * 300, TokenProblem.MALFORMED),
        (lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"), TokenProblem.BAD_SIGNATURE),
        (lambda t: t.replace(".1.", ".2.", 1), TokenProblem.BAD_SIGNATURE),  # another action
    ],
)
def test_tampered_tokens_are_refused(
    approvals: Approvals, storage: SqlStorage, clock: FakeClock, mangle, problem
) -> None:
    token = approvals.issue(make_action(storage, clock.now))
    with pytest.raises(ApprovalError) as caught:
        approvals.redeem(mangle(token), used_by="mallory")
    assert caught.value.reason is problem
    approvals.redeem(token, used_by="alice")  # the genuine one still works


def test_another_secret_cannot_sign(storage: SqlStorage, clock: FakeClock) -> None:
    action_id = make_action(storage, clock.now)
    forged = TokenSigner(b"f" * 40, clock=clock).mint(action_id, clock.now + 60)
    approvals = Approvals(storage, TokenSigner(SECRET, clock=clock), clock=clock)
    with pytest.raises(ApprovalError) as caught:
        approvals.redeem(forged, used_by="mallory")
    assert caught.value.reason is TokenProblem.BAD_SIGNATURE


def test_a_well_signed_token_that_was_never_issued_is_unknown(
    approvals: Approvals, storage: SqlStorage, clock: FakeClock
) -> None:
    action_id = make_action(storage, clock.now)
    stray = TokenSigner(SECRET, clock=clock).mint(action_id, clock.now + 60)
    with pytest.raises(ApprovalError) as caught:
        approvals.peek(stray)
    assert caught.value.reason is TokenProblem.UNKNOWN


def stored_bytes(backend: Backend, request: pytest.FixtureRequest) -> bytes:
    """Every byte the database wrote to disk: the SQLite file and its WAL, or the PostgreSQL
    database's files and the server's WAL (after a checkpoint)."""
    if backend.name == "sqlite":
        main = Path(backend.location)
        files = [p for p in main.parent.iterdir() if p.name.startswith(main.name)]
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        name = backend.location.rsplit("/", 1)[-1]
        with server.admin() as conn:
            conn.execute("CHECKPOINT")
            row = conn.execute("SELECT oid FROM pg_database WHERE datname = %s", (name,)).fetchone()
        assert row is not None
        folders = [server.data / "base" / str(row[0]), server.data / "pg_wal"]
        files = [p for folder in folders for p in folder.iterdir() if p.is_file()]
    return b"".join(p.read_bytes() for p in files)


def test_only_the_hash_of_a_token_is_stored(
    approvals: Approvals,
    storage: SqlStorage,
    clock: FakeClock,
    backend: Backend,
    request: pytest.FixtureRequest,
) -> None:
    token = approvals.issue(make_action(storage, clock.now))
    storage.close()
    data = stored_bytes(backend, request)
    assert token.encode() not in data
    assert token.rsplit(".", 1)[1].encode() not in data  # not even the MAC
    assert token_sha256(token).encode() in data


def test_the_secret_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"f" * 48 + b"\n")
    assert load_secret(path, {}) == b"f" * 48
    assert load_secret(None, {SECRET_ENV: "e" * 40}) == b"e" * 40
    with pytest.raises(ValueError, match="no approval secret"):
        load_secret(None, {})
    short = "tooshort-secret"
    with pytest.raises(ValueError, match=rf"\${SECRET_ENV}: the approval secret needs") as caught:
        load_secret(None, {SECRET_ENV: short})
    assert short not in str(caught.value)
    with pytest.raises(ValueError, match="cannot read"):
        load_secret(tmp_path / "missing", {})


def test_the_signer_does_not_show_its_secret() -> None:
    assert SECRET.decode() not in repr(TokenSigner(SECRET))
    with pytest.raises(ValueError, match="32"):
        TokenSigner(b"short")


def test_tokens_are_unique_and_bounded() -> None:
    signer = TokenSigner(SECRET, clock=time.time)
    tokens = {signer.mint(7, time.time() + 60) for _ in range(50)}
    assert len(tokens) == 50
    assert all(len(t) < 256 for t in tokens)
