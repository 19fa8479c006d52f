"""Collector configuration, parsed once into frozen objects (file, then CLI overrides, then
defaults), through the shared schema machinery (:mod:`gpuwarden.agent.schema`).

Errors are one line naming the file and the dotted key, with ``did you mean`` for a misspelt
key; secrets (the tokens, webhook secrets, keys) are read from files named here and are never
shown. The actuator keys are declared by
:class:`~gpuwarden.collector.remediate.actuators.settings.ActuatorSettings`, which this config
extends, and handed to the actuators as :attr:`CollectorConfig.actuators`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

import msgspec

from gpuwarden.agent.schema import ONE_OR_MANY, ConfigError, convert, read_yaml, redacted_repr
from gpuwarden.collector.accounting.prices import PricesSection, PriceTable
from gpuwarden.collector.ingest.otlp_limits import IngestLimits
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.remediate.actuators.settings import ActuatorSettings, traffic_targets
from gpuwarden.collector.remediate.policy import RemediationSection, RemediationSettings

__all__ = [
    "CollectorConfig",
    "ConfigError",
    "ModelServer",
    "load_collector_config",
    "parse_secrets",
    "parse_tokens",
]

Positive = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]


class ModelServer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A model server to scrape (checked further by ``ingest.scrape.ScrapeTarget``)."""

    url: str
    server: Literal["vllm", "triton", "prometheus"] = "prometheus"  # ingest.scrape.Server
    model: str | None = None
    node: str | None = None


class CollectorConfig(ActuatorSettings, frozen=True, forbid_unknown_fields=True):
    """What the collector listens on and whom it lets in, what it keeps, and what it does.

    ``tokens`` maps a bearer token to the agent (or API caller) name it authenticates; the file
    writes ``tokens_file`` (lines ``<name> <token>``), read by :func:`load_collector_config`.
    With no tokens and ``allow_unauthenticated`` false, every request is refused: safe by
    default. The actuator keys (``slurm_cluster``, ``kubernetes_*``, ``router_*``,
    ``webhooks``) come from :class:`ActuatorSettings`.
    """

    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 4318
    tokens: Mapping[str, str] = msgspec.field(
        default_factory=lambda: MappingProxyType({}), name="tokens_file"
    )
    allow_unauthenticated: bool = False
    max_body_bytes: PositiveInt = 8 * 1024 * 1024
    max_decompressed_bytes: PositiveInt = 64 * 1024 * 1024
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    database: Path = Path("/var/lib/gpuwarden/collector.db")
    step_seconds: PositiveInt = 10
    recent_hours: PositiveInt = 6
    max_series: PositiveInt = 1_000_000
    #: a series (and a GPU, a node) without a point for this long is stale: left out of
    #: /metrics, shown silent on /status, unknown to detectors, and a node-silent incident
    #: opens if jobs run on the node. 60 s is six of the agent's default 10 s rounds
    #: (agent ``interval_seconds``): a node rides out two failed pushes (each up to the
    #: agent's 10 s send timeout, the round then waits in its spool for the next one) and a
    #: slot of rounding without flapping, and a stopped agent is noticed within one 60 s
    #: detection cycle. Agents running a longer interval need at least 3x their interval.
    staleness_seconds: Positive = 60.0
    accounting_period_seconds: PositiveInt = 60
    idle_threshold_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.05
    grid_intensity_grams_per_kwh: Annotated[float, msgspec.Meta(ge=0)] = 400.0
    #: prices per GPU-hour by GPU model, tier and cluster (``accounting.prices``); written as
    #: a ``PricesSection``, held as the effective table (default: the built-in table)
    prices: PriceTable = msgspec.field(default_factory=PriceTable)
    #: the Kubernetes job source's namespace (default: all); its client is kubernetes_*
    kubernetes_namespace: str | None = None
    job_poll_seconds: Positive = 30.0
    max_inflight_requests: int = 64
    # --- hostile load (docs/limits.md): each limit answers with a 4xx or a counted rejection
    #: a connection must send a complete request head within this time of connecting or of
    #: its previous answer, or it is closed (half-sent headers; idle keep-alive connections)
    header_timeout_seconds: Positive = 15.0
    #: a request body must arrive whole within this time of its head (408 otherwise)
    body_timeout_seconds: Positive = 30.0
    #: requests of one token processed at once (503 + Retry-After beyond), within
    #: max_inflight_requests: one caller cannot take every slot
    max_inflight_per_token: PositiveInt = 16
    #: new series one token may create per hour (a bucket refilling continuously); the
    #: series a node already has are never refused by it
    max_new_series_per_source_hour: PositiveInt = 100_000
    #: data points of one request (413 beyond); attributes per point and per resource;
    #: label key and value sizes and metric-name size in UTF-8 bytes (points over them are
    #: rejected and counted in the OTLP partial success, the rest is stored)
    max_points_per_request: PositiveInt = 200_000
    max_attributes: PositiveInt = 64
    max_label_key_bytes: PositiveInt = 128
    max_label_value_bytes: PositiveInt = 1024
    max_metric_name_bytes: PositiveInt = 256
    model_servers: tuple[ModelServer, ...] = ()
    scrape_seconds: Positive = 15.0
    #: rule files or folders (default: the packaged rules/); runbooks checked against runbooks_dir
    rules: Annotated[tuple[Path, ...], ONE_OR_MANY] = ()
    runbooks_dir: Path | None = None
    skip_bad_rules: bool = False
    detection_seconds: Positive = 60.0
    #: "<#channel> <incoming-webhook URL>" per line; "<service> <integration key>" per line
    slack_webhooks_file: Path | None = None
    pagerduty_keys_file: Path | None = None
    pagerduty_events_url: str = "https://events.pagerduty.com/v2/enqueue"
    #: remediation policy (dry-run by default), links, approval secret, escalation routes
    remediation: RemediationSettings = msgspec.field(default_factory=RemediationSettings)
    #: incident alerts: Alertmanager URLs, re-send interval, grouping, routing by severity/team
    alerting: AlertingSettings = msgspec.field(default_factory=AlertingSettings)

    def __post_init__(self) -> None:
        """The checks across keys, in one place (the actuators' in ``actuator_problem``)."""
        if self.max_body_bytes <= 0 or self.max_decompressed_bytes < self.max_body_bytes:
            raise ConfigError("need 0 < max_body_bytes <= max_decompressed_bytes")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("tls_cert_file and tls_key_file go together")
        super().__post_init__()

    def __repr__(self) -> str:
        return redacted_repr(self, "tokens")

    @property
    def ingest_limits(self) -> IngestLimits:
        """The per-request limits the OTLP decoders apply (``ingest.otlp_limits``)."""
        return IngestLimits(
            max_attributes=self.max_attributes,
            max_label_key_bytes=self.max_label_key_bytes,
            max_label_value_bytes=self.max_label_value_bytes,
            max_metric_name_bytes=self.max_metric_name_bytes,
            max_points_per_request=self.max_points_per_request,
        )

    @property
    def actuators(self) -> ActuatorSettings:
        """The actuator keys alone: what ``remediate.actuators.build`` takes."""
        fields = ActuatorSettings.__struct_fields__
        return ActuatorSettings(**{name: getattr(self, name) for name in fields})


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


