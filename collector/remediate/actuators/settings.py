"""The collector config's actuator keys, parsed into frozen values (no client imported here).

Each value mirrors an actuator's constructor: :class:`HTTPRouteTarget` and
:class:`InferenceServiceTarget` the bindings of ``routing.KubernetesRoutingActuator``,
``RouteSpec`` the routes of ``routing_actuator.HttpRouterActuator``, :class:`WebhookEndpoint` a
``webhook.Webhook`` whose secret is read at start-up (from ``secret_file``, else the environment
variable ``secret_env``), so no secret is ever part of the configuration object.

Every parser raises :class:`ActuatorSettingsError` naming ``<file>.<key>[.<entry>]``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpuwarden.agent.config import ConfigError
from gpuwarden.collector.remediate.actuators.http_router import RouteSpec

if TYPE_CHECKING:
    from gpuwarden.collector.config import CollectorConfig

#: As the API server validates: a namespace is a DNS label, an object name a DNS subdomain.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
#: A node-name glob: hostname characters and ``*``, ``?``, ``[...]``.
_NODE_GLOB = re.compile(r"[A-Za-z0-9.*?\[\]!_-]{1,253}")
_WEBHOOK_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ActuatorSettingsError(ConfigError):
    """An actuator key is unusable; the message names the file and key, never a secret."""


@dataclass(frozen=True, slots=True)
class HTTPRouteTarget:
    """A deployment's traffic split in a Gateway API HTTPRoute (backends by Service name)."""

    namespace: str
    route: str
    primary: str
    fallback: str


@dataclass(frozen=True, slots=True)
class InferenceServiceTarget:
    """A deployment served by a KServe InferenceService whose canary is the smaller model."""

    namespace: str
    name: str


TrafficTarget = HTTPRouteTarget | InferenceServiceTarget


@dataclass(frozen=True, slots=True)
class WebhookEndpoint:
    """Where the ``webhook`` action posts, and where its HMAC secret comes from."""

    url: str
    secret_file: Path | None = None
    secret_env: str | None = None
    timeout_seconds: float = 10.0


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ActuatorSettingsError(f"{where}: expected a mapping")
    return value


def _entry(value: object, where: str, allowed: frozenset[str]) -> dict[str, Any]:
    """A mapping of known keys with string values (numbers only where the caller converts)."""
    item = dict(_mapping(value, where))
    unknown = sorted(str(key) for key in set(item) - allowed)
    if unknown:
        known = ", ".join(sorted(allowed))
        raise ActuatorSettingsError(f"{where}: unknown key {unknown[0]!r} (known: {known})")
    return item


