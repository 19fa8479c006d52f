"""Degrade to a smaller model and restore, on Kubernetes: Gateway API HTTPRoute weights, KServe.

Targets are deployments (``<namespace>/<name>``) bound in configuration to one traffic object;
anything unbound is REFUSED. ``traffic_ratio`` (0..1) is the share sent to the fallback.

- :class:`HTTPRouteBinding`: in every rule of the HTTPRoute that lists both the primary and the
  fallback backend, their weights become ``100 * (1 - ratio)`` and ``100 * ratio``. CRDs take no
  strategic merge patch and a merge patch would replace the whole ``rules`` array, so this is a
  JSON patch: a ``test`` of each backend's name at its index (indices shift when someone edits
  the route), ``replace`` (or ``add``, weight unset means 1) of each weight, and a ``replace`` of
  ``metadata.resourceVersion`` with the one read, which makes a concurrent edit a 409.
- :class:`InferenceServiceBinding`: KServe ``spec.predictor.canaryTrafficPercent`` set to
  ``100 * ratio`` (the canary revision being the smaller model), by merge patch.

``undo`` holds the previous weights (``None`` where unset), so the rollback puts back exactly
what was there. Outcomes as in :mod:`gpuwarden.collector.remediate.actuators.kubernetes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.collector.remediate.actuators.base import ActionRequest, ActionResult, Outcome
from gpuwarden.collector.remediate.actuators.kube_api import (
    JSON_PATCH,
    MERGE_PATCH,
    CustomObjects,
    KubeError,
    namespaced_name,
)

DEFAULT_RATIO = 0.5
_REFUSED_STATUSES = frozenset({400, 403, 415, 422})


@dataclass(frozen=True, slots=True)
class HTTPRouteBinding:
    """A deployment's traffic split in a Gateway API HTTPRoute (backends by Service name)."""

    namespace: str
    route: str
    primary: str
    fallback: str


@dataclass(frozen=True, slots=True)
class InferenceServiceBinding:
    """A deployment served by a KServe InferenceService whose canary is the smaller model."""

    namespace: str
    name: str


Binding = HTTPRouteBinding | InferenceServiceBinding
_RESOURCES: Mapping[type, tuple[str, str, str]] = {
    HTTPRouteBinding: ("gateway.networking.k8s.io", "v1", "httproutes"),
    InferenceServiceBinding: ("serving.kserve.io", "v1beta1", "inferenceservices"),
}


def _failure(error: KubeError) -> ActionResult:
    if error.status == 404:
        return ActionResult(Outcome.NOT_FOUND, str(error))
    if error.status in _REFUSED_STATUSES:
        return ActionResult(Outcome.REFUSED, str(error))
    return ActionResult(Outcome.FAILED, str(error))


def _ratio(parameters: Mapping[str, Any]) -> float | None:
    value = parameters.get("traffic_ratio", DEFAULT_RATIO)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        return None
    return float(value)


