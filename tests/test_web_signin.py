"""People on the web: sign-in sessions, a trusted proxy's identity, and approvals that record the
signed-in person, refuse cross-origin and CSRF-less POSTs, and refuse readers.

The Chromium test drives a real collector (its own thread and port) with real headless Chromium
over the DevTools protocol: sign in through the form, open a Slack approval link, click Approve.
The other tests run the real app through aiohttp's client on loopback.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpuwarden.collector.alerts.runbooks import Links, RunbookRenderer
from gpuwarden.collector.config import (
    CollectorConfig,
    ConfigError,
    SignInSettings,
    load_collector_config,
)
from gpuwarden.collector.credentials import TokenTable, credential
from gpuwarden.collector.remediate.approvals import token_sha256
from gpuwarden.collector.remediate.remediator import ActionState
from gpuwarden.collector.rules.loader import default_runbooks_dir
from gpuwarden.collector.rules.model import ActionMode
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import AUTH_STATS, Caller, Role
from gpuwarden.collector.web.login import safe_next, sign_in_refusal
from gpuwarden.collector.web.remediation_setup import Remediation
from gpuwarden.collector.web.session import COOKIE, SESSIONS, SessionSigner
from tests.cdp import CHROMIUM, browser_page
from tests.collector_server import CollectorThread
from tests.test_remediate_web import Setup, awaiting, build
from tests.test_remediator import make_rule

OPERATOR = "operator-token-0123456789abcdef"
AGENT = "agent-token-for-signin-0123456789"
TOKENS = TokenTable(
    (credential(OPERATOR, Role.OPERATOR, "olivia"), credential(AGENT, Role.AGENT, "gpu-node-01"))
)
EVIL = "https://evil.example"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def remediation_of(setup: Setup) -> Remediation:
    return Remediation(
        storage=setup.storage,
        remediator=setup.remediator,
        renderer=RunbookRenderer(default_runbooks_dir()),
        links=Links(base_url="http://127.0.0.1:4318"),
        rules={"idle-gpu": make_rule(mode=ActionMode.APPROVE)},
        approvals=setup.approvals,
    )


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = build(tmp_path, dry_run=False)
    yield s
    s.storage.close()


def app_of(setup: Setup, **keys: Any) -> web.Application:
    config = CollectorConfig(**{"tokens": TOKENS, **keys})
    return create_app(config, remediation=remediation_of(setup))


def own(client: Any) -> dict[str, str]:
    """The Origin header a browser sends from the collector's own pages."""
    return {"Origin": str(client.make_url("/")).rstrip("/")}


async def sign_in(client: Any, token: str = OPERATOR) -> dict[str, str]:
    """Sign in through the form; the session cookie as a header (the client's jar emptied)."""
    response = await client.post(
        "/login",
        data={"token": token, "next": "/status"},
        headers=own(client),
        allow_redirects=False,
    )
    assert response.status == 303, await response.text()
    value = response.cookies[COOKIE].value
    client.session.cookie_jar.clear()
    return {"Cookie": f"{COOKIE}={value}"}


async def csrf_of(client: Any, link: str, headers: Mapping[str, str]) -> str:
    page = await client.get(f"/approve/{link}", headers=headers)
    assert page.status == 200, await page.text()
    found = CSRF.search(await page.text())
    assert found is not None
    return found.group(1)


def state_of(setup: Setup, action_id: int) -> str:
    row = setup.storage.action(action_id)
    assert row is not None
    return str(row.state)


# The browser ------------------------------------------------------------------------------------


