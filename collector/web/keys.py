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
    inflight: int = 0


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


class Role(enum.Enum):
    """What a credential may do; each route declares the roles it admits (least privilege)."""

    AGENT = "agent"
    """Ingest only, for the node names the credential is bound to."""
    READER = "reader"
    """The status page, API reads, ``/metrics``."""
    OPERATOR = "operator"
    """Approve or reject actions, reset the breaker, silence."""
    ADMIN = "admin"
    """Configuration reloads."""
    ALERT_SOURCE = "alert-source"
    """The Alertmanager webhook only."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a request, as established by the authentication middleware.

    ``name`` is the token's subject or the signed-in person; ``nodes`` the node names an agent
    credential may write (empty for other roles); ``via`` how it was established (``token``,
    ``session``, ``proxy``, ``client-cert`` or ``anonymous``).
    """

    name: str
    role: Role
    nodes: frozenset[str] = frozenset()
    via: str = "token"

    def __str__(self) -> str:
        return self.name


CALLER = web.RequestKey("caller", Caller)
"""Who called, set by the authentication middleware on routes that need a credential."""


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


# People on the web ------------------------------------------------------------------------------

CredentialSource = Callable[[web.Request], Caller | None]
"""Who a request comes from when it carries no bearer token (a session cookie, a trusted
proxy's identity header), or None. Consulted by the middleware on pages only."""

CREDENTIAL_SOURCES: web.AppKey[list[CredentialSource]] = web.AppKey("credential_sources")
"""The sources the middleware asks, in order, after the bearer token."""
PAGES: web.AppKey[set[Handler]] = web.AppKey("pages")
"""Handlers of pages for people, added by :func:`add_page`."""


def add_page(
    app: web.Application, method: str, path: str, handler: Handler, access: Access
) -> None:
    """Add a page for people: besides a bearer token, a session or a trusted proxy's identity
    lets them in, and a browser without a credential is sent to ``/login`` instead of a 401.

    A POST page checks its own CSRF token and ``Origin`` (cookies travel with every request).
    """
    add_route(app, method, path, handler, access)
    app.setdefault(PAGES, set()).add(handler)
