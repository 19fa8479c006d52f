"""Agent configuration: parsed once at the edge into frozen objects.

Order of precedence: the YAML file, then the environment variables listed in :data:`ENV`, then
defaults. Unknown keys are rejected with a message naming the file and the key. Nothing below the
CLI reads ``os.environ``: the CLI passes the environment in.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, get_args

import msgspec

from gpuwarden.agent.schema import (
    ONE_OR_MANY,
    ConfigError,
    check_value,
    convert,
    read_yaml,
    redacted_repr,
)

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "ENV",
    "AgentConfig",
    "CollectorConfig",
    "ConfigError",
    "HttpConfig",
    "ResourceConfig",
    "SpoolConfig",
    "load_agent_config",
]

#: Every environment variable the agent reads, and the config key it overrides.
ENV: Mapping[str, str] = MappingProxyType(
    {
        "GPUWARDEN_NODE_NAME": "node_name",
        "GPUWARDEN_COLLECTOR_ENDPOINT": "collector.endpoint",
        "GPUWARDEN_COLLECTOR_ENDPOINTS": "collector.endpoints",
        "GPUWARDEN_AGENT_TOKEN": "collector.token",
        "GPUWARDEN_NVML_LIBRARY": "nvml_library_path",
        "GPUWARDEN_SPOOL_DIR": "spool.directory",
    }
)

#: Variables holding a list: comma-separated (``http://a:4318/v1/metrics,http://b:4318/...``).
LIST_ENV = frozenset({"GPUWARDEN_COLLECTOR_ENDPOINTS"})
DEFAULT_ENDPOINT = "http://127.0.0.1:4318/v1/metrics"
#: How long the agent waits for the collector's answer to one push (``collector.timeout_seconds``);
#: the collector sheds requests that would wait longer than half of it (``max_queue_wait_seconds``).
DEFAULT_TIMEOUT_SECONDS = 10.0

Source = Literal["nvml", "simulated", "replay"]
PriceTier = Literal["on-demand", "spot", "reserved"]
SOURCES: tuple[str, ...] = get_args(Source)
PRICE_TIERS: tuple[str, ...] = get_args(PriceTier)

#: An OTLP/HTTP endpoint: a scheme is required (``host:4318`` alone would be read as a scheme).
Endpoint = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^https?://[^\s/@]+(/\S*)?$",
        description="an http:// or https:// URL such as http://collector:4318/v1/metrics",
    ),
]


class CollectorConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where and how the agent pushes OTLP.

    ``endpoints`` lists several collectors (active/standby, ``docs/operations.md``): the agent
    sends to one at a time, stays on the one that works and moves to the next on a connection
    error, a timeout or a 5xx. Without it, ``endpoint`` is the one collector; ``endpoint`` set
    to something else beside ``endpoints`` is refused as ambiguous.

    An ``https://`` endpoint is always verified: against ``ca_file`` (PEM) when set, else the
    system trust store. ``cert_file`` and ``key_file`` (PEM, unencrypted key) are the agent's
    client certificate for a collector that asks for one (mTLS).
    """

    endpoint: Endpoint | None = DEFAULT_ENDPOINT
    endpoints: Annotated[tuple[Endpoint, ...], ONE_OR_MANY] = ()
    token: str | None = None
    token_file: Path | None = None
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = DEFAULT_TIMEOUT_SECONDS
    gzip_level: int = 6
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if self.cert_file is not None and self.key_file is None:
            raise ConfigError("key_file: required with cert_file (the client certificate's key)")
        if self.key_file is not None and self.cert_file is None:
            raise ConfigError("cert_file: required with key_file (the client certificate)")
        if self.endpoints and self.endpoint not in (None, DEFAULT_ENDPOINT, *self.endpoints):
            raise ConfigError(
                "endpoint: set either endpoint (one collector) or endpoints (a list), not both"
            )
        if self.urls and not any(url.startswith("https://") for url in self.urls):
            for key in ("ca_file", "cert_file"):
                if getattr(self, key) is not None:
                    raise ConfigError(
                        f"{key}: set, but the endpoint is not https://; "
                        "use an https:// endpoint or remove it"
                    )

    def __repr__(self) -> str:
        return redacted_repr(self, "token")

    @property
    def urls(self) -> tuple[str, ...]:
        """Where to push, in order of preference (empty: push disabled)."""
        if self.endpoints:
            return self.endpoints
        return (self.endpoint,) if self.endpoint else ()


class SpoolConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The on-disk spool that keeps unsent requests across outages and restarts."""

    directory: Path = Path("/var/lib/gpuwarden/spool")
    #: one 8-GPU round is ~60 kB of protobuf: a smaller spool cannot hold a single round
    max_bytes: Annotated[int, msgspec.Meta(ge=64 * 1024)] = 256 * 1024 * 1024
    fsync: bool = True


class HttpConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The agent's own HTTP endpoint: ``/healthz`` and, if enabled, Prometheus ``/metrics``."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 9402
    prometheus: bool = True


class ResourceConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Facts about the node that travel as OTLP resource attributes."""

    cluster: str | None = None
    instance_type: str | None = None
    price_tier: PriceTier = "on-demand"
    region: str | None = None


class AgentConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything the node agent needs to run."""

    node_name: str = msgspec.field(default_factory=socket.gethostname)
    interval_seconds: Annotated[float, msgspec.Meta(ge=0.05, le=3600)] = 10.0
    source: Source = "nvml"
    nvml_library_path: Path | None = None
    scenario: str = "mixed"
    replay_path: Path | None = None
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    collector: CollectorConfig = msgspec.field(default_factory=CollectorConfig)
    spool: SpoolConfig = msgspec.field(default_factory=SpoolConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    resource: ResourceConfig = msgspec.field(default_factory=ResourceConfig)

    def __post_init__(self) -> None:
        if self.source == "replay" and self.replay_path is None:
            raise ConfigError("source 'replay' needs replay_path")

    def token(self) -> str | None:
        """The bearer token, from ``collector.token`` or the file ``collector.token_file``."""
        if self.collector.token:
            return self.collector.token
        if self.collector.token_file is not None:
            try:
                return self.collector.token_file.read_text(encoding="utf-8").strip() or None
            except OSError as exc:
                raise ConfigError(
                    f"collector.token_file {self.collector.token_file}: {exc.strerror}"
                ) from exc
        return None


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    head, _, rest = dotted.partition(".")
    if rest:
        section = data.get(head)
        if section is None:
            section = data[head] = {}
        if isinstance(section, dict):  # else a wrong type, which the schema reports
            _set_dotted(section, rest, value)
    else:
        data[head] = value


def load_agent_config(
    path: Path | None,
    env: Mapping[str, str],
    overrides: Mapping[str, Any] | None = None,
    *,
    flags: Mapping[str, str] | None = None,
) -> AgentConfig:
    """Load the agent config from ``path`` (optional), ``env`` and explicit CLI ``overrides``.

    Args:
        path: the YAML file, if any.
        env: the environment; the variables of :data:`ENV` override the file.
        overrides: dotted config key → value given on the command line (``None``: not given).
        flags: dotted config key → the CLI flag that set it, so that an error names the flag.

    Raises:
        ConfigError: one line naming the file, variable or flag, and the key.
    """
    where = str(path) if path is not None else "<defaults>"
    data = read_yaml(path) if path is not None else {}
    given: list[tuple[str, str, Any]] = [
        (var, dotted, env[var].split(",") if var in LIST_ENV else env[var])
        for var, dotted in ENV.items()
        if env.get(var)
    ]
    given += [
        ((flags or {}).get(dotted, dotted), dotted, value)
        for dotted, value in (overrides or {}).items()
        if value is not None
    ]
    for origin, dotted, value in given:
        check_value(value, AgentConfig, dotted, origin)
        _set_dotted(data, dotted, value)
    return convert(data, AgentConfig, where)
