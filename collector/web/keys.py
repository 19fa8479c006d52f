"""The web layer's shared state: every typed ``AppKey``, the caller's ``RequestKey``, the small
state types they hold, and how a route declares who may call it.

``create_app`` sets the keys; route modules read them and add their routes with
:func:`add_route`, which records the roles the route admits (:class:`Admits`) for the
authentication middleware. This module imports only the core, never a route module, so every
route module can import it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from jinja2.sandbox import SandboxedEnvironment
from prometheus_client import CollectorRegistry

from gpuwarden.collector.budgets.spend import DailySpend
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, node_allowed
from gpuwarden.collector.detect.readiness import RuleBoard
from gpuwarden.collector.ha.leadership import Leadership
from gpuwarden.collector.ingest.alertmanager import AlertReceiver
from gpuwarden.collector.ingest.sink import MetricsSink
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.reload import LiveTokens, Reloader
from gpuwarden.collector.web.remediation_setup import Remediation
from gpuwarden.collector.web.shed import LoopLag
from gpuwarden.collector.web.stopping import Stopping
from gpuwarden.collector.web.throttle import FailureThrottle

__all__ = [
    "ADMINS",
    "ADMISSION_CALLERS",
    "ADMISSION_STATS",
    "AGENTS",
    "ALERT_RECEIVER",
    "ALERT_SOURCES",
    "AUTH_STATS",
    "CALLER",
    "CONFIG",
    "CREDENTIAL_SOURCES",
    "LOOP_LAG",
    "METRICS_REGISTRY",
    "OPERATORS",
    "PAGES",
    "PROBE",
    "READERS",
    "READINESS",
    "RELOADER",
    "REMEDIATION",
    "ROUTE_ACCESS",
    "RULE_BOARD",
    "SERVICE",
    "SIGNED_LINK",
    "SINK",
    "SKIPPED_RULES",
    "STATS",
    "STATUS_TEMPLATES",
    "THROTTLE",
    "TOKENS",
    "AdmissionStats",
    "Admits",
    "AuthStats",
    "Caller",
    "CredentialSource",
    "Handler",
    "IngestStats",
    "Role",
    "add_page",
    "add_route",
    "route_template",
]

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
    remote_write_samples: Counter[str] = field(default_factory=Counter)
    """Samples of Prometheus remote-write requests by outcome (``stored``, ``nonfinite``,
    ``over_label_limits``, ``refused_by_store``, ``stale_markers``; ``unmapped_series`` counts
    series): ``gpuwarden_collector_remote_write_samples_total{outcome}``."""
    shed: Counter[str] = field(default_factory=Counter)
    """Requests answered 503 by reason: ``wait`` (queued longer than ``max_queue_wait_seconds``),
    ``slots`` (``max_inflight_requests``), ``caller`` (``max_inflight_per_token``)."""
    gone: int = 0
    """Requests not worked on because their client had closed the connection (no answer)."""


@dataclass
class AuthStats:
    """Refused requests by method, route template, status and reason
    (``gpuwarden_collector_auth_refusals_total``): bounded, never a raw path."""

    refusals: Counter[tuple[str, str, int, str]] = field(default_factory=Counter)
    #: (caller, node) pairs already logged as unbound writes; bounded, then forgotten at once
    unbound_logged: set[tuple[str, str]] = field(default_factory=set)
    max_unbound_logged: int = 4096

    def count(self, request: web.Request, status: int, reason: str) -> None:
        """Count one refusal of ``request`` under its route's template."""
        self.refusals[(request.method, route_template(request), status, reason)] += 1

    def first_unbound(self, caller: str, node: str) -> bool:
        """True the first time ``caller`` is refused writing ``node`` (log it then only)."""
        if (caller, node) in self.unbound_logged:
            return False
        if len(self.unbound_logged) >= self.max_unbound_logged:
            self.unbound_logged.clear()
        self.unbound_logged.add((caller, node))
        return True


@dataclass
class AdmissionStats:
    """Admission checks answered, by source (``kubernetes``, ``slurm``) and verdict
    (``allowed``, ``denied``, ``malformed``: a 4xx) (``gpuwarden_admission_reviews_total``)."""

    verdicts: Counter[tuple[str, str]] = field(default_factory=Counter)


def route_template(request: web.Request) -> str:
    """The matched route's path template (``/v1/actions/{id}/{verb}``), never the raw path."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@dataclass(frozen=True)
class Admits:
    """Who may call a route: the roles it admits (an admin always), or open to anyone.

    ``open_because`` (non-empty) makes the route need no credential and says why: liveness and
    readiness probes, and approval links whose signed, single-use token in the URL decides.
    ``plain_refusals``: refusals are text and counted by the OTLP receiver, whose clients are
    exporters, not browsers or API scripts.
    """

    roles: frozenset[Role] = frozenset()
    open_because: str = ""
    plain_refusals: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", self.roles | {Role.ADMIN})

    def admits(self, role: Role) -> bool:
        """Whether a caller of ``role`` may call the route."""
        return role in self.roles


PROBE = Admits(open_because="a probe: liveness and readiness tell nothing about the fleet")
SIGNED_LINK = Admits(open_because="the signed, single-use token in the URL decides")
READERS = Admits(frozenset({Role.READER, Role.OPERATOR}))
"""Pages, reads of the API and ``/metrics``."""
OPERATORS = Admits(frozenset({Role.OPERATOR}))
"""Decisions (approve, reject, reset) and the API's writes of jobs, models and events."""
AGENTS = Admits(frozenset({Role.AGENT}), plain_refusals=True)
"""OTLP ingest, each agent for its bound nodes."""
ALERT_SOURCES = Admits(frozenset({Role.ALERT_SOURCE}))
"""The Alertmanager webhook."""
ADMISSION_CALLERS = Admits(frozenset({Role.ADMISSION}))
"""The admission checks (``web.admission``): the API server's webhook and the Slurm hook."""
ADMINS = Admits()
"""Administrators only (configuration reloads): what a route that declares nothing gets (fail
closed)."""


