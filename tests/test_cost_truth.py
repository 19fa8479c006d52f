"""``report costs`` against the truth of a simulated fleet: GPU-h, no-data GPU-h, kWh and cost.

Three real agents (``build_agent`` with a ``SimulatedSource``) feed a real collector
(``build_service`` from a config file with an EUR price table) for one simulated hour:

* ``steady`` (8 GPUs, on-demand) runs the whole hour but its agent is silent for ten minutes
  in the middle (a hung agent): that is no-data time, never billed;
* ``late`` (4 GPUs, spot, in a region with its own prices) joins after twenty minutes: nothing
  before its first sample is charged;
* ``early`` (8 GPUs, reserved; 4 train, 4 idle and held by no job) leaves after forty minutes:
  nothing after its last sample is charged.

Accounting runs every period as the collector's background task does, then the real
``gpuwarden report costs`` entry point prints JSON. The truth comes from the scenario alone: GPUs
× the time each node ran (a round every ``STEP`` seconds covers its ``STEP``), the power each
agent reported × that time, and the price table × the GPU-hours of the GPUs a job held.

The OTel SDK stamps points with the process' wall clock; the agents here live on a simulated
clock, so each real OTLP request is re-stamped with the round's simulated time before the
collector decodes it (nothing else in the request changes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from gpuwarden.agent.build import AgentRuntime, build_agent, job_hints
from gpuwarden.agent.config import AgentConfig, CollectorConfig, HttpConfig, ResourceConfig
from gpuwarden.agent.model import JobRef
from gpuwarden.agent.sources.scenario import H100_SXM, Assignment, Scenario, Training
from gpuwarden.agent.sources.simulated import SimulatedSource
from gpuwarden.cli import main
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import load_collector_config
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.store.types import AttrValue

T0 = 1_767_225_600.0  # a whole hour, so accounting periods start on it
STEP = 10.0  # the agents' interval and the store's slot
OFFSET = 3.0  # agents sample 3 s into each slot, as a real one would, off the slot edge
SPAN = 3600.0
PERIOD = 60.0
PRICES = {"on-demand": 3.70, "spot": 1.50, "reserved": 2.40}  # EUR per H100-hour
REGION_PRICES = {"eu-north-1": {"on-demand": 3.20, "spot": 1.20, "reserved": 3.20}}
CONFIG = """\
step_seconds: 10
accounting_period_seconds: 60
prices:
  currency: EUR
  models:
    H100: {on-demand: 3.70, spot: 1.50, reserved: 2.40}
  default: {on-demand: 1.00}
  regions:
    eu-north-1:
      models: {H100: {on-demand: 3.20, spot: 1.20}}
"""


@dataclass(frozen=True)
class Node:
    """One simulated node: when it runs, when its agent is silent, what its GPUs do."""

    name: str
    gpus: int
    tier: str
    start: float  # seconds after T0
    stop: float
    job_gpus: tuple[int, ...]
    silent: tuple[float, float] | None = None  # agent hung: no rounds in [a, b)
    region: str | None = None

    @property
    def price(self) -> float:
        """EUR per GPU-hour of this node's H100s, as the config above writes it."""
        return REGION_PRICES.get(self.region or "", PRICES)[self.tier]

    def ran(self, t: float) -> bool:
        return self.start <= t - T0 < self.stop

    def sends(self, t: float) -> bool:
        quiet = self.silent is not None and self.silent[0] <= t - T0 < self.silent[1]
        return self.ran(t) and not quiet

    @property
    def silent_seconds(self) -> float:
        return 0.0 if self.silent is None else self.silent[1] - self.silent[0]


NODES = (
    Node("steady", 8, "on-demand", 0, SPAN, tuple(range(8)), silent=(1200, 1800)),
    Node("late", 4, "spot", 1200, SPAN, tuple(range(4)), region="eu-north-1"),
    Node("early", 8, "reserved", 0, 2400, tuple(range(4))),
)


@dataclass
class Clock:
    """The simulated wall clock every part reads."""

    now: float = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class Agent:
    """A real agent on a simulated node, and the power it reported (the energy truth)."""

    node: Node
    runtime: AgentRuntime
    reported_watts: list[float] = field(default_factory=list)


def job_id(node: Node) -> str:
    return f"7{NODES.index(node)}"


def scheduler_job(node: Node) -> Job:
    """The job as Slurm reports it: the node's ``job_gpus`` from its start (to its stop)."""
    done = node.stop < SPAN
    return Job(
        key=f"slurm:sim:{job_id(node)}",
        scheduler="slurm",
        job_id=job_id(node),
        state=JobState.COMPLETED if done else JobState.RUNNING,
        team=f"team-{node.name}",
        gpus=len(node.job_gpus),
        start_time=T0 + node.start,
        end_time=T0 + node.stop if done else None,
        allocations=(GpuAllocation(node.name, node.job_gpus),),
    )


