"""The OTLP/HTTP receiver (``POST /v1/metrics``) and liveness (``GET /healthz``).

Handlers parse, call the core and translate domain errors into HTTP answers: 200 (with a
partial-success count when points were rejected), 400 malformed, 401 bad token and 403 a role
other than agent or admin (answered by the authentication middleware, counted here all the
same), 403 a node the agent's token is not bound to (nothing stored), 413 too large, 415 wrong
content type or encoding, 503 with ``Retry-After`` when too many requests are in flight. Never a
5xx for bad input.
"""

from __future__ import annotations

import logging

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.otlp import histogram_points, number_points
from gpuwarden.collector.ingest.otlp_hosts import claimed_hosts
from gpuwarden.collector.ingest.otlp_transport import (
    OtlpError,
    decompress,
    encode_response,
    media_type,
    parse_request,
)
from gpuwarden.collector.ingest.sink import MetricsSink
from gpuwarden.collector.service import Accepted, CollectorService
from gpuwarden.collector.web.keys import (
    AGENTS,
    AUTH_STATS,
    CALLER,
    CONFIG,
    PROBE,
    SINK,
    STATS,
    IngestStats,
    Role,
    add_route,
)

log = logging.getLogger(__name__)


async def otlp_metrics(request: web.Request) -> web.Response:
    """``POST /v1/metrics``: OTLP/HTTP metrics, protobuf or JSON, optionally gzip."""
    config = request.app[CONFIG]
    stats = request.app[STATS]
    if stats.inflight >= config.max_inflight_requests:
        # Back-pressure: agents keep the batch in their spool and retry after the delay.
        stats.responses[503] += 1
        return web.Response(
            status=503, text="collector busy, retry later\n", headers={"Retry-After": "2"}
        )
    stats.inflight += 1
    try:
        return await _ingest(request, config, stats)
    finally:
        stats.inflight -= 1


async def _ingest(
    request: web.Request, config: CollectorConfig, stats: IngestStats
) -> web.Response:
    sink = request.app[SINK]
    source = request[CALLER].name  # the authentication middleware checked the token
    parsed = None
    try:
        kind = media_type(request.headers.get("Content-Type"))
        if request.content_length is not None and request.content_length > config.max_body_bytes:
            raise OtlpError(413, f"body exceeds {config.max_body_bytes} bytes")
        body = await _read_limited(request, config.max_body_bytes)
        payload = decompress(
            body, request.headers.get("Content-Encoding"), config.max_decompressed_bytes
        )
        check_bound_nodes(request, payload, kind)
        if isinstance(sink, CollectorService):
            # The fast path: straight into the store, no NumberPoint per point.
            done = sink.accept_payload(payload, kind, source)
        else:
            parsed = parse_request(payload, kind)
    except OtlpError as exc:
        stats.responses[exc.status] += 1
        return web.Response(status=exc.status, text=exc.message + "\n")
    if parsed is not None:
        done = _accept_parsed(sink, parsed, source)
    stats.points_accepted += done.points - done.stored_rejected
    stats.points_rejected += done.rejected
    stats.responses[200] += 1
    response = ExportMetricsServiceResponse()
    if done.rejected:
        response.partial_success.rejected_data_points = done.rejected
        response.partial_success.error_message = (
            "rejected: non-finite values, points outside the window, series over the limit, "
            "or metric types not stored (summary)"
        )
    return web.Response(body=encode_response(response, kind), content_type=kind)


def _accept_parsed(sink: MetricsSink, parsed: ExportMetricsServiceRequest, source: str) -> Accepted:
    """Any sink: flatten to ``NumberPoint`` and ``HistogramPoint`` objects and hand them over."""
    points, rejected = number_points(parsed)
    histograms = histogram_points(parsed)
    stored_rejected = sink.accept(points, source)
    if histograms:  # number_points counted them as rejected; the sink says which it kept
        rejected -= len(histograms) - sink.accept_histograms(histograms, source)
    return Accepted(
        points=len(points), rejected=rejected + stored_rejected, stored_rejected=stored_rejected
    )


def check_bound_nodes(request: web.Request, payload: bytes, kind: str) -> None:
    """Refuse (403, before anything is stored) a request that writes a node its caller is not
    bound to; admins and the anonymous caller write any node. Each (caller, node) is logged
    once; every refusal is counted."""
    caller = request[CALLER]
    if caller.role is Role.ADMIN:
        return  # skip reading the hosts: an admin may write any
    unbound = sorted(h for h in claimed_hosts(payload, kind) if not caller.may_write(h))
    if not unbound:
        return
    auth = request.app[AUTH_STATS]
    auth.count(request, 403, "node")
    for node in unbound:
        if auth.first_unbound(caller.name, node):
            log.warning(
                "%s (%s) may not write host.name %r (bound to %s): refused, nothing stored",
                caller,
                request.remote,
                node,
                ",".join(sorted(caller.nodes)) or "no node",
            )
    raise OtlpError(403, f"{caller} may not write host.name {unbound[0]!r}; nothing stored")


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
