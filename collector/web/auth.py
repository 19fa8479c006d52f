"""Authentication and roles: one middleware, driven by what each route admits (:class:`Admits`).

Routes add themselves with :func:`~gpuwarden.collector.web.keys.add_route`, naming the roles
they admit; a route that declared nothing admits administrators only (fail closed). For a
request to a route that is not open, the middleware

1. answers 429 with ``Retry-After``, without looking at the credential, when the source address
   failed to authenticate too often (:class:`~.throttle.FailureThrottle`);
2. finds the caller: the ``Authorization: Bearer`` token first; on pages for people
   (``keys.add_page``) and only there, when the token is absent or matches nothing, each of
   ``app[CREDENTIAL_SOURCES]`` (a trusted proxy's identity, a session; see ``web.login``);
   under ``allow_unauthenticated`` everyone is the anonymous admin. No caller: 401 with
   ``WWW-Authenticate``, or for a page without a credential, a browser's GET goes to ``/login``;
3. checks the caller's role against the route's: 403 with a one-line reason otherwise;
4. puts the caller in ``request[CALLER]`` and calls the handler.

Every refusal is counted in ``app[AUTH_STATS]`` under the route's path template (shown on
``/metrics`` as ``gpuwarden_collector_auth_refusals_total``). Refusals are JSON, or text on the
OTLP receiver (which counts every answer it gives). Requests that match no route go on to their
404 or 405.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import quote

from aiohttp import web

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import TokenTable
from gpuwarden.collector.web.keys import (
    ADMINS,
    AUTH_STATS,
    CALLER,
    CONFIG,
    CREDENTIAL_SOURCES,
    PAGES,
    ROUTE_ACCESS,
    STATS,
    THROTTLE,
    TOKENS,
    Admits,
    Caller,
    Handler,
    Role,
    route_template,
)

ANONYMOUS = Caller("anonymous", Role.ADMIN, via="anonymous")
"""Everyone, under ``allow_unauthenticated`` ("auth: none": the demo and loopback set-ups)."""
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def exposure_warning(config: CollectorConfig) -> str | None:
    """The start-up warning for ``allow_unauthenticated`` on an address beyond loopback, else None.

    Loopback is ``localhost`` or a literal loopback address (127.0.0.0/8, ``::1``); any other
    host, a name or ``0.0.0.0``, may be reached from elsewhere.
    """
    if not config.allow_unauthenticated or _is_loopback(config.host):
        return None
    return (
        f"allow_unauthenticated on {config.host}:{config.port}, beyond loopback: anyone who "
        "reaches it is an admin (writes any node, approves actions, reads every page); set "
        "tokens_file, or host: 127.0.0.1 behind an authenticating proxy"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def authenticate(
    config: CollectorConfig, header: str | None, tokens: TokenTable | None = None
) -> Caller | None:
    """The caller of an ``Authorization: Bearer`` header, else None.

    The token is matched by its SHA-256 in ``tokens`` (the app's tokens in force, ``TOKENS``;
    default: the config's). Under ``allow_unauthenticated`` (which excludes tokens) every
    request is :data:`ANONYMOUS`.
    """
    if config.allow_unauthenticated:
        return ANONYMOUS
    scheme, _, presented = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return None
    found = (config.tokens if tokens is None else tokens).match(presented.strip())
    if found is None:
        return None
    return Caller(found.subject, found.role, frozenset(found.nodes))


def find_caller(request: web.Request, *, page: bool) -> Caller | None:
    """The bearer token's caller; on a page, when that gives none, the first credential
    source's; else None.

    Only pages ask the sources: a session cookie travels with every request a browser makes,
    so it must never authorise the API, whose POSTs carry no CSRF token. On a page a bearer
    token that matches nothing does not stop the sources: a reverse proxy may pass its own
    ``Authorization`` header along with the identity it vouches for.
    """
    config = request.app[CONFIG]
    tokens = request.app[TOKENS].table if TOKENS in request.app else None
    caller = authenticate(config, request.headers.get("Authorization"), tokens)
    if caller is not None or config.allow_unauthenticated or not page:
        return caller
    for source in request.app.get(CREDENTIAL_SOURCES, ()):
        caller = source(request)
        if caller is not None:
            return caller
    return None


def sign_in_first(request: web.Request) -> web.Response:
    """A page without a person: a browser's GET goes to the sign-in form, anything else 401."""
    request.app[AUTH_STATS].count(request, 401, "sign-in")
    if request.method in ("GET", "HEAD"):
        location = "/login?next=" + quote(request.rel_url.path_qs, safe="")
        return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})
    return web.Response(status=401, text="sign in first: /login\n", headers=_CHALLENGE)


def _refuse(
    request: web.Request, admits: Admits, status: int, reason: str, message: str
) -> web.Response:
    """Count the refusal and answer it in the route's shape."""
    request.app[AUTH_STATS].count(request, status, reason)
    headers = _CHALLENGE if status == 401 else {}
    if admits.plain_refusals:
        request.app[STATS].responses[status] += 1
        return web.Response(status=status, text=f"{message}\n", headers=headers)
    return web.json_response({"error": message}, status=status, headers=headers)


def _no_caller(request: web.Request, admits: Admits, *, page: bool) -> web.Response:
    """A request without a caller: a page without a credential goes to sign in (nothing was
    guessed, so no throttled failure), anything else is a counted, throttled 401."""
    missing = "Authorization" not in request.headers
    if page and missing:
        return sign_in_first(request)
    request.app[THROTTLE].failed(request.remote or "")
    reason = "missing" if missing else "invalid"
    return _refuse(request, admits, 401, reason, "missing or invalid bearer token")


@web.middleware
async def authentication(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Let the request through when its route is open or its caller admitted; else refuse."""
    match = request.match_info
    if match.http_exception is not None:  # no such route or method: nothing to protect
        return await handler(request)
    app = request.app
    admits = app[ROUTE_ACCESS].get(match.handler, ADMINS)
    if admits.open_because:
        return await handler(request)
    throttle, source = app[THROTTLE], request.remote or ""
    wait = throttle.retry_after(source)
    if wait:
        response = _refuse(
            request, admits, 429, "throttled", "too many failed authentications; retry later"
        )
        response.headers["Retry-After"] = str(wait)
        return response
    page = match.handler in app.get(PAGES, ())
    caller = find_caller(request, page=page)
    if caller is None:
        return _no_caller(request, admits, page=page)
    if not admits.admits(caller.role):
        message = f"role {caller.role.value} may not {request.method} {route_template(request)}"
        return _refuse(request, admits, 403, "role", message)
    request[CALLER] = caller
    return await handler(request)
