"""Two clusters, one database: two collectors whose agents' node names and job ids collide.

``east`` and ``west`` each run a real collector (``CollectorService`` served on loopback) with
its ``cluster:``, on one SQLite file and on one real PostgreSQL. Each is fed by real agents
(simulated GPUs, the OTel SDK, OTLP over HTTP) named ``node-1`` and ``node-2`` in both
clusters, so their GPU UUIDs collide too, and each knows a Slurm job ``123`` on its ``node-1``.

* Incidents stay apart: the shipped ``node-silent`` rule opens one incident per cluster for
  the same fingerprint, and east's node coming back resolves east's incident only.
* Each collector's loops touch only its rows: west's accounting and incident rows, read with a
  connection of our own, are the same before and after east's detection and accounting run.
* The organisation-wide views: ``report costs`` over every cluster equals the sum of the
  per-cluster reports; ``/status`` and ``/v1/accounting?cluster=*`` show both clusters.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.agent.build import AgentRuntime, build_agent
from gpuwarden.agent.config import AgentConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.config import CollectorConfig as AgentLink
from gpuwarden.collector.accounting.report import add_report_parser, run_report
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import RuleSet
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import (
    Event,
    EventKind,
    Incident,
    IncidentState,
    ModelDeployment,
)
from gpuwarden.collector.storage.sqlite import SqliteStorage
from tests.collector_server import TOKEN, CollectorThread
from tests.storage_backends import BACKENDS, Backend, backend_for
from tests.test_collector_api import AUTH as API_AUTH
from tests.test_collector_api import NOW as API_NOW
from tests.test_collector_api import collector_app
from tests.test_collector_api import fleet as api_fleet
from tests.test_remediate_web import TOKEN as WEB_TOKEN
from tests.test_remediate_web import build, make_app
from tests.test_storage import an_action, incident

NODE1, NODE2 = "node-1", "node-2"
CLUSTERS = ("east", "west")
RESOLVE_CYCLES = 3  # the incident tracker's resolve_after


def slurm_job(cluster: str, start: float) -> Job:
    """Slurm job 123 on node-1: the same key in both clusters, a team of each one's own."""
    return Job(
        key="slurm:gpu:123",
        scheduler="slurm",
        job_id="123",
        state=JobState.RUNNING,
        team=f"team-{cluster}",
        gpus=8,
        allocations=(GpuAllocation(NODE1, tuple(range(8))),),
        start_time=start,
    )


@dataclasses.dataclass
class Cluster:
    """One cluster's collector, its detection engine and its agents."""

    name: str
    service: CollectorService
    collector: CollectorThread
    engine: DetectionEngine
    agents: dict[str, AgentRuntime] = dataclasses.field(default_factory=dict)

    def last_seen(self) -> dict[str, float]:
        return self.service.store.last_seen_by_host()

    def silent_incidents(self) -> list[Incident]:
        return [
            i
            for i in self.service.storage.incidents(state=IncidentState.OPEN)
            if i.rule_id == "node-silent"
        ]

    def get(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.collector.port}{path}"
        with urllib.request.urlopen(url, timeout=10) as response:
            text: str = response.read().decode()
            return text


