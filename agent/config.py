"""Agent configuration: parsed once at the edge into frozen objects.

Order of precedence: the YAML file, then the environment variables listed in :data:`ENV`, then
defaults. Unknown keys are rejected with a message naming the file and the key. Nothing below the
CLI reads ``os.environ``: the CLI passes the environment in.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import yaml

#: Every environment variable the agent reads, and the config key it overrides.
ENV: Mapping[str, str] = MappingProxyType(
    {
        "GPUWARDEN_NODE_NAME": "node_name",
        "GPUWARDEN_COLLECTOR_ENDPOINT": "collector.endpoint",
        "GPUWARDEN_AGENT_TOKEN": "collector.token",
        "GPUWARDEN_NVML_LIBRARY": "nvml_library_path",
        "GPUWARDEN_SPOOL_DIR": "spool.directory",
    }
)

SOURCES = ("nvml", "simulated", "replay")
PRICE_TIERS = ("on-demand", "spot", "reserved")


class ConfigError(ValueError):
    """A configuration problem, with the file and key it came from."""


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    """Where and how the agent pushes OTLP."""

    endpoint: str | None = "http://127.0.0.1:4318/v1/metrics"
    token: str | None = field(default=None, repr=False)
    token_file: Path | None = None
    timeout_seconds: float = 10.0
    gzip_level: int = 6
    ca_file: Path | None = None


@dataclass(frozen=True, slots=True)
class SpoolConfig:
    """The on-disk spool that keeps unsent requests across outages and restarts."""

    directory: Path = Path("/var/lib/gpuwarden/spool")
    max_bytes: int = 256 * 1024 * 1024
    fsync: bool = True


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """The agent's own HTTP endpoint: ``/healthz`` and, if enabled, Prometheus ``/metrics``."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9402
    prometheus: bool = True


@dataclass(frozen=True, slots=True)
class ResourceConfig:
    """Facts about the node that travel as OTLP resource attributes."""

    cluster: str | None = None
    instance_type: str | None = None
    price_tier: str = "on-demand"
    region: str | None = None


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything the node agent needs to run."""

    node_name: str = field(default_factory=socket.gethostname)
    interval_seconds: float = 10.0
    source: str = "nvml"
    nvml_library_path: Path | None = None
    scenario: str = "mixed"
    replay_path: Path | None = None
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    spool: SpoolConfig = field(default_factory=SpoolConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    resource: ResourceConfig = field(default_factory=ResourceConfig)

    def __post_init__(self) -> None:
        if not 0.05 <= self.interval_seconds <= 3600:
            raise ConfigError(
                f"interval_seconds must be in [0.05, 3600], got {self.interval_seconds}"
            )
        if self.source not in SOURCES:
            raise ConfigError(f"source must be one of {', '.join(SOURCES)}, got {self.source!r}")
        if self.source == "replay" and self.replay_path is None:
            raise ConfigError("source 'replay' needs replay_path")
        if self.resource.price_tier not in PRICE_TIERS:
            raise ConfigError(
                f"resource.price_tier must be one of {', '.join(PRICE_TIERS)}, "
                f"got {self.resource.price_tier!r}"
            )
        if self.spool.max_bytes < 64 * 1024:
            # one 8-GPU round is ~60 kB of protobuf: a smaller spool cannot hold a single round
            raise ConfigError("spool.max_bytes must be at least 65536")

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


T = TypeVar("T")


def _coerce(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and wrong types."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")
        default = getattr(cls(), key)
        nested = type(default)
        if hasattr(default, "__dataclass_fields__"):
            kwargs[key] = _coerce(nested, value, f"{where}.{key}")
        elif value is None:
            kwargs[key] = None
        elif isinstance(default, Path) or key.endswith(("_path", "_file", "directory", "_root")):
            kwargs[key] = Path(str(value))
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}.{key}: expected true or false, got {value!r}")
            kwargs[key] = value
        elif isinstance(default, int | float) and not isinstance(default, bool):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
            kwargs[key] = nested(value)
        else:
            kwargs[key] = str(value)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    head, _, rest = dotted.partition(".")
    if rest:
        _set_dotted(data.setdefault(head, {}), rest, value)
    else:
        data[head] = value


def load_agent_config(
    path: Path | None, env: Mapping[str, str], overrides: Mapping[str, Any] | None = None
) -> AgentConfig:
    """Load the agent config from ``path`` (optional), ``env`` and explicit CLI ``overrides``."""
    where = str(path) if path is not None else "<defaults>"
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is not None:
            if not isinstance(loaded, dict):
                raise ConfigError(f"{path}: expected a mapping at the top level")
            data = loaded
    for var, dotted in ENV.items():
        if env.get(var):
            _set_dotted(data, dotted, env[var])
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, dotted, value)
    return _coerce(AgentConfig, data, where)
