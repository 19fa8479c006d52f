"""Several clusters on one database (migration 9): every store sees only its own cluster's rows.

Two stores, ``east`` and ``west``, open one database (a SQLite file, a real PostgreSQL) and
write records whose keys collide (the same job key, GPU, period, fingerprint, breaker scope,
cursor name): both are kept, neither store reads, changes or resolves the other's, and the
organisation-wide reads (``cluster=ALL_CLUSTERS``) see both. A database written before
clusters existed keeps its rows, as the ``default`` cluster's.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwarden.agent.schema import ConfigError
from gpuwarden.collector.accounting.report import report_costs
from gpuwarden.collector.config import CollectorConfig, load_collector_config
from gpuwarden.collector.remote_write.naming import labels, with_cluster
from gpuwarden.collector.storage.base import (
    ApprovalRecord,
    BreakerRecord,
    NotificationRecord,
    PageRecord,
    SilenceRecord,
)
from gpuwarden.collector.storage.clusters import ALL_CLUSTERS, check_scope
from gpuwarden.collector.storage.migrations import LATEST_VERSION, MIGRATIONS
from gpuwarden.collector.storage.postgres import PostgresStorage
from gpuwarden.collector.storage.records import (
    Event,
    EventKind,
    IncidentState,
    ModelDeployment,
)
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.web.status_clusters import clusters_context
from tests.storage_backends import Backend, SqlStorage, backend  # noqa: F401 - a fixture
from tests.test_collector_api import NOW as REPORT_NOW
from tests.test_collector_api import ROWS
from tests.test_storage import an_action, audit_entry, incident, make_job, migrate_to, row

NOW = 10_000.0


def open_as(backend: Backend, cluster: str) -> SqlStorage:  # noqa: F811
    """The store of one cluster's collector (``cluster:`` in its config)."""
    if backend.name == "sqlite":
        return SqliteStorage(backend.location, clock=lambda: NOW, cluster=cluster)
    return PostgresStorage(backend.location, clock=lambda: NOW, cluster=cluster)


@pytest.fixture
def pair(backend: Backend) -> Iterator[tuple[SqlStorage, SqlStorage]]:  # noqa: F811
    """Two clusters' stores on one database."""
    east = open_as(backend, "east")
    west = open_as(backend, "west")
    try:
        yield east, west
    finally:
        east.close()
        west.close()


def test_the_same_job_key_in_two_clusters_is_two_jobs(pair):
    east, west = pair
    assert east.upsert_jobs([make_job(team="east-team")]) == 1
    assert west.upsert_jobs([make_job(team="west-team")]) == 1  # not an update of east's
    assert [j.team for j in east.jobs()] == ["east-team"]
    assert [j.team for j in west.jobs()] == ["west-team"]
    assert west.job("slurm:c1:42").team == "west-team"
    assert east.upsert_jobs([make_job(team="east-team")]) == 0  # unchanged: its own row


def test_models_and_events_of_one_name_stay_apart(pair):
    east, west = pair
    assert east.upsert_model(ModelDeployment("llama", "v1", 2))
    assert west.upsert_model(ModelDeployment("llama", "v7", 9))
    assert east.model("llama") == ModelDeployment("llama", "v1", 2)
    assert [m.version for m in west.models()] == ["v7"]
    event = Event(NOW, EventKind.DEPLOY, "llama")
    assert east.record_event(event)
    assert west.record_event(event)  # the same (time, kind, subject): another cluster's
    assert not west.record_event(event)
    assert len(east.events()) == len(west.events()) == 1


