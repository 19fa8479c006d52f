"""What storing each agent round once costs the collector per request.

Not a test: it prints figures. Run from the repository root:

    .venv/bin/python bench/dedupe_cost.py

A real agent (simulated 8-GPU node, the ``mixed`` scenario) takes ``--rounds`` rounds; each is
stored through ``CollectorService.accept_payload`` (the receiver's path) into a fresh collector
on a SQLite file, once without the rounds headers and once with them (one round per request, as
a steady agent sends: one storage write per request remembers the round). Then every round is
sent again with the headers, as an agent that lost its answers would: acknowledged, not stored.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path

from gpuwarden.agent.build import build_agent
from gpuwarden.agent.config import AgentConfig, HttpConfig
from gpuwarden.agent.rounds import INSTANCE_HEADER, ROUNDS_HEADER, Round, encode_rounds
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF
from gpuwarden.collector.ingest.rounds_seen import AgentRounds, agent_rounds
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.store.window import WindowStore

INSTANCE = "0123456789abcdef0123456789abcdef"


def agent_rounds_of(count: int) -> list[bytes]:
    """``count`` OTLP requests of a real agent, one per round, 10 s apart."""
    ticks = itertools.count()
    config = AgentConfig(
        node_name="bench-node",
        interval_seconds=10,
        source="simulated",
        scenario="mixed",
        http=HttpConfig(enabled=False),
    )
    agent = build_agent(config, clock=lambda: 1.7e9 + 10 * next(ticks), with_host=False).agent
    payloads = []
    for _ in range(count):
        agent.sample_once()
        payload = agent.telemetry.collect_otlp()
        if payload is not None:
            payloads.append(payload)
    return payloads


def rounds_of(seq: int, payload: bytes) -> AgentRounds | None:
    header = {INSTANCE_HEADER: INSTANCE, ROUNDS_HEADER: encode_rounds([Round(seq, len(payload))])}
    return agent_rounds(header)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=600)
    args = parser.parse_args()
    payloads = agent_rounds_of(args.rounds)
    print(f"{len(payloads)} requests of about {len(payloads[0])} bytes (one round each)")
    with tempfile.TemporaryDirectory() as folder:
        for case in ("without headers", "with headers", "resent"):
            name = "resent" if case == "resent" else case.replace(" ", "-")
            storage = SqliteStorage(Path(folder) / f"{name}.db")
            store = WindowStore(max_future_seconds=1e6, staleness_seconds=1e9)
            service = CollectorService(store, storage, JobRegistry(storage, []))
            if case == "resent":  # the rounds are stored once first
                for seq, payload in enumerate(payloads, 1):
                    service.accept_payload(payload, PROTOBUF, "bench", rounds_of(seq, payload))
            started = time.perf_counter()
            for seq, payload in enumerate(payloads, 1):
                rounds = None if case == "without headers" else rounds_of(seq, payload)
                service.accept_payload(payload, PROTOBUF, "bench", rounds)
            seconds = time.perf_counter() - started
            print(
                f"{case:>16}: {1e3 * seconds / len(payloads):.3f} ms per request, "
                f"duplicate rounds {service.totals.duplicate_rounds}"
            )
            storage.close()


if __name__ == "__main__":
    main()
