"""Kubernetes actuator: scale a Deployment up, requeue a pod by deleting it, cordon a node.

One boundary, the official client, reached only through :class:`KubeCalls` (raw JSON in and out
through :func:`~.kube_api.call_json`, so the client's model classes never decide what a field
means). Every write carries the
``resourceVersion`` that was read, so a concurrent change answers 409 and is re-read (at most
``CONFLICT_RETRIES`` times) instead of being overwritten; a dry run sends the same write with
``dryRun=All``, so the API server validates it (admission, RBAC) and stores nothing.

- ``scale_up`` on ``<namespace>/<deployment>``: when an autoscaling/v2 HPA targets the
  Deployment, the HPA's ``minReplicas`` is raised (the HPA would revert a direct replica
  change); otherwise the ``scale`` subresource's ``spec.replicas`` (RBAC: ``deployments/scale``
  only). ``step_replicas`` and ``max_replicas`` parameters bound it; at the cap it is REFUSED.
- ``requeue`` on ``<namespace>/<pod>``: when Kueue manages the pod's controller (a Workload
  owned by it exists), through the Workload (:mod:`.kueue`: deactivate, eviction, reactivate);
  otherwise deletes a pod that a controller owns (its controller re-creates it); a bare pod
  would be lost, so it is REFUSED. Cannot be rolled back.
- ``drain``/``resume`` on a node name: ``spec.unschedulable`` true/false (cordon/uncordon).

Outcomes: 404 NOT_FOUND; 400/403/422 REFUSED; 409 after the retries, 429, 5xx and network
errors FAILED; the wanted state already in place ALREADY_DONE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client import ApiClient

from gpuwarden.collector.jobs.kube_client import KubeApis
from gpuwarden.collector.remediate.actuators.base import ActionRequest, ActionResult, Outcome
from gpuwarden.collector.remediate.actuators.kube_api import (
    DEFAULT_REQUEST_TIMEOUT_SECONDS,
    KubeError,
    call_json,
    namespaced_name,
    node_name,
)
from gpuwarden.collector.remediate.actuators.kueue import KueueRequeue

CONFLICT_RETRIES = 3
DEFAULT_STEP_REPLICAS = 1
DEFAULT_MAX_REPLICAS = 32
_REFUSED_STATUSES = frozenset({400, 403, 422})


def _dry(dry_run: bool) -> str | None:
    return "All" if dry_run else None


class KubeCalls:
    """The only place that calls the client: JSON dicts in and out, errors as :class:`KubeError`."""

    def __init__(
        self,
        client: ApiClient,
        *,
        request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        apis = KubeApis(client)
        self._apps = apis.apps()
        self._autoscaling = apis.autoscaling()
        self._core = apis.core()
        self._timeout = request_timeout_seconds

    def _json(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        return call_json(call, *args, timeout_seconds=self._timeout, **kwargs)

    def read_scale(self, namespace: str, name: str) -> dict[str, Any]:
        """GET the Deployment's scale subresource."""
        return self._json(self._apps.read_namespaced_deployment_scale, name, namespace)

    def patch_scale(
        self, namespace: str, name: str, body: dict[str, Any], *, dry_run: bool
    ) -> dict[str, Any]:
        """PATCH the scale subresource (strategic merge, as the client picks for a dict body)."""
        return self._json(
            self._apps.patch_namespaced_deployment_scale,
            name,
            namespace,
            body,
            dry_run=_dry(dry_run),
        )

    def list_hpas(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's autoscaling/v2 HPAs."""
        data = self._json(self._autoscaling.list_namespaced_horizontal_pod_autoscaler, namespace)
        items = data.get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def patch_hpa(
        self, namespace: str, name: str, body: dict[str, Any], *, dry_run: bool
    ) -> dict[str, Any]:
        """PATCH an HPA."""
        return self._json(
            self._autoscaling.patch_namespaced_horizontal_pod_autoscaler,
            name,
            namespace,
            body,
            dry_run=_dry(dry_run),
        )

    def read_node(self, name: str) -> dict[str, Any]:
        """GET a node."""
        return self._json(self._core.read_node, name)

    def patch_node(self, name: str, body: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
        """PATCH a node."""
        return self._json(self._core.patch_node, name, body, dry_run=_dry(dry_run))

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """GET a pod."""
        return self._json(self._core.read_namespaced_pod, name, namespace)

    def delete_pod(self, namespace: str, name: str, uid: str, *, dry_run: bool) -> dict[str, Any]:
        """DELETE a pod, only if it is still the one read (``preconditions.uid``)."""
        body = {"preconditions": {"uid": uid}}
        return self._json(
            self._core.delete_namespaced_pod, name, namespace, body=body, dry_run=_dry(dry_run)
        )


def _failure(error: KubeError) -> ActionResult:
    if error.status == 404:
        return ActionResult(Outcome.NOT_FOUND, str(error))
    if error.status in _REFUSED_STATUSES:
        return ActionResult(Outcome.REFUSED, str(error))
    return ActionResult(Outcome.FAILED, str(error))


def _int_parameter(parameters: Mapping[str, Any], key: str, default: int) -> int | None:
    value = parameters.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


class KubernetesActuator:
    """Scale-up, pod requeue and cordon through one :class:`KubeCalls`; requeue goes through
    Kueue's Workload when ``kueue`` is given and one owns the pod's controller."""

    def __init__(self, calls: KubeCalls, *, kueue: KueueRequeue | None = None) -> None:
        self._calls = calls
        self._kueue = kueue

    @property
    def kinds(self) -> frozenset[str]:
        """Action kinds taken."""
        return frozenset({"scale_up", "requeue", "drain", "resume"})

    def accepts(self, target: str) -> bool:
        """Deployments and pods are ``<namespace>/<name>``; nodes are plain names."""
        return namespaced_name(target) is not None or node_name(target) is not None

    def execute(self, request: ActionRequest) -> ActionResult:
        """Do (or with ``dry_run`` have the API server validate) the action."""
        try:
            if request.kind == "scale_up":
                return self._scale_up(request)
            if request.kind == "requeue":
                tier = request.parameters.get("price_tier", "same")
                if tier != "same":  # a pod recreated by its controller keeps its node pool
                    return ActionResult(
                        Outcome.REFUSED,
                        f"requeue to price tier {tier} is not supported on Kubernetes "
                        "(no node-pool mapping): the pod would restart at its own tier",
                    )
                return self._requeue(request)
            if request.kind in ("drain", "resume"):
                return self._cordon(request, cordon=request.kind == "drain")
        except KubeError as error:
            return _failure(error)
        return ActionResult(Outcome.REFUSED, f"kind {request.kind!r} is not a Kubernetes action")

    def rollback(self, request: ActionRequest, result: ActionResult) -> ActionResult:
        """Put back the replicas, HPA minimum or schedulability recorded in ``result.undo``."""
        undo = result.undo
        try:
            if request.kind == "scale_up" and "replicas" in undo:
                return self._set_replicas(request, int(undo["replicas"]), rollback=True)
            if request.kind == "scale_up" and "min_replicas" in undo:
                return self._set_hpa_min(request, str(undo["hpa"]), int(undo["min_replicas"]))
            if request.kind in ("drain", "resume") and "unschedulable" in undo:
                again = ActionRequest(request.kind, request.target, request.idempotency_key, False)
                return self._cordon(again, cordon=bool(undo["unschedulable"]))
        except KubeError as error:
            return _failure(error)
        return ActionResult(Outcome.REFUSED, f"{request.kind} {request.target} has no undo")

    # scale ------------------------------------------------------------------------------------

    def _scale_up(self, request: ActionRequest) -> ActionResult:
        parsed = namespaced_name(request.target)
        step = _int_parameter(request.parameters, "step_replicas", DEFAULT_STEP_REPLICAS)
        cap = _int_parameter(request.parameters, "max_replicas", DEFAULT_MAX_REPLICAS)
        if parsed is None or step is None or cap is None:
            return ActionResult(Outcome.REFUSED, f"invalid deployment or parameters: {request}")
        namespace, name = parsed
        hpa = self._hpa_for(namespace, name)
        if hpa is not None:
            return self._raise_hpa_min(request, hpa, step, cap)
        for _ in range(CONFLICT_RETRIES):
            scale = self._calls.read_scale(namespace, name)
            current = int(scale.get("spec", {}).get("replicas") or 0)
            wanted = min(current + step, cap)
            if wanted <= current:
                return ActionResult(Outcome.REFUSED, f"{request.target} at {current} ≥ cap {cap}")
            body = {
                "metadata": {"resourceVersion": scale["metadata"]["resourceVersion"]},
                "spec": {"replicas": wanted},
            }
            try:
                self._calls.patch_scale(namespace, name, body, dry_run=request.dry_run)
            except KubeError as error:
                if error.status == 409:
                    continue
                raise
            verb = "would scale" if request.dry_run else "scaled"
            outcome = Outcome.DRY_RUN if request.dry_run else Outcome.DONE
            detail = f"{verb} {request.target} from {current} to {wanted} replicas"
            return ActionResult(outcome, detail, undo={"replicas": current, "set": wanted})
        return ActionResult(Outcome.FAILED, f"{request.target}: conflict after retries")

    def _set_replicas(
        self, request: ActionRequest, replicas: int, *, rollback: bool
    ) -> ActionResult:
        namespace, name = namespaced_name(request.target) or ("", "")
        scale = self._calls.read_scale(namespace, name)
        current = int(scale.get("spec", {}).get("replicas") or 0)
        if current == replicas:
            return ActionResult(Outcome.ALREADY_DONE, f"{request.target} at {replicas} already")
        body = {
            "metadata": {"resourceVersion": scale["metadata"]["resourceVersion"]},
            "spec": {"replicas": replicas},
        }
        self._calls.patch_scale(namespace, name, body, dry_run=False)
        verb = "restored" if rollback else "set"
        return ActionResult(Outcome.DONE, f"{verb} {request.target} to {replicas} replicas")

    def _hpa_for(self, namespace: str, name: str) -> dict[str, Any] | None:
        for hpa in self._calls.list_hpas(namespace):
            ref = hpa.get("spec", {}).get("scaleTargetRef", {})
            if ref.get("kind") == "Deployment" and ref.get("name") == name:
                return hpa
        return None

    def _raise_hpa_min(
        self, request: ActionRequest, hpa: dict[str, Any], step: int, cap: int
    ) -> ActionResult:
        spec = hpa["spec"]
        hpa_name = hpa["metadata"]["name"]
        current = int(spec.get("minReplicas") or 1)
        wanted = min(current + step, cap, int(spec["maxReplicas"]))
        if wanted <= current:
            detail = f"HPA {hpa_name} minReplicas {current} at its cap"
            return ActionResult(Outcome.REFUSED, detail)
        body = {
            "metadata": {"resourceVersion": hpa["metadata"]["resourceVersion"]},
            "spec": {"minReplicas": wanted},
        }
        namespace = hpa["metadata"].get("namespace") or request.target.partition("/")[0]
        try:
            self._calls.patch_hpa(namespace, hpa_name, body, dry_run=request.dry_run)
        except KubeError as error:
            if error.status != 409:
                raise
            return ActionResult(Outcome.FAILED, f"HPA {hpa_name} changed meanwhile (409)")
        verb = "would raise" if request.dry_run else "raised"
        outcome = Outcome.DRY_RUN if request.dry_run else Outcome.DONE
        detail = f"{verb} HPA {hpa_name} minReplicas from {current} to {wanted}"
        return ActionResult(outcome, detail, undo={"hpa": hpa_name, "min_replicas": current})

    def _set_hpa_min(self, request: ActionRequest, hpa_name: str, replicas: int) -> ActionResult:
        namespace = request.target.partition("/")[0]
        body = {"spec": {"minReplicas": replicas}}
        self._calls.patch_hpa(namespace, hpa_name, body, dry_run=False)
        return ActionResult(Outcome.DONE, f"restored HPA {hpa_name} minReplicas to {replicas}")

    # pods and nodes -----------------------------------------------------------------------------

    def _requeue(self, request: ActionRequest) -> ActionResult:
        parsed = namespaced_name(request.target)
        if parsed is None:
            return ActionResult(Outcome.REFUSED, f"invalid pod {request.target!r}")
        namespace, name = parsed
        pod = self._calls.read_pod(namespace, name)
        owners = pod.get("metadata", {}).get("ownerReferences") or []
        if not any(owner.get("controller") for owner in owners):
            return ActionResult(
                Outcome.REFUSED, f"{request.target} has no controller to recreate it"
            )
        if self._kueue is not None:
            controller = next(o for o in owners if o.get("controller"))
            workload = self._kueue.workload_for(namespace, str(controller.get("uid", "")))
            if workload is not None:
                return self._kueue.requeue(namespace, workload, dry_run=request.dry_run)
        if pod.get("metadata", {}).get("deletionTimestamp"):
            return ActionResult(Outcome.ALREADY_DONE, f"{request.target} is already terminating")
        uid = str(pod["metadata"]["uid"])
        self._calls.delete_pod(namespace, name, uid, dry_run=request.dry_run)
        if request.dry_run:
            return ActionResult(Outcome.DRY_RUN, f"would delete pod {request.target}")
        return ActionResult(
            Outcome.DONE, f"deleted pod {request.target}; its controller recreates it"
        )

    def _cordon(self, request: ActionRequest, *, cordon: bool) -> ActionResult:
        name = node_name(request.target)
        if name is None:
            return ActionResult(Outcome.REFUSED, f"invalid node name {request.target!r}")
        word = "cordon" if cordon else "uncordon"
        for _ in range(CONFLICT_RETRIES):
            node = self._calls.read_node(name)
            before = bool(node.get("spec", {}).get("unschedulable", False))
            if before == cordon:
                return ActionResult(Outcome.ALREADY_DONE, f"node {name}: {word} already in place")
            body = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"unschedulable": cordon},
            }
            try:
                self._calls.patch_node(name, body, dry_run=request.dry_run)
            except KubeError as error:
                if error.status == 409:
                    continue
                raise
            if request.dry_run:
                return ActionResult(Outcome.DRY_RUN, f"would {word} node {name}")
            return ActionResult(
                Outcome.DONE, f"{word}ed node {name}", undo={"unschedulable": before}
            )
        return ActionResult(Outcome.FAILED, f"node {name}: conflict after retries")
