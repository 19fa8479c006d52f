"""Kueue ``Workload`` objects (``kueue.x-k8s.io/v1beta1``), read for fairness: when a job was
queued in Kueue, when Kueue admitted it, whether it was evicted.

Kueue keeps a batch Job suspended, with no pods, until its Workload is admitted, so the pods alone
miss the time queued in Kueue and every job still queued there. The boundary is the custom
objects API of the client the Kubernetes job source uses
(:class:`~gpuwarden.collector.jobs.kube_client.KubeApis`), listing ``workloads`` in all
namespaces (or one), in pages.

Fields relied on (``apis/kueue/v1beta1/workload_types.go`` in kubernetes-sigs/kueue):

- ``metadata``: ``namespace``, ``name``, ``uid``, ``creationTimestamp`` (queued since),
  ``labels``, ``ownerReferences`` (the Job, JobSet... or, with Kueue's pod integration, the Pod
  the Workload stands for; the ``controller`` one first).
- ``spec.queueName`` (the LocalQueue), ``spec.active`` (``false``: deactivated, not queued),
  ``spec.podSets[]``: ``count`` × the GPUs of ``template.spec`` (``nvidia.com/gpu`` and MIG
  slices; containers' limits, else requests; largest one-shot init container, as for pods).
- ``status.conditions[]`` (``metav1.Condition``: ``type``, ``status``, ``reason``,
  ``lastTransitionTime``): ``Admitted`` (``QuotaReserved`` when a Workload has no ``Admitted``
  condition), ``Evicted`` / ``Preempted`` (an eviction: preemption, PodsReady timeout,
  deactivation...), ``Requeued`` (back in the queue after an eviction; ``False`` during a
  requeue backoff), ``Finished``.

A Workload holds its latest state only: after an eviction and a new admission Kueue turns
``Evicted`` back to ``False``, so an earlier, evicted admission is no longer seen (as with
``squeue``'s one record per job).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpuwarden.collector.jobs import JobSourceError

if TYPE_CHECKING:
    from kubernetes.client import CustomObjectsApi

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "kueue.x-k8s.io", "v1beta1", "workloads"
DEFAULT_PAGE_SIZE = 500
_EVICTION_TYPES = ("Evicted", "Preempted")


@dataclass(frozen=True, slots=True)
class KueueWorkload:
    """One Workload: what fairness needs of it. Times are Unix seconds, ``None``: not (yet)."""

    namespace: str
    name: str
    uid: str
    queue: str | None
    """``spec.queueName``: the LocalQueue."""
    owners: tuple[tuple[str, str], ...]
    """``(kind, name)`` of the owner references, the controller first."""
    labels: Mapping[str, str]
    gpus: int
    created_time: float | None
    admitted_time: float | None
    """When the ``Admitted`` condition became true; ``None`` while it is not true."""
    evicted_time: float | None
    """When ``Evicted`` (or ``Preempted``) became true; ``None`` while neither is true."""
    eviction_reason: str | None
    requeued_time: float | None
    """When ``Requeued`` became true (the eviction's time when the condition is absent);
    ``None`` while it is false (a requeue backoff): not queued again yet."""
    finished_time: float | None
    active: bool = True

    @property
    def key(self) -> str:
        """The job key of the Workload (``kueue:<uid>``)."""
        return f"kueue:{self.uid}"


def _time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _true_conditions(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    conditions = status.get("conditions") or []
    return {
        str(c.get("type")): c
        for c in conditions
        if isinstance(c, Mapping) and c.get("status") == "True"
    }


def _has_condition(item: Mapping[str, Any], kind: str) -> bool:
    conditions = (item.get("status") or {}).get("conditions") or []
    return any(isinstance(c, Mapping) and c.get("type") == kind for c in conditions)


def _quantity(value: Any) -> int:
    try:
        return int(str(value))  # extended resources are whole numbers
    except ValueError:
        return 0


@dataclass(frozen=True, slots=True)
class GpuResources:
    """Which extended resources are GPUs: whole GPUs by name, MIG slices by prefix (each slice
    one GPU), as the Kubernetes job source counts them."""

    names: frozenset[str] = frozenset({"nvidia.com/gpu"})
    mig_prefix: str = "nvidia.com/mig-"

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.names or name.startswith(self.mig_prefix))


def _container_gpus(container: Mapping[str, Any], gpu: GpuResources) -> int:
    resources = container.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    return sum(
        _quantity(limits.get(name, requests.get(name, 0)))
        for name in {*limits, *requests}
        if name in gpu
    )


def pod_set_gpus(pod_set: Mapping[str, Any], gpu: GpuResources) -> int:
    """GPUs of one pod set: ``count`` × one pod's GPUs (containers and sidecars together, or the
    largest one-shot init container)."""
    spec = (pod_set.get("template") or {}).get("spec") or {}
    init = spec.get("initContainers") or []
    sidecars = [c for c in init if c.get("restartPolicy") == "Always"]
    one_shot = [c for c in init if c.get("restartPolicy") != "Always"]
    together = sum(_container_gpus(c, gpu) for c in [*spec.get("containers", []), *sidecars])
    per_pod = max([together, *(_container_gpus(c, gpu) for c in one_shot)])
    return _quantity(pod_set.get("count", 1)) * per_pod


def parse_workload(
    item: Mapping[str, Any], *, gpu: GpuResources = GpuResources()
) -> KueueWorkload | None:
    """A :class:`KueueWorkload` from one API object; ``None`` without namespace, name or uid."""
    metadata = item.get("metadata") or {}
    spec = item.get("spec") or {}
    namespace, name, uid = metadata.get("namespace"), metadata.get("name"), metadata.get("uid")
    if not (namespace and name and uid):
        log.warning("skipping a Workload without namespace, name or uid: %r", name)
        return None
    true = _true_conditions(item.get("status") or {})
    admitted = true.get("Admitted")
    if admitted is None and not _has_condition(item, "Admitted"):
        admitted = true.get("QuotaReserved")
    eviction = next((true[t] for t in _EVICTION_TYPES if t in true), None)
    evicted_time = _time(eviction.get("lastTransitionTime")) if eviction else None
    requeued_time = (
        _time(true["Requeued"].get("lastTransitionTime")) if "Requeued" in true else None
    )
    if requeued_time is None and not _has_condition(item, "Requeued"):
        requeued_time = evicted_time
    references = [r for r in metadata.get("ownerReferences") or [] if isinstance(r, Mapping)]
    references.sort(key=lambda r: not r.get("controller"))
    return KueueWorkload(
        namespace=str(namespace),
        name=str(name),
        uid=str(uid),
        queue=spec.get("queueName") or None,
        owners=tuple((str(r.get("kind")), str(r.get("name"))) for r in references),
        labels=MappingProxyType(dict(metadata.get("labels") or {})),
        gpus=sum(pod_set_gpus(p, gpu) for p in spec.get("podSets") or []),
        created_time=_time(metadata.get("creationTimestamp")),
        admitted_time=_time(admitted.get("lastTransitionTime")) if admitted else None,
        evicted_time=evicted_time,
        eviction_reason=str(eviction.get("reason")) if eviction else None,
        requeued_time=requeued_time,
        finished_time=(
            _time(true["Finished"].get("lastTransitionTime")) if "Finished" in true else None
        ),
        active=spec.get("active") is not False,
    )


class KueueWorkloadReader:
    """The Workloads of one cluster (or one namespace), through the custom objects API.

    A cluster without Kueue (the API answers 404 for the resource) has no Workloads: ``[]``.
    """

    def __init__(
        self,
        api: CustomObjectsApi,
        *,
        namespace: str | None = None,
        gpu: GpuResources = GpuResources(),
        request_timeout_seconds: float = 10,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        if request_timeout_seconds <= 0 or page_size <= 0:
            raise ValueError("request_timeout_seconds and page_size must be positive")
        self._api = api
        self.namespace = namespace
        self.gpu = gpu
        self.request_timeout_seconds = request_timeout_seconds
        self.page_size = page_size

    def workloads(self) -> list[KueueWorkload]:
        """Every Workload, parsed; unreadable ones are skipped (logged).

        Raises:
            JobSourceError: The API refused (401, 403, ...), failed or was unreachable.

        """
        found = []
        token: str | None = None
        while True:
            page = self._list(token)
            if page is None:
                return []
            for item in page.get("items") or []:
                workload = parse_workload(item, gpu=self.gpu)
                if workload is not None:
                    found.append(workload)
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return found

    def _list(self, token: str | None) -> dict[str, Any] | None:
        """One page; ``None`` when the cluster has no Workload resource (Kueue not installed)."""
        import urllib3
        from kubernetes.client.exceptions import ApiException, OpenApiException

        from gpuwarden.collector.jobs.kubernetes import _api_error

        options: dict[str, Any] = {
            "limit": self.page_size,
            "_request_timeout": self.request_timeout_seconds,
        }
        if token:
            options["_continue"] = token
        try:
            if self.namespace is None:
                page = self._api.list_cluster_custom_object(GROUP, VERSION, PLURAL, **options)
            else:
                page = self._api.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, **options
                )
        except ApiException as error:
            if error.status == 404:
                return None
            raise JobSourceError(_api_error(error)) from error
        except OpenApiException as error:
            raise JobSourceError(_api_error(error)) from error
        except urllib3.exceptions.HTTPError as error:
            raise JobSourceError(f"Kubernetes API unreachable: {error}") from error
        if not isinstance(page, dict):
            raise JobSourceError("Kubernetes API sent an unreadable Workload list")
        return page
