"""The collector's JSON API: GPUs, jobs, models, events, accounting, and readiness.

Every ``/v1`` route needs a valid bearer token (the authentication middleware answers 401
otherwise). Handlers parse and validate, call
the service, and translate domain errors: 400 names the offending field (``jobs[3].state: ...``),
415 for a body that is not JSON, 503 when the storage is unavailable. Errors are
``{"error": "..."}``. Storage calls block, so they run in worker threads.

``GET /readyz`` answers without a token, like ``/healthz``, because probes carry none: 200 when
the storage answers a trivial query and nothing is listed under :data:`READINESS`, else 503 with
the reasons. Start-up checks report there with :func:`add_readiness_problem`. Rules skipped under
``skip_bad_rules`` (:data:`SKIPPED_RULES`) are listed under ``skipped_rules``, one line each, but
do not make it 503: the collector runs the other rules, and a probe that never turns ready would
only keep it out of service.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from aiohttp import web

from gpuwarden.collector.accounting.prices import TIERS
from gpuwarden.collector.accounting.report import (
    CostLine,
    cost_line,
    line_record,
    parse_time,
    sum_lines,
)
from gpuwarden.collector.detect.readiness import summary
from gpuwarden.collector.ha.leadership import LeaderStatus
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.storage.base import StorageError
from gpuwarden.collector.storage.clusters import check_scope
from gpuwarden.collector.storage.records import (
    ROLLUP_DIMENSIONS,
    Event,
    EventKind,
    ModelDeployment,
    RollupDimension,
    dump_json,
)
from gpuwarden.collector.web.gpus import GPU_READINGS, GpuStatus, gpu_statuses
from gpuwarden.collector.web.keys import (
    LEADERSHIP,
    OPERATORS,
    PROBE,
    READERS,
    READINESS,
    RULE_BOARD,
    SERVICE,
    SKIPPED_RULES,
    Handler,
    add_route,
)
from gpuwarden.collector.web.scope import per_cluster, scope_of

log = logging.getLogger(__name__)

MAX_ITEMS = 1000  # jobs, models or events per request
MAX_STRING = 256
MAX_LIST = 1024  # allocations per job, indices or uuids per allocation, labels per object
MAX_ATTRIBUTES_CHARS = 16 * 1024
MAX_UNIX_SECONDS = 1e11  # year 5138: larger values are milliseconds sent by mistake
READY_TIMEOUT_SECONDS = 2.0
T = TypeVar("T")


class ApiError(Exception):
    """A request we refuse, with its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _answering(handler: Callable[[web.Request], Awaitable[web.Response]]) -> Handler:
    """The handler with its domain errors as answers: ``ApiError`` as is, storage as 503."""

    async def wrapped(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except ApiError as exc:
            return _error(exc.status, exc.message)
        except StorageError as exc:
            log.warning("storage unavailable: %s", exc)
            return _error(503, f"storage unavailable: {exc}")

    return wrapped


class _Fields:
    """One JSON object under validation: errors name ``where.key``; unknown keys are refused."""

    def __init__(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise ApiError(400, f"{where}: expected a JSON object")
        self._data: dict[str, Any] = value
        self._where = where
        self._read: set[str] = set()

    def error(self, key: str, problem: str) -> ApiError:
        return ApiError(400, f"{self._where}.{key}: {problem}")

    def _get(self, key: str, required: bool) -> Any:
        self._read.add(key)
        value = self._data.get(key)
        if value is None and required:
            raise self.error(key, "is required")
        return value

    def text(self, key: str, *, required: bool = False) -> str | None:
        value = self._get(key, required)
        if value is not None and not (isinstance(value, str) and 0 < len(value) <= MAX_STRING):
            raise self.error(key, f"expected a non-empty string of at most {MAX_STRING} characters")
        return value

    def choice(self, key: str, choices: Sequence[str], *, required: bool = False) -> str | None:
        value: str | None = self._get(key, required)
        if value is not None and value not in choices:
            raise self.error(key, f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    def number(
        self, key: str, *, low: float = 0.0, high: float = math.inf, what: str = "a number"
    ) -> float | None:
        value = self._get(key, False)
        integer = what == "an integer"
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int if integer else int | float)
            or not low <= value <= high
        ):
            raise self.error(key, f"expected {what} from {low:g} to {high:g}, got {value!r}")
        return value if value is None or integer else float(value)

    def time(self, key: str) -> float | None:
        return self.number(key, high=MAX_UNIX_SECONDS, what="Unix seconds (not milliseconds)")

    def integer(self, key: str, default: int, *, low: int = 0, high: int = 2**31 - 1) -> int:
        value = self.number(key, low=low, high=high, what="an integer")
        return default if value is None else int(value)

    def mapping(self, key: str) -> dict[str, Any]:
        value = self._get(key, False) or {}
        if not isinstance(value, dict):
            raise self.error(key, "expected a JSON object")
        return value

    def items(self, key: str) -> list[Any]:
        value = self._get(key, False)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > MAX_LIST:
            raise self.error(key, f"expected a list of at most {MAX_LIST} items")
        return value

    def labels(self, key: str) -> dict[str, str]:
        value = self._get(key, False) or {}
        if not isinstance(value, dict) or len(value) > MAX_LIST:
            raise self.error(key, f"expected an object of at most {MAX_LIST} string values")
        for name, text in value.items():
            if not (isinstance(text, str) and len(name) <= MAX_STRING and len(text) <= MAX_STRING):
                raise self.error(f"{key}.{name}", f"expected a string of at most {MAX_STRING}")
        return dict(value)

    def done(self) -> None:
        unknown = sorted(set(self._data) - self._read)
        if unknown:
            raise ApiError(400, f"{self._where}: unknown field(s) {', '.join(unknown)}")


def parse_job(value: object, where: str) -> Job:
    """An API job from its JSON; raises :class:`ApiError` (400) naming the bad field."""
    f = _Fields(value, where)
    job_id = f.text("job_id", required=True)
    key = f.text("key")
    if key is not None and key != f"api:{job_id}":
        raise f.error("key", f"API jobs are keyed 'api:<job_id>', expected 'api:{job_id}'")
    if f.text("scheduler") not in (None, "api"):
        raise f.error("scheduler", "must be 'api' (scheduler jobs come from the adapters)")
    state = f.choice("state", tuple(JobState), required=True)
    start, end = f.time("start_time"), f.time("end_time")
    if start is not None and end is not None and end < start:
        raise f.error("end_time", "is before start_time")
    allocations = tuple(
        _allocation(item, f"{where}.allocations[{i}]")
        for i, item in enumerate(f.items("allocations"))
    )
    held = sum(max(len(a.indices), len(a.uuids)) for a in allocations)
    priority = f.number("priority", low=-(2**31), high=2**31 - 1, what="an integer")
    job = Job(
        key=f"api:{job_id}",
        scheduler="api",
        job_id=str(job_id),
        state=JobState(str(state)),
        name=f.text("name"),
        owner=f.text("owner"),
        team=f.text("team"),
        gpus=f.integer("gpus", held, high=1_000_000),
        allocations=allocations,
        submit_time=f.time("submit_time"),
        eligible_time=f.time("eligible_time"),
        start_time=start,
        end_time=end,
        priority=None if priority is None else int(priority),
        model=f.text("model"),
        price_tier=f.choice("price_tier", TIERS),
        restarts=f.integer("restarts", 0),
        labels=f.labels("labels"),
    )
    f.done()
    return job


def _allocation(value: object, where: str) -> GpuAllocation:
    f = _Fields(value, where)
    node = f.text("node", required=True)
    indices = f.items("indices")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 4096 for i in indices):
        raise f.error("indices", "expected GPU indices (integers from 0 to 4095)")
    uuids = f.items("uuids")
    if not all(isinstance(u, str) and 0 < len(u) <= MAX_STRING for u in uuids):
        raise f.error("uuids", f"expected GPU UUIDs (strings of at most {MAX_STRING} characters)")
    f.done()
    return GpuAllocation(str(node), tuple(indices), tuple(uuids))