def test_accounting_of_colliding_gpus_is_kept_apart_and_summed_org_wide(pair):
    east, west = pair
    east.write_rollups([row(gpu="GPU-a", team="east-team")])
    west.write_rollups([row(gpu="GPU-a", team="west-team", gpu_seconds_busy=30.0)])
    # Rewriting east's period replaces east's rows only.
    east.write_rollups([row(gpu="GPU-a", team="east-team", gpu_seconds_busy=50.0)])
    assert [r.gpu_seconds_busy for r in east.accounting_rows(since=0, until=NOW)] == [50.0]
    assert [r.gpu_seconds_busy for r in west.accounting_rows(since=0, until=NOW)] == [30.0]
    assert [r.team for r in east.accounting_rows(since=0, until=NOW, cluster="west")] == [
        "west-team"
    ]
    org = east.rollups(since=0, until=NOW, by=("cluster",), cluster=ALL_CLUSTERS)
    assert {t.group["cluster"]: t.gpu_seconds_busy for t in org} == {"east": 50.0, "west": 30.0}
    (whole,) = west.rollups(since=0, until=NOW, cluster=ALL_CLUSTERS)
    assert whole.gpu_seconds_busy == 80.0
    (own,) = west.rollups(since=0, until=NOW)
    assert own.gpu_seconds_busy == 30.0


def test_one_fingerprint_opens_one_incident_per_cluster_and_none_resolves_the_others(pair):
    east, west = pair
    east_id = east.open_incident(incident())
    west_id = west.open_incident(incident())
    assert east_id is not None
    assert west_id is not None
    assert east_id != west_id
    assert east.open_incident(incident()) is None  # dedup stays, within a cluster
    assert east.open_incident_for("idle:node1:GPU-a").incident_id == east_id
    assert west.open_incident_for("idle:node1:GPU-a").incident_id == west_id
    # East cannot read, resolve or update west's incident even by its id.
    assert east.incident(west_id) is None
    resolved = replace(incident(), incident_id=west_id, state=IncidentState.RESOLVED)
    assert not east.update_incident(resolved)
    assert west.incident(west_id).state is IncidentState.OPEN
    assert [i.incident_id for i in east.incidents(state=IncidentState.OPEN)] == [east_id]
    assert [i.incident_id for i in east.incidents(cluster=ALL_CLUSTERS)] == [east_id, west_id]
    assert [i.incident_id for i in east.incidents(cluster="west")] == [west_id]
    assert east.incident_counts(state=IncidentState.OPEN) == {"east": 1, "west": 1}
    assert west.incident_counts() == {"east": 1, "west": 1}


def test_actions_approvals_and_breakers_are_each_clusters_own(pair):
    east, west = pair
    action = replace(an_action(east), cooldown_until=NOW + 600)
    action_id = east.insert_action(action)
    assert action_id is not None
    assert west.action(action_id) is None
    assert west.actions() == []
    assert west.action_for(action.incident_id, action.idempotency_key) is None
    assert west.cooldown_until("slurm.requeue", "slurm:c1:42", dry_run=False) is None
    assert east.cooldown_until("slurm.requeue", "slurm:c1:42", dry_run=False) == NOW + 600
    stored = replace(action, action_id=action_id, state="running")
    assert not west.update_action(stored, expect_state="awaiting_approval")
    assert east.action(action_id).state == "awaiting_approval"

    east.insert_approval(ApprovalRecord(action_id, "ab" * 32, NOW, NOW + 3600))
    assert west.approval("ab" * 32) is None
    assert not west.use_approval("ab" * 32, now=NOW, used_by="mallory")
    assert west.revoke_approvals(action_id, now=NOW) == 0
    assert east.use_approval("ab" * 32, now=NOW, used_by="alice")

    tripped = BreakerRecord("global", "open", NOW, "too many actions", NOW)
    assert east.set_breaker(tripped, expect_state="closed")
    assert west.breaker("global") is None  # west's automation goes on
    assert west.set_breaker(replace(tripped, reason="west's own"), expect_state="closed")
    assert east.breaker("global").reason == "too many actions"


