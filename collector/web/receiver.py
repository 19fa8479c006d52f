"""The OTLP/HTTP receiver (``POST /v1/metrics``) and liveness (``GET /healthz``).

Handlers parse, call the core and translate domain errors into HTTP answers: 200 (with a
partial-success count when points were rejected, label limits included), 400 malformed, 401 bad
token and 403 a role other than agent or admin (answered by the authentication middleware,
counted here all the same), 403 a node the agent's token is not bound to (nothing stored), 408
body too slow (``web.guard``, counted here too), 413 too large (body, inflated body, points), 415
wrong content type or encoding, 503 with ``Retry-After`` when too many requests, or too many of
one caller, are being processed (503 too while an earlier request of the same agent instance is
being stored: see ``ingest.rounds_seen``), and 503 too when requests wait longer than
``max_queue_wait_seconds`` before they are worked on (``web.shed``: the event loop's lag, or a
big body's wait for a worker thread), and 503 for a node with no series yet while the collector
creates series at ``max_new_series_per_second`` (``ingest.creation_pace``). A request whose
client has closed its connection (an agent that timed out) is not decoded nor stored: counted,
and answered 499 to the access log only.
Never a 5xx for bad input.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.creation_pace import CreationPacedError
from gpuwarden.collector.ingest.otlp import flatten, histogram_points, request_points
from gpuwarden.collector.ingest.otlp_hosts import claimed_hosts
from gpuwarden.collector.ingest.otlp_limits import DEFAULT_LIMITS, IngestLimits
from gpuwarden.collector.ingest.otlp_transport import (
    OtlpError,
    decompress,
    encode_response,
    media_type,
    parse_request,
)
from gpuwarden.collector.ingest.rounds_seen import AgentRounds, agent_rounds
from gpuwarden.collector.ingest.sink import MetricsSink
from gpuwarden.collector.service import Accepted, CollectorService
from gpuwarden.collector.web.keys import (
    AGENTS,
    AUTH_STATS,
    CALLER,
    CONFIG,
    LOOP_LAG,
    PROBE,
    SINK,
    STATS,
    Caller,
    IngestStats,
    Role,
    add_route,
)
from gpuwarden.collector.web.shed import client_gone, retry_after_seconds

log = logging.getLogger(__name__)

SMALL_PAYLOAD_BYTES = 256 << 10
"""A body that decodes to at most this is stored on the event loop at once (an agent's round of
an 8-GPU node is about 40 KiB): a few milliseconds at most, cheaper than a thread hand-off. A
bigger one is decoded and stored in a worker thread, holding an in-flight slot meanwhile, so
the event loop keeps serving everyone else."""


async def otlp_metrics(request: web.Request) -> web.Response:
    """``POST /v1/metrics``: OTLP/HTTP metrics, protobuf or JSON, optionally gzip.

    The body is read first (``web.guard.body_guard`` has buffered it under the body timeout), so
    a slow client holds no slot. A small request (an agent's round) is then decoded and stored
    at once; a big one takes an in-flight slot for its decoding and storing only, which run in
    a worker thread while the event loop serves everyone else. Beyond
    ``max_inflight_requests`` slots in use, or ``max_inflight_per_token`` of one caller, or
    when requests wait longer than ``max_queue_wait_seconds`` (checked before any slot), the
    answer is 503 with ``Retry-After``. Before all that, a request whose client has gone is
    dropped (``web.shed.client_gone``), and checked again when its worker thread starts.
    """
    config = request.app[CONFIG]
    stats = request.app[STATS]
    caller = request[CALLER]  # the authentication middleware checked the token
    source = caller.name
    try:
        kind = media_type(request.headers.get("Content-Type"))
        rounds = agent_rounds(request.headers)  # an agent's spooled rounds: each stored once
        if request.content_length is not None and request.content_length > config.max_body_bytes:
            raise OtlpError(413, f"body exceeds {config.max_body_bytes} bytes")
        body = await _read_limited(request, config.max_body_bytes)
    except OtlpError as exc:
        stats.responses[exc.status] += 1
        return web.Response(status=exc.status, text=exc.message + "\n")
    refused = _admission(request, config, stats, source)
    if refused is not None:
        return refused
    encoding = request.headers.get("Content-Encoding")
    try:
        small = _small_payload(body, encoding, config)
        if small is not None:  # an agent's usual request: decoded at once, on the event loop
            done = _store_payload(request.app[SINK], small, kind, caller, config, rounds)
        else:
            done = await _store_in_thread(request, body, kind, encoding, caller, rounds)
    except _DroppedError as exc:
        return exc.answer(stats)
    except CreationPacedError as exc:
        stats.shed["new_series"] += 1
        return _shed(stats, exc.message, exc.retry_after)
    except OtlpError as exc:
        if isinstance(exc, UnboundNodesError):
            _log_unbound(request, caller, exc.nodes)
        stats.responses[exc.status] += 1
        return web.Response(status=exc.status, text=exc.message + "\n")
    stats.points_accepted += done.points - done.stored_rejected
    stats.points_rejected += done.rejected
    stats.points_over_limits += done.over_limits
    stats.responses[200] += 1
    response = ExportMetricsServiceResponse()
    if done.rejected:
        response.partial_success.rejected_data_points = done.rejected
        over = f"{done.over_limits} " if done.over_limits else ""
        response.partial_success.error_message = (
            "rejected: non-finite values, points outside the window, series over the limit, "
            f"metric types not stored (summary), or {over}points over the label limits "
            f"({config.ingest_limits.describe()})"
        )
    return web.Response(body=encode_response(response, kind), content_type=kind)


def _admission(
    request: web.Request, config: CollectorConfig, stats: IngestStats, source: str
) -> web.Response | None:
    """The answer to a request that is not worked on (None: work on it): a client that has gone
    (an agent that timed out: nobody would read the answer), or a 503 (:func:`_busy`)."""
    if client_gone(request):
        return _gone(stats)
    busy = _busy(config, stats, source, request.app[LOOP_LAG].seconds())
    if busy is None:
        return None
    reason, retry_after = busy
    return _shed(stats, reason, retry_after)


def _busy(
    config: CollectorConfig, stats: IngestStats, source: str, wait_seconds: float
) -> tuple[str, int] | None:
    """Why the request is not worked on now, and its ``Retry-After`` (None: it is).

    ``wait_seconds`` is the event loop's lag (``web.shed.LoopLag``): what a request waits before
    its handler runs. Past ``max_queue_wait_seconds`` the answer would come too late for the
    agent, and working on it only makes the next requests wait longer."""
    if wait_seconds > config.max_queue_wait_seconds:
        stats.shed["wait"] += 1
        reason = f"collector overloaded (requests wait {wait_seconds:.1f} s)"
        return reason, retry_after_seconds(wait_seconds)
    if stats.inflight >= config.max_inflight_requests:
        stats.shed["slots"] += 1
        return "collector busy", 2
    if stats.inflight_by_caller[source] >= config.max_inflight_per_token:
        stats.shed["caller"] += 1
        return f"{config.max_inflight_per_token} requests of this caller in flight", 2
    return None


def _shed(stats: IngestStats, reason: str, retry_after: int) -> web.Response:
    """Back-pressure: agents keep the batch in their spool and retry after the delay."""
    stats.responses[503] += 1
    headers = {"Retry-After": str(retry_after)}
    return web.Response(status=503, text=f"{reason}, retry later\n", headers=headers)


def _gone(stats: IngestStats) -> web.Response:
    """A request whose client closed its connection: counted, not worked on. The 499 (nginx's
    "client closed request") reaches only the access log: the connection is closed."""
    stats.gone += 1
    response = web.Response(status=499, text="client closed the connection\n")
    response.force_close()
    return response


class _DroppedError(Exception):
    """A big body not worked on when its worker thread started; ``answer`` says so."""

    def answer(self, stats: IngestStats) -> web.Response:
        raise NotImplementedError


class _GoneError(_DroppedError):
    """The client closed its connection while its body waited for a worker thread."""

    def answer(self, stats: IngestStats) -> web.Response:
        return _gone(stats)


class _WaitedError(_DroppedError):
    """A body waited for a worker thread longer than ``max_queue_wait_seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"waited {seconds:.1f} s for a worker thread")
        self.seconds = seconds

    def answer(self, stats: IngestStats) -> web.Response:
        stats.shed["wait"] += 1
        return _shed(stats, f"collector overloaded ({self})", retry_after_seconds(self.seconds))


