"""The JSON API through the real app: exact answers, 401 without a token, 400 naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from gpuwarden.collector.build import load_configured_rules
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import AccountingRow
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.web.api import MAX_ITEMS, add_readiness_problem
from gpuwarden.collector.web.app import create_app

NOW = 1_700_002_800.0  # a whole hour
TOKEN = "api-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ADMIN_TOKENS = TokenTable((credential(TOKEN, Role.ADMIN, "ops"),))
H100 = "NVIDIA H100 80GB HBM3"
GIB = 2**30


def _point(node: str, metric: str, value: float, **attrs: str | int | float | bool) -> NumberPoint:
    return NumberPoint(
        resource={"host.name": node},
        metric=metric,
        unit="",
        kind="gauge",
        monotonic=False,
        attributes=dict(attrs),
        time_unix_nano=int((NOW - 5) * 1e9),
        value=value,
    )


def fleet_points() -> list[NumberPoint]:
    """node-a: two H100s, fully reported; node-b: one L4 with utilisation only."""
    points = []
    for uuid, index, util, used, power, temp, state in (
        ("GPU-A0", 0, 0.75, 32 * GIB, 350.0, 61.0, "ok"),
        ("GPU-A1", 1, 0.0, 0, 70.0, 40.0, "degraded"),
    ):
        gpu: dict[str, str | int] = {"hw.id": uuid}
        info: dict[str, str | int] = {"hw.model": H100, "gpuwarden.gpu.index": index}
        points += [
            _point("node-a", "gpuwarden.gpu.info", 1.0, **gpu, **info),
            _point("node-a", "hw.gpu.utilization", util, **gpu, **{"hw.gpu.task": "general"}),
            _point("node-a", "hw.gpu.memory.usage", used, **gpu),
            _point("node-a", "hw.gpu.memory.limit", 80 * GIB, **gpu),
            _point("node-a", "hw.power", power, **gpu, **{"hw.type": "gpu"}),
            _point("node-a", "hw.temperature", temp, **gpu, **_sensor("gpu")),
            _point("node-a", "hw.temperature", temp + 10, **gpu, **_sensor("memory")),
        ]
        for name in ("ok", "degraded", "failed"):
            attrs = {**gpu, "hw.type": "gpu", "hw.state": name}
            points.append(_point("node-a", "hw.status", float(name == state), **attrs))
    # The agent saw a process of Slurm job 77 on GPU-A1 (no scheduler allocation covers it).
    process = {"hw.id": "GPU-A1", "gpuwarden.job.scheduler": "slurm", "gpuwarden.job.id": "77"}
    points.append(_point("node-a", "gpuwarden.gpu.process.memory.usage", GIB, **process))
    points += [
        _point("node-b", "gpuwarden.gpu.info", 1.0, **{"hw.id": "GPU-B0", "hw.model": "NVIDIA L4"}),
        _point("node-b", "hw.gpu.utilization", 0.25, **{"hw.id": "GPU-B0"}),
    ]
    return points


def _sensor(location: str) -> dict[str, str]:
    return {"hw.type": "gpu", "hw.sensor_location": location}


TRAIN = Job(
    key="api:train-1",
    scheduler="api",
    job_id="train-1",
    state=JobState.RUNNING,
    team="vision",
    model="resnet",
    gpus=1,
    allocations=(GpuAllocation("node-a", (0,)),),
    start_time=NOW - 1800,
)


def _row(
    period: float,
    job: str | None,
    team: str | None,
    model: str | None,
    gpu: str,
    seconds: tuple[float, float, float, float],
    energy_joules: float | None,
    cost: float,
    carbon_grams: float | None,
) -> AccountingRow:
    allocated, busy, idle, unknown = seconds
    return AccountingRow(
        period_start=period,
        period_seconds=3600,
        job_key=job,
        team=team,
        model=model,
        node="node-b" if gpu == "GPU-B0" else "node-a",
        gpu_uuid=gpu,
        price_tier="on-demand",
        gpu_seconds_allocated=allocated,
        gpu_seconds_busy=busy,
        gpu_seconds_idle=idle,
        gpu_seconds_unknown=unknown,
        energy_joules=energy_joules,
        cost=cost,
        currency="EUR",
        carbon_grams=carbon_grams,
    )


# fmt: off
ROWS = [
    # period, job, team, model, GPU, seconds allocated/busy/idle/unknown, J, EUR, g CO2e
    _row(NOW - 7200, "api:train-1", "vision", "resnet", "GPU-A0", (3600, 2700, 900, 0),
         3.6e6, 4.0, 400.0),
    _row(NOW - 7200, "api:infer-2", "nlp", "llama", "GPU-A1", (1800, 1800, 0, 0),
         1.8e6, 2.0, 200.0),
    _row(NOW - 7200, None, None, None, "GPU-A1", (1800, 0, 1800, 0), 0.72e6, 0.0, 80.0),
    # No energy counter on node-b: energy and carbon missing (a partial total), never 0.
    _row(NOW - 3600, "api:train-1", "vision", "resnet", "GPU-B0", (1800, 900, 0, 900),
         None, 1.0, None),
    # Outside the last 24 h.
    _row(NOW - 3 * 86400, "api:old", "vision", None, "GPU-A0", (3600, 0, 3600, 0),
         1e6, 4.0, 100.0),
]
# fmt: on


def fleet(storage: SqliteStorage | None = None) -> CollectorService:
    """A service on a fixed clock holding ``fleet_points``, ``TRAIN`` and ``ROWS``."""
    storage = storage if storage is not None else SqliteStorage(":memory:", clock=lambda: NOW)
    store = WindowStore(
        step_seconds=10,
        recent_seconds=3600,
        long_step_seconds=60,
        long_seconds=3600,
        clock=lambda: NOW,
    )
    service = CollectorService(
        store=store, storage=storage, registry=JobRegistry(storage), clock=lambda: NOW
    )
    assert service.accept(fleet_points(), "agents") == 0
    service.registry.put([TRAIN])
    storage.write_rollups(ROWS)
    return service


def collector_app(service: CollectorService) -> web.Application:
    """The real app, as the collector serves it (without the background loops)."""
    config = CollectorConfig(tokens=ADMIN_TOKENS)
    return create_app(config, service=service, background=False)


@pytest.fixture
def service():
    service = fleet()
    yield service
    service.storage.close()


@pytest.fixture
async def client(aiohttp_client, service):
    return await aiohttp_client(collector_app(service))


# --- authentication ---------------------------------------------------------------------------

ROUTES = [
    ("GET", "/v1/gpus"),
    ("GET", "/v1/jobs"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/models"),
    ("POST", "/v1/models"),
    ("GET", "/v1/events"),
    ("POST", "/v1/events"),
    ("GET", "/v1/accounting"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("header", [None, "Bearer wrong-token-0123456789", f"Basic {TOKEN}"])
async def test_every_v1_route_needs_a_valid_bearer_token(client, method, path, header):
    headers = {"Authorization": header} if header else {}
    resp = await client.request(method, path, headers=headers, json={})
    assert resp.status == 401
    assert resp.headers["WWW-Authenticate"] == "Bearer"
    assert await resp.json() == {"error": "missing or invalid bearer token"}


# --- GPUs and jobs ----------------------------------------------------------------------------


async def test_gpus(client):
    resp = await client.get("/v1/gpus", headers=AUTH)
    assert resp.status == 200
    a0 = {"node": "node-a", "uuid": "GPU-A0", "index": 0, "model": H100, "parent_uuid": None}
    a1 = {**a0, "uuid": "GPU-A1", "index": 1}
    b0 = {"node": "node-b", "uuid": "GPU-B0", "index": None, "model": "NVIDIA L4"}
    assert await resp.json() == {
        "gpus": [
            {**a0, "status": "ok", "utilization_ratio": 0.75, "memory_used_bytes": 32 * GIB,
             "memory_total_bytes": 80 * GIB, "power_watts": 350.0, "temperature_celsius": 61.0,
             "job": {"key": "api:train-1", "team": "vision", "model": "resnet"}},
            {**a1, "status": "degraded", "utilization_ratio": 0.0, "memory_used_bytes": 0,
             "memory_total_bytes": 80 * GIB, "power_watts": 70.0, "temperature_celsius": 40.0,
             "job": {"key": "slurm:77", "team": None, "model": None}},
            {**b0, "parent_uuid": None, "status": None, "utilization_ratio": 0.25,
             "memory_used_bytes": None, "memory_total_bytes": None, "power_watts": None,
             "temperature_celsius": None, "job": None},
        ]
    }  # fmt: skip


def _job_json(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "scheduler": "api", "name": None, "owner": None, "team": None, "gpus": 0,
        "allocations": [], "submit_time": None, "start_time": None, "end_time": None,
        "priority": None, "model": None, "price_tier": None, "restarts": 0, "labels": {},
        "eligible_time": None, "current": True,
    }  # fmt: skip
    return {**base, **fields}


async def test_post_jobs_then_list_and_filter(client, service):
    body = [
        {
            "job_id": "bench-9",
            "state": "pending",
            "team": "infra",
            "submit_time": NOW - 60,
            "labels": {"queue": "short"},
        },
        {
            "key": "api:serve-3",
            "job_id": "serve-3",
            "state": "running",
            "model": "llama",
            "price_tier": "spot",
            "priority": -5,
            "start_time": NOW - 600,
            "allocations": [{"node": "node-b", "uuids": ["GPU-B0"]}],
        },
    ]
    resp = await client.post("/v1/jobs", json=body, headers=AUTH)
    assert resp.status == 200
    assert await resp.json() == {"accepted": 2, "changed": 2}
    assert service.storage.job("api:serve-3").price_tier == "spot"  # persisted

    resp = await client.get("/v1/jobs?state=running", headers=AUTH)
    train = _job_json(key="api:train-1", job_id="train-1", state="running", team="vision",
                      model="resnet", gpus=1, start_time=NOW - 1800,
                      allocations=[{"node": "node-a", "indices": [0], "uuids": []}])  # fmt: skip
    serve = _job_json(key="api:serve-3", job_id="serve-3", state="running", model="llama",
                      price_tier="spot", priority=-5, start_time=NOW - 600, gpus=1,
                      allocations=[{"node": "node-b", "indices": [], "uuids": ["GPU-B0"]}],
                      )  # fmt: skip
    assert await resp.json() == {"jobs": [serve, train], "truncated": False}

    resp = await client.get("/v1/jobs?state=pending,running&limit=1", headers=AUTH)
    bench = _job_json(key="api:bench-9", job_id="bench-9", state="pending", team="infra",
                      submit_time=NOW - 60, labels={"queue": "short"})  # fmt: skip
    assert await resp.json() == {"jobs": [bench], "truncated": True}


J = {"job_id": "a", "state": "running"}
STRING = "expected a non-empty string of at most 256 characters"
SECONDS = "expected Unix seconds (not milliseconds) from 0 to 1e+11, got"
STATES = "pending, running, suspended, completed, failed, cancelled, preempted, requeued, unknown"
TOO_MANY = [{"job_id": str(i), "state": "running"} for i in range(MAX_ITEMS + 1)]


# fmt: off
INVALID_JOBS = [
    ({"state": "running"}, "job.job_id: is required"),
    ({**J, "job_id": ""}, f"job.job_id: {STRING}"),
    ({**J, "job_id": "x" * 257}, f"job.job_id: {STRING}"),
    ({**J, "job_id": 7}, f"job.job_id: {STRING}"),
    ({"job_id": "a"}, "job.state: is required"),
    ({**J, "state": "zombie"}, f"job.state: expected one of {STATES}, got 'zombie'"),
    ({**J, "key": "slurm:c:1"},
     "job.key: API jobs are keyed 'api:<job_id>', expected 'api:a'"),
    ({**J, "scheduler": "slurm"},
     "job.scheduler: must be 'api' (scheduler jobs come from the adapters)"),
    ({**J, "start_time": "yesterday"}, f"job.start_time: {SECONDS} 'yesterday'"),
    ({**J, "start_time": 1.7e12}, f"job.start_time: {SECONDS} 1700000000000.0"),
    ({**J, "start_time": 10, "end_time": 5}, "job.end_time: is before start_time"),
    ({**J, "gpus": -1}, "job.gpus: expected an integer from 0 to 1e+06, got -1"),
    ({**J, "gpus": 1.5}, "job.gpus: expected an integer from 0 to 1e+06, got 1.5"),
    ({**J, "gpus": True}, "job.gpus: expected an integer from 0 to 1e+06, got True"),
    ({**J, "price_tier": "free"},
     "job.price_tier: expected one of on-demand, spot, reserved, got 'free'"),
    ({**J, "allocations": {"node": "n"}},
     "job.allocations: expected a list of at most 1024 items"),
    ({**J, "allocations": [{"indices": [0]}]}, "job.allocations[0].node: is required"),
    ({**J, "allocations": [{"node": "n", "indices": [-1]}]},
     "job.allocations[0].indices: expected GPU indices (integers from 0 to 4095)"),
    ({**J, "allocations": [{"node": "n", "gpu": 0}]},
     "job.allocations[0]: unknown field(s) gpu"),
    ({**J, "labels": {"k": 1}}, "job.labels.k: expected a string of at most 256"),
    ({**J, "colour": "red", "size": 1}, "job: unknown field(s) colour, size"),
    ([J, "b"], "jobs[1]: expected a JSON object"),
    ([], f"body: expected 1 to {MAX_ITEMS} jobs per request, got 0"),
    (TOO_MANY, f"body: expected 1 to {MAX_ITEMS} jobs per request, got {MAX_ITEMS + 1}"),
]
# fmt: on


@pytest.mark.parametrize(("body", "error"), INVALID_JOBS)
async def test_post_jobs_validation_names_the_field(client, service, body, error):
    resp = await client.post("/v1/jobs", json=body, headers=AUTH)
    assert resp.status == 400
    assert await resp.json() == {"error": error}
    assert [job.key for job in service.registry.known()] == ["api:train-1"]  # nothing stored


async def test_post_body_must_be_json(client):
    resp = await client.post("/v1/jobs", data=b"job_id=a", headers=AUTH)
    assert resp.status == 415
    assert await resp.json() == {
        "error": "send jobs as application/json, not application/octet-stream"
    }
    headers = {**AUTH, "Content-Type": "application/json"}
    resp = await client.post("/v1/jobs", data=b'{"job_id": "a",', headers=headers)
    assert resp.status == 400
    assert (await resp.json())["error"].startswith("body: not valid JSON: ")
    resp = await client.post("/v1/events", data=b'{"time": NaN}', headers=headers)
    assert resp.status == 400
    assert await resp.json() == {"error": "body: not valid JSON: NaN is not JSON"}


async def test_bad_query_parameters_are_400(client):
    for path, error in [
        ("/v1/jobs?state=zombie", "state: unknown value(s) zombie (use pending, running, "
         "suspended, completed, failed, cancelled, preempted, requeued, unknown)"),
        ("/v1/jobs?limit=0", "limit: expected an integer from 1 to 10000, got '0'"),
        ("/v1/jobs?current=yes", "current: unknown value(s) yes (use true, false)"),
        ("/v1/events?since=yesterday", "since: invalid time 'yesterday': use 'now', Unix "
         "seconds, or a duration ago such as 24h"),
        ("/v1/accounting?by=colour", "by: unknown value(s) colour (use cluster, job_key, team, "
         "model, node, gpu_uuid, price_tier, project, gpu_model, job)"),
        ("/v1/accounting?by=team,team", "by: a dimension is repeated in 'team,team'"),
        ("/v1/accounting?since=1h&until=2h",
         "since: 1699999200.0 is not before until (1699995600.0)"),
    ]:  # fmt: skip
        resp = await client.get(path, headers=AUTH)
        assert resp.status == 400, path
        assert await resp.json() == {"error": error}, path


# --- models and events ------------------------------------------------------------------------


async def test_models(client):
    body = {
        "name": "llama",
        "version": "3.1-8b",
        "replicas": 4,
        "slo_latency_p99_seconds": 0.5,
        "slo_error_ratio": 0.001,
        "fallback_model": "llama-small",
        "labels": {"owner": "nlp"},
    }
    resp = await client.post("/v1/models", json=body, headers=AUTH)
    assert await resp.json() == {"accepted": 1, "changed": 1}
    resp = await client.post("/v1/models", json=[body, {"name": "resnet", "version": "50"}],
                             headers=AUTH)  # fmt: skip
    assert await resp.json() == {"accepted": 2, "changed": 1}  # llama unchanged
    resp = await client.get("/v1/models", headers=AUTH)
    resnet = {"name": "resnet", "version": "50", "replicas": 1, "slo_latency_p99_seconds": None,
              "slo_error_ratio": None, "fallback_model": None, "labels": {}}  # fmt: skip
    own = {"cluster": "default"}  # this collector's cluster (``?cluster=`` reads another)
    assert await resp.json() == {"models": [body | own, resnet | own]}

    resp = await client.post("/v1/models", json={"name": "x", "version": "1",
                             "slo_error_ratio": 2}, headers=AUTH)  # fmt: skip
    assert resp.status == 400
    assert await resp.json() == {
        "error": "model.slo_error_ratio: expected a number from 0 to 1, got 2"
    }


async def test_events(client):
    deploy = {"time": NOW - 300, "kind": "deploy", "subject": "llama",
              "attributes": {"version": "3.1-8b", "canary": True}}  # fmt: skip
    notice = {"kind": "preemption_notice", "subject": "node-b"}  # time defaults to now
    resp = await client.post("/v1/events", json=[deploy, notice], headers=AUTH)
    assert await resp.json() == {"accepted": 2, "recorded": 2}
    resp = await client.post("/v1/events", json=deploy, headers=AUTH)
    assert await resp.json() == {"accepted": 1, "recorded": 0}  # the same event twice: a no-op

    resp = await client.get("/v1/events", headers=AUTH)
    deploy = {**deploy, "cluster": "default"}  # this collector's (``?cluster=`` reads another)
    stored_notice = {**notice, "time": NOW, "attributes": {}, "cluster": "default"}
    assert await resp.json() == {"events": [deploy, stored_notice], "truncated": False}
    resp = await client.get("/v1/events?kind=deploy&since=1h", headers=AUTH)
    assert await resp.json() == {"events": [deploy], "truncated": False}
    resp = await client.get("/v1/events?subject=node-b", headers=AUTH)
    assert await resp.json() == {"events": [stored_notice], "truncated": False}
    resp = await client.get("/v1/events?since=1m", headers=AUTH)
    assert await resp.json() == {"events": [stored_notice], "truncated": False}

    resp = await client.post("/v1/events", json={"kind": "reboot", "subject": "n"}, headers=AUTH)
    assert resp.status == 400
    assert await resp.json() == {
        "error": "event.kind: expected one of deploy, rollback, scale, preemption_notice, "
        "node_drain, gpu_lost, got 'reboot'"
    }


# --- accounting -------------------------------------------------------------------------------


def _totals(
    hours: tuple[float, float, float, float],
    kwh: float,
    usd: float,
    kg: float,
    rows: int,
    incomplete: int = 0,
) -> dict[str, object]:
    allocated, busy, idle, unknown = hours
    return {
        "gpu_hours_allocated": allocated,
        "gpu_hours_busy": busy,
        "gpu_hours_idle": idle,
        "gpu_hours_unknown": unknown,
        "energy_kwh": kwh,
        "cost": usd,
        "currency": "EUR" if rows else None,
        "carbon_kg": kg,
        "rows": rows,
        "incomplete_rows": incomplete,
    }


async def test_accounting_by_team_and_job(client):
    resp = await client.get("/v1/accounting?since=24h&until=now&by=team,job", headers=AUTH)
    assert resp.status == 200
    assert await resp.json() == {
        "since": NOW - 86400,
        "until": NOW,
        "cluster": "default",
        "by": ["team", "job_key"],
        "groups": [
            {"group": {"team": None, "job_key": None},
             **_totals((0.5, 0.0, 0.5, 0.0), 0.2, 0.0, 0.08, 1)},
            {"group": {"team": "nlp", "job_key": "api:infer-2"},
             **_totals((0.5, 0.5, 0.0, 0.0), 0.5, 2.0, 0.2, 1)},
            {"group": {"team": "vision", "job_key": "api:train-1"},
             **_totals((1.5, 1.0, 0.25, 0.25), 1.0, 5.0, 0.4, 2, 1)},
        ],
        "total": _totals((2.5, 1.5, 0.75, 0.25), 1.7, 7.0, 0.68, 4, 1),
    }  # fmt: skip


async def test_accounting_window_in_unix_seconds(client):
    since, until = int(NOW - 3 * 86400), int(NOW - 2 * 86400)
    resp = await client.get(f"/v1/accounting?since={since}&until={until}", headers=AUTH)
    assert await resp.json() == {
        "since": since,
        "until": until,
        "cluster": "default",
        "by": [],
        "groups": [{"group": {}, **_totals((1.0, 0.0, 1.0, 0.0), 0.277778, 4.0, 0.1, 1)}],
        "total": _totals((1.0, 0.0, 1.0, 0.0), 0.277778, 4.0, 0.1, 1),
    }


# --- readiness --------------------------------------------------------------------------------


async def test_ready_without_a_token(client):
    resp = await client.get("/readyz")
    assert resp.status == 200
    assert await resp.json() == {"status": "ready"}


async def test_not_ready_with_startup_problems_or_no_storage(aiohttp_client, service):
    app = collector_app(service)
    add_readiness_problem(app, "rules/gpu.yaml: unknown detector 'spike'")
    client = await aiohttp_client(app)
    resp = await client.get("/readyz")
    assert resp.status == 503
    assert await resp.json() == {
        "status": "not ready",
        "problems": ["rules/gpu.yaml: unknown detector 'spike'"],
    }
    service.storage.close()
    resp = await client.get("/readyz")
    assert resp.status == 503
    assert await resp.json() == {
        "status": "not ready",
        "problems": [
            "rules/gpu.yaml: unknown detector 'spike'",
            "storage: :memory:: the store is closed",
        ],
    }
    resp = await client.get("/v1/models", headers=AUTH)  # a storage failure is a 503, not a 500
    assert resp.status == 503
    assert await resp.json() == {"error": "storage unavailable: :memory:: the store is closed"}


RULES_ONE_GOOD_ONE_BAD = """\
rules:
  - id: idle
    detector: idle_gpu
    severity: warning
    owner: me
    runbook: idle-gpu.md
  - id: too-short
    detector: idle_gpu
    severity: warning
    owner: me
    runbook: idle-gpu.md
    parameters: {window_seconds: -5}