CONFIG = web.AppKey("config", CollectorConfig)
STATS = web.AppKey("stats", IngestStats)
LOOP_LAG = web.AppKey("loop_lag", LoopLag)
STOPPING = web.AppKey("stopping", Stopping)
SINK = web.AppKey("sink", MetricsSink)
SERVICE = web.AppKey("service", CollectorService)
READINESS: web.AppKey[list[str]] = web.AppKey("readiness")
"""Start-up problems that make ``/readyz`` answer 503."""
SKIPPED_RULES: web.AppKey[tuple[str, ...]] = web.AppKey("skipped_rules")
"""Rules that did not load under ``skip_bad_rules``, one line each (file, rule, key, why):
listed by ``/readyz``, which stays 200 for them (the other rules run)."""
DAILY_SPEND = web.AppKey("daily_spend", DailySpend)
"""The month's daily spend per budget scope, complete days read once: ``/metrics`` and
``/status`` share it, so neither re-sums the month on every scrape or refresh."""
RULE_BOARD = web.AppKey("rule_board", RuleBoard)
"""Each rule's readiness (ready, warming up until, skipped): ``/readyz`` and ``/status``."""
METRICS_REGISTRY = web.AppKey("metrics_registry", CollectorRegistry)
STATUS_TEMPLATES = web.AppKey("status_templates", SandboxedEnvironment)
REMEDIATION = web.AppKey("remediation", Remediation)
ALERT_RECEIVER = web.AppKey("alert_receiver", AlertReceiver)
ROUTE_ACCESS: web.AppKey[dict[Handler, Admits]] = web.AppKey("route_access")
"""Each handler's :class:`Admits`, as declared by :func:`add_route`."""
AUTH_STATS = web.AppKey("auth_stats", AuthStats)
ADMISSION_STATS = web.AppKey("admission_stats", AdmissionStats)
THROTTLE = web.AppKey("throttle", FailureThrottle)
"""Failed authentications per source address (``auth_failure_*`` of the config)."""
TOKENS = web.AppKey("tokens", LiveTokens)
"""The bearer tokens in force (``CONFIG``'s at start; an admin reload swaps them)."""
RELOADER = web.AppKey("reloader", Reloader)
"""Reloads tokens, rules and the certificate (``POST /v1/admin/reload`` and SIGHUP)."""
LEADERSHIP: web.AppKey[Leadership] = web.AppKey("leadership")
"""Whether this replica leads (``collector.ha``): ``/readyz``, ``/status``, ``gpuwarden_leader``.
Set only when ``ha`` is on: a lone collector always leads and says nothing about it."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a request, as established by the authentication middleware.

    ``name`` is the token's subject or the signed-in person; ``nodes`` the node names or globs
    (``gpu-rack3-*``) an agent credential may write (empty for other roles); ``via`` how it
    was established (``token``, ``session``, ``proxy``, ``client-cert`` or ``anonymous``).
    """

    name: str
    role: Role
    nodes: frozenset[str] = frozenset()
    via: str = "token"

    def __str__(self) -> str:
        return self.name

    def may_write(self, node: str) -> bool:
        """Whether this caller may write ``node``'s telemetry (its ``host.name``; "" for none):
        an admin (and the anonymous caller of ``allow_unauthenticated``) any node, an agent its
        bound nodes (names or globs), nobody else any."""
        if self.role is Role.ADMIN:
            return True
        return self.role is Role.AGENT and node_allowed(self.nodes, node)


CredentialSource = Callable[[web.Request], Caller | None]
"""Another way to establish a caller after the bearer token (a session, a trusted proxy's
identity header): the caller, or None when the request carries no such credential."""


CALLER = web.RequestKey("caller", Caller)
"""Who called, set by the authentication middleware on routes that need a credential."""
CREDENTIAL_SOURCES: web.AppKey[list[CredentialSource]] = web.AppKey("credential_sources")
"""Tried in order when a request's bearer token is absent or matches nothing (see
:data:`CredentialSource`); ``create_app`` starts it empty."""


def add_route(
    app: web.Application,
    method: str,
    path: str,
    handler: Handler,
    admits: Admits = ADMINS,
    *,
    allow_head: bool = True,
) -> None:
    """Add a route and declare who may call it (:class:`Admits`; nothing declared: admins
    only); ``GET`` answers ``HEAD`` too unless told not."""
    if method == "GET":
        app.router.add_get(path, handler, allow_head=allow_head)
    else:
        app.router.add_route(method, path, handler)
    if ROUTE_ACCESS not in app:
        app[ROUTE_ACCESS] = {}
    app[ROUTE_ACCESS][handler] = admits


# People on the web ------------------------------------------------------------------------------

PAGES: web.AppKey[set[Handler]] = web.AppKey("pages")
"""Handlers of pages for people, added by :func:`add_page`."""


def add_page(
    app: web.Application, method: str, path: str, handler: Handler, admits: Admits
) -> None:
    """Add a page for people: besides a bearer token, a session or a trusted proxy's identity
    lets them in, and a browser without a credential is sent to ``/login`` instead of a 401.

    A POST page checks its own CSRF token and ``Origin`` (cookies travel with every request).
    """
    add_route(app, method, path, handler, admits)
    app.setdefault(PAGES, set()).add(handler)