async def _store_in_thread(
    request: web.Request,
    body: bytes,
    kind: str,
    encoding: str | None,
    caller: Caller,
    rounds: AgentRounds | None,
) -> Accepted:
    """Decode and store a big body in a worker thread, holding an in-flight slot meanwhile."""
    config, stats = request.app[CONFIG], request.app[STATS]
    source = caller.name
    stats.inflight += 1
    stats.inflight_by_caller[source] += 1
    queued = time.monotonic()

    def work() -> Accepted:
        waited = time.monotonic() - queued  # the executor's queue: every worker was busy
        if client_gone(request):
            raise _GoneError
        if waited > config.max_queue_wait_seconds:
            raise _WaitedError(waited)
        return _decode_and_store(request.app[SINK], body, kind, encoding, caller, config, rounds)

    try:
        return await asyncio.to_thread(work)
    finally:
        stats.inflight -= 1
        stats.inflight_by_caller[source] -= 1
        if not stats.inflight_by_caller[source]:
            del stats.inflight_by_caller[source]


def _decode_and_store(
    sink: MetricsSink,
    body: bytes,
    kind: str,
    encoding: str | None,
    caller: Caller,
    config: CollectorConfig,
    rounds: AgentRounds | None,
) -> Accepted:
    """Inflate and store one body (in a worker thread); raises ``OtlpError``."""
    payload = decompress(body, encoding, config.max_decompressed_bytes)
    return _store_payload(sink, payload, kind, caller, config, rounds)