def make_agent(node: Node, clock: Clock, tmp: Path) -> Agent:
    job = JobRef(scheduler="slurm", job_id=job_id(node))
    scenario = Scenario(
        node_name=node.name,
        gpu_count=node.gpus,
        assignments=(Assignment(node.job_gpus, Training(job=job)),),
    )
    sim = SimulatedSource(scenario, clock=clock)
    config = AgentConfig(
        node_name=node.name,
        interval_seconds=STEP,
        source="simulated",
        resource=ResourceConfig(price_tier=node.tier, region=node.region),  # type: ignore[arg-type]
        collector=CollectorConfig(endpoint=None),  # the test hands requests over: no spool
        http=HttpConfig(enabled=False),
    )
    runtime = build_agent(
        config,
        source=(sim, job_hints(sim.jobs), sim.events),
        clock=clock,
        with_host=False,
        machine_id_file=tmp / "no-machine-id",
    )
    return Agent(node, runtime)


def restamped(payload: bytes, time_ns: int, start_ns: int) -> bytes:
    """The agent's OTLP request with every point at the simulated round's time."""
    request = ExportMetricsServiceRequest.FromString(payload)
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                data = getattr(metric, str(metric.WhichOneof("data")))
                for point in data.data_points:
                    point.time_unix_nano = time_ns
                    if point.start_time_unix_nano:
                        point.start_time_unix_nano = start_ns
    return request.SerializeToString()


def run_fleet(service: CollectorService, agents: list[Agent], clock: Clock) -> None:
    """One simulated hour: a round per agent per ``STEP``, accounting every ``PERIOD``."""
    for k in range(int(SPAN / STEP)):
        clock.now = T0 + k * STEP + OFFSET
        for agent in agents:
            if not agent.node.ran(clock.now):
                continue
            if agent.node.sends(clock.now):
                result = agent.runtime.agent.sample_once()
                payload = agent.runtime.agent.telemetry.collect_otlp()
                assert payload is not None
                body = restamped(payload, int(clock.now * 1e9), int(T0 * 1e9))
                accepted = service.accept_payload(body, "application/x-protobuf", agent.node.name)
                assert accepted.rejected == 0
                watts = [g.power_watts for g in result.snapshot.gpus if g.power_watts]
                agent.reported_watts.append(sum(watts) / len(watts))
        if (k + 1) % int(PERIOD / STEP) == 0:
            service.run_accounting(now=T0 + (k + 1) * STEP + OFFSET)
    clock.now = T0 + SPAN + OFFSET
    service.run_accounting(now=clock.now)


@dataclass(frozen=True)
class Truth:
    gpu_hours: float  # with data
    no_data_gpu_hours: float
    kwh: float
    cost: float


def truth(agent: Agent) -> Truth:
    node = agent.node
    reporting = node.stop - node.start - node.silent_seconds
    mean_watts = sum(agent.reported_watts) / len(agent.reported_watts)
    return Truth(
        gpu_hours=node.gpus * reporting / 3600,
        no_data_gpu_hours=node.gpus * node.silent_seconds / 3600,
        kwh=node.gpus * mean_watts * (node.stop - node.start) / 3.6e6,
        cost=len(node.job_gpus) * reporting / 3600 * node.price,
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Agent]]:
    tmp_path = tmp_path_factory.mktemp("fleet")
    config_path = tmp_path / "collector.yaml"
    db = tmp_path / "collector.db"
    config_path.write_text(CONFIG + f"database: {db}\n", encoding="utf-8")
    clock = Clock()
    service = build_service(load_collector_config(config_path), clock=clock)
    agents = [make_agent(node, clock, tmp_path) for node in NODES]
    service.registry.put([scheduler_job(node) for node in NODES])
    try:
        run_fleet(service, agents, clock)
    finally:
        for agent in agents:
            agent.runtime.agent.telemetry.shutdown()
        service.storage.close()
    return db, config_path, agents


