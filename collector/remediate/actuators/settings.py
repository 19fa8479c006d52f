"""The actuators' settings (the actuator keys of the collector config), as frozen structs.

:class:`ActuatorSettings` is what ``build.build_actuators`` takes; the collector config declares
these keys by extending it (they stay top-level keys of the file) and hands the actuators
``CollectorConfig.actuators``, so nothing here knows the collector config. No client is imported.

Each value mirrors an actuator's constructor: :class:`HTTPRouteTarget` and
:class:`InferenceServiceTarget` the bindings of ``routing.KubernetesRoutingActuator``,
:class:`RouteSpec` the routes of ``http_router.HttpRouterActuator``, :class:`WebhookEndpoint` a
``webhook.Webhook`` whose secret is read at start-up (from ``secret_file``, else the environment
variable ``secret_env``), so no secret is ever part of the configuration object.

``kubernetes_routes`` is written as :class:`KubernetesRoute` entries and held as targets:
:func:`traffic_targets` turns the one into the other when the file is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Literal

import msgspec

from gpuwarden.agent.schema import ONE_OR_MANY, ConfigError, convert

#: As the API server validates: a namespace is a DNS label, an object name a DNS subdomain.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = (
    r"(?=[^/]{1,253}(/|$))[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)

ObjectName = Annotated[
    str, msgspec.Meta(pattern=f"^{_DNS_SUBDOMAIN}$", description="a Kubernetes object name")
]
Namespaced = Annotated[
    str,
    msgspec.Meta(pattern=f"^{_DNS_LABEL}/{_DNS_SUBDOMAIN}$", description="'<namespace>/<name>'"),
]
ObjectRef = Annotated[
    str,
    msgspec.Meta(
        pattern=f"^({_DNS_LABEL}/)?{_DNS_SUBDOMAIN}$",
        description="a Kubernetes object name or '<namespace>/<name>'",
    ),
]
#: A node-name glob: hostname characters and ``*``, ``?``, ``[...]``.
NodeGlob = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z0-9.*?\[\]!_-]{1,253}$",
        description="a node-name glob such as 'gpu-a-*'",
    ),
]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
HttpUrl = Annotated[str, msgspec.Meta(pattern="^https?://", description="an http(s) URL")]
WebhookName = Annotated[
    str,
    msgspec.Meta(
        pattern="^[a-z0-9][a-z0-9_-]{0,62}$",
        description="a webhook name (lowercase letters, digits, -, _)",
    ),
]
EnvName = Annotated[
    str,
    msgspec.Meta(pattern="^[A-Za-z_][A-Za-z0-9_]*$", description="an environment variable name"),
]

#: The price tiers a requeue may move a job to (``price_tier`` of ``requeue`` but ``same``).
PriceTier = Literal["on-demand", "spot", "reserved"]
#: A Slurm partition name: letters, digits, ``.``, ``_``, ``-`` (no list, space or ``=``).
SlurmPartition = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="a Slurm partition name (letters, digits, '.', '_', '-')",
    ),
]


class HTTPRouteTarget(msgspec.Struct, frozen=True, tag="httproute"):
    """A deployment's traffic split in a Gateway API HTTPRoute (backends by Service name)."""

    namespace: str
    route: str
    primary: str
    fallback: str


class InferenceServiceTarget(msgspec.Struct, frozen=True, tag="inferenceservice"):
    """A deployment served by a KServe InferenceService whose canary is the smaller model."""

    namespace: str
    name: str


#: (Tagged only so that msgspec takes either in one mapping; the file never writes the tag.)
TrafficTarget = HTTPRouteTarget | InferenceServiceTarget