def test_audit_notifications_pages_cursors_and_silences_are_each_clusters_own(pair):
    east, west = pair
    east.append_audit(audit_entry(time_seconds=NOW))
    assert west.audit() == []
    assert west.count_logged(since=0, result="ok", dry_run=True) == (0, frozenset())
    assert east.count_logged(since=0, result="ok", dry_run=True)[0] == 1

    incident_id = east.open_incident(incident())
    east.save_notification(NotificationRecord(incident_id, "slack:#gpu", "firing", False, NOW))
    assert west.notifications(delivered=False) == []  # west's dispatcher never sends it
    assert len(east.notifications(delivered=False)) == 1

    page_id = east.add_page(PageRecord("slack:#gpu", {"summary": "approve?"}, NOW))
    assert west.pages(status="pending") == []
    west.save_page(PageRecord("slack:#gpu", {}, NOW, status="lost", page_id=page_id))
    assert east.pages()[0].status == "pending"  # west could not touch it

    east.set_cursor("pagerduty-audit", 7)
    assert west.cursor("pagerduty-audit") == 0
    west.set_cursor("pagerduty-audit", 2)
    assert east.cursor("pagerduty-audit") == 7

    silence = SilenceRecord({"node": "node1"}, NOW, NOW + 60, "alice", "maintenance")
    silence_id = east.add_silence(silence)
    assert west.silences() == []
    assert not west.expire_silence(silence_id, now=NOW + 1, actor="bob")
    assert east.silence(silence_id).ends_at == NOW + 60


def test_a_database_from_before_clusters_keeps_its_rows_as_the_default_clusters(
    backend: Backend,  # noqa: F811
):
    assert migrate_to(backend, list(MIGRATIONS[:7])) == list(range(1, 8))
    # Rows the previous gpuwarden wrote: no cluster column yet.
    backend.execute(
        "INSERT INTO accounting (period_start, period_seconds, job_key, gpu_uuid, node,"
        " gpu_seconds_allocated, gpu_seconds_busy, gpu_seconds_idle, gpu_seconds_unknown,"
        " written_at) VALUES (60, 60, 'slurm:c:1', 'GPU-a', 'n1', 60, 60, 0, 0, 1);"
        "INSERT INTO jobs VALUES ('slurm:c:1', 'slurm', '1', 'running', NULL, NULL, 'ml', 1,"
        " '[]', NULL, NULL, NULL, NULL, NULL, NULL, 0, '{}', 1, 1);"
        "INSERT INTO incidents (fingerprint, rule_id, state, severity, first_seen, last_seen,"
        " evidence, updated_at) VALUES ('fp', 'r', 'open', 'warning', 1, 1, '{}', 1);"
        "INSERT INTO events (time, kind, subject, attributes, recorded_at)"
        " VALUES (5, 'deploy', 'llama', '{}', 5);"
        "INSERT INTO models VALUES ('llama', 'v1', 1, NULL, NULL, NULL, '{}', 1);"
        "INSERT INTO breaker_state VALUES ('global', 'open', 'tripped', 1, 1);"
        "INSERT INTO cursors VALUES ('pagerduty-audit', 4, 1)"
    )
    with backend.open(lambda: NOW) as store:
        assert store.applied_migrations == list(range(8, LATEST_VERSION + 1))
        assert store.cluster == "default"
        assert [r.gpu_uuid for r in store.accounting_rows(since=0, until=NOW)] == ["GPU-a"]
        assert [j.team for j in store.jobs()] == ["ml"]
        assert store.open_incident_for("fp") is not None
        assert [e.subject for e in store.events()] == ["llama"]
        assert store.model("llama") == ModelDeployment("llama", "v1", 1)
        breaker = store.breaker("global")
        assert breaker is not None
        assert breaker.state == "open"
        assert store.cursor("pagerduty-audit") == 4
        assert store.record_event(Event(6, EventKind.DEPLOY, "llama"))  # ids go on rising
    with open_as(backend, "east") as east:
        assert east.events() == []
        assert east.breaker("global") is None
        assert east.accounting_rows(since=0, until=NOW) == []
        assert east.jobs() == []
        assert east.open_incident(incident(fingerprint="fp")) is not None  # its own