EVIL_PAGE = """<!doctype html><html><body><h1>You won a GPU</h1>
<form method="post" action="{action}"><input type="hidden" name="csrf_token" value="guess">
<button id="claim" type="submit">Claim</button></form></body></html>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
async def test_an_operator_signs_in_and_approves_in_chromium(setup, tmp_path, aiohttp_server):
    action_id = awaiting(setup)
    link = setup.approval_token()
    server = CollectorThread(remediation=remediation_of(setup), settings={"tokens": TOKENS})
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        approve_url = f"{base}/approve/{link}"
        evil = web.Application()

        async def lure(_request: web.Request) -> web.Response:
            return web.Response(text=EVIL_PAGE.format(action=approve_url), content_type="text/html")

        evil.router.add_get("/", lure)
        lure_url = str((await aiohttp_server(evil)).make_url("/"))

        async with browser_page(tmp_path / "profile") as page:
            # The Slack link, not signed in: the sign-in form, which comes back to the link.
            await page.navigate(approve_url)
            assert (await page.location()).startswith(f"{base}/login?next=%2Fapprove%2F")
            await page.type_into("token", OPERATOR)
            await page.click("signin")
            assert await page.location() == approve_url
            assert "Signed in as olivia" in await page.text()
            (cookie,) = await page.cookies(base)
            assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"]) == (
                COOKIE,
                True,
                "Strict",
            )
            assert OPERATOR not in cookie["value"]

            # Another origin (same host, another port: same site, so the cookie goes along)
            # posts the approval form: refused, nothing approved.
            await page.navigate(lure_url)
            await page.click("claim")
            assert "cross-origin request refused" in await page.text()
            assert state_of(setup, action_id) == ActionState.AWAITING_APPROVAL

            # The collector's own page without its CSRF token: refused.
            await page.navigate(approve_url)
            await page.evaluate("document.querySelector('[name=csrf_token]').remove()")
            await page.click("approve")
            assert "missing or wrong CSRF token" in await page.text()
            assert state_of(setup, action_id) == ActionState.AWAITING_APPROVAL
            assert setup.actuator.real_calls == []

            # The page as served: approved, as the signed-in operator.
            await page.navigate(approve_url)
            await page.click("approve")
            assert "Approved" in await page.text()
    finally:
        server.stop()
    assert state_of(setup, action_id) == ActionState.VERIFYING
    assert len(setup.actuator.real_calls) == 1
    approvals = [e for e in setup.storage.audit() if e.verdict == "human_approved"]
    assert [e.actor for e in approvals] == ["olivia"]
    record = setup.storage.approval(token_sha256(link))
    assert record is not None
    assert record.used_by == "olivia"


# Sessions ---------------------------------------------------------------------------------------


async def test_a_page_without_a_person_goes_to_sign_in(aiohttp_client, setup) -> None:
    awaiting(setup)
    link = setup.approval_token()
    client = await aiohttp_client(app_of(setup))
    page = await client.get(f"/approve/{link}", allow_redirects=False)
    assert page.status == 303
    assert page.headers["Location"] == f"/login?next=%2Fapprove%2F{link}"
    runbook = await client.get("/runbooks/idle-gpu?format=md", allow_redirects=False)
    assert runbook.headers["Location"] == "/login?next=%2Frunbooks%2Fidle-gpu%3Fformat%3Dmd"
    post = await client.post(f"/approve/{link}", headers=own(client))
    assert post.status == 401
    api = await client.get("/v1/actions", allow_redirects=False)  # the API still answers 401
    assert (api.status, api.content_type) == (401, "application/json")


async def test_the_session_cookie_and_what_it_opens(aiohttp_client, setup) -> None:
    client = await aiohttp_client(app_of(setup))
    response = await client.post(
        "/login",
        data={"token": OPERATOR, "next": "/runbooks/idle-gpu"},
        headers=own(client),
        allow_redirects=False,
    )
    assert response.status == 303
    assert response.headers["Location"] == "/runbooks/idle-gpu"
    set_cookie = response.headers["Set-Cookie"]
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"):
        assert attribute in set_cookie, attribute
    assert "Secure" not in set_cookie  # plain HTTP here; over TLS the cookie is Secure
    assert OPERATOR not in set_cookie
    cookie = {"Cookie": f"{COOKIE}={response.cookies[COOKIE].value}"}
    client.session.cookie_jar.clear()
    assert (await client.get("/runbooks/idle-gpu", headers=cookie)).status == 200
    # The session opens pages, never the API: a cookie cannot drive /v1 from another site.
    assert (await client.get("/v1/actions", headers=cookie)).status == 401
    # On a page a bearer token that matches nothing does not hide the session: a reverse proxy
    # may pass its own Authorization header along (web.auth.find_caller).
    wrong = {**cookie, "Authorization": "Bearer wrong-token-0123456789abc"}
    page = await client.get("/runbooks/idle-gpu", headers=wrong, allow_redirects=False)
    assert page.status == 200


async def test_a_tampered_or_signed_out_cookie_is_not_signed_in(aiohttp_client, setup) -> None:
    client = await aiohttp_client(app_of(setup))
    cookie = await sign_in(client)
    value = cookie["Cookie"].split("=", 1)[1]
    version, payload, mac = value.split(".")
    flipped = payload[:-2] + ("A" if payload[-2] != "A" else "B") + payload[-1]
    tampered = [
        f"{version}.{flipped}.{mac}",
        f"{version}.{payload}.{mac[:-1]}{'A' if mac[-1] != 'A' else 'B'}",
        f"{version}.{payload}",
        "garbage",
    ]
    for bad in tampered:
        page = await client.get(
            "/runbooks/idle-gpu", headers={"Cookie": f"{COOKIE}={bad}"}, allow_redirects=False
        )
        assert page.status == 303, bad
    assert (await client.get("/runbooks/idle-gpu", headers=cookie)).status == 200
    out = await client.post("/logout", headers={**cookie, **own(client)}, allow_redirects=False)
    assert out.status == 303
    page = await client.get("/runbooks/idle-gpu", headers=cookie, allow_redirects=False)
    assert page.status == 303  # the signed-out cookie no longer opens anything


def test_sessions_expire_and_carry_no_other_role() -> None:
    now = [1_000.0]
    signer = SessionSigner(b"k" * 32, ttl_seconds=60, clock=lambda: now[0])
    cookie, session = signer.issue("olivia", Role.OPERATOR)
    assert signer.read(cookie) == session
    now[0] += 59
    assert signer.read(cookie) == session
    now[0] += 1
    assert signer.read(cookie) is None
    assert SessionSigner(b"x" * 32, 60, clock=lambda: 1_000.0).read(cookie) is None  # other key
    with pytest.raises(ValueError, match="cannot have a session"):
        signer.issue("gpu-node-01", Role.AGENT)
    with pytest.raises(ValueError, match="cannot have a session"):
        signer.issue("two words", Role.READER)


def test_agent_and_alert_source_tokens_cannot_sign_in() -> None:
    assert sign_in_refusal(Caller("gpu-node-01", Role.AGENT)) == "agent tokens cannot sign in"
    assert sign_in_refusal(Caller("am", Role.ALERT_SOURCE)) == "alert-source tokens cannot sign in"
    assert sign_in_refusal(None) == "not a valid token"
    for role in (Role.READER, Role.OPERATOR, Role.ADMIN):
        assert sign_in_refusal(Caller("person", role)) is None


async def test_a_wrong_token_does_not_sign_in(aiohttp_client, setup) -> None:
    client = await aiohttp_client(app_of(setup))
    for data in ({"token": "wrong-token-0123456789abc"}, {}):
        response = await client.post("/login", data=data, headers=own(client))
        assert response.status == 403
        assert "Not signed in: not a valid token." in await response.text()
        assert COOKIE not in response.cookies
    agent = await client.post("/login", data={"token": AGENT}, headers=own(client))
    assert agent.status == 403
    assert "Not signed in: agent tokens cannot sign in." in await agent.text()
    assert COOKIE not in agent.cookies
    cross = await client.post("/login", data={"token": OPERATOR}, headers={"Origin": EVIL})
    assert cross.status == 403
    assert COOKIE not in cross.cookies


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/approve/v1.2.3", "/approve/v1.2.3"),
        ("/status?x=1", "/status?x=1"),
        ("https://evil.example/", "/status"),
        ("//evil.example/x", "/status"),
        ("/\\evil.example", "/status"),
        ("/\t/evil.example", "/status"),
        ("javascript:alert(1)", "/status"),
        ("status", "/status"),
        ("", "/status"),
    ],
)
def test_next_is_a_path_on_this_collector(value: str, expected: str) -> None:
    assert safe_next(value) == expected


async def test_no_open_redirect_after_sign_in(aiohttp_client, setup) -> None:
    client = await aiohttp_client(app_of(setup))
    for bad in ("https://evil.example/", "//evil.example", "/\\evil.example"):
        form = await client.get("/login", params={"next": bad})
        assert 'name="next" value="/status"' in await form.text()
        response = await client.post(
            "/login",
            data={"token": OPERATOR, "next": bad},
            headers=own(client),
            allow_redirects=False,
        )
        assert response.headers["Location"] == "/status", bad


# Approvals --------------------------------------------------------------------------------------


async def test_cross_origin_and_csrf_less_posts_approve_nothing(aiohttp_client, setup) -> None:
    action_id = awaiting(setup)
    link = setup.approval_token()
    client = await aiohttp_client(app_of(setup))
    cookie = await sign_in(client)
    csrf = await csrf_of(client, link, cookie)
    refused = [
        ({"Origin": EVIL}, {"csrf_token": csrf}, "cross-origin request refused"),
        ({"Origin": "null"}, {"csrf_token": csrf}, "cross-origin request refused"),
        ({"Referer": f"{EVIL}/x"}, {"csrf_token": csrf}, "cross-origin request refused"),
        ({}, {"csrf_token": csrf}, "no Origin or Referer"),
        (own(client), {}, "missing or wrong CSRF token"),
        (own(client), {"csrf_token": csrf[:-2] + "xx"}, "missing or wrong CSRF token"),
        # the form field that used to name the approver names no one now
        (own(client), {"approver": "mallory"}, "missing or wrong CSRF token"),
    ]
    for headers, data, reason in refused:
        response = await client.post(f"/approve/{link}", data=data, headers={**cookie, **headers})
        assert response.status == 403, (headers, data)
        assert reason in await response.text()
    assert state_of(setup, action_id) == ActionState.AWAITING_APPROVAL
    counted = client.app[AUTH_STATS].refusals[("POST", "/approve/{token}", 403, "page-csrf")]
    assert counted == len(refused)
    # Another person's token does not pass for this session's.
    other = await sign_in(client)
    other_csrf = await csrf_of(client, link, other)
    assert other_csrf != csrf
    wrong = await client.post(
        f"/approve/{link}", data={"csrf_token": other_csrf}, headers={**cookie, **own(client)}
    )
    assert wrong.status == 403
    # The same session, its own token, its own origin; the form's name is ignored.
    done = await client.post(
        f"/approve/{link}",
        data={"csrf_token": csrf, "approver": "mallory"},
        headers={**cookie, **own(client)},
    )
    assert done.status == 200, await done.text()
    assert state_of(setup, action_id) == ActionState.VERIFYING
    actors = {e.actor for e in setup.storage.audit()}
    assert "olivia" in actors
    assert "mallory" not in actors


async def test_a_reader_sees_the_page_but_cannot_approve(aiohttp_client, setup) -> None:
    action_id = awaiting(setup)
    link = setup.approval_token()
    app = app_of(setup)
    client = await aiohttp_client(app)
    value, _ = app[SESSIONS].issue("rita", Role.READER)  # a reader's session, as /login makes
    cookie = {"Cookie": f"{COOKIE}={value}"}
    page = await client.get(f"/approve/{link}", headers=cookie)
    assert page.status == 200
    assert "Only an operator or admin may approve." in await page.text()
    csrf = await csrf_of(client, link, cookie)
    post = await client.post(
        f"/approve/{link}", data={"csrf_token": csrf}, headers={**cookie, **own(client)}
    )
    assert post.status == 403
    assert "rita is a reader: only an operator or admin may approve" in await post.text()
    assert state_of(setup, action_id) == ActionState.AWAITING_APPROVAL
    # counted with the middleware's refusals, under the route's template
    assert app[AUTH_STATS].refusals[("POST", "/approve/{token}", 403, "page-role")] == 1


async def test_without_auth_the_approver_is_anonymous(aiohttp_client, setup) -> None:
    action_id = awaiting(setup)
    link = setup.approval_token()
    app = create_app(CollectorConfig(allow_unauthenticated=True), remediation=remediation_of(setup))
    client = await aiohttp_client(app)
    csrf = await csrf_of(client, link, {})
    cross = await client.post(
        f"/approve/{link}", data={"csrf_token": csrf}, headers={"Origin": EVIL}
    )
    assert cross.status == 403  # no person to protect, still no cross-origin approvals
    done = await client.post(f"/approve/{link}", data={"csrf_token": csrf}, headers=own(client))
    assert done.status == 200
    assert state_of(setup, action_id) == ActionState.VERIFYING
    assert any(e.actor == "anonymous" for e in setup.storage.audit())


# A trusted reverse proxy -------------------------------------------------------------------------


async def test_proxy_headers_from_an_untrusted_peer_are_ignored(aiohttp_client, setup, caplog):
    awaiting(setup)
    link = setup.approval_token()
    signin = SignInSettings(trusted_proxies=("10.9.9.0/24",), proxy_default_role="operator")
    client = await aiohttp_client(app_of(setup, signin=signin))
    caplog.set_level(logging.WARNING, "gpuwarden.collector.web.proxy_identity")
    for header in ("X-Forwarded-User", "X-Auth-Request-Email", "X-Forwarded-User"):
        page = await client.get(
            f"/approve/{link}", headers={header: "mallory"}, allow_redirects=False
        )
        assert page.status == 303
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "ignoring X-Forwarded-User from 127.0.0.1: not a trusted proxy (signin.trusted_proxies)"
    ]  # once per peer


async def test_proxy_identity_from_a_trusted_peer_approves_as_that_person(
    aiohttp_client, setup
) -> None:
    action_id = awaiting(setup)
    link = setup.approval_token()
    signin = SignInSettings(
        trusted_proxies=("127.0.0.1",),
        proxy_roles={"ops@example.com": "operator"},
        proxy_default_role="reader",
    )
    client = await aiohttp_client(app_of(setup, signin=signin))
    reader = {"X-Forwarded-User": "rita"}
    assert (
        "Signed in as rita (reader)"
        in await (await client.get(f"/approve/{link}", headers=reader)).text()
    )
    csrf = await csrf_of(client, link, reader)
    refused = await client.post(
        f"/approve/{link}", data={"csrf_token": csrf}, headers={**reader, **own(client)}
    )
    assert refused.status == 403
    # oauth2-proxy's e-mail header names the person, before X-Forwarded-User.
    operator = {"X-Auth-Request-Email": "ops@example.com", "X-Forwarded-User": "rita"}
    csrf = await csrf_of(client, link, operator)
    done = await client.post(
        f"/approve/{link}", data={"csrf_token": csrf}, headers={**operator, **own(client)}
    )
    assert done.status == 200, await done.text()
    assert state_of(setup, action_id) == ActionState.VERIFYING
    assert any(e.actor == "ops@example.com" for e in setup.storage.audit())


async def test_proxy_people_without_a_role_are_not_let_in(aiohttp_client, setup) -> None:
    signin = SignInSettings(trusted_proxies=("127.0.0.0/8",), proxy_default_role=None)
    client = await aiohttp_client(app_of(setup, signin=signin))
    page = await client.get(
        "/runbooks/idle-gpu", headers={"X-Forwarded-User": "someone"}, allow_redirects=False
    )
    assert page.status == 303


# Configuration ----------------------------------------------------------------------------------


def test_signin_config_is_checked_at_load(tmp_path: Path) -> None:
    path = tmp_path / "collector.yaml"
    key = tmp_path / "session.key"
    key.write_text("short\n")
    cases = [
        ("signin:\n  trusted_proxies: [10.0.0.0/33]\n", "is not an IP address or CIDR"),
        ("signin:\n  proxy_default_role: agent\n", "signin.proxy_default_role"),
        (f"signin:\n  session_key_file: {key}\n", "needs 32+ bytes"),
        (f"signin:\n  session_key_file: {tmp_path / 'none'}\n", "No such file"),
    ]
    for text, message in cases:
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_collector_config(path)
    key.write_text("k" * 48 + "\n")
    path.write_text(f"signin:\n  session_key_file: {key}\n  trusted_proxies: 10.0.0.1\n")
    config = load_collector_config(path)
    assert config.signin.trusted_proxies == ("10.0.0.1",)
    assert config.signin.session_seconds == 12 * 3600


async def test_the_demo_operator_approves_as_a_browser_does(aiohttp_server, setup) -> None:
    """The demo (auth: none on loopback) still approves through the link, as a browser does."""
    import aiohttp

    from gpuwarden.demo import _Operator

    action_id = awaiting(setup)
    link = setup.approval_token()
    server = await aiohttp_server(app_of(setup, tokens=TokenTable(()), allow_unauthenticated=True))
    lines: list[str] = []
    async with aiohttp.ClientSession() as session:
        operator = _Operator(session, lines.append, delay_seconds=0)
        operator.offer(str(server.make_url(f"/approve/{link}")))
        await operator.act()
    assert lines == ["operator: approved through the signed link -> HTTP 200"]
    assert state_of(setup, action_id) == ActionState.VERIFYING
    assert any(e.actor == "anonymous" for e in setup.storage.audit())
