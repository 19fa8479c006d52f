"""Warm start: a collector restarted from its snapshot finds what it would have found, and
says which rules are ready or warming up (``/readyz``, ``/status``, ``gpuwarden rules status``).

Service A (the real ``CollectorService`` from ``build_service``, served by the real app) ingests
2 h of a scripted fleet, then stops: the app's shutdown writes the snapshot. Service B starts on
the same database and snapshot path and runs the shipped default rules at the same time as A
would have; a cold service (no snapshot) is the control that makes the comparison mean something.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from gpuwarden.collector.build import build_service, load_configured_rules
from gpuwarden.collector.cli.rules_status import EXIT_READY, EXIT_WARMING, run_status
from gpuwarden.collector.clients.http import HttpClient
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import DETECTORS
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.readiness import RuleBoard, State
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.rules.model import RuleSet
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.store.types import AttrValue
from gpuwarden.collector.web.app import create_app
from tests.collector_server import READER_TOKEN, TOKENS

T0 = 1_767_225_600.0
STEP = 10
END = T0 + 2 * 3600
NODES = {"a": "slurm:c:1", "b": "slurm:c:2"}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def utilization(node: str, gpu: int, t: float, rnd: np.random.Generator) -> float:
    """a/0 goes idle 80 min in (idle-gpu); b's GPUs fall from 0.9 to 0.5 after an hour (a drop
    the level-shift rule needs its whole 2 h to see); the rest stay busy."""
    if (node, gpu) == ("a", 0) and t >= T0 + 80 * 60:
        return 0.0
    level = 0.5 if node == "b" and t >= T0 + 3600 else 0.9
    return min(1.0, max(0.0, level + rnd.normal(0, 0.02)))


def rounds() -> list[list[NumberPoint]]:
    rnd = np.random.default_rng(16)
    out = []
    t = T0
    while t < END:
        batch = []
        for node in NODES:
            resource: dict[str, AttrValue] = {"host.name": node}
            for gpu in range(2):
                attrs: dict[str, AttrValue] = {"hw.id": f"GPU-{node}-{gpu}"}
                ns = int(t * 1e9)
                batch += [
                    NumberPoint(
                        resource,
                        "hw.gpu.utilization",
                        "1",
                        "gauge",
                        False,
                        attrs,
                        ns,
                        utilization(node, gpu, t, rnd),
                    ),
                    NumberPoint(
                        resource,
                        "gpuwarden.gpu.info",
                        "1",
                        "gauge",
                        False,
                        {**attrs, "hw.model": "H100", "gpuwarden.gpu.index": gpu},
                        ns,
                        1.0,
                    ),
                ]
        out.append(batch)
        t += STEP
    return out


def config(tmp_path: Path) -> CollectorConfig:
    return CollectorConfig(
        database=tmp_path / "collector.db",
        snapshot_seconds=300,
        tokens=TOKENS,
        recent_hours=6,
    )


def jobs() -> list[Job]:
    return [
        Job(
            key=key,
            scheduler="slurm",
            job_id=key.rsplit(":", 1)[1],
            state=JobState.RUNNING,
            team="ml",
            gpus=2,
            start_time=T0 - 3600,
            allocations=(GpuAllocation(node, (0, 1)),),
        )
        for node, key in NODES.items()
    ]


def findings(service: CollectorService, rules: RuleSet, now: float) -> set[tuple[str, str, str]]:
    """Every default rule run once at ``now``: (rule, subject, verdict) of its firing findings."""
    out = set()
    for rule in rules.enabled():
        detector = DETECTORS[rule.detector]
        for f in detector.detect(service.detection_view, rule, now):
            if f.verdict is Verdict.FIRING:
                out.add((f.rule_id, f.subject, str(f.verdict)))
    return out


def serve_and_stop(service: CollectorService, cfg: CollectorConfig) -> None:
    """Serve the real app with its background loops, then stop it the orderly way."""

    async def run() -> None:
        app = create_app(cfg, service=service, background=True)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await runner.cleanup()  # the shutdown: loops end, then the snapshot is written

    asyncio.run(run())


@pytest.fixture(scope="module")
def scripted() -> list[list[NumberPoint]]:
    return rounds()


def test_a_restarted_collector_finds_what_it_would_have_found(tmp_path, scripted):
    cfg = config(tmp_path)
    rules = load_configured_rules(cfg)
    clock = Clock(T0)
    a = build_service(cfg, clock=clock)
    a.registry.put(jobs())
    for batch in scripted:
        clock.now = batch[0].time_unix_nano / 1e9
        assert a.accept(batch, "agents") == 0
    clock.now = END
    serve_and_stop(a, cfg)
    assert cfg.snapshot_path is not None
    assert cfg.snapshot_path.exists()

    detect_at = END + STEP  # B's first cycle after the restart
    clock.now = detect_at
    b = build_service(cfg, clock=clock)
    assert b.restored is not None
    assert b.restored.series == a.store.series_count()
    expected = findings(a, rules, detect_at)
    # the scenario's two rules fire, so the comparison is not between two empty sets
    assert {rule for rule, _, _ in expected} >= {"idle-gpu", "gpu-utilization-drop"}
    assert findings(b, rules, detect_at) == expected

    # the control: the same restart without a snapshot is blind to both
    cold_cfg = CollectorConfig(database=tmp_path / "cold.db", snapshot_seconds=0)
    cold = build_service(cold_cfg, clock=clock)
    cold.registry.put(jobs())
    assert cold.restored is None
    assert findings(cold, rules, detect_at) == set()

    board = RuleBoard(rules.rules, (), b.store, started_at=detect_at, clock=clock)
    states = {s.rule_id: s for s in board.states()}
    assert states["idle-gpu"].state is State.READY
    assert states["gpu-utilization-drop"].state is State.READY
    assert states["model-latency-drift"].state is State.WARMING_UP
    cold_board = RuleBoard(rules.rules, (), cold.store, started_at=detect_at, clock=clock)
    cold_states = {s.rule_id: s for s in cold_board.states()}
    assert cold_states["idle-gpu"].state is State.WARMING_UP
    assert cold_states["idle-gpu"].until is None  # no data at all yet


def test_the_running_app_writes_the_snapshot_periodically(tmp_path, scripted):
    """Without stopping: the first periodic snapshot comes one interval after the start."""
    cfg = CollectorConfig(database=tmp_path / "c.db", snapshot_seconds=0.05, tokens=TOKENS)
    clock = Clock(T0)
    a = build_service(cfg, clock=clock)
    for batch in scripted[:30]:
        clock.now = batch[0].time_unix_nano / 1e9
        a.accept(batch, "agents")
    path = cfg.snapshot_path
    assert path is not None

    async def run() -> bool:
        app = create_app(cfg, service=a, background=True)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            async with asyncio.timeout(60):
                while not path.exists():  # an external effect of the loop: await it
                    await asyncio.sleep(0.01)
            return path.exists()
        finally:
            await runner.cleanup()

    assert asyncio.run(run())
    restored = build_service(cfg, clock=clock).restored
    assert restored is not None
    assert restored.series == a.store.series_count()


async def test_readyz_status_and_the_cli_show_each_rules_state(tmp_path, scripted, aiohttp_client):
    cfg = config(tmp_path)
    rules = load_configured_rules(cfg)
    clock = Clock(T0)
    service = build_service(cfg, clock=clock)
    service.registry.put(jobs())
    for batch in scripted[: 45 * 6]:  # 45 minutes
        clock.now = batch[0].time_unix_nano / 1e9
        service.accept(batch, "agents")
    app = create_app(cfg, service=service, background=False, rules=rules)
    client = await aiohttp_client(app)
    resp = await client.get("/readyz")
    assert resp.status == 200  # warming up is not "not ready": the rules run on what there is
    body = await resp.json()
    by_rule = {r["rule"]: r for r in body["rules"]}
    assert by_rule["idle-gpu"]["state"] == "ready"  # 30 min window, 45 min held
    drop = by_rule["gpu-utilization-drop"]
    assert drop["state"] == "warming up"
    assert drop["until"] == T0 + 2 * 3600  # 1 h window + 1 h baseline after T0
    assert drop["text"] == "warming up until 2026-01-01 02:00 UTC"
    assert by_rule["prometheus-gpu-failed"]["state"] == "ready"  # pushed alerts
    assert sum(body["rules_summary"].values()) == len(rules.rules)

    resp = await client.get("/status", headers={"Authorization": f"Bearer {READER_TOKEN}"})
    page = await resp.text()
    assert resp.status == 200
    assert '<section id="rules">' in page
    assert "warming up until 2026-01-01 02:00 UTC" in page

    token = tmp_path / "token"
    token.write_text(READER_TOKEN + "\n")
    args = argparse.Namespace(url=str(client.make_url("/")), token_file=token, json=False)
    out, err = io.StringIO(), io.StringIO()
    code = await asyncio.to_thread(run_status, args, out, err, {}, HttpClient())
    assert code == EXIT_WARMING, err.getvalue()
    lines = {line.split()[0]: line for line in out.getvalue().splitlines()[1:]}
    assert lines["idle-gpu"].endswith("ready")
    assert "warming up until 2026-01-01 02:00 UTC" in lines["gpu-utilization-drop"]

    clock.now = T0 + 20 * 86400  # long after: every rule's history is covered
    out = io.StringIO()
    args.json = True
    assert await asyncio.to_thread(run_status, args, out, err, {}, HttpClient()) == EXIT_READY
    states = {r["rule"]: r["state"] for r in json.loads(out.getvalue())}
    assert set(states.values()) == {"ready"}


def test_the_cli_says_when_it_cannot_read_the_collector(tmp_path):
    args = argparse.Namespace(url="http://127.0.0.1:9", token_file=None, json=False)
    err = io.StringIO()
    assert run_status(args, io.StringIO(), err, {}, HttpClient()) == 1
    assert "cannot reach the collector" in err.getvalue()
