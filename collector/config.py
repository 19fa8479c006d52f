"""Collector configuration, parsed once into frozen objects (file, then defaults)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gpuwarden.agent.config import ConfigError
from gpuwarden.collector.notify.settings import AlertingSettings, AlertingSettingsError
from gpuwarden.collector.remediate.actuators.http_router import RouteSpec
from gpuwarden.collector.remediate.actuators.settings import (
    ACTUATOR_KEYS,
    TrafficTarget,
    WebhookEndpoint,
    actuator_problem,
)
from gpuwarden.collector.remediate.policy import PolicyError, RemediationSettings


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    """What the collector listens on and whom it lets in.

    ``tokens`` maps a bearer token to the agent (or API caller) name it authenticates. With no
    tokens and ``allow_unauthenticated`` false, every request is refused: safe by default.
    """

    host: str = "127.0.0.1"
    port: int = 4318
    tokens: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    allow_unauthenticated: bool = False
    max_body_bytes: int = 8 * 1024 * 1024
    max_decompressed_bytes: int = 64 * 1024 * 1024
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    database: Path = Path("/var/lib/gpuwarden/collector.db")
    step_seconds: int = 10
    recent_hours: int = 6
    max_series: int = 1_000_000
    accounting_period_seconds: int = 60
    idle_threshold_ratio: float = 0.05
    grid_intensity_grams_per_kwh: float = 400.0
    slurm_cluster: str | None = None
    #: Kubernetes pods with GPU requests: a kubeconfig file, or the pod's service account
    kubernetes_kubeconfig: Path | None = None
    kubernetes_context: str | None = None
    kubernetes_in_cluster: bool = False
    kubernetes_namespace: str | None = None
    #: actuators (all off by default): scale_up, requeue (k8s: jobs) and drain/resume (cordon)
    #: through the kubernetes_* client above; node-name globs each scheduler drains when both act
    kubernetes_actions: bool = False
    #: requeue Kueue-managed jobs through their Workload (deactivate, eviction, reactivate)
    kubernetes_kueue: bool = False
    slurm_action_nodes: tuple[str, ...] = ()
    kubernetes_action_nodes: tuple[str, ...] = ()
    #: degrade/restore: "<namespace>/<deployment>" → HTTPRoute weights or KServe canary percent
    kubernetes_routes: Mapping[str, TrafficTarget] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: degrade/restore through an HTTP router (serving_router's contract): deployment → route
    router_url: str | None = None
    router_token_file: Path | None = None
    router_routes: Mapping[str, RouteSpec] = field(default_factory=lambda: MappingProxyType({}))
    #: the webhook action's endpoints by name; secrets are read from files or env at start-up
    webhooks: Mapping[str, WebhookEndpoint] = field(default_factory=lambda: MappingProxyType({}))
    job_poll_seconds: float = 30.0
    max_inflight_requests: int = 64
    #: model servers to scrape: mappings with url, server (vllm|triton|prometheus), model, node
    model_servers: tuple[Mapping[str, str], ...] = ()
    scrape_seconds: float = 15.0
    #: rule files or folders (default: the packaged rules/); runbooks checked against runbooks_dir
    rules: tuple[Path, ...] = ()
    runbooks_dir: Path | None = None
    skip_bad_rules: bool = False
    detection_seconds: float = 60.0
    #: "<#channel> <incoming-webhook URL>" per line; "<service> <integration key>" per line
    slack_webhooks_file: Path | None = None
    pagerduty_keys_file: Path | None = None
    pagerduty_events_url: str = "https://events.pagerduty.com/v2/enqueue"
    #: remediation policy (dry-run by default), links, approval secret, escalation routes
    remediation: RemediationSettings = field(default_factory=RemediationSettings)
    #: incident alerts: Alertmanager URLs, re-send interval, grouping, routing by severity/team
    alerting: AlertingSettings = field(default_factory=AlertingSettings)

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0 or self.max_decompressed_bytes < self.max_body_bytes:
            raise ConfigError("need 0 < max_body_bytes <= max_decompressed_bytes")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("tls_cert_file and tls_key_file go together")
        if self.kubernetes_in_cluster and self.kubernetes_kubeconfig is not None:
            raise ConfigError("kubernetes_in_cluster and kubernetes_kubeconfig exclude each other")
        problem = actuator_problem(self)
        if problem is not None:
            raise ConfigError(problem)


def parse_secrets(path: Path, what: str) -> dict[str, str]:
    """A secrets file: one ``<name> <secret>`` per line; ``# `` (a hash and a space) starts a
    comment, so Slack channel names such as ``#gpu-waste`` can begin a line.

    Errors name the file and line, never the secret.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line == "#" or line.startswith("# "):
            continue
        line = line.split(" # ", 1)[0].strip()
        parts = line.split()
        if len(parts) != 2:
            raise ConfigError(f"{path}:{lineno}: expected '<name> <{what}>'")
        out[parts[0]] = parts[1]
    return out


