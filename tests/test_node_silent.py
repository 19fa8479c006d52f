"""``node_silent``: the detector on a stored fleet, and the issue's end-to-end check.

The end-to-end test runs a real collector (the aiohttp app on 127.0.0.1) on an injected clock,
two real agents (``build_agent`` with simulated 8-GPU sources) pushing real OTLP, and the
shipped default rules through ``DetectionEngine``. One agent stops: past the staleness bound
its GPUs leave ``/metrics``, its liveness reads 0, ``/status`` shows it silent, a node-silent
incident opens, and none of its series reaches a detector; it restarts, and all of that undoes.
"""

from __future__ import annotations

import dataclasses
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.agent.build import AgentRuntime, build_agent
from gpuwarden.agent.config import AgentConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.config import CollectorConfig as AgentLink
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.node_silent import NodeSilentParams, run_node_silent
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import IncidentState
from gpuwarden.collector.store.fresh import IDENTITY_METRICS
from tests.collector_server import READER, TOKEN, CollectorThread
from tests.detectors import make_rule
from tests.test_detect_waste import T0, feed, gauge, gpu_points, job

# --- the detector on a stored fleet -------------------------------------------------------------


def process(node: str, t: float, job_id: str) -> NumberPoint:
    attrs = {
        "hw.id": f"GPU-{node}-0",
        "gpuwarden.job.scheduler": "slurm",
        "gpuwarden.job.id": job_id,
    }
    return gauge("gpuwarden.gpu.process.memory.usage", node, t, 2e9, **attrs)


DEFAULTS = NodeSilentParams()


def verdicts(
    svc: CollectorService, now: float, p: NodeSilentParams = DEFAULTS
) -> dict[str, Verdict]:
    found = run_node_silent(svc.detection_view, make_rule("node_silent"), p, now)
    return {f.subject: f.verdict for f in found}


@pytest.fixture
def quiet(tmp_path: Path) -> Iterator[CollectorService]:
    """Nodes a-d report until T0 + 600, then a and b stop; c and d go on to END = T0 + 900.
    a runs job 7 (its agent saw the process; no scheduler knows it), b ran job 8 (the
    scheduler lists it completed), c runs job 9 (the scheduler's allocation), d none."""
    end = T0 + 900.0
    svc = build_service(CollectorConfig(database=tmp_path / "c.db"), clock=lambda: end)
    svc.registry.put(
        [
            job("slurm:c:8", "b", (0,), T0, T0 + 590, state=JobState.COMPLETED),
            job("slurm:c:9", "c", (0,), T0),
        ]
    )

    def points(t: float) -> list[NumberPoint]:
        out = []
        for node, job_id in (("a", "7"), ("b", "8"), ("c", "9"), ("d", None)):
            if t < T0 + 600 or node in "cd":
                out += gpu_points(node, 0, t, 0.9)
                out += [process(node, t, job_id)] if job_id else []
        return out

    feed(svc, np.arange(T0, end, 10.0), points)
    yield svc
    svc.storage.close()


def test_a_silent_node_fires_while_a_job_runs_on_it(quiet):
    now = T0 + 900.0  # a and b silent for 310 s
    assert verdicts(quiet, now) == {
        "a": Verdict.FIRING,  # the agent's last report saw job 7's process
        "b": Verdict.CLEAR,  # silent, but its job had ended: nothing at stake
        "c": Verdict.CLEAR,
        "d": Verdict.CLEAR,
    }
    assert verdicts(quiet, now, NodeSilentParams(with_jobs_only=False))["b"] is Verdict.FIRING
    graced = NodeSilentParams(grace_seconds=250.0)
    assert verdicts(quiet, now, graced)["a"] is Verdict.CLEAR  # silent 310 s, not past 60 + 250
    assert verdicts(quiet, T0 + 590 + 60)["a"] is Verdict.CLEAR  # exactly at the bound


def test_the_finding_says_who_what_and_since_when(quiet):
    (a,) = [
        f
        for f in run_node_silent(
            quiet.detection_view, make_rule("node_silent"), NodeSilentParams(), T0 + 900
        )
        if f.subject == "a"
    ]
    assert a.facts.nodes == ("a",)
    assert a.facts.job == "slurm:7"
    assert dict(a.evidence) == {
        "node": "a",
        "last_seen_unix": T0 + 590,
        "silent_seconds": 310.0,
        "staleness_seconds": 60.0,
        "grace_seconds": 0.0,
        "gpus": 1,
        "jobs": "slurm:7",
        "job": "slurm:7",
    }


# --- end to end: real collector, real agents ----------------------------------------------------