def _small_payload(body: bytes, encoding: str | None, config: CollectorConfig) -> bytes | None:
    """The decoded payload when it is at most ``SMALL_PAYLOAD_BYTES``, else None (big)."""
    if len(body) > SMALL_PAYLOAD_BYTES:
        return None
    cap = min(SMALL_PAYLOAD_BYTES, config.max_decompressed_bytes)
    try:
        return decompress(body, encoding, cap)
    except OtlpError as exc:
        if exc.status == 413 and cap < config.max_decompressed_bytes:
            return None  # inflates past the small size: the worker thread decodes it
        raise


class UnboundNodesError(OtlpError):
    """A request writes nodes its caller is not bound to: 403, nothing of it stored."""

    def __init__(self, caller: Caller, nodes: list[str]) -> None:
        super().__init__(403, f"{caller} may not write host.name {nodes[0]!r}; nothing stored")
        self.nodes = nodes


def unbound_nodes(caller: Caller, payload: bytes, kind: str) -> list[str]:
    """The nodes ``payload`` writes that ``caller`` is not bound to (sorted); admins and the
    anonymous caller write any node."""
    if caller.role is Role.ADMIN:
        return []  # skip reading the hosts: an admin may write any
    return sorted(h for h in claimed_hosts(payload, kind) if not caller.may_write(h))


def _log_unbound(request: web.Request, caller: Caller, nodes: list[str]) -> None:
    """Count a refusal for unbound nodes; log each (caller, node) once."""
    auth = request.app[AUTH_STATS]
    auth.count(request, 403, "node")
    for node in nodes:
        if auth.first_unbound(caller.name, node):
            log.warning(
                "%s (%s) may not write host.name %r (bound to %s): refused, nothing stored",
                caller,
                request.remote,
                node,
                ",".join(sorted(caller.nodes)) or "no node",
            )


def _store_payload(
    sink: MetricsSink,
    payload: bytes,
    kind: str,
    caller: Caller,
    config: CollectorConfig,
    rounds: AgentRounds | None = None,
) -> Accepted:
    """Check the caller's nodes, then decode and store one payload (all or nothing); raises
    ``OtlpError`` (``UnboundNodesError`` for a node the caller may not write)."""
    unbound = unbound_nodes(caller, payload, kind)
    if unbound:
        raise UnboundNodesError(caller, unbound)
    source = caller.name
    if isinstance(sink, CollectorService):
        # The fast path: straight into the store, no NumberPoint per point.
        return sink.accept_payload(payload, kind, source, rounds)
    parsed = parse_request(payload, kind)
    if request_points(parsed) > config.max_points_per_request:
        raise OtlpError(413, f"request holds more than {config.max_points_per_request} data points")
    return _accept_parsed(sink, parsed, source, config.ingest_limits)


def _accept_parsed(
    sink: MetricsSink,
    parsed: ExportMetricsServiceRequest,
    source: str,
    limits: IngestLimits = DEFAULT_LIMITS,
) -> Accepted:
    """Any sink: flatten to ``NumberPoint`` and ``HistogramPoint`` objects and hand them over."""
    flat = flatten(parsed, limits)
    points, rejected = flat.points, flat.rejected
    histograms = histogram_points(parsed, limits)
    stored_rejected = sink.accept(points, source)
    if histograms:  # number_points counted them as rejected; the sink says which it kept
        rejected -= len(histograms) - sink.accept_histograms(histograms, source)
    return Accepted(
        points=len(points),
        rejected=rejected + stored_rejected,
        stored_rejected=stored_rejected,
        over_limits=flat.over_limits,
    )


async def _read_limited(request: web.Request, limit: int) -> bytes:
    """The whole body in one read; aiohttp stops at ``client_max_size`` (``limit`` here)."""
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise OtlpError(413, f"body exceeds {limit} bytes") from None
    if len(body) > limit:
        raise OtlpError(413, f"body exceeds {limit} bytes")
    return body


async def healthz(_request: web.Request) -> web.Response:
    """Liveness."""
    return web.json_response({"status": "ok"})


def setup_receiver(app: web.Application) -> None:
    """Add ``POST /v1/metrics`` (agents) into ``app[SINK]`` and ``GET /healthz`` (a probe)."""
    add_route(app, "POST", "/v1/metrics", otlp_metrics, AGENTS)
    add_route(app, "GET", "/healthz", healthz, PROBE)
