"""A reference serving router: weighted backends per route, read and set over HTTP.

This is the small contract gpuwarden's HTTP routing actuator speaks, and what the demo runs in
front of its model servers. A route (usually one per model deployment) sends each request to a
backend with probability weight / sum of weights.

- ``GET /v1/routes`` → ``{"routes": [{"name": ..., "backends": {"<backend>": weight}}]}``
- ``GET /v1/routes/{name}`` → ``{"name": ..., "backends": {...}}`` (404 for an unknown route)
- ``PUT /v1/routes/{name}`` with ``{"backends": {...}}``: the same backends as before, weights
  finite and >= 0 with a positive sum (400 otherwise; the route is unchanged)

With a token, every call needs ``Authorization: Bearer <token>`` (401 otherwise).
"""

from __future__ import annotations

import hmac
import json
import math
import threading
from collections.abc import Mapping

from aiohttp import web

MAX_BODY_BYTES = 64 * 1024


class RouteError(ValueError):
    """A route or weights the router refuses."""


class RouterState:
    """The routes and their weights; thread-safe (the demo's simulation reads it too)."""

    def __init__(self, routes: Mapping[str, Mapping[str, float]]) -> None:
        self._lock = threading.Lock()
        self._routes = {name: self._checked(name, dict(w), None) for name, w in routes.items()}

    @staticmethod
    def _checked(
        name: str, weights: Mapping[str, object], current: Mapping[str, float] | None
    ) -> dict[str, float]:
        if not weights:
            raise RouteError(f"route {name}: no backends")
        out: dict[str, float] = {}
        for backend, weight in weights.items():
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                raise RouteError(f"route {name}: weight of {backend!r} is not a number")
            if not math.isfinite(weight) or weight < 0:
                raise RouteError(f"route {name}: weight of {backend!r} must be finite and >= 0")
            out[str(backend)] = float(weight)
        if sum(out.values()) <= 0:
            raise RouteError(f"route {name}: the weights must not all be 0")
        if current is not None and set(out) != set(current):
            raise RouteError(f"route {name}: backends are {sorted(current)}, not {sorted(out)}")
        return out

    def routes(self) -> dict[str, dict[str, float]]:
        """Every route's weights (a copy)."""
        with self._lock:
            return {name: dict(weights) for name, weights in self._routes.items()}

    def get(self, name: str) -> dict[str, float]:
        """One route's weights; ``KeyError`` for an unknown route."""
        with self._lock:
            return dict(self._routes[name])

    def set(self, name: str, weights: Mapping[str, object]) -> dict[str, float]:
        """Replace a route's weights (same backends); ``KeyError``, ``RouteError``."""
        with self._lock:
            current = self._routes[name]
            self._routes[name] = self._checked(name, weights, current)
            return dict(self._routes[name])

    def share(self, name: str, backend: str) -> float:
        """The share of the route's traffic that goes to ``backend`` (0 when unknown)."""
        with self._lock:
            weights = self._routes.get(name, {})
            total = sum(weights.values())
            return weights.get(backend, 0.0) / total if total > 0 else 0.0


_STATE = web.AppKey("router_state", RouterState)
_TOKEN = web.AppKey("router_token", str)


def _authorized(request: web.Request) -> None:
    token = request.app[_TOKEN]
    if not token:
        return
    sent = request.headers.get("Authorization", "")
    if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
        raise web.HTTPUnauthorized(text="missing or wrong bearer token\n")


async def _list(request: web.Request) -> web.Response:
    _authorized(request)
    routes = request.app[_STATE].routes()
    return web.json_response(
        {"routes": [{"name": n, "backends": w} for n, w in sorted(routes.items())]}
    )


async def _get(request: web.Request) -> web.Response:
    _authorized(request)
    name = request.match_info["name"]
    try:
        weights = request.app[_STATE].get(name)
    except KeyError:
        raise web.HTTPNotFound(text=f"no route {name!r}\n") from None
    return web.json_response({"name": name, "backends": weights})


async def _put(request: web.Request) -> web.Response:
    _authorized(request)
    name = request.match_info["name"]
    body = await request.content.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=len(body))
    try:
        payload = json.loads(body)
        backends = payload["backends"]
        if not isinstance(backends, dict):
            raise TypeError("backends must be an object")
        weights = request.app[_STATE].set(name, backends)
    except KeyError:
        if name not in request.app[_STATE].routes():
            raise web.HTTPNotFound(text=f"no route {name!r}\n") from None
        raise web.HTTPBadRequest(text='expected {"backends": {"<backend>": weight}}\n') from None
    except (ValueError, TypeError) as exc:
        raise web.HTTPBadRequest(text=f"{exc}\n") from None
    return web.json_response({"name": name, "backends": weights})


def create_router_app(state: RouterState, *, token: str = "") -> web.Application:
    """The router's HTTP API over ``state``."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[_STATE] = state
    app[_TOKEN] = token
    app.router.add_get("/v1/routes", _list)
    app.router.add_get("/v1/routes/{name}", _get)
    app.router.add_put("/v1/routes/{name}", _put)
    return app
