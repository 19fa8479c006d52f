"""Two collectors on one real PostgreSQL, one agent failing over between them and back: every
round is stored once. The first collector cached the agent's window before the agent left; with
a database shared by several collectors the window is read through (``RoundsLedger``), so a
round the other collector stored is acknowledged, not stored again."""

from __future__ import annotations

from collections import Counter

import pytest

from gpuwarden.agent.rounds import Round, encode_rounds
from gpuwarden.collector.ingest.rounds_seen import RoundsLedger, agent_rounds
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.postgres import PostgresStorage
from tests.test_rounds_once import INSTANCE, CountingStore, _round


class Replica:
    """One collector's ingest over the shared database."""

    def __init__(self, database: str, handed: Counter[int], *, read_through: bool) -> None:
        self.storage = PostgresStorage(database)
        self.service = CollectorService(
            CountingStore(handed), self.storage, JobRegistry(self.storage, [])
        )
        self.service.intake.rounds_ledger = RoundsLedger(read_through=read_through)

    def send(self, seqs: list[int]) -> int:
        """The agent's request carrying rounds ``seqs``; the points stored."""
        payloads = {s: _round(s) for s in seqs}
        body = b"".join(payloads.values())
        header = encode_rounds([Round(s, len(payloads[s])) for s in seqs])
        rounds = agent_rounds(
            {"Gpuwarden-Agent-Instance": INSTANCE, "Gpuwarden-Agent-Rounds": header}
        )
        return self.service.accept_payload(body, "application/x-protobuf", "agents", rounds).points


@pytest.mark.parametrize("read_through", [True, False])
def test_rounds_stored_once_across_replicas(fresh_database: str, read_through: bool) -> None:
    handed: Counter[int] = Counter()
    alpha = Replica(fresh_database, handed, read_through=read_through)
    beta = Replica(fresh_database, handed, read_through=read_through)
    try:
        assert alpha.send([1, 2]) == 2  # alpha caches the window: high water 2
        assert beta.send([3, 4, 5]) == 3  # the agent failed over to beta
        # beta's answer to 3..5 was lost: the agent went back to alpha and resends them
        stored_again = alpha.send([3, 4, 5, 6])
    finally:
        alpha.storage.close()
        beta.storage.close()
    if read_through:  # the shared database's window: 3..5 acknowledged, 6 stored
        assert stored_again == 1
        assert handed == Counter(dict.fromkeys(range(1, 7), 1))
    else:  # what a per-process cache does: 3..5 stored twice (why read-through is needed)
        assert stored_again == 4
        assert handed[4] == 2