class Org:
    """Both clusters on one database, on one injected clock (the agents stamp wall time)."""

    def __init__(self, tmp: Path, backend: Backend, stack: ExitStack) -> None:
        self.tmp, self.backend = tmp, backend
        self.clock = [time.time()]
        rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
        silent = rules.get("node-silent")
        assert silent is not None  # the shipped rule, as shipped
        self.clusters: dict[str, Cluster] = {}
        for name in CLUSTERS:
            where: dict[str, Any] = (
                {"database": Path(backend.location)}
                if backend.name == "sqlite"
                else {"database_url": backend.location}
            )
            config = CollectorConfig(cluster=name, snapshot_seconds=0, **where)
            service = build_service(config, clock=lambda: self.clock[0])
            stack.callback(service.storage.close)
            service.registry.put([slurm_job(name, self.clock[0] - 600)])
            collector = stack.enter_context(CollectorThread(service=service, unauthenticated=True))
            engine = DetectionEngine(
                service.detection_view,
                RuleSet((silent,)),
                storage=service.storage,
                clock=lambda: self.clock[0],
            )
            self.clusters[name] = Cluster(name, service, collector, engine)
        stack.callback(self.stop_all)

    @property
    def east(self) -> Cluster:
        return self.clusters["east"]

    @property
    def west(self) -> Cluster:
        return self.clusters["west"]

    def start(self, cluster: Cluster, node: str, life: int = 0) -> None:
        config = AgentConfig(
            node_name=node,
            source="simulated",
            scenario="training",
            collector=AgentLink(endpoint=cluster.collector.endpoint, token=TOKEN),
            spool=SpoolConfig(directory=self.tmp / f"spool-{cluster.name}-{node}-{life}"),
            http=HttpConfig(enabled=False),
        )
        cluster.agents[node] = build_agent(
            config, with_host=False, machine_id_file=self.tmp / "machine-id"
        )

    def stop(self, cluster: Cluster, node: str) -> None:
        assert cluster.agents.pop(node).agent.shutdown(flush_timeout_seconds=5)

    def stop_all(self) -> None:
        for cluster in self.clusters.values():
            for node in list(cluster.agents):
                self.stop(cluster, node)

    def round(self) -> None:
        """One sample round of every running agent, pushed and acknowledged."""
        for cluster in self.clusters.values():
            for runtime in cluster.agents.values():
                runtime.agent.sample_once()
                assert runtime.agent.sender is not None
                assert runtime.agent.sender.flush(timeout_seconds=10)

    def newest(self) -> float:
        return max(t for c in self.clusters.values() for t in c.last_seen().values())

    def silence(self, cluster: Cluster, node: str) -> None:
        """Stop ``node``'s agent, let the others report once more, and set the clock just past
        the stopped node's staleness bound (every live node stays within it)."""
        self.stop(cluster, node)
        self.round()
        stopped = cluster.last_seen()[node]
        live = min(
            t for c in self.clusters.values() for n, t in c.last_seen().items() if n in c.agents
        )
        gap = live - stopped
        assert gap > 0
        self.clock[0] = stopped + cluster.service.store.staleness_seconds + gap / 2

    def cycle(self, *clusters: Cluster) -> None:
        for cluster in clusters:
            assert cluster.engine.run_cycle().failed_rules == ()

    def rows(self, cluster: str) -> dict[str, list[tuple[Any, ...]]]:
        """A cluster's accounting and incident rows, read with a connection of our own."""
        return {
            table: self.backend.query(
                f"SELECT * FROM {table} WHERE cluster = '{cluster}' ORDER BY 1, 2, 3, 4"  # noqa: S608 - test constants
            )
            for table in ("accounting", "incidents", "jobs")
        }


@pytest.fixture(params=BACKENDS)
def org(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Org]:
    backend = backend_for(request.param, request, tmp_path)
    with ExitStack() as stack:
        yield Org(tmp_path, backend, stack)


