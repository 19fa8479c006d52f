"""Kubernetes adapter: pods that ask for GPUs, as scheduler-neutral :class:`Job` objects.

The only boundary to Kubernetes is ``CoreV1Api`` listing pods (all namespaces, or one), in pages;
the client is configured in :mod:`~gpuwarden.collector.jobs.kube_client`.
A pod is a job when its containers ask for a GPU resource (``nvidia.com/gpu``, or a MIG slice
``nvidia.com/mig-<profile>``). The API names nodes but not devices, so allocations carry the node
only (kubelet's PodResources API would give device UUIDs; it is out of scope here).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType

import urllib3
from kubernetes.client import (
    CoreV1Api,
    V1Container,
    V1ContainerStatus,
    V1Pod,
    V1PodList,
    V1PodStatus,
)
from kubernetes.client.exceptions import ApiException, OpenApiException

from gpuwarden.collector.jobs import JobSourceError
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState

log = logging.getLogger(__name__)

SCHEDULER = "kubernetes"
KEY_PREFIX = "k8s"
MAX_LABELS = 32
MAX_LABEL_VALUE_CHARS = 256
DEFAULT_PAGE_SIZE = 500

_PHASES: Mapping[str | None, JobState] = MappingProxyType(
    {
        None: JobState.PENDING,  # just created: no status written yet
        "Pending": JobState.PENDING,
        "Running": JobState.RUNNING,
        "Succeeded": JobState.COMPLETED,
        "Failed": JobState.FAILED,
        "Unknown": JobState.UNKNOWN,
    }
)
_ENDED_PHASES = frozenset({"Succeeded", "Failed"})
_DISRUPTION_REASONS = frozenset({"Preempted", "Evicted"})


def _timestamp(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def pod_state(status: V1PodStatus | None) -> JobState:
    """Map a pod's phase to a :class:`JobState`; a disrupted pod that did not succeed is preempted.

    Disrupted means the ``DisruptionTarget`` condition is true (preemption, eviction, taint
    manager, node shutdown) or the pod's ``reason`` is ``Preempted`` or ``Evicted``.
    """
    phase = status.phase if status is not None else None
    if phase != "Succeeded" and status is not None and _disrupted(status):
        return JobState.PREEMPTED
    return _PHASES.get(phase, JobState.UNKNOWN)


def _disrupted(status: V1PodStatus) -> bool:
    if status.reason in _DISRUPTION_REASONS:
        return True
    return any(
        condition.type == "DisruptionTarget" and condition.status == "True"
        for condition in status.conditions or ()
    )


def _container_statuses(status: V1PodStatus | None) -> list[V1ContainerStatus]:
    if status is None:
        return []
    return [*(status.init_container_statuses or ()), *(status.container_statuses or ())]


def _end_time(status: V1PodStatus | None) -> float | None:
    """When the last container of an ended pod finished; ``None`` while the pod has not ended."""
    if status is None or status.phase not in _ENDED_PHASES:
        return None
    finished = [
        terminated.finished_at.timestamp()
        for container in _container_statuses(status)
        if container.state is not None
        and (terminated := container.state.terminated) is not None
        and terminated.finished_at is not None
    ]
    return max(finished) if finished else None


def bounded_labels(labels: Mapping[str, str] | None) -> Mapping[str, str]:
    """Copy at most ``MAX_LABELS`` labels (in key order), values cut to 256 characters."""
    items = sorted((labels or {}).items())[:MAX_LABELS]
    return MappingProxyType({key: value[:MAX_LABEL_VALUE_CHARS] for key, value in items})


def _api_error(error: OpenApiException) -> str:
    """Describe an API error by status, reason and the ``Status`` object's message."""
    if not isinstance(error, ApiException):
        return f"Kubernetes client error: {error}"
    message = ""
    try:
        body = json.loads(error.body or "")
    except ValueError:
        body = None
    if isinstance(body, Mapping) and isinstance(body.get("message"), str):
        message = f": {body['message']}"
    return f"Kubernetes API answered {error.status} {error.reason}{message}"


