"""The agent the crash tests push with: simulated GPUs (the training scenario), a durable spool
that fsyncs every round, no host metrics and no HTTP endpoint, sending OTLP to a collector on
loopback. A test kills the collector under it and checks that nothing the agent spooled is
lost or stored twice."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.agent.build import AgentRuntime, build_agent
from gpuwarden.agent.config import AgentConfig, CollectorConfig, HttpConfig, SpoolConfig


def make_agent(tmp: Path, port: int, *, node: str, token: str) -> AgentRuntime:
    """The agent of node ``node`` pushing to ``127.0.0.1:port`` with ``token``, its spool in
    ``tmp/spool``."""
    config = AgentConfig(
        node_name=node,
        source="simulated",
        scenario="training",
        collector=CollectorConfig(
            endpoint=f"http://127.0.0.1:{port}/v1/metrics", token=token, timeout_seconds=2
        ),
        spool=SpoolConfig(directory=tmp / "spool", fsync=True),
        http=HttpConfig(enabled=False),
    )
    return build_agent(config, with_host=False)