def parse_tokens(text: str, where: str) -> dict[str, str]:
    """Parse a tokens file: one ``<name> <token>`` per line, ``#`` starts a comment."""
    tokens: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[1]) < 16:
            raise ConfigError(f"{where}:{lineno}: expected '<name> <token of 16+ characters>'")
        name, token = parts
        if token in tokens:
            raise ConfigError(f"{where}:{lineno}: token reused (names must have their own)")
        tokens[token] = name
    return tokens


_KEYS = {
    "host": str,
    "port": int,
    "tokens_file": Path,
    "allow_unauthenticated": bool,
    "max_body_bytes": int,
    "max_decompressed_bytes": int,
    "tls_cert_file": Path,
    "tls_key_file": Path,
    "database": Path,
    "step_seconds": int,
    "recent_hours": int,
    "max_series": int,
    "accounting_period_seconds": int,
    "idle_threshold_ratio": float,
    "grid_intensity_grams_per_kwh": float,
    "slurm_cluster": str,
    "kubernetes_kubeconfig": Path,
    "kubernetes_context": str,
    "kubernetes_in_cluster": bool,
    "kubernetes_namespace": str,
    "kubernetes_actions": bool,
    "kubernetes_kueue": bool,
    **dict.fromkeys(ACTUATOR_KEYS, object),  # parsed by _setting (remediate/actuator_settings)
    "router_url": str,
    "router_token_file": Path,
    "job_poll_seconds": float,
    "max_inflight_requests": int,
    "model_servers": list,
    "scrape_seconds": float,
    "rules": tuple,
    "runbooks_dir": Path,
    "skip_bad_rules": bool,
    "detection_seconds": float,
    "remediation": dict,
    "alerting": dict,
    "slack_webhooks_file": Path,
    "pagerduty_keys_file": Path,
    "pagerduty_events_url": str,
}


_SCRAPE_KEYS = frozenset({"url", "server", "model", "node"})


def _model_servers(value: object, where: str) -> tuple[Mapping[str, str], ...]:
    """Validate the model-server list: mappings of strings with known keys and a url."""
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected a list of mappings")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ConfigError(f"{where}[{i}]: expected a mapping")
        unknown = set(item) - _SCRAPE_KEYS
        if unknown:
            raise ConfigError(f"{where}[{i}]: unknown key {sorted(unknown)[0]!r}")
        if "url" not in item:
            raise ConfigError(f"{where}[{i}]: url is required")
        out.append(MappingProxyType({str(k): str(v) for k, v in item.items()}))
    return tuple(out)


def _value(key: str, value: Any, where: str) -> Any:
    """One config value, checked against the type of its key."""
    kind = _KEYS.get(key)
    if kind is None:
        raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(_KEYS))})")
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}: expected true or false, got {value!r}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where}.{key}: expected an integer, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
    if kind is list:
        return _model_servers(value, f"{where}.{key}")
    if kind is dict:  # the remediation and alerting sections
        if not isinstance(value, dict):
            raise ConfigError(f"{where}.{key}: expected a mapping")
        if key == "alerting":
            try:
                return AlertingSettings.from_mapping(value, f"{where}: {key}")
            except AlertingSettingsError as exc:
                raise ConfigError(str(exc)) from None
        try:
            return RemediationSettings.from_mapping(value, f"{where}: {key}")
        except PolicyError as exc:
            raise ConfigError(str(exc)) from None
    if kind is tuple:  # a list of paths
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(item, str) for item in items):
            raise ConfigError(f"{where}.{key}: expected a path or a list of paths")
        return tuple(Path(item) for item in items)
    return kind(value)


def _setting(key: str, value: Any, where: str) -> Any:
    """One config value: the actuator keys parsed by their own module, the rest by ``_value``."""
    parse = ACTUATOR_KEYS.get(key)
    return parse(value, f"{where}.{key}") if parse is not None else _value(key, value, where)


def load_collector_config(
    path: Path | None, overrides: Mapping[str, Any] | None = None
) -> CollectorConfig:
    """Load the collector config file (YAML), with explicit CLI overrides on top."""
    where = str(path) if path is not None else "<defaults>"
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data = dict(loaded)
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    kwargs = {key: _setting(key, value, where) for key, value in data.items()}
    tokens_file = kwargs.pop("tokens_file", None)
    if tokens_file is not None:
        try:
            kwargs["tokens"] = MappingProxyType(
                parse_tokens(tokens_file.read_text(encoding="utf-8"), str(tokens_file))
            )
        except OSError as exc:
            raise ConfigError(f"{where}.tokens_file {tokens_file}: {exc.strerror}") from exc
    try:
        return CollectorConfig(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