def report(db: str, until: float, *extra: str) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="gpuwarden")
    add_report_parser(parser.add_subparsers(dest="command", required=True))
    argv = ["report", "costs", "--db", db, "--by", "node", "--format", "json"]
    args = parser.parse_args([*argv, "--since", "1h", "--until", str(until), *extra])
    out = io.StringIO()
    assert run_report(args, out=out) == 0
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def test_two_clusters_share_one_database_and_never_touch_each_others_rows(org):
    east, west = org.east, org.west
    for cluster in (east, west):
        org.start(cluster, NODE1)
        org.start(cluster, NODE2)
    org.round()
    org.round()
    org.clock[0] = org.newest()
    org.cycle(east, west)
    assert east.silent_incidents() == west.silent_incidents() == []

    # East's node-1 goes silent: east opens an incident, west (whose node-1 reports) does not.
    org.silence(east, NODE1)
    org.cycle(east, west)
    (east_incident,) = east.silent_incidents()
    assert east_incident.evidence["node"] == NODE1
    assert west.silent_incidents() == []

    # West's node-1 goes silent too: the same fingerprint, west's own incident.
    org.silence(west, NODE1)
    org.cycle(east, west)
    (west_incident,) = west.silent_incidents()
    assert west_incident.fingerprint == east_incident.fingerprint
    assert west_incident.incident_id != east_incident.incident_id
    assert [i.incident_id for i in east.silent_incidents()] == [east_incident.incident_id]

    # East's node-1 comes back; east's cycles resolve east's incident, and leave west's rows be.
    org.start(east, NODE1, life=1)
    west_before = org.rows("west")
    for _ in range(RESOLVE_CYCLES):
        org.round()
        org.clock[0] = max(east.last_seen().values())
        org.cycle(east)
    assert east.silent_incidents() == []
    assert east.service.storage.incident(east_incident.incident_id).state is IncidentState.RESOLVED
    assert [i.incident_id for i in west.silent_incidents()] == [west_incident.incident_id]
    assert org.rows("west") == west_before

    # Accounting: two minutes on, each collector recomputes its own periods only.
    end = org.newest() + 120
    org.clock[0] = end
    assert west.service.run_accounting() > 0
    west_before = org.rows("west")
    assert east.service.run_accounting() > 0
    org.cycle(east)
    assert org.rows("west") == west_before
    east_gpus = {r.gpu_uuid for r in east.service.storage.accounting_rows(since=0, until=end)}
    west_gpus = {r.gpu_uuid for r in west.service.storage.accounting_rows(since=0, until=end)}
    assert east_gpus & west_gpus  # the GPUs' UUIDs collide (named after their node)

    # The organisation's report is the sum of the clusters' reports; lines name their cluster.
    everyone = report(org.backend.location, end)
    apart = {name: report(org.backend.location, end, "--cluster", name) for name in CLUSTERS}
    for measure in ("gpu_hours_allocated", "gpu_hours_busy", "gpu_hours_idle", "rows"):
        parts = [apart[name]["total"][measure] for name in CLUSTERS]
        assert measure == "gpu_hours_idle" or all(part > 0 for part in parts), measure
        assert everyone["total"][measure] == pytest.approx(sum(parts), abs=1e-5), measure
    assert sorted((g["cluster"], g["group"]) for g in everyone["groups"]) == [
        (name, node) for name in CLUSTERS for node in (NODE1, NODE2)
    ]
    assert all("cluster" not in g for g in apart["east"]["groups"])  # one cluster: no column

    # The JSON API's ?cluster= and the status page's table, seen from east's collector.
    until = f"&since={int(end - 3600)}&until={int(end)}"
    org_wide = json.loads(east.get(f"/v1/accounting?cluster=*&by=cluster{until}"))
    hours = {g["group"]["cluster"]: g["gpu_hours_allocated"] for g in org_wide["groups"]}
    assert hours == {
        name: pytest.approx(apart[name]["total"]["gpu_hours_allocated"], abs=1e-5)
        for name in CLUSTERS
    }
    west_only = json.loads(east.get(f"/v1/accounting?cluster=west{until}"))
    assert west_only["total"]["rows"] == apart["west"]["total"]["rows"]
    page = east.get("/status")
    assert '<section id="clusters">' in page
    assert "east <span" in page
    assert "(this collector)" in page
    assert '<tr class="cluster"><td>west</td>' in page