LIVE, QUIET = "node-live", "node-quiet"
JOB = Job(
    key="slurm:c:1001",
    scheduler="slurm",
    job_id="1001",
    state=JobState.RUNNING,
    team="ml",
    gpus=8,
    allocations=(GpuAllocation(QUIET, tuple(range(8))),),
    start_time=T0,
)


class Fleet:
    """The collector on an injected clock, and the agents that push to it."""

    def __init__(
        self, tmp: Path, collector: CollectorThread, service: CollectorService, clock: list[float]
    ) -> None:
        self.tmp, self.collector, self.service = tmp, collector, service
        self._clock = clock  # the collector's: its store, intake, fleet, app and engine
        self.agents: dict[str, AgentRuntime] = {}

    @property
    def now(self) -> float:
        return self._clock[0]

    def set_now(self, value: float) -> None:
        self._clock[0] = value

    def start(self, node: str, scenario: str) -> None:
        config = AgentConfig(
            node_name=node,
            source="simulated",
            scenario=scenario,
            collector=AgentLink(endpoint=self.collector.endpoint, token=TOKEN),
            spool=SpoolConfig(directory=self.tmp / f"spool-{node}", fsync=False),
            http=HttpConfig(enabled=False),
        )
        self.agents[node] = build_agent(
            config,
            clock=lambda: self.now,
            with_host=False,
            machine_id_file=self.tmp / "machine-id",
        )

    def stop(self, node: str) -> None:
        assert self.agents.pop(node).agent.shutdown(flush_timeout_seconds=5)

    def round(self) -> None:
        """One sample round of every running agent, pushed and acknowledged."""
        for runtime in self.agents.values():
            runtime.agent.sample_once()
            assert runtime.agent.sender is not None
            assert runtime.agent.sender.flush(timeout_seconds=10)

    def last_seen(self) -> dict[str, float]:
        return self.service.store.last_seen_by_host()

    def get(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.collector.port}{path}"
        request = urllib.request.Request(url, headers=READER)
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - http only
            text: str = response.read().decode()
            return text

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(self.get("/metrics"))
            for s in family.samples
        }


