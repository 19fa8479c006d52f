"""``gpuwarden demo``: the whole loop on a laptop, with no GPU and no external service.

One process runs a real collector (OTLP receiver, WindowStore, SQLite, detection, remediation,
status page, ``/metrics``) on loopback, four real agents over simulated 8-GPU nodes
(``demo_fleet``), a simulated vLLM server the collector scrapes, and the reference serving
router the degrade action drives. Workloads run ``speed`` times faster than the wall clock and
the rules' durations shrink by the same factor, so three minutes show about three hours.

Remediation is live on the simulated targets (requeue frees the idle notebook's GPUs, degrade
moves traffic to the smaller model) and a dry run elsewhere (draining a node). The demo plays
the operator too: it approves what waits for approval through the signed links the alerts
carry. At the end it prints the waste found, the incidents, the actions and the URLs.

SIGINT (Ctrl-C) or SIGTERM ends the run early, with the report; the collector's loops finish their
running step before the database closes. Without ``--db`` the database lives in a temporary
directory removed at exit, unless ``--linger`` keeps the status page up (then it is kept and its
path printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from gpuwarden.agent.build import AgentRuntime, build_agent, job_hints
from gpuwarden.agent.config import (
    AgentConfig,
    CollectorConfig,
    HttpConfig,
    ResourceConfig,
    SpoolConfig,
)
from gpuwarden.agent.sources.simulated import SimulatedSource
from gpuwarden.collector.build import build_remediation, build_service, load_configured_rules
from gpuwarden.collector.config import CollectorConfig as ServerConfig
from gpuwarden.collector.config import ModelServer
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.jobs.model import JobState
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.remediate.actuators.base import Actuator
from gpuwarden.collector.remediate.actuators.http_router import HttpRouterActuator
from gpuwarden.collector.remediate.actuators.settings import RouteSpec
from gpuwarden.collector.remediate.policy import SETTLE_SECONDS, PolicyConfig, RemediationSettings
from gpuwarden.collector.storage.records import Event, EventKind, IncidentState
from gpuwarden.collector.web.app import create_app
from gpuwarden.demo_budget import print_budgets, with_budget
from gpuwarden.demo_fleet import (
    FALLBACK_MODEL,
    HOST_CPU_BUSY,
    NODES,
    SERVICE_MODEL,
    ConsoleNotifier,
    DemoScheduler,
    SimulatedHost,
    deployment,
    jobs,
    peak_hour,
    preempt,
    scaled_rules,
    scenario,
)
from gpuwarden.demo_policy import with_demo_policies
from gpuwarden.demo_report import print_report, print_status
from gpuwarden.demo_router import RouterState, create_router_app
from gpuwarden.demo_serving import ServingProfile, SimulatedModelServer

STEP_SECONDS = 1
DEPLOY_AT, XID_AT, PREEMPT_AT = 0.30, 0.20, 0.45
"""When the slow deploy, the XID and the spot preemption happen, as shares of the duration."""
ROLLBACK_AT_LATEST = 0.70
"""When the on-call rolls the slow version back if no deploy-regression page came first."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _compressed_clock(speed: float, start: float) -> Callable[[], float]:
    return lambda: start + (time.time() - start) * speed


class _PortInUseError(Exception):
    """A port the demo serves on is taken."""

    def __init__(self, port: int) -> None:
        super().__init__(f"127.0.0.1:{port} is in use")
        self.port = port