"""


def skipped_rule_app(service: CollectorService, tmp_path: Path) -> tuple[web.Application, int]:
    """The real app as ``collector`` builds it with ``skip_bad_rules: true`` and one bad rule."""
    (tmp_path / "team.yaml").write_text(RULES_ONE_GOOD_ONE_BAD)
    config = CollectorConfig(tokens=ADMIN_TOKENS, rules=(tmp_path,), skip_bad_rules=True)
    rules = load_configured_rules(config)
    app = create_app(
        config,
        service=service,
        background=False,
        rule_problems=[str(p) for p in rules.problems],
    )
    return app, len(rules.rules)


async def test_ready_with_a_skipped_rule_and_the_body_says_which_and_why(
    aiohttp_client, service, tmp_path
):
    app, loaded = skipped_rule_app(service, tmp_path)
    assert loaded == 1  # the good rule runs
    client = await aiohttp_client(app)
    resp = await client.get("/readyz")
    assert resp.status == 200
    body = await resp.json()
    assert body["status"] == "ready"
    [line] = body["skipped_rules"]
    assert line.startswith(
        f"{tmp_path / 'team.yaml'}: rules[1] (too-short).parameters.window_seconds"
    )
    assert "must be between" in line
    assert "\n" not in line


async def test_a_skipped_rule_does_not_hide_what_makes_it_unready(
    aiohttp_client, service, tmp_path
):
    app, _ = skipped_rule_app(service, tmp_path)
    add_readiness_problem(app, "remediation: no notifier for slack:#x")
    client = await aiohttp_client(app)
    service.storage.close()
    resp = await client.get("/readyz")
    assert resp.status == 503
    body = await resp.json()
    assert body["problems"] == [
        "remediation: no notifier for slack:#x",
        "storage: :memory:: the store is closed",
    ]
    assert len(body["skipped_rules"]) == 1


async def test_a_posted_deploy_moves_its_models_record_and_an_older_one_does_not(client):
    """deploy_regression judges the version actually serving, read from the model's record:
    a deploy posted by a CD pipeline names the version now serving, unless a later change
    already did."""
    model = {"name": "chat", "version": "v1", "replicas": 2}
    assert (await client.post("/v1/models", json=model, headers=AUTH)).status == 200

    async def version() -> str:
        resp = await client.get("/v1/models", headers=AUTH)
        models = (await resp.json())["models"]
        return str(next(m["version"] for m in models if m["name"] == "chat"))

    deploy = {"time": NOW - 600, "kind": "deploy", "subject": "chat", "attributes": {"to": "v2"}}
    assert await (await client.post("/v1/events", json=deploy, headers=AUTH)).json() == {
        "accepted": 1,
        "recorded": 1,
    }
    assert await version() == "v2"
    rollback = {"time": NOW - 60, "kind": "rollback", "subject": "chat",
                "attributes": {"from": "v2", "to": "v1"}}  # fmt: skip
    await client.post("/v1/events", json=rollback, headers=AUTH)
    assert await version() == "v1"
    late = {"time": NOW - 300, "kind": "deploy", "subject": "chat", "attributes": {"version": "v3"}}
    await client.post(
        "/v1/events", json=late, headers=AUTH
    )  # reported late: older than the rollback
    assert await version() == "v1"
    other = {"time": NOW, "kind": "deploy", "subject": "unknown-model", "attributes": {"to": "v9"}}
    await client.post("/v1/events", json=other, headers=AUTH)  # no record: nothing to move
    models = await (await client.get("/v1/models", headers=AUTH)).json()
    assert "unknown-model" not in {m["name"] for m in models["models"]}
