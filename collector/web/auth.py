"""Authentication: one middleware, driven by what each route declared (:class:`Access`).

Routes add themselves with :func:`~gpuwarden.collector.web.keys.add_route`, naming who may call
them; a route that declared nothing needs the API token. The middleware checks the bearer
token before the handler runs, puts the token's owner in ``request[CALLER]``, and refuses with
401 in the shape of the route: JSON for the API, text for the OTLP receiver (which counts every
answer it gives). Requests that match no route go on to their 404 or 405.

Pages for people (``keys.add_page``), and only they, also take a person from the credential
sources when the request has no ``Authorization`` header (``CREDENTIAL_SOURCES``: a trusted
proxy's identity, a session; see ``web.login``); a browser without one is sent to ``/login``.
"""

from __future__ import annotations

import hmac
from urllib.parse import quote

from aiohttp import web

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.web.keys import (
    CALLER,
    CONFIG,
    CREDENTIAL_SOURCES,
    PAGES,
    ROUTE_ACCESS,
    STATS,
    Access,
    Caller,
    Handler,
    Role,
)

_REFUSED = "missing or invalid bearer token"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def authenticate(config: CollectorConfig, header: str | None) -> Caller | None:
    """Return the caller for a valid ``Bearer`` token, else None (constant-time compare).

    Every token is still an administrator here: roles per token come with the tokens file's
    role column.
    """
    if not config.tokens:
        if not config.allow_unauthenticated:
            return None
        return Caller("anonymous", Role.ADMIN, via="anonymous")
    scheme, _, presented = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return None
    name = None
    candidate = presented.strip().encode("utf-8")
    for token, owner in config.tokens.items():
        if hmac.compare_digest(candidate, token.encode("utf-8")):
            name = owner
    return Caller(name, Role.ADMIN) if name is not None else None


@web.middleware
async def authentication(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Let the request through when its route is open or its token valid; else answer 401."""
    match = request.match_info
    if match.http_exception is not None:  # no such route or method: nothing to protect
        return await handler(request)
    app = request.app
    access = app[ROUTE_ACCESS].get(match.handler, Access.API_TOKEN)
    if access is Access.OPEN:
        return await handler(request)
    caller = authenticate(app[CONFIG], request.headers.get("Authorization"))
    page = match.handler in app.get(PAGES, ())
    if caller is None and page and "Authorization" not in request.headers:
        caller = person(request)
        if caller is None:
            return sign_in_first(request)
    if caller is None:
        if access is Access.INGEST_TOKEN:
            app[STATS].responses[401] += 1
            return web.Response(status=401, text=f"{_REFUSED}\n", headers=_CHALLENGE)
        return web.json_response({"error": _REFUSED}, status=401, headers=_CHALLENGE)
    request[CALLER] = caller
    return await handler(request)


# People on the web: pages also take a session or a trusted proxy's identity (web.login) -------


def person(request: web.Request) -> Caller | None:
    """The person a page request without ``Authorization`` comes from: the first credential
    source that names one (a trusted proxy's identity, a session), else None.

    Only pages ask: a session cookie travels with every request a browser makes, so it must
    never authorise the API, whose POSTs carry no CSRF token.
    """
    for source in request.app.get(CREDENTIAL_SOURCES, ()):
        caller = source(request)
        if caller is not None:
            return caller
    return None


def sign_in_first(request: web.Request) -> web.Response:
    """A page without a person: a browser's GET goes to the sign-in form, anything else 401."""
    if request.method in ("GET", "HEAD"):
        location = "/login?next=" + quote(request.rel_url.path_qs, safe="")
        return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})
    return web.Response(status=401, text="sign in first: /login\n", headers=_CHALLENGE)