async def test_the_incidents_api_reads_one_cluster_another_or_every_one(aiohttp_client, tmp_path):
    setup = build(tmp_path)  # this collector: the default cluster
    with SqliteStorage(setup.path, cluster="west") as west:
        own = setup.storage.open_incident(incident())
        theirs = west.open_incident(incident())  # the same fingerprint, west's own
        client = await aiohttp_client(make_app(setup))
        auth = {"Authorization": f"Bearer {WEB_TOKEN}"}

        async def listed(query: str) -> list[tuple[str, int]]:
            resp = await client.get(f"/v1/incidents{query}", headers=auth)
            assert resp.status == 200, await resp.text()
            return [(i["cluster"], i["incident_id"]) for i in (await resp.json())["incidents"]]

        assert await listed("") == [("default", own)]
        assert await listed("?cluster=west") == [("west", theirs)]
        assert await listed("?state=open&cluster=*") == [("default", own), ("west", theirs)]
        resp = await client.get("/v1/incidents?cluster=no%20such", headers=auth)
        assert resp.status == 400
        assert "is not a cluster name" in (await resp.json())["error"]
    setup.storage.close()


async def test_the_actions_api_reads_one_cluster_another_or_every_one(aiohttp_client, tmp_path):
    setup = build(tmp_path)  # this collector: the default cluster
    with SqliteStorage(setup.path, cluster="west") as west:
        own = setup.storage.insert_action(an_action(setup.storage))
        theirs = west.insert_action(an_action(west))  # the same key, west's own
        client = await aiohttp_client(make_app(setup))
        auth = {"Authorization": f"Bearer {WEB_TOKEN}"}

        async def listed(query: str) -> list[tuple[str, int]]:
            resp = await client.get(f"/v1/actions{query}", headers=auth)
            assert resp.status == 200, await resp.text()
            return [(a["cluster"], a["action_id"]) for a in (await resp.json())["actions"]]

        assert await listed("") == [("default", own)]
        assert await listed("?cluster=west") == [("west", theirs)]
        assert await listed("?cluster=*") == [("west", theirs), ("default", own)]  # newest first
        assert await listed("?cluster=*&limit=1") == [("west", theirs)]
        resp = await client.get("/v1/actions?cluster=a%20b", headers=auth)
        assert resp.status == 400
        assert "is not a cluster name" in (await resp.json())["error"]
    setup.storage.close()


async def test_the_models_and_events_api_read_one_cluster_another_or_every_one(
    aiohttp_client, tmp_path
):
    path = tmp_path / "org.db"
    service = api_fleet(SqliteStorage(path, clock=lambda: API_NOW))
    with SqliteStorage(path, cluster="west", clock=lambda: API_NOW) as west:
        for storage, version in ((service.storage, "1"), (west, "2")):
            storage.upsert_model(ModelDeployment(name="llama", version=version, replicas=1))
            storage.record_event(Event(API_NOW - 60, EventKind.DEPLOY, "llama", {"v": version}))
        west.record_event(Event(API_NOW - 120, EventKind.SCALE, "llama"))
        client = await aiohttp_client(collector_app(service))

        async def listed(path: str) -> list[tuple[str, str]]:
            resp = await client.get(path, headers=API_AUTH)
            assert resp.status == 200, await resp.text()
            body = await resp.json()
            rows = body.get("models") or body["events"]
            return [(r["cluster"], r.get("version") or r["kind"]) for r in rows]

        assert await listed("/v1/models") == [("default", "1")]
        assert await listed("/v1/models?cluster=west") == [("west", "2")]
        assert await listed("/v1/models?cluster=*") == [("default", "1"), ("west", "2")]
        assert await listed("/v1/events?cluster=west") == [("west", "scale"), ("west", "deploy")]
        assert await listed("/v1/events?cluster=*") == [
            ("west", "scale"),  # oldest first across clusters
            ("default", "deploy"),
            ("west", "deploy"),
        ]
        for route in ("/v1/models", "/v1/events"):
            resp = await client.get(f"{route}?cluster=%2A%2A", headers=API_AUTH)
            assert resp.status == 400
            assert "is not a cluster name" in (await resp.json())["error"]
    service.storage.close()
