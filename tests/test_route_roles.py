"""Every route of the full collector app (service and remediation), enumerated from its router,
tried with no token, a wrong token and a token of each role: exactly the roles of the table
below get through; the others are refused by the authentication middleware (401 without a
valid credential, 403 with a one-line reason for a role the route does not admit).

The table is written here, not read from the code: a route added without a row fails
``test_every_route_has_a_row``, and a route whose declared roles drift from the table fails
``test_each_role_reaches_exactly_its_routes``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from gpuwarden.collector.alerts.runbooks import Links, RunbookRenderer
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.rules.loader import default_runbooks_dir
from gpuwarden.collector.rules.model import ActionMode
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import AUTH_STATS, CREDENTIAL_SOURCES, AuthStats, Caller
from gpuwarden.collector.web.remediation_setup import Remediation
from tests.prom_translate import translate
from tests.test_collector_api import fleet
from tests.test_remediate_web import Setup, build
from tests.test_remediator import make_rule

TOKENS = {role: f"{role.value}-token-0123456789abcdef" for role in Role}
WRONG = "wrong-token-0123456789abcdef"

OPEN = "open"
R, OP, A, AG, AS = Role.READER, Role.OPERATOR, Role.ADMIN, Role.AGENT, Role.ALERT_SOURCE
AD = Role.ADMISSION
READ = frozenset({R, OP, A})
DECIDE = frozenset({OP, A})

#: (method, route template) → the roles it admits, or OPEN (no credential needed).
TABLE: dict[tuple[str, str], frozenset[Role] | str] = {
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/login"): OPEN,
    ("GET", "/static/gpuwarden.css"): OPEN,  # the pages' stylesheet (the CSP forbids inline)
    ("POST", "/login"): OPEN,  # checks the token itself, throttled like the middleware
    ("POST", "/logout"): OPEN,
    # the signed link names the action; a person opens it, and only an operator or admin's
    # POST approves (the handler's own 403, after its Origin and CSRF checks)
    ("GET", "/approve/{token}"): READ,
    ("POST", "/approve/{token}"): READ,
    ("POST", "/v1/metrics"): frozenset({AG, A}),
    ("POST", "/api/v1/write"): frozenset({AG, A}),  # Prometheus remote-write, like OTLP
    ("POST", "/v1/alertmanager"): frozenset({AS, A}),
    ("GET", "/metrics"): READ,
    ("GET", "/status"): READ,
    ("GET", "/status/incidents/{id}"): READ,
    ("GET", "/runbooks/{rule}"): READ,
    ("GET", "/incidents/{id}/runbook"): READ,
    ("GET", "/v1/gpus"): READ,
    ("GET", "/v1/jobs"): READ,
    ("GET", "/v1/models"): READ,
    ("GET", "/v1/events"): READ,
    ("GET", "/v1/accounting"): READ,
    ("GET", "/v1/incidents"): READ,
    ("GET", "/v1/incidents/{id}"): READ,
    ("GET", "/v1/actions"): READ,
    ("GET", "/v1/actions/{id}"): READ,
    ("GET", "/v1/breaker"): READ,
    ("POST", "/v1/jobs"): DECIDE,
    ("POST", "/v1/models"): DECIDE,
    ("POST", "/v1/events"): DECIDE,
    ("POST", "/v1/actions/{id}/{verb}"): DECIDE,
    ("POST", "/v1/breaker/reset"): DECIDE,
    ("GET", "/v1/silences"): READ,
    ("POST", "/v1/silences"): DECIDE,
    ("DELETE", "/v1/silences/{id}"): DECIDE,
    # the incident page's "Silence 4h" button: the handler checks Origin and CSRF itself
    ("POST", "/status/incidents/{id}/silence"): DECIDE,
    ("POST", "/v1/admin/reload"): frozenset({A}),
    # the Kubernetes API server's validating webhook and the Slurm job_submit hook
    ("POST", "/admission/v1/validate"): frozenset({AD, A}),
    ("POST", "/admission/v1/slurm"): frozenset({AD, A}),
}
#: Pages for people: without any credential a browser's GET goes to /login, a POST gets 401.
PAGES = {
    "/status",
    "/status/incidents/{id}",
    "/status/incidents/{id}/silence",
    "/runbooks/{rule}",
    "/incidents/{id}/runbook",
    "/approve/{token}",
}
#: a value for each path parameter, so that every route can be called
PARAMS = {"id": "1", "rule": "idle-gpu", "token": "not-a-signed-token", "verb": "approve"}


def full_app(service: CollectorService, setup: Setup) -> web.Application:
    tokens = TokenTable(
        tuple(
            credential(token, role, f"{role.value}-1", ("node-a",) if role is AG else ())
            for role, token in TOKENS.items()
        )
    )
    remediation = Remediation(
        storage=setup.storage,
        remediator=setup.remediator,
        renderer=RunbookRenderer(default_runbooks_dir()),
        links=Links(base_url="http://127.0.0.1:4318"),
        rules={"idle-gpu": make_rule(mode=ActionMode.APPROVE)},
        approvals=setup.approvals,
    )
    # No throttling here: this test sends many wrong tokens on purpose (test_auth_throttle).
    config = CollectorConfig(tokens=tokens, auth_failure_limit=0)
    return create_app(
        config,
        service=service,
        background=False,
        remediation=remediation,
        prom_translate=translate,
    )


def routes(app: web.Application) -> list[tuple[str, str]]:
    """Every (method, template) the router serves; HEAD is tried as its own method."""
    found = set()
    for route in app.router.routes():
        assert route.resource is not None
        found.add((route.method, route.resource.canonical))
    return sorted(found)


def row(method: str, template: str) -> frozenset[Role] | str:
    return TABLE[("GET" if method == "HEAD" else method, template)]


def concrete(template: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: PARAMS[m.group(1)], template)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[web.Application]:
    service = fleet()
    setup = build(tmp_path, dry_run=False)
    yield full_app(service, setup)
    setup.storage.close()
    service.storage.close()


def test_every_route_has_a_row(app):
    served = {("GET" if m == "HEAD" else m, t) for m, t in routes(app)}
    assert served == set(TABLE), "a route without a row, or a row without a route"


def middleware_refusals(stats: AuthStats) -> int:
    """Refusals by the authentication middleware; a handler's own (``page-*``: a page's
    CSRF/Origin check, a reader's approval) come after the middleware let the request in."""
    return sum(n for key, n in stats.refusals.items() if not key[3].startswith("page-"))