def _tokens(written: object, where: str, key: str) -> dict[str, str]:
    """``tokens_file``: the file's tokens (token → name)."""
    path = convert(written, Path, where, section=key)
    try:
        return parse_tokens(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise ConfigError(f"{where}: {key} {path}: {exc.strerror}") from None


def _remediation(written: object, where: str, key: str) -> RemediationSettings:
    """``remediation``: written with the policy's keys beside the links'."""
    return convert(written, RemediationSection, where, section=key).settings()


def _prices(written: object, where: str, key: str) -> PriceTable:
    """``prices``: the section as written, held as the effective table naming its file."""
    return convert(written, PricesSection, where, section=key).table(source=where)


#: Keys written in one form and held in another: key → its reader, (written, file, key) → held,
#: which checks what is written through the schema too. The held value then passes through.
_READERS: Mapping[str, Callable[[object, str, str], object]] = MappingProxyType(
    {
        "tokens_file": _tokens,
        "kubernetes_routes": traffic_targets,
        "remediation": _remediation,
        "prices": _prices,
    }
)


def load_collector_config(
    path: Path | None, overrides: Mapping[str, Any] | None = None
) -> CollectorConfig:
    """Load the collector config file (YAML), with explicit CLI overrides on top.

    Raises:
        ConfigError: one line, ``<file>: <dotted.key>: <what is wrong>``.
    """
    where = str(path) if path is not None else "<defaults>"
    data = read_yaml(path) if path is not None else {}
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    for key, read in _READERS.items():
        if key in data:
            data[key] = read(data[key], where, key)
    return convert(data, CollectorConfig, where)
