"""The collector's aiohttp application: OTLP/HTTP ingest and health.

Handlers parse, authenticate, call the core and translate domain errors into HTTP answers:
200 (with a partial-success count when points were rejected), 400 malformed, 401 bad token,
413 too large, 415 wrong content type or encoding. Never a 5xx for bad input.
"""

from __future__ import annotations

import hmac
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.otlp import (
    OtlpError,
    decompress,
    encode_response,
    histogram_points,
    media_type,
    number_points,
    parse_request,
)
from gpuwarden.collector.ingest.sink import MetricsSink, SeriesLog
from gpuwarden.collector.service import Accepted, CollectorService
from gpuwarden.collector.web import tasks
from gpuwarden.collector.web.tasks import SERVICE

if TYPE_CHECKING:
    from gpuwarden.collector.detect.engine import DetectionEngine
    from gpuwarden.collector.web.remediation import Remediation

log = logging.getLogger(__name__)


@dataclass
class IngestStats:
    """The receiver's own counters."""

    responses: Counter[int] = field(default_factory=Counter)
    points_accepted: int = 0
    points_rejected: int = 0
    inflight: int = 0


CONFIG = web.AppKey("config", CollectorConfig)
SINK = web.AppKey("sink", MetricsSink)
STATS = web.AppKey("stats", IngestStats)


def authenticate(config: CollectorConfig, header: str | None) -> str | None:
    """Return the caller's name for a valid ``Bearer`` token, else None (constant-time compare)."""
    if not config.tokens:
        return "anonymous" if config.allow_unauthenticated else None
    scheme, _, presented = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return None
    name = None
    candidate = presented.strip().encode("utf-8")
    for token, owner in config.tokens.items():
        if hmac.compare_digest(candidate, token.encode("utf-8")):
            name = owner
    return name


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
    parsed = None
    try:
        source = authenticate(config, request.headers.get("Authorization"))
        if source is None:
            raise OtlpError(401, "missing or invalid bearer token")
        kind = media_type(request.headers.get("Content-Type"))
        if request.content_length is not None and request.content_length > config.max_body_bytes:
            raise OtlpError(413, f"body exceeds {config.max_body_bytes} bytes")
        body = await _read_limited(request, config.max_body_bytes)
        payload = decompress(
            body, request.headers.get("Content-Encoding"), config.max_decompressed_bytes
        )
        if isinstance(sink, CollectorService):
            # The fast path: straight into the store, no NumberPoint per point.
            done = sink.accept_payload(payload, kind, source)
        else:
            parsed = parse_request(payload, kind)
    except OtlpError as exc:
        stats.responses[exc.status] += 1
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return web.Response(status=exc.status, text=exc.message + "\n", headers=headers)
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


def create_app(
    config: CollectorConfig,
    sink: MetricsSink | None = None,
    *,
    service: CollectorService | None = None,
    background: bool = True,
    detection: DetectionEngine | None = None,
    remediation: Remediation | None = None,
    rule_problems: Sequence[str] = (),
) -> web.Application:
    """Build the collector application.

    With a ``service`` the points go to its WindowStore and, unless ``background`` is false
    (tests drive it themselves), job polling and accounting run while the app serves. Without
    one, points go to ``sink`` (an in-memory series log by default).
    """
    # We inflate bodies ourselves, with a cap: aiohttp's own decompression has none.
    app = web.Application(
        client_max_size=config.max_body_bytes, handler_args={"auto_decompress": False}
    )
    app[CONFIG] = config
    app[STATS] = IngestStats()
    if service is not None:
        # imported here: api and exposition import this module for CONFIG/STATS/authenticate
        from gpuwarden.collector.web.api import add_readiness_problem, setup_api
        from gpuwarden.collector.web.exposition import setup_metrics
        from gpuwarden.collector.web.status_page import setup_status_page

        app[SERVICE] = service
        app[SINK] = service
        setup_api(app)
        setup_metrics(app, service)
        setup_status_page(app, service)
        for problem in rule_problems:
            add_readiness_problem(app, f"rule skipped: {problem}")
        if remediation is not None:
            from gpuwarden.collector.web.remediation import setup_remediation

            setup_remediation(app, remediation)
        if background:
            app.cleanup_ctx.append(
                tasks.background(
                    job_poll_seconds=config.job_poll_seconds,
                    accounting_seconds=config.accounting_period_seconds,
                    scrape_seconds=config.scrape_seconds,
                    detection=detection,
                    detection_seconds=config.detection_seconds,
                    remediator=remediation.remediator if remediation is not None else None,
                    remediation_seconds=config.remediation.interval_seconds,
                    dispatcher=remediation.dispatcher if remediation is not None else None,
                    alerting_seconds=config.alerting.interval_seconds,
                )
            )
    else:
        app[SINK] = sink if sink is not None else SeriesLog()
    app.router.add_post("/v1/metrics", otlp_metrics)
    app.router.add_get("/healthz", healthz)
    return app
