"""A Kubernetes ``admission.k8s.io/v1`` AdmissionReview: what the object asks for, and the answer.

Pure: bytes in, a :class:`Review` out. What a request asks for:

- **Pod** (``v1``): its effective ``nvidia.com/gpu`` (configurable) request as the scheduler
  counts it: the larger of the app containers plus restartable init containers ("sidecars")
  and, for each plain init container, its own request plus the sidecars started before it.
  A container's ``limits`` win over its ``requests`` (for extended resources both must be equal
  when both are set; ``limits`` alone imply ``requests``).
- **Job** (``batch/v1``): its pod template's GPUs times ``parallelism`` (default 1). Its pods are
  also admitted one by one when the controller creates them, which the team limits count.
- **Workload** (``kueue.x-k8s.io/v1beta1``): the sum over ``podSets`` of ``count`` times the
  template's GPUs.

The team is the object's ``team`` label (configurable; a Job's or Workload's own, else its pod
template's), else its namespace (as the Kubernetes job source counts it); the model its
``gpuwarden.io/model`` label. An AdmissionReview carries the object, not its namespace's labels:
``Review.namespace`` says when the team is the namespace, so the caller may name it by a
namespace label instead (:func:`with_team`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from gpuwarden.collector.policy.admission import (
    GPU_RESOURCE,
    AdmissionError,
    AdmissionSettings,
    Decision,
)
from gpuwarden.collector.policy.limits import LimitRequest

ADMISSION_API: Final = "admission.k8s.io/v1"

# The AdmissionReview, as far as it is read. Unknown fields are ignored (the API server adds
# fields over releases); the fields read are checked strictly.


class _Resources(msgspec.Struct, frozen=True):
    limits: dict[str, str | int] | None = None
    requests: dict[str, str | int] | None = None


class _Container(msgspec.Struct, frozen=True):
    name: str
    resources: _Resources | None = None
    restartPolicy: str | None = None  # noqa: N815 (the API's name)


class _PodSpec(msgspec.Struct, frozen=True):
    containers: list[_Container]
    initContainers: list[_Container] | None = None  # noqa: N815


class _Meta(msgspec.Struct, frozen=True):
    name: str | None = None
    generateName: str | None = None  # noqa: N815
    namespace: str | None = None
    labels: dict[str, str] | None = None


class _Template(msgspec.Struct, frozen=True):
    spec: _PodSpec
    metadata: _Meta | None = None


class _JobSpec(msgspec.Struct, frozen=True):
    template: _Template
    parallelism: int | None = None


class _PodSet(msgspec.Struct, frozen=True):
    name: str
    template: _Template
    count: int = 1


class _WorkloadSpec(msgspec.Struct, frozen=True):
    podSets: list[_PodSet]  # noqa: N815


class _Pod(msgspec.Struct, frozen=True):
    spec: _PodSpec
    metadata: _Meta | None = None


class _Job(msgspec.Struct, frozen=True):
    spec: _JobSpec
    metadata: _Meta | None = None


class _Workload(msgspec.Struct, frozen=True):
    spec: _WorkloadSpec
    metadata: _Meta | None = None


class _Kind(msgspec.Struct, frozen=True):
    group: str
    version: str
    kind: str


class _Request(msgspec.Struct, frozen=True):
    uid: str
    kind: _Kind
    operation: str
    namespace: str | None = None
    name: str | None = None
    object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # JSON null: b"null"
    dryRun: bool = False  # noqa: N815


class _Review(msgspec.Struct, frozen=True):
    apiVersion: str  # noqa: N815
    kind: str
    request: _Request


#: (group, kind) → the struct its object decodes to
_OBJECTS: Final[dict[tuple[str, str], type[_Pod | _Job | _Workload]]] = {
    ("", "Pod"): _Pod,
    ("batch", "Job"): _Job,
    ("kueue.x-k8s.io", "Workload"): _Workload,
}
_QUANTITY = re.compile(r"([0-9]+)(|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)")
_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_SUFFIX |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


@dataclass(frozen=True, slots=True)
class Review:
    """A decoded AdmissionReview: its ``uid`` (echoed in the answer) and what it asks for
    (``None``: nothing to judge, such as a DELETE or a kind without GPUs to count)."""

    uid: str
    request: LimitRequest | None
    namespace: str | None = None
    """The object's namespace when its team is that namespace (no team label on the object):
    a team named by a namespace label may replace it (:func:`with_team`)."""


def with_team(request: LimitRequest, team: str) -> LimitRequest:
    """``request`` of ``team`` instead."""
    return dataclasses.replace(request, team=team)


def quantity(value: str | int, where: str) -> int:
    """A whole-number Kubernetes quantity (``2``, ``"2"``, ``"1k"``); extended resources such as
    GPUs cannot be fractional."""
    if isinstance(value, int):
        if value < 0:
            raise AdmissionError(f"{where}: negative quantity {value}")
        return value
    match = _QUANTITY.fullmatch(value.strip())
    if match is None:
        raise AdmissionError(f"{where}: not a whole-number quantity: {value[:40]!r}")
    return int(match[1]) * _SUFFIX[match[2]]


def _container_gpus(container: _Container, resource: str, where: str) -> int:
    resources = container.resources or _Resources()
    for key, table in (("limits", resources.limits), ("requests", resources.requests)):
        if table is not None and resource in table:
            return quantity(table[resource], f"{where}.resources.{key}[{resource}]")
    return 0


def pod_gpus(spec: _PodSpec, resource: str = GPU_RESOURCE, where: str = "spec") -> int:
    """The GPUs a pod needs while it runs or initialises, as the scheduler counts them."""
    sidecars = 0
    peak = 0
    for i, init in enumerate(spec.initContainers or ()):
        gpus = _container_gpus(init, resource, f"{where}.initContainers[{i}]")
        if init.restartPolicy == "Always":  # a sidecar: runs on beside what follows
            sidecars += gpus
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + gpus)
    app = sum(
        _container_gpus(c, resource, f"{where}.containers[{i}]")
        for i, c in enumerate(spec.containers)
    )
    return max(peak, app + sidecars)


def _limit_request(
    gpus: int, meta: _Meta | None, namespace: str | None, labels: AdmissionSettings
) -> tuple[LimitRequest, bool]:
    """The request, and whether its team is its namespace (no team label)."""
    tags = (meta.labels if meta is not None else None) or {}
    name = (meta.name or meta.generateName) if meta is not None else None
    space = namespace or (meta.namespace if meta is not None else None)
    labelled = tags.get(labels.team_label) or None
    asked = LimitRequest(
        gpus=gpus,
        team=labelled or space or None,
        job=f"{space}/{name}" if space and name else name,
        job_kind=tags.get(labels.job_kind_label) or None,
        model=tags.get(labels.model_label) or None,
    )
    return asked, labelled is None and bool(space)


def _merged(meta: _Meta | None, templates: Sequence[_Meta | None]) -> _Meta | None:
    """The object's metadata with its pod templates' labels under its own (a Job's team label
    may sit on the Job or only on its pods)."""
    labels: dict[str, str] = {}
    for template in templates:
        labels |= (template.labels if template is not None else None) or {}
    if not labels:
        return meta
    own = meta if meta is not None else _Meta()
    return msgspec.structs.replace(own, labels=labels | (own.labels or {}))


def _object_request(
    request: _Request, object_type: type[_Pod | _Job | _Workload], labels: AdmissionSettings
) -> tuple[LimitRequest, bool]:
    if bytes(request.object) in (b"", b"null"):
        raise AdmissionError(f"request.object: required for {request.operation}")
    try:
        found = msgspec.json.decode(request.object, type=object_type)
    except msgspec.ValidationError as exc:
        raise AdmissionError(f"request.object: {exc}") from None
    resource = labels.gpu_resource
    if isinstance(found, _Pod):
        gpus = pod_gpus(found.spec, resource, "request.object.spec")
    elif isinstance(found, _Job):
        per_pod = pod_gpus(found.spec.template.spec, resource, "request.object.spec.template.spec")
        gpus = per_pod * (found.spec.parallelism if found.spec.parallelism is not None else 1)
    else:
        gpus = sum(
            pod_set.count
            * pod_gpus(
                pod_set.template.spec, resource, f"request.object.spec.podSets[{i}].template.spec"
            )
            for i, pod_set in enumerate(found.spec.podSets)
        )
    templates = (
        [found.spec.template]
        if isinstance(found, _Job)
        else [p.template for p in found.spec.podSets]
        if isinstance(found, _Workload)
        else []
    )
    meta = _merged(found.metadata, [t.metadata for t in templates])
    return _limit_request(gpus, meta, request.namespace, labels)


def parse_review(body: bytes, labels: AdmissionSettings | None = None) -> Review:
    """Decode an ``admission.k8s.io/v1`` AdmissionReview into what it asks for.

    Only ``CREATE`` is judged (a pod's GPUs cannot change afterwards); other operations and
    kinds other than Pod, batch Job and Kueue Workload yield ``request=None`` (allowed).

    Raises:
        AdmissionError: not JSON, not an ``admission.k8s.io/v1`` AdmissionReview, or a judged
            object that is not shaped as its kind (one line naming the field).
    """
    labels = labels or AdmissionSettings()
    try:
        review = msgspec.json.decode(body, type=_Review)
    except msgspec.DecodeError as exc:
        raise AdmissionError(f"not an AdmissionReview: {exc}") from None
    if review.apiVersion != ADMISSION_API or review.kind != "AdmissionReview":
        raise AdmissionError(
            f"expected apiVersion {ADMISSION_API} kind AdmissionReview, "
            f"got {review.apiVersion[:60]!r} {review.kind[:60]!r}"
        )
    request = review.request
    if not request.uid:
        raise AdmissionError("request.uid: required (the answer echoes it)")
    object_type = _OBJECTS.get((request.kind.group, request.kind.kind))
    if request.operation != "CREATE" or object_type is None:
        return Review(request.uid, None)
    asked, by_namespace = _object_request(request, object_type, labels)
    return Review(request.uid, asked, asked.team if by_namespace else None)


def review_response(uid: str, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview the API server expects back: ``uid`` echoed, ``allowed``, and for a
    denial ``status.code`` 403 with the message the user sees (``kubectl`` prints it)."""
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": decision.message}
    return {"apiVersion": ADMISSION_API, "kind": "AdmissionReview", "response": response}
