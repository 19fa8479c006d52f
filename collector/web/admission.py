"""Admission over HTTP: the Kubernetes validating webhook and the Slurm hook's check.

* ``POST /admission/v1/validate``: an ``admission.k8s.io/v1`` AdmissionReview in (a Pod,
  batch Job or Kueue Workload being created), the AdmissionReview out: the request's ``uid``,
  ``allowed``, and for a denial ``status.code`` 403 and a message naming the policy and the
  numbers. A body that is not such a review is a 400 (the API server then applies the
  webhook's ``failurePolicy``); one over ``admission.max_review_bytes`` a 413.
* ``POST /admission/v1/slurm``: the fields ``deploy/slurm/job_submit.lua`` sends (through
  ``gpuwarden policies admit``), answered ``{"allowed": ..., "message": ...}``.

Both admit the ``admission`` role (and admins); each answer is counted by source and verdict
(``gpuwarden_admission_reviews_total``). The ``limit`` policies come from
``policies_dir``, read once when the app is built; the GPUs each team and model already hold
or wait for come from the job registry at each request (``policy.admission.usage_of``).
Serve HTTPS (``tls:``): the API server calls webhooks over TLS only.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from gpuwarden.collector.config import CollectorConfig, ConfigError
from gpuwarden.collector.extras import needs_extra
from gpuwarden.collector.jobs import JobSourceError
from gpuwarden.collector.jobs.kube_client import KubeApis, load_client
from gpuwarden.collector.jobs.kube_namespaces import NamespaceLabels
from gpuwarden.collector.policy.admission import (
    AdmissionError,
    AdmissionSettings,
    Decision,
    decide,
    usage_of,
)
from gpuwarden.collector.policy.limits import LimitRequest
from gpuwarden.collector.policy.loader import load_policies
from gpuwarden.collector.policy.model import Policy, PolicyError, PolicyKind
from gpuwarden.collector.policy.review import parse_review, review_response, with_team
from gpuwarden.collector.policy.slurm_job import parse_slurm, slurm_answer
from gpuwarden.collector.web.keys import (
    ADMISSION_CALLERS,
    ADMISSION_STATS,
    CALLER,
    CONFIG,
    SERVICE,
    add_route,
)

__all__ = ["ADMISSION", "REVIEW_PATH", "SLURM_PATH", "Admission", "setup_admission"]

log = logging.getLogger(__name__)
REVIEW_PATH = "/admission/v1/validate"
SLURM_PATH = "/admission/v1/slurm"
KUBERNETES, SLURM = "kubernetes", "slurm"
"""The ``source`` label of ``gpuwarden_admission_reviews_total``."""
MAX_SLURM_BYTES = 64 * 1024
"""A job request is a few short strings; the hook sends no script."""


@dataclass(frozen=True, slots=True)
class Admission:
    """What the admission routes judge by: the limit policies, the label settings, and the
    namespace labels (when ``team_namespace_label`` is set)."""

    policies: tuple[Policy, ...]
    settings: AdmissionSettings
    namespaces: NamespaceLabels | None = None


ADMISSION = web.AppKey("admission", Admission)


def _limits(config_dir: Path | None) -> tuple[Policy, ...]:
    """The ``limit`` policies of ``policies_dir`` (none when unset).

    Raises:
        ConfigError: a policy file that does not load (its one line).
    """
    if config_dir is None:
        return ()
    try:
        loaded = load_policies([config_dir])
    except PolicyError as exc:
        raise ConfigError(f"policies_dir: {exc}") from None
    return tuple(loaded.of_kind(PolicyKind.LIMIT))


def _namespace_labels(config: CollectorConfig) -> NamespaceLabels | None:
    """The namespace label reader for ``admission.team_namespace_label`` (None when unset).

    Raises:
        ConfigError: the label is set without a Kubernetes client (``kubernetes_kubeconfig`` or
            ``kubernetes_in_cluster``), or the client cannot be configured.
    """
    settings = config.admission
    if settings.team_namespace_label is None:
        return None
    if config.kubernetes_kubeconfig is None and not config.kubernetes_in_cluster:
        raise ConfigError(
            "admission.team_namespace_label: needs kubernetes_kubeconfig or "
            "kubernetes_in_cluster (the namespaces are read from the Kubernetes API)"
        )
    with needs_extra("kubernetes", "admission.team_namespace_label"):
        try:
            client = load_client(
                kubeconfig=config.kubernetes_kubeconfig,
                context=config.kubernetes_context,
                in_cluster=config.kubernetes_in_cluster,
            )
        except JobSourceError as exc:
            raise ConfigError(f"admission.team_namespace_label: {exc}") from None
    return NamespaceLabels(KubeApis(client).core(), ttl_seconds=settings.namespace_cache_seconds)


def setup_admission(app: web.Application, policies: tuple[Policy, ...] | None = None) -> None:
    """Add the admission routes; ``policies`` default to the limits of ``policies_dir``."""
    config = app[CONFIG]
    found = _limits(config.policies_dir) if policies is None else policies
    app[ADMISSION] = Admission(found, config.admission, _namespace_labels(config))
    add_route(app, "POST", REVIEW_PATH, validate, ADMISSION_CALLERS)
    add_route(app, "POST", SLURM_PATH, slurm_check, ADMISSION_CALLERS)


def _count(request: web.Request, source: str, verdict: str) -> None:
    stats = request.app.get(ADMISSION_STATS)
    if stats is not None:
        stats.verdicts[(source, verdict)] += 1


def _judge(request: web.Request, source: str, asked: LimitRequest | None) -> Decision:
    """The decision on ``asked`` against the limits and the registry's jobs now."""
    usage = usage_of(request.app[SERVICE].registry.jobs())
    decision = decide(request.app[ADMISSION].policies, asked, usage)
    _count(request, source, "allowed" if decision.allowed else "denied")
    if not decision.allowed:
        log.info("admission denied for %s: %s", request[CALLER], decision.message)
    return decision


