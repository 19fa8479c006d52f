"""The actuators their settings enable (the remediation half of the composition root).

Everything is off by default. ``slurm_cluster`` enables the Slurm actuator (requeue, drain,
resume); ``kubernetes_actions`` the Kubernetes one (scale_up, requeue of ``k8s:`` jobs by deleting
their pod, drain/resume as cordon/uncordon) through the ``kubernetes_*`` client settings;
``kubernetes_routes`` degrade/restore through HTTPRoute weights or a KServe canary;
``router_url`` with ``router_routes`` degrade/restore through an HTTP router; ``webhooks`` the
signed ``webhook`` action. When Slurm and Kubernetes both act, each job goes to its scheduler
(by its key) and each node to the scheduler whose ``*_action_nodes`` globs match it (see
:mod:`gpuwarden.collector.remediate.actuators.ownership`).

Client libraries are imported only for what is enabled. Unusable settings (a kubeconfig that
does not load, an unreadable secret) raise ``ConfigError`` naming the key, never a secret; a
setting whose extra is not installed raises ``MissingExtraError`` naming the extra.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gpuwarden.agent.config import ConfigError
from gpuwarden.collector.extras import needs_extra
from gpuwarden.collector.remediate.actuators.ownership import NodeOwnership, OwnedActuator
from gpuwarden.collector.remediate.actuators.settings import (
    ActuatorSettings,
    HTTPRouteTarget,
    WebhookEndpoint,
)

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from gpuwarden.collector.alerts.signing import Webhook
    from gpuwarden.collector.clients.http import HttpClient
    from gpuwarden.collector.jobs.model import Job
    from gpuwarden.collector.remediate.actuators.base import Actuator

#: Job key → the job, current or remembered (``JobRegistry.get``).
JobLookup = Callable[[str], "Job | None"]


def build_actuators(
    config: ActuatorSettings,
    environ: Mapping[str, str],
    *,
    jobs: JobLookup | None = None,
    clock: Callable[[], float] = time.time,
    http: HttpClient | None = None,
) -> list[Actuator]:
    """The actuators ``config`` enables, in a fixed order: Slurm, Kubernetes, HTTPRoute/KServe,
    HTTP router, webhooks.

    Args:
        config: the actuator settings (``CollectorConfig.actuators``).
        environ: the environment (``scontrol``'s environment, webhook secrets by variable name).
        jobs: job lookup that turns a ``k8s:<uid>`` key into the pod to requeue; without it
            Kubernetes jobs are not requeued (the action is proposed instead).
        clock: Unix seconds, for webhook signatures.
        http: the shared HTTP client of the router and webhook actuators.

    Kinds without an actuator (e.g. scale-up without ``kubernetes_actions``) are proposed in
    alerts, never executed.

    Raises:
        ConfigError: a setting that cannot be used, naming the key.
    """
    nodes = NodeOwnership(
        {
            system: globs
            for system, globs, enabled in (
                ("slurm", config.slurm_action_nodes, bool(config.slurm_cluster)),
                ("kubernetes", config.kubernetes_action_nodes, config.kubernetes_actions),
            )
            if enabled
        }
    )
    actuators: list[Actuator] = []
    if config.slurm_cluster:
        actuators.append(_slurm(config.slurm_cluster, config, environ, nodes))
    client = _kube_client(config) if config.kubernetes_actions or config.kubernetes_routes else None
    if client is not None and config.kubernetes_actions:
        actuators.append(_kubernetes(client, nodes, jobs, kueue=config.kubernetes_kueue))
    if client is not None and config.kubernetes_routes:
        actuators.append(_kubernetes_routes(client, config))
    if config.router_url is not None:
        actuators.append(_router(config, config.router_url, http))
    if config.webhooks:
        actuators.append(_webhooks(config.webhooks, environ, clock, http))
    return actuators


def _slurm(
    cluster: str, config: ActuatorSettings, environ: Mapping[str, str], nodes: NodeOwnership
) -> Actuator:
    from gpuwarden.collector.remediate.actuators.slurm import SlurmActuator

    partitions = {str(tier): name for tier, name in config.slurm_partitions_by_tier.items()}
    slurm = SlurmActuator(cluster, environ=environ, partitions_by_tier=partitions)
    if not (config.kubernetes_actions or config.slurm_action_nodes):
        return slurm  # the only scheduler acting, on every node

    def owns(target: str) -> str | None:
        if not slurm.accepts(target):  # its own cluster's job keys and plain node names
            return None
        if target.startswith("slurm:") or nodes.owner(target) == "slurm":
            return target
        return None

    return OwnedActuator(slurm, owns, system="Slurm")


def _kube_client(config: ActuatorSettings) -> ApiClient:
    from gpuwarden.collector.jobs import JobSourceError
    from gpuwarden.collector.jobs.kube_client import load_client

    try:
        with needs_extra("kubernetes", _kube_setting(config)):  # the client loads kubernetes
            return load_client(
                kubeconfig=config.kubernetes_kubeconfig,
                context=config.kubernetes_context,
                in_cluster=config.kubernetes_in_cluster,
            )
    except JobSourceError as exc:
        raise ConfigError(f"kubernetes_actions: {exc}") from None


def _kube_setting(config: ActuatorSettings) -> str:
    """The key that made the actuators need a Kubernetes client."""
    return "kubernetes_actions" if config.kubernetes_actions else "kubernetes_routes"


def _kubernetes(
    client: ApiClient, nodes: NodeOwnership, jobs: JobLookup | None, *, kueue: bool
) -> Actuator:
    with needs_extra("kubernetes", "kubernetes_actions"):
        from gpuwarden.collector.jobs.kubernetes import KEY_PREFIX, SCHEDULER
        from gpuwarden.collector.remediate.actuators.kube_api import (
            CustomObjects,
            namespaced_name,
            node_name,
        )
        from gpuwarden.collector.remediate.actuators.kubernetes import (
            KubeCalls,
            KubernetesActuator,
        )

    requeue = None
    if kueue:
        with needs_extra("kubernetes", "kubernetes_kueue"):
            from gpuwarden.collector.remediate.actuators.kueue import KueueRequeue

        requeue = KueueRequeue(CustomObjects(client))
    kubernetes = KubernetesActuator(KubeCalls(client), kueue=requeue)

    def owns(target: str) -> str | None:
        if target.startswith(f"{KEY_PREFIX}:"):  # a pod's job key: the pod its registry entry names
            job = jobs(target) if jobs is not None else None
            if job is None or job.scheduler != SCHEDULER:
                return None
            return job.job_id if namespaced_name(job.job_id) is not None else None
        if namespaced_name(target) is not None:  # a deployment or a pod
            return target
        if node_name(target) is not None and nodes.owner(target) == "kubernetes":
            return target
        return None

    return OwnedActuator(kubernetes, owns, system="Kubernetes")


def _kubernetes_routes(client: ApiClient, config: ActuatorSettings) -> Actuator:
    with needs_extra("kubernetes", "kubernetes_routes"):
        from gpuwarden.collector.remediate.actuators.kube_api import CustomObjects
        from gpuwarden.collector.remediate.actuators.routing import (
            Binding,
            HTTPRouteBinding,
            InferenceServiceBinding,
            KubernetesRoutingActuator,
        )
    bindings: dict[str, Binding] = {
        deployment: (
            HTTPRouteBinding(target.namespace, target.route, target.primary, target.fallback)
            if isinstance(target, HTTPRouteTarget)
            else InferenceServiceBinding(target.namespace, target.name)
        )
        for deployment, target in config.kubernetes_routes.items()
    }
    return KubernetesRoutingActuator(CustomObjects(client), bindings)


def _router(config: ActuatorSettings, url: str, http: HttpClient | None) -> Actuator:
    from gpuwarden.collector.remediate.actuators.http_router import HttpRouterActuator

    token = ""
    if config.router_token_file is not None:
        try:
            token = config.router_token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            message = f"router_token_file {config.router_token_file}: cannot read: {exc.strerror}"
            raise ConfigError(message) from None
    return HttpRouterActuator(url, config.router_routes, token=token, http=http)


def load_webhooks(
    webhooks: Mapping[str, WebhookEndpoint], environ: Mapping[str, str]
) -> list[Webhook]:
    """The configured ``webhooks`` with their secrets (for the action and the ``webhook:``
    alert route). Raises ``ConfigError`` naming the webhook, never the secret."""
    from gpuwarden.collector.alerts.signing import Webhook, WebhookConfigError, load_secret

    endpoints = []
    for name, endpoint in webhooks.items():
        try:
            secret = load_secret(
                name,
                secret_file=endpoint.secret_file,
                secret_env=endpoint.secret_env,
                environ=environ,
            )
            endpoints.append(Webhook(name, endpoint.url, secret, endpoint.timeout_seconds))
        except WebhookConfigError as exc:
            raise ConfigError(f"webhooks.{name}: {exc}") from None
    return endpoints


def _webhooks(
    webhooks: Mapping[str, WebhookEndpoint],
    environ: Mapping[str, str],
    clock: Callable[[], float],
    http: HttpClient | None,
) -> Actuator:
    from gpuwarden.collector.remediate.actuators.webhook import WebhookActuator

    return WebhookActuator(load_webhooks(webhooks, environ), clock=clock, http=http)