def parse_model(value: object, where: str) -> ModelDeployment:
    """A model deployment from its JSON; raises :class:`ApiError` (400) naming the bad field."""
    f = _Fields(value, where)
    model = ModelDeployment(
        name=str(f.text("name", required=True)),
        version=str(f.text("version", required=True)),
        replicas=f.integer("replicas", 1, high=1_000_000),
        slo_latency_p99_seconds=f.number("slo_latency_p99_seconds", low=1e-6, high=86400),
        slo_error_ratio=f.number("slo_error_ratio", high=1.0),
        fallback_model=f.text("fallback_model"),
        labels=f.labels("labels"),
    )
    f.done()
    return model


def parse_event(value: object, where: str, now: float) -> Event:
    """An event from its JSON (``time`` defaults to now); raises :class:`ApiError` (400)."""
    f = _Fields(value, where)
    when = f.time("time")
    kind = f.choice("kind", tuple(EventKind), required=True)
    subject = str(f.text("subject", required=True))
    attributes = f.mapping("attributes")
    if len(dump_json(attributes)) > MAX_ATTRIBUTES_CHARS:
        raise f.error("attributes", f"larger than {MAX_ATTRIBUTES_CHARS} characters of JSON")
    f.done()
    return Event(now if when is None else when, EventKind(str(kind)), subject, attributes)


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


