"""``gpuwarden demo``: a simulated two-node fleet through the real agent and real OTLP.

Everything runs in one process on embedded defaults: a collector on a free loopback port with a
fresh token, and two agents (simulated GPUs, time compressed by ``speed``) whose spools live in a
temporary directory. It prints what the collector receives while it runs, then a summary.
"""

from __future__ import annotations

import asyncio
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from aiohttp import web

from gpuwarden.agent.build import AgentRuntime, build_agent
from gpuwarden.agent.config import (
    AgentConfig,
    CollectorConfig,
    HttpConfig,
    ResourceConfig,
    SpoolConfig,
)
from gpuwarden.collector.app import STATS, create_app
from gpuwarden.collector.config import CollectorConfig as ServerConfig
from gpuwarden.collector.sink import SeriesLog

#: The demo fleet: node name → (scenario preset, price tier).
FLEET = {"gpu-node-a": ("mixed", "on-demand"), "gpu-node-b": ("training", "spot")}


@dataclass(frozen=True)
class NodeView:
    """What the collector knows about one node, for printing."""

    host: str
    gpus: int
    failed: int
    degraded: int
    mean_utilization: float
    power_watts: float
    energy_joules: float
    xids: int
    jobs: tuple[str, ...]
    rounds: int


def node_views(log: SeriesLog) -> list[NodeView]:
    """Summarise the latest values per node from what the collector received."""
    views = []
    for host in sorted(log.hosts()):
        util = log.latest("hw.gpu.utilization", host)
        status = log.latest("hw.status", host)
        state_of = {
            dict(k[2]).get("hw.id"): dict(k[2]).get("hw.state") for k, v in status.items() if v == 1
        }
        power = log.latest("hw.power", host)
        energy = {
            k: v for k, v in log.latest("hw.energy", host).items() if ("hw.type", "gpu") in k[2]
        }
        xids = log.latest("gpuwarden.gpu.xid.errors", host)
        procs = log.latest("gpuwarden.gpu.process.memory.usage", host)
        rounds = log.latest("gpuwarden.agent.samples", host)
        jobs = {dict(k[2]).get("gpuwarden.job.id") or dict(k[2]).get("k8s.pod.uid") for k in procs}
        views.append(
            NodeView(
                host=host,
                gpus=len(state_of),
                failed=sum(1 for s in state_of.values() if s == "failed"),
                degraded=sum(1 for s in state_of.values() if s == "degraded"),
                mean_utilization=sum(util.values()) / len(util) if util else 0.0,
                power_watts=sum(power.values()),
                energy_joules=sum(energy.values()),
                xids=int(sum(xids.values())),
                jobs=tuple(sorted(str(j) for j in jobs if j)),
                rounds=int(max(rounds.values(), default=0)),
            )
        )
    return views


def _print_views(views: list[NodeView], elapsed: float, speed: float) -> None:
    print(f"\n[{elapsed:5.1f} s wall, {elapsed * speed / 60:5.1f} min simulated]")
    print(
        f"{'node':<12} {'GPUs':>4} {'failed':>6} {'degr.':>5} {'util':>6} {'power W':>8} "
        f"{'energy kJ':>9} {'XIDs':>4} {'rounds':>6}  jobs"
    )
    for v in views:
        print(
            f"{v.host:<12} {v.gpus:>4} {v.failed:>6} {v.degraded:>5} "
            f"{v.mean_utilization:>6.1%} {v.power_watts:>8.0f} {v.energy_joules / 1e3:>9.1f} "
            f"{v.xids:>4} {v.rounds:>6}  {', '.join(v.jobs)}"
        )


def _agent_config(
    node: str, preset: str, tier: str, port: int, token: str, spool: Path, interval: float
) -> AgentConfig:
    return AgentConfig(
        node_name=node,
        interval_seconds=interval,
        source="simulated",
        scenario=preset,
        collector=CollectorConfig(
            endpoint=f"http://127.0.0.1:{port}/v1/metrics", token=token, timeout_seconds=5
        ),
        spool=SpoolConfig(directory=spool / node, max_bytes=64 * 1024 * 1024, fsync=False),
        http=HttpConfig(enabled=False),
        resource=ResourceConfig(
            cluster="demo", instance_type="p5.48xlarge", price_tier=tier, region="local"
        ),
    )


def _compressed_clock(speed: float) -> Callable[[], float]:
    start = time.time()
    return lambda: start + (time.time() - start) * speed


async def _serve(
    config: ServerConfig, log: SeriesLog
) -> tuple[web.AppRunner, int, web.Application]:
    app = create_app(config, log)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    return runner, port, app


async def _demo(duration_seconds: float, interval_seconds: float, speed: float) -> int:
    token = secrets.token_urlsafe(24)
    log = SeriesLog()
    runner, port, app = await _serve(
        ServerConfig(port=0, tokens=MappingProxyType({token: "demo-agents"})), log
    )
    print(f"collector listening on http://127.0.0.1:{port}/v1/metrics")
    stop = threading.Event()
    runtimes: list[AgentRuntime] = []
    threads = []
    with tempfile.TemporaryDirectory(prefix="gpuwarden-demo-") as tmp:
        clock = _compressed_clock(speed)
        for node, (preset, tier) in FLEET.items():
            config = _agent_config(node, preset, tier, port, token, Path(tmp), interval_seconds)
            runtime = build_agent(config, clock=clock)
            runtimes.append(runtime)
            thread = threading.Thread(
                target=runtime.agent.run, args=(stop,), name=node, daemon=True
            )
            threads.append(thread)
            thread.start()
            print(f"agent {node}: scenario {preset!r}, {tier}, every {interval_seconds} s")
        started = time.monotonic()
        try:
            while (elapsed := time.monotonic() - started) < duration_seconds:
                await asyncio.sleep(min(5.0, duration_seconds - elapsed))
                _print_views(node_views(log), time.monotonic() - started, speed)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=10)
            for runtime in runtimes:
                runtime.agent.shutdown(flush_timeout_seconds=5)
            stats = app[STATS]
            await runner.cleanup()
        _print_views(node_views(log), time.monotonic() - started, speed)
        print(
            f"\ncollector: {sum(stats.responses.values())} requests "
            f"({dict(stats.responses)}), {stats.points_accepted} points accepted, "
            f"{stats.points_rejected} rejected, {len(log.metric_names())} metric names"
        )
    return 0


def run_demo(*, duration_seconds: float, interval_seconds: float, speed: float = 30.0) -> int:
    """Run the demo; Ctrl-C ends it early with the summary."""
    try:
        return asyncio.run(_demo(duration_seconds, interval_seconds, speed))
    except KeyboardInterrupt:
        return 130
