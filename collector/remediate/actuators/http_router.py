"""Degrade to a smaller model, and restore, through a router that speaks the reference contract.

``degrade`` moves ``traffic_ratio`` of a route's traffic to its fallback backend (the rest stays
on the primary); ``undo`` keeps the weights as they were, so a rollback (the remediator's
restore once the incident resolves, or the undo of a degrade that did not help) puts back
exactly those. The router is ``serving_router`` or anything with the same three endpoints.
Targets are deployments configured here; anything else is refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from gpuwarden.collector.clients.http import HttpClient
from gpuwarden.collector.remediate.actuators.base import ActionRequest, ActionResult, Outcome
from gpuwarden.collector.remediate.actuators.settings import RouteSpec

DEFAULT_RATIO = 0.5


class HttpRouterActuator:
    """``degrade`` / ``restore`` deployments through a router's HTTP API.

    Args:
        base_url: the router, e.g. ``http://router:8080``.
        routes: deployment (the incident's ``model``) → its route.
        token: bearer token of the router, if it wants one (never logged).
        timeout_seconds: per HTTP call (connect and read).
        http: the shared HTTP client (default: one of its own).
    """

    kinds = frozenset({"degrade", "restore"})

    def __init__(
        self,
        base_url: str,
        routes: Mapping[str, RouteSpec],
        *,
        token: str = "",
        timeout_seconds: float = 10.0,
        http: HttpClient | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError("the router URL must be http:// or https://")
        self._base = base_url.rstrip("/")
        self._routes = dict(routes)
        self._token = token
        self._timeout = timeout_seconds
        self._http = http or HttpClient()

    def accepts(self, target: str) -> bool:
        """Deployments with a configured route."""
        return target in self._routes

    def execute(self, request: ActionRequest) -> ActionResult:
        """Move traffic to the fallback (``degrade``) or back (``restore``: all to primary)."""
        spec = self._routes.get(request.target)
        if spec is None or request.kind not in self.kinds:
            return ActionResult(
                Outcome.REFUSED, f"no route configured for {request.kind} {request.target!r}"
            )
        current = self._weights(spec.route)
        if isinstance(current, ActionResult):
            return current
        wanted = _wanted(request, spec, current)
        if isinstance(wanted, ActionResult):
            return wanted
        if all(math.isclose(wanted[k], current[k], abs_tol=1e-9) for k in wanted):
            return ActionResult(Outcome.ALREADY_DONE, f"route {spec.route} is already {current}")
        if request.dry_run:
            return ActionResult(Outcome.DRY_RUN, f"would set route {spec.route} to {wanted}")
        return self._put(spec.route, wanted, undo=current)

    def rollback(self, request: ActionRequest, result: ActionResult) -> ActionResult:
        """Put back the weights recorded in ``result.undo``."""
        spec = self._routes.get(request.target)
        previous = result.undo.get("weights")
        if spec is None or not isinstance(previous, Mapping):
            return ActionResult(Outcome.REFUSED, f"nothing to restore for {request.target!r}")
        if request.dry_run:
            return ActionResult(Outcome.DRY_RUN, f"would restore route {spec.route}")
        return self._put(spec.route, {str(k): float(v) for k, v in previous.items()}, undo={})

    def probe(self, request: ActionRequest) -> ActionResult | None:
        """After a crash: is the route already at the degraded split? (None: cannot tell)."""
        spec = self._routes.get(request.target)
        if spec is None or request.kind != "degrade":
            return None
        current = self._weights(spec.route)
        if isinstance(current, ActionResult):
            return None
        total = sum(current.values())
        ratio = _ratio(request.parameters.get("traffic_ratio", DEFAULT_RATIO))
        if ratio is not None and total > 0:
            share = current.get(spec.fallback, 0.0) / total
            if math.isclose(share, ratio, abs_tol=1e-6):
                return ActionResult(Outcome.ALREADY_DONE, f"route {spec.route} already degraded")
        return None

    # --- HTTP -------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Status and decoded answer (JSON on a 2xx, else the start of the text).

        Raises:
            _UnreachableError: no answer.
            ValueError: a 2xx answer that is not JSON.
        """
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        answer = self._http.request(
            method, self._base + path, body=data, headers=headers, timeout_seconds=self._timeout
        )
        if answer.status == 0:
            raise _UnreachableError(answer.detail.removeprefix("unreachable: "))
        if answer.ok:
            return answer.status, json.loads(answer.body or b"null")
        return answer.status, answer.body.decode(errors="replace")[:300]

    def _weights(self, route: str) -> dict[str, float] | ActionResult:
        try:
            status, body = self._call("GET", f"/v1/routes/{route}")
        except _UnreachableError as exc:
            return ActionResult(Outcome.FAILED, f"router unreachable: {exc}")
        except ValueError as exc:
            return ActionResult(Outcome.FAILED, f"router unreachable: {type(exc).__name__}")
        if status == 404:
            return ActionResult(Outcome.NOT_FOUND, f"the router has no route {route}")
        if status != 200 or not isinstance(body, dict):
            return ActionResult(Outcome.FAILED, f"router answered {status} for route {route}")
        backends = body.get("backends")
        if not isinstance(backends, dict):
            return ActionResult(Outcome.FAILED, f"route {route}: no backends in the answer")
        return {str(k): float(v) for k, v in backends.items()}

    def _put(
        self, route: str, weights: dict[str, float], *, undo: dict[str, float]
    ) -> ActionResult:
        try:
            status, body = self._call("PUT", f"/v1/routes/{route}", {"backends": weights})
        except _UnreachableError as exc:
            return ActionResult(Outcome.FAILED, f"router unreachable: {exc}")
        except ValueError as exc:
            return ActionResult(Outcome.FAILED, f"router unreachable: {type(exc).__name__}")
        if status == 200:
            return ActionResult(Outcome.DONE, f"route {route} now {weights}", {"weights": undo})
        if 400 <= status < 500:
            return ActionResult(Outcome.REFUSED, f"router refused route {route}: {status} {body}")
        return ActionResult(Outcome.FAILED, f"router answered {status} for route {route}")


class _UnreachableError(Exception):
    """The router gave no answer (the message names the error type)."""


def _wanted(
    request: ActionRequest, spec: RouteSpec, current: Mapping[str, float]
) -> dict[str, float] | ActionResult:
    """The weights a degrade (``traffic_ratio`` to the fallback) or a restore asks for."""
    if {spec.primary, spec.fallback} - set(current):
        return ActionResult(
            Outcome.REFUSED, f"route {spec.route} has no {spec.primary}/{spec.fallback}"
        )
    total = sum(current.values())
    if request.kind != "degrade":
        return {**current, spec.fallback: 0.0, spec.primary: total}
    ratio = _ratio(request.parameters.get("traffic_ratio", DEFAULT_RATIO))
    if ratio is None:
        return ActionResult(Outcome.REFUSED, "traffic_ratio must be in [0, 1]")
    return {**current, spec.fallback: total * ratio, spec.primary: total * (1 - ratio)}


def _ratio(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0.0 <= value <= 1.0 else None
