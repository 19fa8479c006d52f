"""The web layer's shared state: every typed ``AppKey``, the caller's ``RequestKey``, the small
state types they hold, and how a route declares who may call it.

``create_app`` sets the keys; route modules read them and add their routes with
:func:`add_route`, which records the route's :class:`Access` for the authentication middleware.
This module imports only the core, never a route module, so every route module can import it.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from jinja2.sandbox import SandboxedEnvironment
from prometheus_client import CollectorRegistry

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.alertmanager import AlertReceiver
from gpuwarden.collector.ingest.sink import MetricsSink
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.remediation_setup import Remediation

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class IngestStats:
    """The OTLP receiver's own counters (``gpuwarden_collector_requests_total``)."""

    responses: Counter[int] = field(default_factory=Counter)
    points_accepted: int = 0
    points_rejected: int = 0
    points_over_limits: int = 0
    """Of ``points_rejected``, those over the label limits (decoded by the fast path)."""
    inflight: int = 0
    """Requests being decoded and stored (their bodies read): the slots in use."""
    inflight_by_caller: Counter[str] = field(default_factory=Counter)


class Access(enum.Enum):
    """Who may call a route. A route that declares nothing needs the API token (fail closed)."""

    OPEN = enum.auto()
    """Probes, ``/metrics``, the status page, runbooks and approval links (signed tokens)."""
    API_TOKEN = enum.auto()
    """A bearer token of ``CollectorConfig.tokens``; refused with a JSON 401."""
    INGEST_TOKEN = enum.auto()
    """The same tokens for agents; refused with a text 401 the receiver counts."""


CONFIG = web.AppKey("config", CollectorConfig)
STATS = web.AppKey("stats", IngestStats)
SINK = web.AppKey("sink", MetricsSink)
SERVICE = web.AppKey("service", CollectorService)
READINESS: web.AppKey[list[str]] = web.AppKey("readiness")
"""Start-up problems that make ``/readyz`` answer 503."""
SKIPPED_RULES: web.AppKey[tuple[str, ...]] = web.AppKey("skipped_rules")
"""Rules that did not load under ``skip_bad_rules``, one line each (file, rule, key, why):
listed by ``/readyz``, which stays 200 for them (the other rules run)."""
METRICS_REGISTRY = web.AppKey("metrics_registry", CollectorRegistry)
STATUS_TEMPLATES = web.AppKey("status_templates", SandboxedEnvironment)
REMEDIATION = web.AppKey("remediation", Remediation)
ALERT_RECEIVER = web.AppKey("alert_receiver", AlertReceiver)
ROUTE_ACCESS: web.AppKey[dict[Handler, Access]] = web.AppKey("route_access")
"""Each handler's :class:`Access`, as declared by :func:`add_route`."""

CALLER = web.RequestKey("caller", str)
"""The token's owner, set by the authentication middleware on routes that need a token."""


def add_route(
    app: web.Application,
    method: str,
    path: str,
    handler: Handler,
    access: Access,
    *,
    allow_head: bool = True,
) -> None:
    """Add a route and declare who may call it; ``GET`` answers ``HEAD`` too unless told not."""
    if method == "GET":
        app.router.add_get(path, handler, allow_head=allow_head)
    else:
        app.router.add_route(method, path, handler)
    if ROUTE_ACCESS not in app:
        app[ROUTE_ACCESS] = {}
    app[ROUTE_ACCESS][handler] = access