class KubernetesJobSource:
    """The GPU pods of one Kubernetes cluster (or one namespace of it).

    Args:
        api: A configured ``CoreV1Api``; its ``ApiClient`` is the caller's to close.
        gpu_resource_names: Extended resources that are whole GPUs.
        mig_prefix: Prefix of MIG slice resources (each slice counts as one GPU).
        team_label: Pod label naming the team; the namespace when absent.
        model_label: Pod label naming the model a pod serves or trains.
        price_tier_label: Pod label naming the price tier.
        owner_label: Pod label naming the owner when no controller owns the pod.
        namespace: List this namespace only; ``None`` lists all namespaces.
        request_timeout_seconds: Timeout of each list request.
        page_size: Pods per list request (``limit``; later pages follow ``continue``).

    """

    def __init__(
        self,
        api: CoreV1Api,
        *,
        gpu_resource_names: Sequence[str] = ("nvidia.com/gpu",),
        mig_prefix: str = "nvidia.com/mig-",
        team_label: str = "team",
        model_label: str = "gpuwarden.io/model",
        price_tier_label: str = "gpuwarden.io/price-tier",
        owner_label: str = "owner",
        namespace: str | None = None,
        request_timeout_seconds: float = 10,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        if request_timeout_seconds <= 0 or page_size <= 0:
            raise ValueError("request_timeout_seconds and page_size must be positive")
        self._api = api
        self.gpu_resource_names = frozenset(gpu_resource_names)
        self.mig_prefix = mig_prefix
        self.team_label = team_label
        self.model_label = model_label
        self.price_tier_label = price_tier_label
        self.owner_label = owner_label
        self.namespace = namespace
        self.request_timeout_seconds = request_timeout_seconds
        self.page_size = page_size

    def jobs(self, now: float) -> list[Job]:
        """Every pod that asks for a GPU, whatever its phase.

        Raises:
            JobSourceError: The API refused (401, 403, 404, ...), failed or was unreachable.

        """
        jobs = []
        for pod in self._pods():
            job = self.job_from_pod(pod)
            if job is not None:
                jobs.append(job)
        return jobs

    def _pods(self) -> list[V1Pod]:
        pods: list[V1Pod] = []
        token: str | None = None
        while True:
            page = self._list(token)
            pods.extend(page.items)
            token = page.metadata._continue if page.metadata is not None else None
            if not token:
                return pods

    def _list(self, token: str | None) -> V1PodList:
        """One page of pods; the single place that talks to the API server."""
        try:
            if self.namespace is None:
                return self._api.list_pod_for_all_namespaces(
                    limit=self.page_size,
                    _continue=token,
                    _request_timeout=self.request_timeout_seconds,
                )
            return self._api.list_namespaced_pod(
                self.namespace,
                limit=self.page_size,
                _continue=token,
                _request_timeout=self.request_timeout_seconds,
            )
        except OpenApiException as error:
            raise JobSourceError(_api_error(error)) from error
        except urllib3.exceptions.HTTPError as error:
            raise JobSourceError(f"Kubernetes API unreachable: {error}") from error
        except ValueError as error:  # a body that is not a PodList (pydantic's ValidationError)
            raise JobSourceError(f"Kubernetes API sent an unreadable pod list: {error}") from error

    def gpu_count(self, containers: Iterable[V1Container]) -> int:
        """Sum the GPU and MIG resources the containers ask for: limits, else requests."""
        return sum(self._container_gpus(container) for container in containers)

    def _container_gpus(self, container: V1Container) -> int:
        resources = container.resources
        if resources is None:
            return 0
        limits = resources.limits or {}
        requests = resources.requests or {}
        count = 0
        for name in {*limits, *requests}:
            if name not in self.gpu_resource_names and not name.startswith(self.mig_prefix):
                continue
            quantity = limits.get(name, requests.get(name, "0"))
            try:
                # Extended resources are whole numbers, which the API server writes as digits.
                count += int(quantity)
            except ValueError:
                log.warning(
                    "container %s: unreadable %s quantity %r", container.name, name, quantity
                )
        return count

    def _pod_gpus(self, pod: V1Pod) -> int:
        """GPUs the pod holds: its containers together, or its largest init container alone.

        Init containers run one after another before the others (sidecars, ``restartPolicy:
        Always``, keep running beside them), as in the scheduler's effective-request rule.
        """
        spec = pod.spec
        if spec is None:
            return 0
        init = spec.init_containers or []
        sidecars = [container for container in init if container.restart_policy == "Always"]
        one_shot = [container for container in init if container.restart_policy != "Always"]
        together = self.gpu_count([*spec.containers, *sidecars])
        return max([together, *(self._container_gpus(container) for container in one_shot)])

    def _owner(self, pod: V1Pod, labels: Mapping[str, str]) -> str | None:
        references = (pod.metadata.owner_references if pod.metadata else None) or []
        controllers = [reference for reference in references if reference.controller]
        if controllers or references:
            reference = (controllers or references)[0]
            return f"{reference.kind}/{reference.name}"
        return labels.get(self.owner_label) or None

    def job_from_pod(self, pod: V1Pod) -> Job | None:
        """Build a :class:`Job` from a pod, or ``None`` for a pod that asks for no GPU."""
        gpus = self._pod_gpus(pod)
        metadata = pod.metadata
        if gpus <= 0 or metadata is None:
            return None
        if not metadata.uid or not metadata.name:
            log.warning("skipping a GPU pod without uid or name: %r", metadata.name)
            return None
        namespace = metadata.namespace or "default"
        labels = metadata.labels or {}
        status = pod.status
        node = pod.spec.node_name if pod.spec is not None else None
        # Bound and not ended: the kubelet has (or is about to) hand the devices over.
        ended = status is not None and status.phase in _ENDED_PHASES
        return Job(
            key=f"{KEY_PREFIX}:{metadata.uid}",
            scheduler=SCHEDULER,
            job_id=f"{namespace}/{metadata.name}",
            state=pod_state(status),
            name=metadata.name,
            owner=self._owner(pod, labels),
            team=labels.get(self.team_label) or namespace,
            gpus=gpus,
            allocations=(GpuAllocation(node=node),) if node and not ended else (),
            submit_time=_timestamp(metadata.creation_timestamp),
            start_time=_timestamp(status.start_time) if status is not None else None,
            end_time=_end_time(status),
            priority=pod.spec.priority if pod.spec is not None else None,
            model=labels.get(self.model_label) or None,
            price_tier=labels.get(self.price_tier_label) or None,
            restarts=sum(container.restart_count for container in _container_statuses(status)),
            labels=bounded_labels(labels),
        )