async def test_each_role_reaches_exactly_its_routes(aiohttp_client, app):
    client = await aiohttp_client(app)
    stats = app[AUTH_STATS]
    credentials: list[tuple[str, str | None, Role | None]] = [
        ("no token", None, None),
        ("a wrong token", WRONG, None),
        *((role.value, token, role) for role, token in TOKENS.items()),
    ]
    wrong: list[str] = []
    for method, template in routes(app):
        admitted = row(method, template)
        for label, token, role in credentials:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            before = middleware_refusals(stats)
            resp = await client.request(
                method, concrete(template), headers=headers, json={}, allow_redirects=False
            )
            body = await resp.text()
            refused = middleware_refusals(stats) > before
            if admitted == OPEN or (role is not None and role in admitted):
                expected = "allowed"
            elif token is None and template in PAGES and method != "POST":
                expected = "303"  # to the sign-in form
                assert resp.headers.get("Location", "").startswith("/login?next="), template
            elif role is None:
                expected = "401"
            else:
                expected = "403"
            got = "allowed" if not refused else str(resp.status)
            if got != expected or resp.status >= 500:
                wrong.append(f"{label} {method} {template}: {resp.status} {body[:80]!r}")
            if expected == "401" and refused:
                assert resp.headers["WWW-Authenticate"] == "Bearer"
            if expected == "403" and refused and method != "HEAD":
                reason = f"role {role.value if role else ''} may not {method} {template}"
                assert reason in body, body
    assert wrong == []