def gpus_exported(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> dict[str, int]:
    """Node → GPUs with a utilisation gauge on ``/metrics``."""
    out: dict[str, int] = {}
    for name, labels in samples:
        if name == "gpuwarden_gpu_utilization_ratio":
            node = dict(labels)["node"]
            out[node] = out.get(node, 0) + 1
    return out


def up(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> dict[str, float]:
    return {dict(lb)["node"]: v for (n, lb), v in samples.items() if n == "gpuwarden_node_up"}


def node_row(status_html: str, node: str) -> str:
    match = re.search(rf"<tr[^>]*><td>{node}</td>.*?</tr>", status_html, re.S)
    assert match is not None, node
    return match.group(0)


def silent_incidents(service: CollectorService, state: IncidentState) -> list[str]:
    return [
        str(i.evidence["node"])
        for i in service.storage.incidents(state=state)
        if i.rule_id == "node-silent"
    ]


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    clock = [time.time()]  # the agents stamp points with the wall clock (the OTel SDK)
    service = build_service(CollectorConfig(database=tmp_path / "c.db"), clock=lambda: clock[0])
    service.registry.put([dataclasses.replace(JOB, start_time=clock[0] - 600)])
    with CollectorThread(service=service, unauthenticated=True) as collector:  # a browser's view
        f = Fleet(tmp_path, collector, service, clock)
        try:
            yield f
        finally:
            for node in list(f.agents):
                f.stop(node)
            service.storage.close()


def test_a_stopped_agent_goes_silent_everywhere_and_comes_back(fleet):
    service = fleet.service
    bound = service.store.staleness_seconds
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    assert rules.get("node-silent") is not None  # the shipped rule, as shipped
    engine = DetectionEngine(
        service.detection_view, rules, storage=service.storage, clock=lambda: fleet.now
    )
    fleet.start(LIVE, "inference")
    fleet.start(QUIET, "training")
    fleet.round()
    fleet.round()
    seen = fleet.last_seen()
    fleet.set_now(max(seen.values()))
    before = fleet.metrics()
    assert gpus_exported(before) == {LIVE: 8, QUIET: 8}
    assert up(before) == {LIVE: 1.0, QUIET: 1.0}
    assert engine.run_cycle().failed_rules == ()
    assert silent_incidents(service, IncidentState.OPEN) == []

    fleet.stop(QUIET)
    fleet.round()  # the live agent reports on
    seen = fleet.last_seen()
    gap = seen[LIVE] - seen[QUIET]
    assert gap > 0
    # The agents stamp with the wall clock; the collector's clock is injected. Set it just
    # before, then just past, the quiet node's deadline (its last point + the bound): the live
    # node's newest point is `gap` younger, so it stays within the bound throughout.
    fleet.set_now(seen[QUIET] + bound - gap / 2)
    assert up(fleet.metrics()) == {LIVE: 1.0, QUIET: 1.0}  # not yet past the bound
    fleet.set_now(seen[QUIET] + bound + gap / 2)

    samples = fleet.metrics()
    assert gpus_exported(samples) == {LIVE: 8}
    for name, labels in samples:
        if name.startswith("gpuwarden_gpu_") and name != "gpuwarden_gpu_last_seen_age_seconds":
            assert dict(labels)["node"] == LIVE, name
    assert up(samples) == {LIVE: 1.0, QUIET: 0.0}
    age = samples[("gpuwarden_node_last_seen_age_seconds", frozenset({("node", QUIET)}))]
    assert age == pytest.approx(bound + gap / 2)

    page = fleet.get("/status")
    assert "silent" in node_row(page, QUIET)
    assert "reporting" in node_row(page, LIVE)
    assert re.search(r'<div class="value">8</div><div class="label">GPUs reporting', page)
    assert re.search(r'<div class="value">1</div><div class="label">silent nodes', page)

    view = service.detection_view  # what every detector reads
    fed = 0
    for metric in sorted(service.store.metric_names() - IDENTITY_METRICS):
        if not service.store.keeps_recent(metric):  # its latest value only: unknown now
            latest = view.store.latest(metric)
            for info, value in zip(latest.series, latest.values, strict=True):
                if info.attributes.get("host.name") == QUIET:
                    assert np.isnan(value), metric
            continue
        matrix = view.store.matrix(metric, start=fleet.now - 3600, end=fleet.now)
        for info, row in zip(matrix.series, matrix.values, strict=True):
            if info.attributes.get("host.name") == QUIET:
                assert np.isnan(row).all(), metric
            elif np.isfinite(row).any():
                fed += 1
    assert fed > 50  # the live node's series still feed the detectors
    _, timelines = view.timelines(fleet.now - 600, fleet.now)
    assert {t.node for t in timelines if np.isfinite(t.utilization_ratio).any()} == {LIVE}

    result = engine.run_cycle()
    assert result.failed_rules == ()
    assert silent_incidents(service, IncidentState.OPEN) == [QUIET]
    (incident,) = [
        i for i in service.storage.incidents(state=IncidentState.OPEN) if i.rule_id == "node-silent"
    ]
    assert incident.severity == "warning"
    assert incident.evidence["jobs"] == JOB.key

    fleet.start(QUIET, "training")  # the agent comes back
    for _ in range(3):  # the tracker resolves after three clear cycles
        fleet.round()
        fleet.set_now(max(fleet.last_seen().values()))
        assert engine.run_cycle().failed_rules == ()
    assert silent_incidents(service, IncidentState.OPEN) == []
    assert silent_incidents(service, IncidentState.RESOLVED) == [QUIET]
    samples = fleet.metrics()
    assert up(samples) == {LIVE: 1.0, QUIET: 1.0}
    assert gpus_exported(samples) == {LIVE: 8, QUIET: 8}
    assert "reporting" in node_row(fleet.get("/status"), QUIET)


def test_a_gpu_that_fell_off_the_bus_stops_exporting_its_last_value(fleet):
    """The simulated ``faults`` node loses GPU 5 at 95 s: its agent reports on, GPU 5 only as
    failed. Past the bound, GPU 5's readings are gone from ``/metrics``; its failed status,
    still reported, stays; the node is up."""
    bound = fleet.service.store.staleness_seconds
    fleet.start(LIVE, "faults")  # the simulated source runs on the collector's clock
    fleet.round()
    fleet.set_now(fleet.now + 100)  # GPU 5 is lost from here on
    fleet.round()
    latest = fleet.service.store.latest("hw.gpu.utilization", max_age_seconds=float("inf"))
    seen = {str(i.attributes["hw.id"]): t for i, t in zip(latest.series, latest.times, strict=True)}
    (lost,) = [uuid for uuid, t in seen.items() if t < max(seen.values())]  # GPU 5 alone
    gap = max(seen.values()) - seen[lost]
    fleet.set_now(seen[lost] + bound + gap / 2)  # past the lost GPU's bound, within the others'

    samples = fleet.metrics()
    readings = {
        dict(labels)["gpu"] for name, labels in samples if name == "gpuwarden_gpu_utilization_ratio"
    }
    assert len(readings) == 7
    assert lost not in readings
    status = {
        dict(labels)["state"]: value
        for (name, labels), value in samples.items()
        if name == "gpuwarden_gpu_status" and dict(labels)["gpu"] == lost
    }
    assert status == {"ok": 0.0, "degraded": 0.0, "failed": 1.0}
    assert up(samples) == {LIVE: 1.0}