def _text(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ActuatorSettingsError(f"{where}.{key}: expected a non-empty string, got {value!r}")
    return value.strip()


def _object_name(value: str, where: str) -> str:
    if not _DNS_SUBDOMAIN.fullmatch(value):
        raise ActuatorSettingsError(f"{where}: {value!r} is not a Kubernetes object name")
    return value


def _namespaced(value: str, where: str) -> tuple[str, str]:
    namespace, slash, name = value.partition("/")
    if not slash or not _DNS_LABEL.fullmatch(namespace) or not _DNS_SUBDOMAIN.fullmatch(name):
        raise ActuatorSettingsError(f"{where}: expected '<namespace>/<name>', got {value!r}")
    return namespace, name


def node_globs(value: object, where: str) -> tuple[str, ...]:
    """``slurm_action_nodes`` / ``kubernetes_action_nodes``: node-name globs (``gpu-a-*``)."""
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not isinstance(item, str) or not _NODE_GLOB.fullmatch(item):
            raise ActuatorSettingsError(
                f"{where}: expected node-name globs such as 'gpu-a-*', got {item!r}"
            )
    return tuple(items)


_ROUTE_KEYS = frozenset({"httproute", "inferenceservice", "primary", "fallback"})


def kubernetes_routes(value: object, where: str) -> Mapping[str, TrafficTarget]:
    """``kubernetes_routes``: ``<namespace>/<deployment>`` → an HTTPRoute or InferenceService.

    ``httproute`` (with ``primary`` and ``fallback`` backend Service names) or
    ``inferenceservice`` names the object, in the deployment's namespace unless written
    ``<namespace>/<name>``.
    """
    out: dict[str, TrafficTarget] = {}
    for deployment, raw in _mapping(value, where).items():
        at = f"{where}.{deployment}"
        namespace, _ = _namespaced(str(deployment), at)
        item = _entry(raw, at, _ROUTE_KEYS)
        kinds = [key for key in ("httproute", "inferenceservice") if key in item]
        if len(kinds) != 1:
            raise ActuatorSettingsError(f"{at}: set exactly one of httproute, inferenceservice")
        ref = _text(item, kinds[0], at)
        if "/" in ref:
            namespace, name = _namespaced(ref, f"{at}.{kinds[0]}")
        else:
            name = _object_name(ref, f"{at}.{kinds[0]}")
        if kinds[0] == "inferenceservice":
            if {"primary", "fallback"} & set(item):
                raise ActuatorSettingsError(f"{at}: primary/fallback go with httproute only")
            out[str(deployment)] = InferenceServiceTarget(namespace, name)
            continue
        primary = _object_name(_text(item, "primary", at), f"{at}.primary")
        fallback = _object_name(_text(item, "fallback", at), f"{at}.fallback")
        if primary == fallback:
            raise ActuatorSettingsError(f"{at}: primary and fallback are the same backend")
        out[str(deployment)] = HTTPRouteTarget(namespace, name, primary, fallback)
    return MappingProxyType(out)


_ROUTER_KEYS = frozenset({"route", "primary", "fallback"})


def router_routes(value: object, where: str) -> Mapping[str, RouteSpec]:
    """``router_routes``: deployment (the incident's model) → ``{route, primary, fallback}``."""
    out: dict[str, RouteSpec] = {}
    for deployment, raw in _mapping(value, where).items():
        at = f"{where}.{deployment}"
        item = _entry(raw, at, _ROUTER_KEYS)
        spec = RouteSpec(*(_text(item, key, at) for key in ("route", "primary", "fallback")))
        if spec.primary == spec.fallback:
            raise ActuatorSettingsError(f"{at}: primary and fallback are the same backend")
        out[str(deployment)] = spec
    return MappingProxyType(out)


_WEBHOOK_KEYS = frozenset({"url", "secret_file", "secret_env", "timeout_seconds"})


def webhooks(value: object, where: str) -> Mapping[str, WebhookEndpoint]:
    """``webhooks``: name (as rules write ``parameters: {name: ...}``) → endpoint."""
    out: dict[str, WebhookEndpoint] = {}
    for name, raw in _mapping(value, where).items():
        at = f"{where}.{name}"
        if not isinstance(name, str) or not _WEBHOOK_NAME.fullmatch(name):
            raise ActuatorSettingsError(f"{at}: a webhook name is lowercase letters, digits, -, _")
        item = _entry(raw, at, _WEBHOOK_KEYS)
        url = _text(item, "url", at)
        if not url.startswith(("https://", "http://")):
            raise ActuatorSettingsError(f"{at}.url: expected an http(s) URL")
        secret_file = Path(_text(item, "secret_file", at)) if "secret_file" in item else None
        secret_env = _text(item, "secret_env", at) if "secret_env" in item else None
        if secret_env is not None and not _ENV_NAME.fullmatch(secret_env):
            raise ActuatorSettingsError(f"{at}.secret_env: not an environment variable name")
        if secret_file is None and secret_env is None:
            raise ActuatorSettingsError(f"{at}: set secret_file or secret_env (the HMAC secret)")
        timeout = item.get("timeout_seconds", 10.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ActuatorSettingsError(f"{at}.timeout_seconds: expected a positive number")
        out[name] = WebhookEndpoint(url, secret_file, secret_env, float(timeout))
    return MappingProxyType(out)


#: The keys parsed here, for ``collector.config``'s key table.
ACTUATOR_KEYS: Mapping[str, Callable[[object, str], object]] = MappingProxyType(
    {
        "slurm_action_nodes": node_globs,
        "kubernetes_action_nodes": node_globs,
        "kubernetes_routes": kubernetes_routes,
        "router_routes": router_routes,
        "webhooks": webhooks,
    }
)


def actuator_problem(config: CollectorConfig) -> str | None:
    """What contradicts itself among the actuator keys (``None``: nothing)."""
    kube_client = config.kubernetes_kubeconfig is not None or config.kubernetes_in_cluster
    url = config.router_url
    both = sorted(set(config.kubernetes_routes) & set(config.router_routes))
    checks = (
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
