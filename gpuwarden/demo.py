"""``gpuwarden demo``: a simulated two-node fleet through the real agent, OTLP and collector.

Everything runs in one process on embedded defaults: a collector (WindowStore, SQLite, job
registry, accounting) on a free loopback port with a fresh token, and two agents with simulated
GPUs (workload time compressed by ``speed``) whose spools live in a temporary directory. It prints
what the collector holds while it runs, then the per-job accounting, and leaves the database for
``gpuwarden report costs``.
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

import numpy as np
from aiohttp import web

from gpuwarden.agent.build import AgentRuntime, build_agent
from gpuwarden.agent.config import (
    AgentConfig,
    CollectorConfig,
    HttpConfig,
    ResourceConfig,
    SpoolConfig,
)
from gpuwarden.agent.sources.simulated import load_scenario
from gpuwarden.collector.accounting import UNALLOCATED, totals
from gpuwarden.collector.app import STATS, create_app
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig as ServerConfig
from gpuwarden.collector.model import GpuAllocation, Job, JobState
from gpuwarden.collector.service import CollectorService

#: The demo fleet: node name → (scenario preset, price tier, team).
FLEET = {
    "gpu-node-a": ("mixed", "on-demand", "ml-research"),
    "gpu-node-b": ("training", "spot", "llm"),
}
STEP_SECONDS = 1


@dataclass(frozen=True)
class NodeView:
    """What the collector holds about one node, for printing."""

    host: str
    gpus: int
    failed: int
    degraded: int
    mean_utilization: float
    power_watts: float
    xids: int


def _latest(
    service: CollectorService, metric: str, host: str
) -> list[tuple[dict[str, object], float]]:
    latest = service.store.latest(metric, {"host.name": host})
    return [
        (dict(info.attributes), float(value))
        for info, value in zip(latest.series, latest.values, strict=True)
        if not np.isnan(value)
    ]


def node_views(service: CollectorService) -> list[NodeView]:
    """Summarise the latest values per node from the collector's store."""
    views = []
    for host in sorted(service.nodes):
        status = _latest(service, "hw.status", host)
        states = [str(a["hw.state"]) for a, v in status if v == 1]
        util = [v for _, v in _latest(service, "hw.gpu.utilization", host)]
        xids = service.store.matrix(
            "gpuwarden.gpu.xid.errors",
            selector={"host.name": host},
            start=time.time() - 3600,
            end=time.time() + 60,
        )
        views.append(
            NodeView(
                host=host,
                gpus=len(states),
                failed=states.count("failed"),
                degraded=states.count("degraded"),
                mean_utilization=sum(util) / len(util) if util else 0.0,
                power_watts=sum(v for _, v in _latest(service, "hw.power", host)),
                xids=len(xids.series),
            )
        )
    return views


def _print_views(views: list[NodeView], elapsed: float, speed: float) -> None:
    print(f"\n[{elapsed:5.1f} s wall, {elapsed * speed / 60:5.1f} min of simulated workload]")
    header = f"{'node':<12} {'GPUs':>4} {'failed':>6} {'degr.':>5} {'util':>6} {'power W':>8}"
    print(f"{header} {'XID GPUs':>8}")
    for v in views:
        print(
            f"{v.host:<12} {v.gpus:>4} {v.failed:>6} {v.degraded:>5} "
            f"{v.mean_utilization:>6.1%} {v.power_watts:>8.0f} {v.xids:>8}"
        )