@pytest.mark.parametrize(
    ("method", "path", "template"),
    [
        ("POST", "/v1/actions/1/approve", "/v1/actions/{id}/{verb}"),
        ("POST", "/v1/actions/1/reject", "/v1/actions/{id}/{verb}"),
        ("POST", "/v1/breaker/reset", "/v1/breaker/reset"),
        ("POST", "/v1/alertmanager", "/v1/alertmanager"),
        ("POST", "/v1/jobs", "/v1/jobs"),
        ("POST", "/v1/silences", "/v1/silences"),
        ("DELETE", "/v1/silences/1", "/v1/silences/{id}"),
        ("GET", "/v1/silences", "/v1/silences"),
        ("POST", "/v1/admin/reload", "/v1/admin/reload"),
        ("GET", "/v1/incidents", "/v1/incidents"),
        ("GET", "/status", "/status"),
        ("GET", "/metrics", "/metrics"),
    ],
)
async def test_an_agent_token_cannot_decide_alert_or_read(
    aiohttp_client, app, method, path, template
):
    client = await aiohttp_client(app)
    headers = {"Authorization": f"Bearer {TOKENS[AG]}"}
    resp = await client.request(method, path, headers=headers, json={})
    assert resp.status == 403
    assert await resp.json() == {"error": f"role agent may not {method} {template}"}
    refusals = app[AUTH_STATS].refusals
    assert refusals == {(method, template, 403, "role"): 1}


async def test_a_refusal_is_on_metrics_under_its_route_template(aiohttp_client, app):
    client = await aiohttp_client(app)
    agent = {"Authorization": f"Bearer {TOKENS[AG]}"}
    for action in ("1", "2", "3"):
        await client.post(f"/v1/actions/{action}/approve", headers=agent)
    await client.get("/v1/breaker")
    reader = {"Authorization": f"Bearer {TOKENS[R]}"}
    text = await (await client.get("/metrics", headers=reader)).text()
    lines = [line for line in text.splitlines() if line.startswith("gpuwarden_collector_auth_")]
    assert lines == [
        'gpuwarden_collector_auth_refusals_total{method="GET",reason="missing",'
        'route="/v1/breaker",status="401"} 1.0',
        'gpuwarden_collector_auth_refusals_total{method="POST",reason="role",'
        'route="/v1/actions/{id}/{verb}",status="403"} 3.0',
    ]


async def test_a_route_that_declares_nothing_admits_only_admins(aiohttp_client, app):
    async def secret(_request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app.router.add_get("/undeclared", secret)  # not through add_route: no roles declared
    client = await aiohttp_client(app)
    for role, token in TOKENS.items():
        resp = await client.get("/undeclared", headers={"Authorization": f"Bearer {token}"})
        assert resp.status == (200 if role is A else 403), role


async def test_other_credential_sources_are_asked_after_the_bearer_token(aiohttp_client, app):
    """On pages only: a session cookie travels with every request a browser makes, so it must
    never authorise the API (whose POSTs carry no CSRF token)."""

    def session(request: web.Request) -> Caller | None:
        return Caller("carol", OP, via="session") if "session" in request.cookies else None

    app[CREDENTIAL_SOURCES].append(session)
    client = await aiohttp_client(app)
    cookie = {"Cookie": "session=1"}
    assert (await client.get("/status", allow_redirects=False)).status == 303
    assert (await client.get("/status", headers=cookie)).status == 200
    wrong_and_cookie = {**cookie, "Authorization": f"Bearer {WRONG}"}
    assert (await client.get("/status", headers=wrong_and_cookie)).status == 200
    assert (await client.get("/v1/breaker", headers=cookie)).status == 401
    refused = await client.post("/v1/alertmanager", headers=cookie, json={})
    assert refused.status == 401