def test_cluster_names_are_label_values_and_star_means_every_cluster(tmp_path: Path):
    assert check_scope("*") == ALL_CLUSTERS
    assert check_scope("eu-west-1.a_b") == "eu-west-1.a_b"
    for bad in ("", "a b", "-east", "x" * 64, 'e"ast'):
        with pytest.raises(ValueError, match="is not a cluster name"):
            check_scope(bad)
        with pytest.raises(ValueError, match="is not a cluster name"):
            SqliteStorage(":memory:", cluster=bad)
    path = tmp_path / "collector.yaml"
    path.write_text("cluster: 'us east'\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="cluster: 'us east' is not a cluster name"):
        load_collector_config(path)
    path.write_text("cluster: us-east\ndatabase: /tmp/c.db\n", encoding="utf-8")
    config = load_collector_config(path)
    assert config.cluster == "us-east"
    # Two clusters' collectors on one SQLite file keep their windows apart.
    assert config.snapshot_path == Path("/tmp/c.db.us-east.window.npz")
    assert CollectorConfig(database=Path("/tmp/c.db")).snapshot_path == Path("/tmp/c.db.window.npz")


def test_remote_written_series_carry_the_writers_cluster():
    series = labels("hw_power_watts", [("host.name", "node-1"), ("cluster", "agent's")])
    assert dict(series)["cluster"] == "agent's"
    mine = labels("hw_power_watts", [("host.name", "node-1")], cluster="east")
    assert mine == (("__name__", "hw_power_watts"), ("cluster", "east"), ("host_name", "node-1"))
    assert dict(with_cluster(series, "west"))["cluster"] == "west"  # the writer's wins
    assert with_cluster(series, None) == series


ORG_TABLE = """\
cluster  team           GPU-h  busy GPU-h  idle GPU-h  no-data GPU-h    kWh  cost EUR  kg CO2e
east     (unallocated)   0.50        0.00        0.50           0.00  0.20      0.00     0.08
east     nlp             0.50        0.50        0.00           0.00  0.50      2.00     0.20
east     vision          1.50        1.00        0.25           0.25  1.00*     5.00*    0.40*
west     vision          0.50        0.50        0.00           0.00  0.50      2.00     0.20
-------  -------------  -----  ----------  ----------  -------------  -----  --------  -------
         TOTAL           3.00        2.00        0.75           0.25  2.20*     9.00*    0.88*
* partial: energy, cost or carbon missing for some accounting rows
"""


def test_the_cost_report_names_each_lines_cluster_when_there_are_several(pair):
    east, west = pair
    east.write_rollups(ROWS)
    # West's team "vision" is another team than east's: its line stays apart.
    west.write_rollups([replace(ROWS[1], team="vision", gpu_uuid="GPU-west")])
    out = io.StringIO()
    assert report_costs(west, since_seconds=86400, until=REPORT_NOW, by="team", fmt="table",
                        out=out) == 0  # fmt: skip
    assert out.getvalue() == ORG_TABLE
    out = io.StringIO()
    report_costs(east, since_seconds=86400, until=REPORT_NOW, by="team", fmt="csv", out=out,
                 cluster="west")  # fmt: skip
    assert out.getvalue().splitlines() == [
        "team,gpu_hours_allocated,gpu_hours_busy,gpu_hours_idle,gpu_hours_unknown,"
        "energy_kwh,cost,currency,carbon_kg,rows,incomplete_rows",
        "vision,0.5,0.5,0.0,0.0,0.5,2.0,EUR,0.2,1,0",
        "TOTAL,0.5,0.5,0.0,0.0,0.5,2.0,EUR,0.2,1,0",
    ]


def test_the_status_pages_cluster_table_appears_with_a_second_cluster(pair):
    east, west = pair
    east.write_rollups(ROWS)
    assert clusters_context(east, REPORT_NOW) == []  # one cluster: the page is its own
    west.write_rollups([replace(ROWS[1], gpu_uuid="GPU-west")])
    assert west.open_incident(incident()) is not None
    assert clusters_context(west, REPORT_NOW) == [
        # GPUs with accounting in the last 24 h: GPU-A0, GPU-A1, GPU-B0
        {"name": "east", "own": False, "gpus": 3, "gpu_hours": "2.50", "idle_hours": "0.75",
         "cost": "7.00 EUR", "open_incidents": 0},
        {"name": "west", "own": True, "gpus": 1, "gpu_hours": "0.50", "idle_hours": "0.00",
         "cost": "2.00 EUR", "open_incidents": 1},
    ]  # fmt: skip
