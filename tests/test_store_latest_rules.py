"""Every default rule finds the same on a store with the latest-only tier as on one that keeps
every metric's recent ring: the tier changes what is held, never what the detectors conclude.

One real simulated agent (scenario ``mixed``: 8 GPUs, Slurm jobs on seven, the host's metrics:
every metric of the catalog the agent emits) is sampled twice; its second request is replayed
for 7 h of 10 s rounds, with noise, into two real collectors (default rules, SQLite), one with
the default ``recent_metrics`` and one with ``["*"]``. One detection cycle each: the same
findings, the same incidents.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from gpuwarden.agent.build import build_agent
from gpuwarden.agent.config import AgentConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.config import CollectorConfig as AgentCollectorConfig
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.ingest.otlp import NumberPoint, number_points
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.service import CollectorService

T_END = 1_767_225_600.0
STEP = 10
NODE = "gpu-node-0000"


def agent_points(tmp_path: Path) -> list[NumberPoint]:
    """The simulated agent's second request (the first has no counter deltas)."""
    now = [T_END - 7 * 3600]
    runtime = build_agent(
        AgentConfig(
            node_name=NODE,
            source="simulated",
            scenario="mixed",
            collector=AgentCollectorConfig(endpoint="http://127.0.0.1:9/v1/metrics"),
            spool=SpoolConfig(directory=tmp_path / "spool", fsync=False),
            http=HttpConfig(enabled=False),
        ),
        clock=lambda: now[0],
        with_host=True,
    )
    payload = b""
    try:
        for _ in range(2):
            now[0] += STEP
            runtime.agent.sample_once()
            assert runtime.agent.spool is not None
            ((seq, payload),) = runtime.agent.spool.peek(1, 1 << 30)
            runtime.agent.spool.ack(seq)
    finally:
        runtime.agent.telemetry.shutdown()
    points, _ = number_points(ExportMetricsServiceRequest.FromString(payload))
    return points


def jobs_of(points: list[NumberPoint]) -> list[Job]:
    """The agent's Slurm jobs (from its per-process series), as the registry knows them."""
    index_of = {
        p.attributes["hw.id"]: int(str(p.attributes["gpuwarden.gpu.index"]))
        for p in points
        if p.metric == "gpuwarden.gpu.info"
    }
    held: dict[str, set[int]] = {}
    for p in points:
        if p.metric == "gpuwarden.gpu.process.memory.usage":
            held.setdefault(str(p.attributes["gpuwarden.job.id"]), set()).add(
                index_of[p.attributes["hw.id"]]
            )
    return [
        Job(
            key=f"slurm:test:{ident}",
            scheduler="slurm",
            job_id=ident,
            state=JobState.RUNNING,
            name=f"train-{ident}",
            owner="user1",
            team="team-a",
            gpus=len(gpus),
            allocations=(GpuAllocation(NODE, tuple(sorted(gpus))),),
            submit_time=T_END - 8 * 3600,
            start_time=T_END - 7 * 3600,
            price_tier="on-demand",
        )
        for ident, gpus in sorted(held.items())
    ]


def feed(service: CollectorService, template: list[NumberPoint], clock: list[float]) -> None:
    """7 h of rounds: gauges with 2 % noise (ratios clipped to 1), counters growing steadily."""
    rng = np.random.default_rng(7)
    start = T_END - 7 * 3600
    for k in range(7 * 3600 // STEP):
        t = start + k * STEP
        clock[0] = t + 1.0
        noise = rng.standard_normal(len(template))
        points = []
        for p, e in zip(template, noise, strict=True):
            if p.kind == "sum" and p.monotonic:
                value = p.value + max(1.0, abs(p.value) / 1e4) * k
            elif p.value == round(p.value):
                value = p.value
            else:
                value = p.value * (1.0 + 0.02 * e)
                if p.unit == "1":
                    value = min(max(value, 0.0), 1.0)
            points.append(dataclasses.replace(p, time_unix_nano=int(t * 1e9), value=value))
        service.accept(points, "agent-0")
    clock[0] = T_END


class Outcome(NamedTuple):
    failed: tuple[str, ...]
    findings: int
    firing: int
    incidents: list[tuple[str, str, str]]
    latest_only: int


def cycle(tmp_path: Path, template: list[NumberPoint], recent: tuple[str, ...]) -> Outcome:
    clock = [T_END]
    config = CollectorConfig(database=tmp_path / "c.db", recent_metrics=recent)
    service = build_service(config, clock=lambda: clock[0])
    try:
        service.registry.put(jobs_of(template))
        feed(service, template, clock)
        rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
        engine = DetectionEngine(
            service.detection_view, rules, storage=service.storage, clock=lambda: clock[0]
        )
        result = engine.run_cycle(T_END)
        incidents = sorted(
            (i.rule_id, i.fingerprint, json.dumps(i.evidence, sort_keys=True, default=dict))
            for i in service.storage.incidents()
        )
        latest_only = service.store._table.next_row - service.store._table.next_recent_row
        return Outcome(
            tuple(result.failed_rules), result.findings, result.firing, incidents, latest_only
        )
    finally:
        service.storage.close()


def test_every_default_rule_finds_the_same_with_latest_only_metrics(tmp_path: Path) -> None:
    template = agent_points(tmp_path)
    assert len({p.metric for p in template}) > 30  # the agent's whole catalog, host included
    got = cycle(tmp_path / "tiered", template, ())
    ref = cycle(tmp_path / "every", template, ("*",))
    assert got.failed == ref.failed == ()
    assert got.latest_only > len(template) // 2  # most of the node's series keep no ring here
    assert ref.latest_only == 0
    assert (got.findings, got.firing, got.incidents) == (ref.findings, ref.firing, ref.incidents)
    assert got.findings > 0
    assert got.incidents  # the mixed scenario's idle GPUs, the faults of its ECC counters