def _refuse(request: web.Request, source: str, status: int, message: str) -> web.Response:
    """A 4xx for a request that could not be judged, counted as ``malformed``."""
    _count(request, source, "malformed")
    return web.json_response({"error": message}, status=status)


async def _body(request: web.Request, source: str, limit: int) -> bytes | web.Response:
    """The JSON body, or the 413/415 refusing it."""
    body = await request.read()  # buffered by the body guard, within max_body_bytes
    if len(body) > limit:
        return _refuse(request, source, 413, f"body exceeds {limit} bytes")
    if request.content_type != "application/json":
        message = f"expected Content-Type application/json, got {request.content_type[:60]!r}"
        return _refuse(request, source, 415, message)
    return body


async def validate(request: web.Request) -> web.Response:
    """``POST /admission/v1/validate``: judge one AdmissionReview."""
    settings = request.app[ADMISSION].settings
    body = await _body(request, KUBERNETES, settings.max_review_bytes)
    if isinstance(body, web.Response):
        return body
    try:
        review = parse_review(body, settings)
    except AdmissionError as exc:
        return _refuse(request, KUBERNETES, 400, str(exc))
    asked = review.request
    namespaces = request.app[ADMISSION].namespaces
    label = settings.team_namespace_label
    if asked is not None and review.namespace and namespaces is not None and label:
        labels = await asyncio.to_thread(namespaces.labels, review.namespace)  # cached
        if labels and labels.get(label):
            asked = with_team(asked, labels[label])
    decision = _judge(request, KUBERNETES, asked)
    return web.json_response(review_response(review.uid, decision))


async def slurm_check(request: web.Request) -> web.Response:
    """``POST /admission/v1/slurm``: judge one Slurm job submission."""
    body = await _body(request, SLURM, MAX_SLURM_BYTES)
    if isinstance(body, web.Response):
        return body
    try:
        asked = parse_slurm(body)
    except AdmissionError as exc:
        return _refuse(request, SLURM, 400, str(exc))
    return web.json_response(dict(slurm_answer(_judge(request, SLURM, asked))))