class KubernetesRoutingActuator:
    """``degrade`` (and ``restore``) for deployments bound to an HTTPRoute or InferenceService."""

    def __init__(self, objects: CustomObjects, bindings: Mapping[str, Binding]) -> None:
        self._objects = objects
        self._bindings = dict(bindings)

    @property
    def kinds(self) -> frozenset[str]:
        """Action kinds taken."""
        return frozenset({"degrade", "restore"})

    def accepts(self, target: str) -> bool:
        """Only deployments bound here."""
        return target in self._bindings

    def execute(self, request: ActionRequest) -> ActionResult:
        """Shift ``traffic_ratio`` to the fallback (``restore``: ratio 0)."""
        binding = self._bindings.get(request.target)
        ratio = 0.0 if request.kind == "restore" else _ratio(request.parameters)
        if binding is None or namespaced_name(request.target) is None or ratio is None:
            return ActionResult(Outcome.REFUSED, f"{request.target!r} is not bound or bad ratio")
        try:
            if isinstance(binding, HTTPRouteBinding):
                return self._route(request, binding, ratio)
            return self._canary(request, binding, round(100 * ratio))
        except KubeError as error:
            return _failure(error)

    def rollback(self, request: ActionRequest, result: ActionResult) -> ActionResult:
        """Put back exactly the weights in ``result.undo``."""
        binding = self._bindings.get(request.target)
        again = ActionRequest("restore", request.target, request.idempotency_key, False)
        try:
            if isinstance(binding, HTTPRouteBinding) and "weights" in result.undo:
                return self._set_weights(again, binding, result.undo["weights"])
            if isinstance(binding, InferenceServiceBinding) and "canary_percent" in result.undo:
                percent = result.undo["canary_percent"]
                return self._canary(again, binding, percent)
        except KubeError as error:
            return _failure(error)
        return ActionResult(Outcome.REFUSED, f"nothing to roll back for {request.target}")

    # HTTPRoute --------------------------------------------------------------------------------

    def _route(
        self, request: ActionRequest, binding: HTTPRouteBinding, ratio: float
    ) -> ActionResult:
        fallback = round(100 * ratio)
        wanted = {binding.primary: 100 - fallback, binding.fallback: fallback}
        return self._set_weights(request, binding, wanted)

    def _set_weights(
        self, request: ActionRequest, binding: HTTPRouteBinding, wanted: Any
    ) -> ActionResult:
        """Set weights by backend name (a dict) or, for a rollback, by position (the ``undo``
        list of ``[rule, backend, name, weight]``)."""
        resource = _RESOURCES[HTTPRouteBinding]
        route = self._objects.get(resource, binding.namespace, binding.route)
        by_name = wanted if isinstance(wanted, Mapping) else {}
        rows = () if by_name else wanted
        by_position = {(int(i), int(j)): weight for i, j, _, weight in rows}
        operations: list[dict[str, Any]] = []
        previous: list[list[Any]] = []
        for i, rule in enumerate(route.get("spec", {}).get("rules") or []):
            refs = rule.get("backendRefs") or []
            names = [ref.get("name") for ref in refs]
            if binding.primary not in names or binding.fallback not in names:
                continue
            for j, ref in enumerate(refs):
                name = ref.get("name")
                if name not in (binding.primary, binding.fallback):
                    continue
                value = by_position.get((i, j)) if not by_name else by_name[name]
                previous.append([i, j, name, ref.get("weight")])
                path = f"/spec/rules/{i}/backendRefs/{j}"
                operations.append({"op": "test", "path": f"{path}/name", "value": name})
                if value is None:  # weight unset (1) before the degrade: unset it again
                    if "weight" in ref:
                        operations.append({"op": "remove", "path": f"{path}/weight"})
                elif "weight" not in ref:
                    operations.append({"op": "add", "path": f"{path}/weight", "value": value})
                elif ref["weight"] != value:
                    operations.append({"op": "replace", "path": f"{path}/weight", "value": value})
        if not previous:
            return ActionResult(Outcome.REFUSED, f"no rule of {binding.route} has both backends")
        if all(op["op"] == "test" for op in operations):
            return ActionResult(Outcome.ALREADY_DONE, f"{binding.route} weights already set")
        version = route["metadata"]["resourceVersion"]
        operations.append({"op": "replace", "path": "/metadata/resourceVersion", "value": version})
        self._objects.patch(
            resource,
            binding.namespace,
            binding.route,
            operations,
            content_type=JSON_PATCH,
            dry_run=request.dry_run,
        )
        shown = dict(by_name) if by_name else "as before"
        detail = f"HTTPRoute {binding.namespace}/{binding.route} weights {shown}"
        if request.dry_run:
            return ActionResult(Outcome.DRY_RUN, f"would set {detail}")
        return ActionResult(Outcome.DONE, f"set {detail}", undo={"weights": previous})

    # KServe -----------------------------------------------------------------------------------

    def _canary(
        self,
        request: ActionRequest,
        binding: InferenceServiceBinding,
        percent: int | None,
    ) -> ActionResult:
        resource = _RESOURCES[InferenceServiceBinding]
        service = self._objects.get(resource, binding.namespace, binding.name)
        predictor = service.get("spec", {}).get("predictor") or {}
        previous = predictor.get("canaryTrafficPercent")
        if previous == percent:
            return ActionResult(Outcome.ALREADY_DONE, f"canaryTrafficPercent already {percent}")
        body = {
            "metadata": {"resourceVersion": service["metadata"]["resourceVersion"]},
            "spec": {"predictor": {"canaryTrafficPercent": percent}},
        }
        self._objects.patch(
            resource,
            binding.namespace,
            binding.name,
            body,
            content_type=MERGE_PATCH,
            dry_run=request.dry_run,
        )
        detail = f"InferenceService {binding.namespace}/{binding.name} canary {percent}%"
        if request.dry_run:
            return ActionResult(Outcome.DRY_RUN, f"would set {detail}")
        return ActionResult(Outcome.DONE, f"set {detail}", undo={"canary_percent": previous})