async def _items(request: web.Request, noun: str) -> list[tuple[object, str]]:
    """The body's objects (one or a list) with the path each error should name."""
    if request.content_type != "application/json":
        raise ApiError(415, f"send {noun} as application/json, not {request.content_type}")
    try:
        value = json.loads(await request.read(), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"body: not valid JSON: {exc}") from None
    if not isinstance(value, list):
        return [(value, noun.rstrip("s"))]
    if not value or len(value) > MAX_ITEMS:
        raise ApiError(400, f"body: expected 1 to {MAX_ITEMS} {noun} per request, got {len(value)}")
    return [(item, f"{noun}[{i}]") for i, item in enumerate(value)]


def _plain(value: object) -> Any:
    """Records as JSON values (dataclasses → objects, mappings → objects, tuples → lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _query(request: web.Request, name: str, parse: Callable[[str], Any], default: str) -> Any:
    text = request.query.get(name, default)
    try:
        return parse(text)
    except ValueError as exc:
        raise ApiError(400, f"{name}: {exc}") from None


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 10 * MAX_ITEMS:
        raise ValueError(f"expected an integer from 1 to {10 * MAX_ITEMS}, got {text!r}")
    return int(text)


def _choices(vocabulary: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        chosen = [part.strip() for part in text.split(",") if part.strip()]
        wrong = [part for part in chosen if part not in vocabulary]
        if wrong:
            raise ValueError(f"unknown value(s) {', '.join(wrong)} (use {', '.join(vocabulary)})")
        return chosen

    return parse


def _count(write: Callable[[T], bool], records: Sequence[T]) -> int:
    """Write each record (blocking); return how many writes changed something."""
    return sum(write(record) for record in records)


def _gpu_json(gpu: GpuStatus) -> dict[str, Any]:
    readings = {r.key: gpu.readings.get(r.key) for r in GPU_READINGS}
    job = None
    if gpu.job_key is not None:
        job = {"key": gpu.job_key, "team": gpu.team, "model": gpu.model_name}
    identity = {"node": gpu.node, "uuid": gpu.uuid, "index": gpu.index, "model": gpu.model}
    return {**identity, "parent_uuid": gpu.parent_uuid, "status": gpu.state, **readings, "job": job}


async def get_gpus(request: web.Request) -> web.Response:
    """``GET /v1/gpus``: every GPU with its latest readings, state and current job."""
    service = request.app[SERVICE]
    gpus = await asyncio.to_thread(gpu_statuses, service, service.clock())
    return web.json_response({"gpus": [_gpu_json(g) for g in gpus]})


async def get_jobs(request: web.Request) -> web.Response:
    """``GET /v1/jobs[?state=running,pending][&current=true][&limit=N]``: jobs by key."""
    registry = request.app[SERVICE].registry
    states = _query(request, "state", _choices(tuple(JobState)), "")
    only_current = _query(request, "current", _choices(("true", "false")), "") == ["true"]
    limit = _query(request, "limit", _limit, str(MAX_ITEMS))
    current = {job.key for job in registry.jobs()}
    jobs = [
        job
        for job in sorted(registry.known(), key=lambda job: job.key)
        if (not states or job.state in states) and (job.key in current or not only_current)
    ]
    body = [{**_plain(job), "current": job.key in current} for job in jobs[:limit]]
    return web.json_response({"jobs": body, "truncated": len(jobs) > limit})


async def post_jobs(request: web.Request) -> web.Response:
    """``POST /v1/jobs``: register or update API jobs (one object or a list)."""
    jobs = [parse_job(item, where) for item, where in await _items(request, "jobs")]
    changed = await asyncio.to_thread(request.app[SERVICE].registry.put, jobs)
    return web.json_response({"accepted": len(jobs), "changed": changed})


async def get_models(request: web.Request) -> web.Response:
    """``GET /v1/models[?cluster=NAME|*]``: every model deployment by name, of this collector's
    cluster, another one's, or every cluster's (``*``), each naming its cluster."""
    storage = request.app[SERVICE].storage
    scope = _query(request, "cluster", lambda text: scope_of(text, storage), storage.cluster)

    def read() -> list[tuple[str, ModelDeployment]]:
        found = per_cluster(storage, scope, lambda name: storage.models(cluster=name))
        return sorted(found, key=lambda pair: (pair[1].name, pair[0]))

    found = await asyncio.to_thread(read)
    return web.json_response({"models": [{**_plain(m), "cluster": c} for c, m in found]})


async def post_models(request: web.Request) -> web.Response:
    """``POST /v1/models``: record model deployments (a deploy replaces the version)."""
    models = [parse_model(item, where) for item, where in await _items(request, "models")]
    changed = await asyncio.to_thread(_count, request.app[SERVICE].storage.upsert_model, models)
    return web.json_response({"accepted": len(models), "changed": changed})


async def get_events(request: web.Request) -> web.Response:
    """``GET /v1/events[?since=24h][&kind=deploy,...][&subject=...][&limit=N][&cluster=NAME|*]``:
    oldest first, of this collector's cluster, another one's, or every cluster's (``*``), each
    naming its cluster."""
    service = request.app[SERVICE]
    storage = service.storage
    since = _query(request, "since", lambda t: parse_time(t, service.clock()), "24h")
    kinds = _query(request, "kind", _choices(tuple(EventKind)), "")
    limit = _query(request, "limit", _limit, str(MAX_ITEMS))
    scope = _query(request, "cluster", lambda text: scope_of(text, storage), storage.cluster)
    subject = request.query.get("subject")

    def read() -> list[tuple[str, Event]]:
        found = per_cluster(
            storage,
            scope,
            lambda name: storage.events(
                since=since,
                kinds=[EventKind(k) for k in kinds] or None,
                subject=subject,
                cluster=name,
            ),
        )
        return sorted(found, key=lambda pair: pair[1].time)  # stable: stored order within a time

    events = await asyncio.to_thread(read)
    return web.json_response(
        {
            "events": [{**_plain(e), "cluster": c} for c, e in events[-limit:]],
            "truncated": len(events) > limit,
        }
    )


async def post_events(request: web.Request) -> web.Response:
    """``POST /v1/events``: record deploys, preemption notices... (a repeat is a no-op)."""
    service = request.app[SERVICE]
    now = service.clock()
    events = [parse_event(item, where, now) for item, where in await _items(request, "events")]
    recorded = await asyncio.to_thread(service.record_events, events)
    return web.json_response({"accepted": len(events), "recorded": recorded})


def _measures(line: CostLine) -> dict[str, object]:
    return {k: v for k, v in line_record(line).items() if k != "group"}


def _dimensions(text: str) -> tuple[RollupDimension, ...]:
    aliases: dict[str, RollupDimension] = {d: d for d in ROLLUP_DIMENSIONS} | {"job": "job_key"}
    chosen = _choices(tuple(aliases))(text)
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"a dimension is repeated in {text!r}")
    return tuple(aliases[name] for name in chosen)


async def get_accounting(request: web.Request) -> web.Response:
    """``GET /v1/accounting?since=24h&until=now&by=team,job_key[&cluster=NAME|*]``: totals per
    group, of this collector's cluster unless ``cluster`` names another or ``*`` (every
    cluster on the database; ``by=cluster`` keeps them apart)."""
    service = request.app[SERVICE]
    now = service.clock()
    since = _query(request, "since", lambda t: parse_time(t, now), "24h")
    until = _query(request, "until", lambda t: parse_time(t, now), "now")
    by = _query(request, "by", _dimensions, "")
    cluster = _query(request, "cluster", check_scope, service.storage.cluster)
    if since >= until:
        raise ApiError(400, f"since: {since!r} is not before until ({until!r})")
    totals = await asyncio.to_thread(
        service.storage.rollups, since=since, until=until, by=by, cluster=cluster
    )
    lines = [cost_line("", total) for total in totals]
    groups = [
        {"group": dict(t.group), **_measures(line)} for t, line in zip(totals, lines, strict=True)
    ]
    total = _measures(sum_lines("", lines))
    body = {
        "since": since,
        "until": until,
        "cluster": cluster,
        "by": list(by),
        "groups": groups,
        "total": total,
    }
    return web.json_response(body)


def add_readiness_problem(app: web.Application, problem: str) -> None:
    """Make ``/readyz`` answer 503 with ``problem`` (e.g. a rule file that failed to load)."""
    if READINESS not in app:
        app[READINESS] = []
    app[READINESS].append(problem)


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: 200 when the storage answers and no start-up check failed, else 503;
    either way the body lists the skipped rules, if any, and each rule's readiness (``rules``:
    ready, warming up until, skipped; ``detect.readiness``), which never makes it 503: a rule
    warming up still runs on the data there is."""
    problems = request.app[READINESS].copy()
    skipped_rules = request.app[SKIPPED_RULES]
    skipped: dict[str, list[str]] = {"skipped_rules": list(skipped_rules)} if skipped_rules else {}
    storage = request.app[SERVICE].storage
    try:
        await asyncio.wait_for(asyncio.to_thread(storage.job, ""), READY_TIMEOUT_SECONDS)
    except TimeoutError:
        problems.append(f"storage: no answer within {READY_TIMEOUT_SECONDS:g} s")
    except Exception as exc:  # noqa: BLE001 - any backend failure means "not ready", with its reason
        problems.append(f"storage: {exc}")
    rules: dict[str, object] = {}
    if RULE_BOARD in request.app:
        states = await asyncio.to_thread(request.app[RULE_BOARD].states)
        if states:  # a collector without rules (the receiver alone) says nothing of them
            rules = {"rules": [s.as_json() for s in states], "rules_summary": summary(states)}
    lead = request.app[LEADERSHIP].status() if LEADERSHIP in request.app else None
    leader = {"leadership": _leadership_json(lead)} if lead is not None else {}
    if problems:
        body = {"status": "not ready", "problems": problems, **skipped, **leader, **rules}
        return web.json_response(body, status=503)
    return web.json_response({"status": "ready", **skipped, **leader, **rules})