def report(db: Path, by: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    argv = ["report", "costs", "--db", str(db), "--by", by, "--format", "json"]
    argv += ["--since", f"{SPAN:.0f}s", "--until", f"{T0 + SPAN:.0f}"]
    capsys.readouterr()
    assert main(argv) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


COST_KEY = "cost"


def test_report_costs_matches_the_scenario_truth(fleet, capsys):
    db, _, agents = fleet
    doc = report(db, "node", capsys)
    assert doc["currency"] == "EUR"
    lines = {g["group"]: g for g in doc["groups"]}  # type: ignore[attr-defined]
    want = {a.node.name: truth(a) for a in agents}
    total = Truth(*(sum(getattr(t, f) for t in want.values()) for f in Truth.__dataclass_fields__))
    measured: dict[str, tuple[float, float, float, float]] = {}
    for name, line in [*lines.items(), ("TOTAL", doc["total"])]:
        measured[name] = (
            line["gpu_hours_allocated"],
            line["gpu_hours_unknown"],
            line["energy_kwh"],
            line[COST_KEY],
        )
    with capsys.disabled():
        print(f"\n{'group':8} {'':9} {'GPU-h':>8} {'no-data':>8} {'kWh':>8} {'cost':>8}")
        for name, t in [*want.items(), ("TOTAL", total)]:
            got = measured.get(name, (float("nan"),) * 4)
            print(f"{name:8} {'measured':9} " + " ".join(f"{v:8.4f}" for v in got))
            print(f"{'':8} {'truth':9} " + " ".join(f"{v:8.4f}" for v in vars(t).values()))
    for name, t in [*want.items(), ("TOTAL", total)]:
        gpu_h, no_data, kwh, cost = measured[name]
        assert gpu_h == pytest.approx(t.gpu_hours, rel=0.01), name
        assert no_data == pytest.approx(t.no_data_gpu_hours, rel=0.01, abs=1e-9), name
        assert kwh == pytest.approx(t.kwh, rel=0.01), name
        assert cost == pytest.approx(t.cost, rel=0.01), name
    for agent in agents:  # never more GPU time than the node had, nor more power than its TDP
        node, gpu_h, no_data, kwh, _ = agent.node, *measured[agent.node.name]
        assert gpu_h + no_data <= node.gpus * (node.stop - node.start) / 3600 * 1.0001
        assert kwh * 1000 / (gpu_h + no_data) <= H100_SXM.tdp_watts


def test_no_data_is_never_billed_to_a_job(fleet, capsys):
    db, _, agents = fleet
    doc = report(db, "job", capsys)
    jobs = {g["group"]: g for g in doc["groups"]}  # type: ignore[attr-defined]
    jobs.pop("(unallocated)")
    assert set(jobs) == {scheduler_job(a.node).key for a in agents}
    for group in jobs.values():
        assert group["gpu_hours_unknown"] == 0
    billed = sum(g[COST_KEY] for g in jobs.values())
    assert billed == pytest.approx(sum(truth(a).cost for a in agents), rel=0.01)


def test_a_node_that_ran_156_seconds_is_charged_156_seconds(tmp_path, capsys):
    """The issue's case: an 8-GPU node that ran 156 s was charged 1.47 GPU-h (the ten minutes
    before its first sample counted as no data); at most 8 x 156 s (+ one slot) is possible."""
    config_path = tmp_path / "collector.yaml"
    config_path.write_text(CONFIG + f"database: {tmp_path / 'c.db'}\n", encoding="utf-8")
    clock = Clock(T0 + 1800)
    service = build_service(load_collector_config(config_path), clock=clock)
    resource: dict[str, AttrValue] = {"host.name": "brief"}
    try:
        for k in range(16):  # a round every 10 s from 1803 s to 1953 s: it ran 156 s
            clock.now = T0 + 1803 + k * STEP
            ns = int(clock.now * 1e9)
            batch = []
            for gpu in range(8):
                attrs: dict[str, AttrValue] = {"hw.id": f"GPU-brief-{gpu}"}
                info = {**attrs, "hw.model": H100_SXM.name, "gpuwarden.gpu.index": gpu}
                energy = {**attrs, "hw.type": "gpu"}
                batch += [
                    NumberPoint(
                        resource, "hw.gpu.utilization", "1", "gauge", False, attrs, ns, 0.9
                    ),
                    NumberPoint(resource, "gpuwarden.gpu.info", "1", "gauge", False, info, ns, 1.0),
                    NumberPoint(resource, "hw.energy", "J", "sum", True, energy, ns, 600.0 * k),
                ]
            assert service.accept(batch, "brief") == 0
            service.run_accounting(now=clock.now)
        for minute in range(1, 12):  # the collector keeps recomputing after the node is gone
            service.run_accounting(now=clock.now + 60 * minute)
        (total,) = service.storage.rollups(since=T0, until=T0 + SPAN)
    finally:
        service.storage.close()
    charged_h = (total.gpu_seconds_allocated + total.gpu_seconds_unknown) / 3600
    with capsys.disabled():
        print(f"\n156 s node: charged {charged_h:.4f} GPU-h, at most {8 * 156 / 3600:.4f}")
    assert 8 * 150 / 3600 <= charged_h <= 8 * (156 + STEP) / 3600
    assert total.gpu_seconds_unknown == 0
    # 60 W per GPU (60 J per 10 s round): energy per GPU-hour is the power the GPUs drew
    assert total.energy_joules == pytest.approx(60.0 * total.gpu_seconds_allocated)