async def _serve(runners: list[web.AppRunner], app: web.Application, port: int) -> None:
    """Serve ``app`` on loopback; its runner joins ``runners`` (cleaned up even if this fails)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    runners.append(runner)
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise _PortInUseError(port) from None
        raise


def _agent_config(node: str, port: int, spool: Path, interval: float) -> AgentConfig:
    return AgentConfig(
        node_name=node,
        interval_seconds=interval,
        source="simulated",
        collector=CollectorConfig(
            endpoint=f"http://127.0.0.1:{port}/v1/metrics", timeout_seconds=5
        ),
        spool=SpoolConfig(directory=spool / node, max_bytes=64 * 1024 * 1024, fsync=False),
        http=HttpConfig(enabled=False),
        resource=ResourceConfig(
            cluster="demo", instance_type="p5.48xlarge", price_tier="on-demand", region="local"
        ),
    )


def _server_config(port: int, db: Path, model_port: int, speed: float) -> ServerConfig:
    policy = PolicyConfig(
        dry_run=False,  # live on the simulated targets; the drain actuator answers dry runs
        settle_seconds=MappingProxyType(
            {kind: max(40.0, seconds / speed) for kind, seconds in SETTLE_SECONDS.items()}
        ),
        breaker_max_actions=10,
        breaker_window_seconds=max(60.0, 600.0 / speed),
        breaker_max_fleet_ratio=0.5,  # five jobs: one target is already 20 % of this fleet
        approval_ttl_seconds=3600.0,
    )
    return ServerConfig(
        port=port,
        # auth: none, on loopback only: the status page and /metrics open in a browser without
        # a token, and the agents need none (the collector would warn beyond loopback)
        allow_unauthenticated=True,
        database=db,
        snapshot_seconds=0,  # every run tells the same story from nothing, even with --db kept
        step_seconds=STEP_SECONDS,
        recent_hours=1,
        accounting_period_seconds=10,
        model_servers=(
            ModelServer(
                url=f"http://127.0.0.1:{model_port}/metrics",
                server="vllm",
                model=SERVICE_MODEL,
                node="gpu-node-c",
            ),
        ),
        scrape_seconds=1.0,
        detection_seconds=2.0,
        remediation=RemediationSettings(
            policy=policy, external_url=f"http://127.0.0.1:{port}", interval_seconds=2.0
        ),
        alerting=AlertingSettings(interval_seconds=1.0),
    )


_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@dataclasses.dataclass
class _Operator:
    """Plays the human: approves what waits for approval through the links in the alerts."""

    session: aiohttp.ClientSession
    log: Callable[[str], None]
    delay_seconds: float = 4.0
    seen: dict[str, float] = dataclasses.field(default_factory=dict)
    done: set[str] = dataclasses.field(default_factory=set)

    def offer(self, url: str) -> None:
        self.seen.setdefault(url, time.monotonic())

    async def act(self) -> None:
        now = time.monotonic()
        for url, first in list(self.seen.items()):
            if url in self.done or now - first < self.delay_seconds:
                continue
            self.done.add(url)
            # As a browser does: open the page, press its Approve button (the form's CSRF
            # token, sent from the collector's own origin).
            async with self.session.get(url) as page:
                found = _CSRF.search(await page.text())
            data = {"csrf_token": found.group(1)} if found else {}
            parts = urlsplit(url)
            headers = {"Origin": f"{parts.scheme}://{parts.netloc}"}
            async with self.session.post(
                url, data=data, headers=headers, allow_redirects=False
            ) as response:
                self.log(f"operator: approved through the signed link -> HTTP {response.status}")


class _Demo:
    """One run: the collector, the model server, the agents, the timeline and the report."""

    def __init__(
        self, duration: float, interval: float, speed: float, db: Path, port: int | None
    ) -> None:
        self.duration, self.interval, self.speed, self.db = duration, interval, speed, db
        self.environ = {"GPUWARDEN_APPROVAL_SECRET": secrets.token_urlsafe(48)}
        self.port, self.model_port = port or _free_port(), _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.config = with_budget(_server_config(self.port, db, self.model_port, speed))
        db.unlink(missing_ok=True)
        self.service = build_service(self.config)
        self.started = time.time()
        self.clock = _compressed_clock(speed, self.started)
        self.service.registry.put(jobs(self.started))
        self.service.storage.upsert_model(deployment())
        peak = peak_hour(self.started, duration * speed)
        self.sources = {
            node: SimulatedSource(scenario(node, XID_AT * duration * speed, peak), clock=self.clock)
            for node in NODES
        }
        self.router = RouterState({SERVICE_MODEL: {SERVICE_MODEL: 100.0, FALLBACK_MODEL: 0.0}})
        self.router_port = _free_port()
        self.serving = SimulatedModelServer(
            ServingProfile(model=SERVICE_MODEL, fallback_model=FALLBACK_MODEL, peak_hour_utc=peak),
            clock=self.clock,
            fallback_share=lambda: self.router.share(SERVICE_MODEL, FALLBACK_MODEL),
        )
        self.scheduler = DemoScheduler(self.service, self.sources, log=_say)
        self.notifiers = {
            scheme: ConsoleNotifier(scheme, _say) for scheme in ("slack", "pagerduty")
        }
        self.stop = threading.Event()
        self.interrupted = asyncio.Event()  # set by SIGINT or SIGTERM
        self.runtimes: list[AgentRuntime] = []
        self.threads: list[threading.Thread] = []
        self.runners: list[web.AppRunner] = []
        self.done = {"deploy": False, "preempt": False, "rollback": False, "restored": False}
        self.degraded_at: float | None = None

    async def start(self, spool: Path) -> None:
        """Serve the collector and the model server; start the four agents."""
        rules = scaled_rules(load_configured_rules(self.config), self.speed)
        router = HttpRouterActuator(
            f"http://127.0.0.1:{self.router_port}",
            {SERVICE_MODEL: RouteSpec(SERVICE_MODEL, SERVICE_MODEL, FALLBACK_MODEL)},
        )
        actuators: list[Actuator] = [self.scheduler, router]
        remediation = build_remediation(
            with_demo_policies(self.config, spool.parent / "policies", _say),
            self.service,
            rules,
            actuators=actuators,
            notifiers=self.notifiers,
            environ=self.environ,
        )
        app = create_app(
            self.config,
            service=self.service,
            detection=DetectionEngine(
                self.service.detection_view, rules, storage=self.service.storage
            ),
            remediation=remediation,
        )
        await _serve(self.runners, app, self.port)
        await _serve(self.runners, self.serving.app(), self.model_port)
        await _serve(self.runners, create_router_app(self.router), self.router_port)
        _say(
            f"collector on {self.base}  ·  status page {self.base}/status  ·  "
            f"metrics {self.base}/metrics"
        )
        _say(
            f"fleet: {len(NODES)} nodes x 8 GPUs, workloads at {self.speed:g}x; "
            f"{self.duration:.0f} s of demo"
        )
        for node, sim in self.sources.items():
            runtime = build_agent(
                _agent_config(node, self.port, spool, self.interval),
                source=(sim, job_hints(sim.jobs), sim.events),
                clock=self.clock,
                host=SimulatedHost(HOST_CPU_BUSY[node]).sample,
            )
            self.runtimes.append(runtime)
            thread = threading.Thread(target=runtime.agent.run, args=(self.stop,), name=node)
            self.threads.append(thread)
            thread.start()

    def timeline(self, elapsed: float) -> None:
        """The scripted events: the slow deploy and the spot preemption."""
        if not self.done["deploy"] and elapsed >= DEPLOY_AT * self.duration:
            self.done["deploy"] = True
            self.serving.deploy("v2")
            self.service.storage.upsert_model(deployment("v2"))
            change = {"from": "v1", "to": "v2"}
            self.service.storage.record_event(
                Event(time.time(), EventKind.DEPLOY, SERVICE_MODEL, change)
            )
            _say(f"deploy: {SERVICE_MODEL} v1 -> v2 (the new version is slower)")
        share = self.router.share(SERVICE_MODEL, FALLBACK_MODEL)
        if share > 0 and self.degraded_at is None:
            self.degraded_at = elapsed
            _say(f"router: {share:.0%} of {SERVICE_MODEL} traffic now goes to {FALLBACK_MODEL}")
        if share == 0 and self.degraded_at is not None and not self.done["restored"]:
            self.done["restored"] = True
            _say(f"router: all {SERVICE_MODEL} traffic is back on {SERVICE_MODEL}")
        if (
            self.done["deploy"]
            and not self.done["rollback"]
            and (self._regression_paged() or elapsed >= ROLLBACK_AT_LATEST * self.duration)
        ):
            # paged for the regression, the on-call rolls the slow version back; the degrade
            # is undone once the SLO burn has ended
            self.done["rollback"] = True
            self.serving.deploy("v1")
            self.service.storage.upsert_model(deployment("v1"))
            self.service.storage.record_event(
                Event(time.time(), EventKind.ROLLBACK, SERVICE_MODEL, {"from": "v2", "to": "v1"})
            )
            _say(f"on-call: rolled {SERVICE_MODEL} back to v1")
        if not self.done["preempt"] and elapsed >= PREEMPT_AT * self.duration:
            self.done["preempt"] = True
            key = preempt(self.service, self.sources["gpu-node-b"], time.time())
            _say(f"spot: {key} preempted (capacity reclaimed)")

    def _regression_paged(self) -> bool:
        """Whether the deploy-regression incident opened (the story's cue for the rollback).

        Waiting for it, rather than for a number of wall seconds, keeps the story in order
        however slowly a loaded machine runs the detection cycles.
        """
        return any(
            incident.rule_id == "deploy-regression"
            for incident in self.service.storage.incidents(state=IncidentState.OPEN)
        )

    async def run(self) -> None:
        """Tick the model server, play the timeline and the operator, print a summary."""
        async with aiohttp.ClientSession() as session:
            operator = _Operator(session, _say)
            began = last_status = time.monotonic()
            while (elapsed := time.monotonic() - began) < self.duration:
                self.serving.tick(0.5)
                if await _interrupted_within(self.interrupted, 0.5):
                    _say("interrupted: finishing with the report")
                    return
                self.timeline(elapsed)
                for notifier in self.notifiers.values():
                    for alert in notifier.sent:
                        for action in alert.actions:
                            if action.approval_url:
                                operator.offer(action.approval_url)
                await operator.act()
                if time.monotonic() - last_status >= 15:
                    last_status = time.monotonic()
                    await asyncio.to_thread(print_status, self.service, elapsed, self.speed)

    async def stop_agents(self) -> None:
        """Stop the agents; they flush what they hold to the collector. Idempotent."""
        self.stop.set()
        threads, runtimes = self.threads, self.runtimes
        self.threads, self.runtimes = [], []

        def stop_agents() -> None:
            for thread in threads:
                thread.join(timeout=10)
            for runtime in runtimes:
                runtime.agent.shutdown(flush_timeout_seconds=5)

        await asyncio.to_thread(stop_agents)

    async def report(self) -> None:
        """End the run's jobs, account for the last period and print the report.

        The jobs end with the run (the demo's cluster goes away with it): otherwise the last
        accounting period, which reaches past the agents' last samples, would charge them for
        GPU time the run never had.
        """
        await self.stop_agents()
        service = self.service
        ended = time.time()
        service.registry.put(
            dataclasses.replace(job, state=JobState.COMPLETED, end_time=ended)
            for job in service.registry.jobs()
            if job.state is JobState.RUNNING
        )
        service.run_accounting(now=ended + service.period_seconds)
        await asyncio.to_thread(
            print_report,
            service,
            self.started,
            ended,
            self.speed,
            self.base,
            self.scheduler.requeued,
        )
        await asyncio.to_thread(print_budgets, service, ended)

    async def close(self) -> None:
        """Stop the agents, stop serving (the collector's loops end first), close the database."""
        await self.stop_agents()
        for runner in reversed(self.runners):
            await runner.cleanup()
        self.runners = []
        self.service.storage.close()


async def _interrupted_within(interrupted: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(interrupted.wait(), seconds)
    return interrupted.is_set()


def _say(line: str) -> None:
    print(line, flush=True)


async def _demo(
    duration: float,
    interval: float,
    speed: float,
    db: Path,
    linger: float,
    port: int | None,
    spool: Path,
    db_kept: bool,
) -> int:
    demo = _Demo(duration, interval, speed, db, port)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, demo.interrupted.set)
    try:
        try:
            await demo.start(spool)
        except _PortInUseError as exc:
            print(
                f"gpuwarden demo: 127.0.0.1:{exc.port} is in use; choose another port with "
                "--port or leave it out",
                file=sys.stderr,
            )
            return 1
        await demo.run()
        demo.interrupted.clear()  # from here a signal skips the linger
        await demo.report()
        if db_kept:
            print(f"database kept at {db}: gpuwarden report costs --db {db} --since 1h --by team")
            print(
                "  (the collector's own accounting is on the wall clock: its GPU-h and $ are "
                f"1/{demo.speed:g} of the report's, its kWh are the simulated ones)"
            )
        else:
            print(f"database {db} is removed at exit (--db PATH keeps one)")
        if linger > 0 and not demo.interrupted.is_set():
            print(f"serving {demo.base}/status for {linger:.0f} more seconds (Ctrl-C stops)")
            await _interrupted_within(demo.interrupted, linger)
    finally:
        await demo.close()
    return 0


def run_demo(
    *,
    duration_seconds: float,
    interval_seconds: float,
    speed: float = 60.0,
    db: Path | None = None,
    linger_seconds: float = 0.0,
    port: int | None = None,
) -> int:
    """Run the demo; SIGINT (Ctrl-C) or SIGTERM ends it early with the report.

    Returns 0 (also when ended early), 1 when a port it serves on is in use.
    """
    directory = Path(tempfile.mkdtemp(prefix="gpuwarden-demo-"))
    db_kept = db is not None or linger_seconds > 0
    path = db if db is not None else directory / "demo.db"
    try:
        return asyncio.run(
            _demo(
                duration_seconds,
                interval_seconds,
                speed,
                path,
                linger_seconds,
                port,
                directory / "spool",
                db_kept,
            )
        )
    except KeyboardInterrupt:  # before the demo's own handlers were installed
        return 130
    finally:
        if db_kept and db is None:
            shutil.rmtree(directory / "spool", ignore_errors=True)
        else:
            shutil.rmtree(directory, ignore_errors=True)