def _leadership_json(status: LeaderStatus) -> dict[str, object]:
    """``/readyz``'s ``leadership``: a standby is ready (it ingests) and says who leads."""
    return {
        "role": status.role,
        "replica": status.replica,
        "leader": status.leader,
        "since": status.since,
        "epoch": status.epoch,
        "detail": status.describe(),
    }


def setup_api(app: web.Application) -> None:
    """Add the ``/v1`` JSON routes (readers read, operators write) and ``/readyz`` (a probe);
    reads ``app[SERVICE]``."""
    if READINESS not in app:
        app[READINESS] = []
    if SKIPPED_RULES not in app:
        app[SKIPPED_RULES] = ()
    # Jobs, models and events steer detection and remediation (a posted job names the GPUs an
    # action would touch): writing them is an operator's, never an agent's.
    routes = [
        ("GET", "/v1/gpus", get_gpus, READERS),
        ("GET", "/v1/jobs", get_jobs, READERS),
        ("POST", "/v1/jobs", post_jobs, OPERATORS),
        ("GET", "/v1/models", get_models, READERS),
        ("POST", "/v1/models", post_models, OPERATORS),
        ("GET", "/v1/events", get_events, READERS),
        ("POST", "/v1/events", post_events, OPERATORS),
        ("GET", "/v1/accounting", get_accounting, READERS),
    ]
    for method, path, handler, admits in routes:
        # The JSON API has never answered HEAD (405); keep it so.
        add_route(app, method, path, _answering(handler), admits, allow_head=False)
    add_route(app, "GET", "/readyz", readyz, PROBE)