class KubernetesRoute(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One ``kubernetes_routes`` entry as written: ``httproute`` (with ``primary`` and
    ``fallback`` backend Service names) or ``inferenceservice``, in the deployment's namespace
    unless written ``<namespace>/<name>``."""

    httproute: ObjectRef | None = None
    inferenceservice: ObjectRef | None = None
    primary: ObjectName | None = None
    fallback: ObjectName | None = None

    def __post_init__(self) -> None:
        if (self.httproute is None) == (self.inferenceservice is None):
            raise ConfigError("set exactly one of httproute, inferenceservice")
        if self.inferenceservice is not None:
            if self.primary is not None or self.fallback is not None:
                raise ConfigError("primary/fallback go with httproute only")
            return
        for side in ("primary", "fallback"):
            if getattr(self, side) is None:
                raise ConfigError(f"{side}: required with httproute")
        if self.primary == self.fallback:
            raise ConfigError("primary and fallback are the same backend")

    def target(self, deployment: str) -> TrafficTarget:
        """The target of ``deployment`` (``<namespace>/<name>``)."""
        namespace = deployment.partition("/")[0]
        if self.inferenceservice is not None:
            return InferenceServiceTarget(*_in(namespace, self.inferenceservice))
        if self.httproute is None or self.primary is None or self.fallback is None:
            raise ConfigError("httproute needs primary and fallback")  # as __post_init__ says
        return HTTPRouteTarget(*_in(namespace, self.httproute), self.primary, self.fallback)


def _in(namespace: str, ref: str) -> tuple[str, str]:
    """``(namespace, name)`` of ``ref``, in ``namespace`` unless it names its own."""
    own, slash, name = ref.partition("/")
    return (own, name) if slash else (namespace, ref)


def traffic_targets(written: object, where: str, section: str) -> dict[str, TrafficTarget]:
    """``kubernetes_routes`` as written (``<namespace>/<deployment>`` → :class:`KubernetesRoute`)
    into targets.

    Raises:
        ConfigError: ``<where>: <section>.<deployment>[.<key>]: <what is wrong>``.
    """
    routes = convert(written, dict[Namespaced, KubernetesRoute], where, section=section)
    return {name: route.target(name) for name, route in routes.items()}


class RouteSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Which route of an HTTP router serves a deployment, and its primary and fallback
    backends (a ``router_routes`` entry)."""

    route: NonEmpty
    primary: NonEmpty
    fallback: NonEmpty

    def __post_init__(self) -> None:
        if self.primary == self.fallback:
            raise ConfigError("primary and fallback are the same backend")


class WebhookEndpoint(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where the ``webhook`` action posts, and where its HMAC secret comes from."""

    url: HttpUrl
    secret_file: Path | None = None
    secret_env: EnvName | None = None
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, description="a positive number")] = 10.0

    def __post_init__(self) -> None:
        if self.secret_file is None and self.secret_env is None:
            raise ConfigError("set secret_file or secret_env (the HMAC secret)")


class ActuatorSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The actuators the collector may use (all off by default) and their client settings.

    Attributes:
        slurm_cluster: the Slurm actuator (requeue, drain, resume), and the Slurm job source.
        slurm_action_nodes: node-name globs Slurm drains when Kubernetes acts too.
        slurm_partitions_by_tier: price tier → the Slurm partition a ``requeue`` with that
            ``price_tier`` moves the job to (a tier without one is refused).
        kubernetes_kubeconfig: the Kubernetes client: a kubeconfig file (also the job source's).
        kubernetes_context: the kubeconfig context.
        kubernetes_in_cluster: the Kubernetes client: the pod's service account.
        kubernetes_actions: scale_up, requeue (``k8s:`` jobs) and drain/resume (cordon).
        kubernetes_kueue: requeue Kueue-managed jobs through their Workload.
        kubernetes_action_nodes: node-name globs Kubernetes drains when Slurm acts too.
        kubernetes_routes: degrade/restore: ``<namespace>/<deployment>`` → HTTPRoute weights
            or KServe canary percent.
        router_url: degrade/restore through an HTTP router (serving_router's contract).
        router_token_file: the router's bearer token.
        router_routes: deployment (the incident's model) → route.
        webhooks: the ``webhook`` action's endpoints by name (secrets read at start-up).
    """

    slurm_cluster: NonEmpty | None = None
    slurm_action_nodes: Annotated[tuple[NodeGlob, ...], ONE_OR_MANY] = ()
    slurm_partitions_by_tier: Mapping[PriceTier, SlurmPartition] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    kubernetes_kubeconfig: Path | None = None
    kubernetes_context: str | None = None
    kubernetes_in_cluster: bool = False
    kubernetes_actions: bool = False
    kubernetes_kueue: bool = False
    kubernetes_action_nodes: Annotated[tuple[NodeGlob, ...], ONE_OR_MANY] = ()
    kubernetes_routes: Mapping[str, TrafficTarget] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    router_url: str | None = None
    router_token_file: Path | None = None
    router_routes: Mapping[str, RouteSpec] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    webhooks: Mapping[WebhookName, WebhookEndpoint] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )

    def __post_init__(self) -> None:
        problem = actuator_problem(self)
        if problem is not None:
            raise ConfigError(problem)


def actuator_problem(config: ActuatorSettings) -> str | None:
    """What contradicts itself among the actuator keys (``None``: nothing)."""
    kube_client = config.kubernetes_kubeconfig is not None or config.kubernetes_in_cluster
    url = config.router_url
    both = sorted(set(config.kubernetes_routes) & set(config.router_routes))
    checks = (
        (
            config.kubernetes_in_cluster and config.kubernetes_kubeconfig is not None,
            "kubernetes_in_cluster and kubernetes_kubeconfig exclude each other",
        ),
        (
            (config.kubernetes_actions or bool(config.kubernetes_routes)) and not kube_client,
            "kubernetes_actions and kubernetes_routes need kubernetes_kubeconfig or "
            "kubernetes_in_cluster (the API client they use)",
        ),
        (
            bool(config.kubernetes_action_nodes) and not config.kubernetes_actions,
            "kubernetes_action_nodes needs kubernetes_actions: true",
        ),
        (
            config.kubernetes_kueue and not config.kubernetes_actions,
            "kubernetes_kueue needs kubernetes_actions: true",
        ),
        (
            bool(config.slurm_action_nodes) and not config.slurm_cluster,
            "slurm_action_nodes needs slurm_cluster",
        ),
        (
            bool(config.slurm_partitions_by_tier) and not config.slurm_cluster,
            "slurm_partitions_by_tier needs slurm_cluster",
        ),
        (
            bool(config.slurm_cluster)
            and config.kubernetes_actions
            and not (config.slurm_action_nodes or config.kubernetes_action_nodes),
            "slurm_cluster and kubernetes_actions both drain nodes: set slurm_action_nodes "
            "and/or kubernetes_action_nodes (node-name globs) so each node has one owner",
        ),
        ((url is None) != (not config.router_routes), "router_url and router_routes go together"),
        (
            config.router_token_file is not None and url is None,
            "router_token_file needs router_url",
        ),
        (
            url is not None and not url.startswith(("http://", "https://")),
            "router_url must be an http(s) URL",
        ),
        (
            bool(both),
            f"deployment {both[0] if both else ''!r} is in both kubernetes_routes and "
            "router_routes",
        ),
    )
    return next((message for failed, message in checks if failed), None)