def _print_accounting(service: CollectorService, start: float, end: float, speed: float) -> None:
    usage = service.usage(start, end)
    teams = {job.key: job.team or "" for job in service.registry.known()}
    print(f"\naccounting over the last {end - start:.0f} s of wall time, {len(usage)} GPU×job rows")
    print(f"(the simulated energy counters run {speed:g}× faster, like the workloads)")
    print(f"{'job':<22} {'team':<12} {'GPU-min':>8} {'idle GPU-min':>12} {'Wh':>8} {'$':>9}")
    for row in totals(usage):
        name = row.group or "(unallocated)"
        team = teams.get(row.group, "") if row.group != UNALLOCATED else ""
        print(
            f"{name:<22} {team:<12} {row.gpu_hours_allocated * 60:>8.2f} "
            f"{row.gpu_hours_idle * 60:>12.2f} {row.energy_kwh * 1000:>8.1f} "
            f"{row.cost_usd:>9.4f}"
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


def demo_jobs(now: float) -> list[Job]:
    """The scheduler's view of the simulated workloads: the jobs and the GPUs they hold."""
    jobs: dict[str, Job] = {}
    for node, (preset, tier, team) in FLEET.items():
        scenario = load_scenario(preset, node_name=node)
        for assignment in scenario.assignments:
            ref = assignment.workload.job
            if ref is None or ref.job_id is None:
                continue
            key = f"slurm:demo:{ref.job_id}"
            alloc = GpuAllocation(node, tuple(assignment.gpus))
            previous = jobs.get(key)
            allocations = (*previous.allocations, alloc) if previous else (alloc,)
            jobs[key] = Job(
                key=key,
                scheduler="slurm",
                job_id=ref.job_id,
                state=JobState.RUNNING,
                name=f"{type(assignment.workload).__name__.lower()}-{ref.job_id}",
                owner="demo",
                team=team,
                gpus=sum(len(a.indices) for a in allocations),
                allocations=allocations,
                start_time=now,
                price_tier=tier,
            )
    return list(jobs.values())


def _compressed_clock(speed: float) -> Callable[[], float]:
    start = time.time()
    return lambda: start + (time.time() - start) * speed


async def _serve(
    config: ServerConfig, service: CollectorService
) -> tuple[web.AppRunner, int, web.Application]:
    app = create_app(config, service=service, background=False)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    return runner, port, app


async def _demo(duration_seconds: float, interval_seconds: float, speed: float, db: Path) -> int:
    token = secrets.token_urlsafe(24)
    db.unlink(missing_ok=True)
    config = ServerConfig(
        port=0,
        tokens=MappingProxyType({token: "demo-agents"}),
        database=db,
        step_seconds=STEP_SECONDS,
        recent_hours=1,
        accounting_period_seconds=10,
    )
    service = build_service(config)
    started_wall = time.time()
    service.registry.put(demo_jobs(started_wall))
    runner, port, app = await _serve(config, service)
    print(f"collector listening on http://127.0.0.1:{port}/v1/metrics (database {db})")
    stop = threading.Event()
    runtimes: list[AgentRuntime] = []
    threads = []
    with tempfile.TemporaryDirectory(prefix="gpuwarden-demo-") as tmp:
        clock = _compressed_clock(speed)
        for node, (preset, tier, _team) in FLEET.items():
            agent_config = _agent_config(
                node, preset, tier, port, token, Path(tmp), interval_seconds
            )
            runtime = build_agent(agent_config, clock=clock)
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
                _print_views(node_views(service), time.monotonic() - started, speed)
        finally:
            stop.set()

            def stop_agents() -> None:
                for thread in threads:
                    thread.join(timeout=10)
                for runtime in runtimes:
                    runtime.agent.shutdown(flush_timeout_seconds=5)

            # the agents flush to this loop's server: stop them off the loop
            await asyncio.to_thread(stop_agents)
            stats = app[STATS]
            await runner.cleanup()
    end = time.time()
    _print_accounting(service, started_wall, end, speed)
    service.recompute_periods = int((end - started_wall) // service.period_seconds) + 2
    service.run_accounting(now=end + service.period_seconds)
    service.storage.close()
    print(
        f"\ncollector: {sum(stats.responses.values())} requests ({dict(stats.responses)}), "
        f"{stats.points_accepted} points accepted, {stats.points_rejected} rejected, "
        f"{service.store.series_count()} series"
    )
    print(f"costs by team: gpuwarden report costs --db {db} --since 1h --by team")
    return 0


def run_demo(
    *, duration_seconds: float, interval_seconds: float, speed: float = 30.0, db: Path | None = None
) -> int:
    """Run the demo; Ctrl-C ends it early with the summary."""
    path = db if db is not None else Path(tempfile.gettempdir()) / "gpuwarden-demo.db"
    try:
        return asyncio.run(_demo(duration_seconds, interval_seconds, speed, path))
    except KeyboardInterrupt:
        return 130
