"""Sign-in for people: ``GET``/``POST /login`` and ``POST /logout``, and :func:`setup_signin`,
which registers the credential sources the middleware asks on pages (a trusted proxy's
identity, then the session cookie).

A person signs in with a reader, operator or admin token (an agent's or an alert source's token
is refused); the token is checked once and never kept: the session cookie (HttpOnly,
SameSite=Strict, Secure over TLS or when ``remediation.external_url`` is https) carries the
name and role (:mod:`.session`). ``next`` is followed only when it is a path on this collector.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from aiohttp import web
from jinja2.sandbox import SandboxedEnvironment

from gpuwarden.collector.web.auth import authenticate
from gpuwarden.collector.web.keys import (
    CONFIG,
    CREDENTIAL_SOURCES,
    THROTTLE,
    TOKENS,
    Admits,
    Caller,
    add_route,
)
from gpuwarden.collector.web.proxy_identity import ProxyIdentity
from gpuwarden.collector.web.session import (
    COOKIE,
    PERSON_ROLES,
    SESSIONS,
    SessionSigner,
    load_session_key,
    origin_problem,
    session_caller,
)

log = logging.getLogger(__name__)

DEFAULT_NEXT = "/status"
_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "same-origin"}

_SIGN_IN = Admits(open_because="the sign-in form: its POST checks the token itself")

_FORM = SandboxedEnvironment(autoescape=True).from_string(
    """<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Sign in: gpuwarden</title></head>
<body class="doc narrow">
<h1>Sign in</h1>{% if message %}<p id="message">{{ message }}</p>{% endif %}
<form method="post" action="/login">
<input type="hidden" name="next" value="{{ next }}">
<label>Token <input id="token" type="password" name="token" autocomplete="off" required></label>
<button id="signin" type="submit">Sign in</button></form>
<p>Use a reader, operator or admin token; agent and alert-source tokens cannot sign in.</p>
</body></html>"""
)


def safe_next(value: str | None) -> str:
    """``value`` when it is a path on this collector, else :data:`DEFAULT_NEXT` (no open
    redirect: no scheme, no host, no ``//`` or ``/\\`` that browsers read as a host)."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")):
        return DEFAULT_NEXT
    if "\\" in value or not value.isprintable() or any(c.isspace() for c in value):
        return DEFAULT_NEXT
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return DEFAULT_NEXT
    return value


def _form(next_path: str, message: str = "", status: int = 200) -> web.Response:
    body = _FORM.render(next=next_path, message=message)
    return web.Response(text=body, content_type="text/html", status=status, headers=_HEADERS)


def sign_in_refusal(caller: Caller | None) -> str | None:
    """Why this credential may not sign in, or None."""
    if caller is None:
        return "not a valid token"
    if caller.role not in PERSON_ROLES:
        return f"{caller.role.value} tokens cannot sign in"
    return None


async def login_page(request: web.Request) -> web.Response:
    """``GET /login``: the sign-in form."""
    return _form(safe_next(request.query.get("next")))


async def login(request: web.Request) -> web.StreamResponse:
    """``POST /login``: check the token, set the session cookie, go to ``next``."""
    form = await request.post()
    next_path = safe_next(str(form.get("next") or ""))
    problem = origin_problem(request)
    if problem is not None:
        return _form(next_path, problem, status=403)
    throttle, source = request.app[THROTTLE], request.remote or ""
    if throttle.retry_after(source):
        return _form(next_path, "Too many failed sign-ins; retry later.", status=429)
    token = str(form.get("token") or "").strip()
    tokens = request.app[TOKENS].table if TOKENS in request.app else None
    caller = authenticate(request.app[CONFIG], f"Bearer {token}", tokens) if token else None
    refusal = sign_in_refusal(caller)
    if refusal is not None or caller is None:
        throttle.failed(source)  # the same budget as the bearer tokens of the middleware
        log.warning("sign-in refused from %s: %s", request.remote, refusal)
        return _form(next_path, f"Not signed in: {refusal}.", status=403)
    config = request.app[CONFIG]
    signer = request.app[SESSIONS]
    cookie, _ = signer.issue(caller.name, caller.role)
    secure = request.secure or config.remediation.external_url.lower().startswith("https:")
    response = web.Response(status=303, headers={**_HEADERS, "Location": next_path})
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=int(signer.ttl_seconds()),
        path="/",
        secure=secure,
        httponly=True,
        samesite="Strict",
    )
    log.info("%s signed in as %s from %s", caller.name, caller.role.value, request.remote)
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    """``POST /logout``: end the session (same origin only) and forget the cookie."""
    problem = origin_problem(request)
    if problem is not None:
        return web.Response(status=403, text=f"{problem}\n")
    signer = request.app[SESSIONS]
    session = signer.read(request.cookies.get(COOKIE))
    if session is not None:
        signer.revoke(session)
    response = web.Response(status=303, headers={**_HEADERS, "Location": "/login"})
    response.del_cookie(COOKIE, path="/")
    return response


def setup_signin(app: web.Application) -> None:
    """The session signer, the credential sources and the sign-in routes.

    Raises:
        ValueError: the configured session key cannot be read.
    """
    settings = app[CONFIG].signin
    key, made = load_session_key(settings.session_key_file)
    if made:
        log.info("no signin.session_key_file: a new session key, sessions end at restart")
    app[SESSIONS] = SessionSigner(key, settings.session_seconds)
    sources = app.setdefault(CREDENTIAL_SOURCES, [])
    if settings.trusted_proxies:
        sources.append(ProxyIdentity(settings))
    sources.append(session_caller)
    add_route(app, "GET", "/login", login_page, _SIGN_IN)
    add_route(app, "POST", "/login", login, _SIGN_IN)
    add_route(app, "POST", "/logout", logout, _SIGN_IN)
