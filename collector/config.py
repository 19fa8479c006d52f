"""Collector configuration, parsed once into frozen objects (file, then CLI overrides, then
defaults), through the shared schema machinery (:mod:`gpuwarden.agent.schema`).

Errors are one line naming the file and the dotted key, with ``did you mean`` for a misspelt
key; secrets (the tokens, webhook secrets, keys) are read from files named here and are never
shown. The actuator keys are declared by
:class:`~gpuwarden.collector.remediate.actuators.settings.ActuatorSettings`, which this config
extends, and handed to the actuators as :attr:`CollectorConfig.actuators`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

import msgspec

from gpuwarden.agent.config import DEFAULT_TIMEOUT_SECONDS as AGENT_TIMEOUT_SECONDS
from gpuwarden.agent.schema import ONE_OR_MANY, ConfigError, convert, read_yaml, redacted_repr
from gpuwarden.collector.accounting.prices import PricesSection, PriceTable
from gpuwarden.collector.budgets.config import Budgets, BudgetsSection
from gpuwarden.collector.credentials import CredentialsError, TokenTable
from gpuwarden.collector.credentials import parse_tokens as parse_tokens_text
from gpuwarden.collector.fairness.settings import FairnessSettings
from gpuwarden.collector.ha.settings import HaSettings
from gpuwarden.collector.ingest.otlp_limits import IngestLimits
from gpuwarden.collector.notify.settings import AlertingSettings
from gpuwarden.collector.policy.admission import AdmissionSettings
from gpuwarden.collector.remediate.actuators.settings import ActuatorSettings, traffic_targets
from gpuwarden.collector.remediate.policy import RemediationSection, RemediationSettings
from gpuwarden.collector.remote_write.settings import RemoteWriteSettings
from gpuwarden.collector.storage.clusters import DEFAULT_CLUSTER, cluster_problem
from gpuwarden.collector.storage.urls import has_password, is_postgresql_url, redact_url

__all__ = [
    "CollectorConfig",
    "ConfigError",
    "ModelServer",
    "SignInSettings",
    "TlsSettings",
    "load_collector_config",
    "parse_secrets",
    "parse_tokens",
]

Positive = Annotated[float, msgspec.Meta(gt=0)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]


class ModelServer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A model server to scrape (checked further by ``ingest.scrape.ScrapeTarget``)."""

    url: str
    server: Literal["vllm", "triton", "tgi", "prometheus"] = "prometheus"  # ingest.scrape.Server
    model: str | None = None
    node: str | None = None


class TlsSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``tls:``: serve HTTPS from these PEM files (reloaded on SIGHUP), and optionally mTLS.

    ``cert_file`` (the chain, leaf first) and ``key_file`` go together; neither means plain
    HTTP. With ``client_ca_file`` a client certificate is verified against it when presented
    (its names reach the request, :func:`gpuwarden.collector.web.tls.client_names`); with
    ``require_client_cert`` a client without a valid one is refused at the handshake.
    """

    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None
    require_client_cert: bool = False

    def __post_init__(self) -> None:
        if self.cert_file is not None and self.key_file is None:
            raise ConfigError("key_file: required with cert_file (the certificate's private key)")
        if self.key_file is not None and self.cert_file is None:
            raise ConfigError("cert_file: required with key_file (the server certificate)")
        if self.require_client_cert and self.client_ca_file is None:
            raise ConfigError(
                "client_ca_file: required with require_client_cert: true "
                "(the CA that signs the agents' client certificates)"
            )
        if self.client_ca_file is not None and self.cert_file is None:
            raise ConfigError("cert_file: required with client_ca_file (mTLS needs HTTPS)")

    @property
    def enabled(self) -> bool:
        """Whether the collector serves HTTPS."""
        return self.cert_file is not None

    def files(self) -> dict[str, Path]:
        """The files named, by key: what the loader checks and the reload reads again."""
        named = {
            "cert_file": self.cert_file,
            "key_file": self.key_file,
            "client_ca_file": self.client_ca_file,
        }
        return {key: path for key, path in named.items() if path is not None}


#: The roles a person may hold on the web (``web.keys.Role`` without agent and alert-source).
PersonRole = Literal["reader", "operator", "admin"]
MIN_SESSION_KEY_BYTES = 32


class SignInSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``signin:`` section: how people reach the pages (status, incidents, runbooks,
    approvals): a session from ``/login`` with a reader/operator/admin token, or a trusted
    reverse proxy's identity headers.

    Attributes:
        session_key_file: the HMAC key that signs session cookies (32+ bytes). Without one a
            random key is made at start, so every session ends when the collector restarts.
        session_seconds: how long a sign-in lasts.
        trusted_proxies: addresses or CIDRs of reverse proxies (oauth2-proxy or similar) whose
            ``X-Auth-Request-Email`` / ``X-Forwarded-User`` headers name the person; the same
            headers from any other peer are ignored.
        proxy_roles: the role of a person named by the proxy (user or email as sent).
        proxy_default_role: the role of a proxy-named person not in ``proxy_roles``; ``null``
            lets only the listed people in.
    """

    session_key_file: Path | None = None
    session_seconds: Positive = 12 * 3600.0
    trusted_proxies: Annotated[tuple[str, ...], ONE_OR_MANY] = ()
    proxy_roles: Mapping[str, PersonRole] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    proxy_default_role: PersonRole | None = "reader"

    def __post_init__(self) -> None:
        """Every proxy entry is an address or a network."""
        for entry in self.trusted_proxies:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"trusted_proxies: {entry!r} is not an IP address or CIDR"
                ) from None

    def proxy_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """``trusted_proxies`` as networks (an address is a network of one)."""
        return tuple(ipaddress.ip_network(e, strict=False) for e in self.trusted_proxies)


class CollectorConfig(ActuatorSettings, frozen=True, forbid_unknown_fields=True):
    """What the collector listens on and whom it lets in, what it keeps, and what it does.

    ``tokens`` holds every bearer credential (role, subject, the token's SHA-256, bound nodes);
    the file writes ``tokens_file`` (lines ``<role> <subject> <token or sha256:hex>
    [nodes=a,b]``, see :mod:`~gpuwarden.collector.credentials`), read by
    :func:`load_collector_config`. With no tokens and ``allow_unauthenticated`` false, every
    request is refused: safe by default. ``allow_unauthenticated`` ("auth: none", for the demo
    and loopback) makes every caller an anonymous admin and so excludes a ``tokens_file``.
    ``auth_failure_limit`` failed authentications from one address within
    ``auth_failure_window_seconds`` make it answer 429 until the window ends (0: no limit);
    ``auth_failure_sources`` bounds how many addresses are remembered. The actuator keys
    (``slurm_cluster``, ``kubernetes_*``, ``router_*``, ``webhooks``) come from
    :class:`ActuatorSettings`.
    """

    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 4318
    tokens: TokenTable = msgspec.field(default_factory=TokenTable, name="tokens_file")
    allow_unauthenticated: bool = False
    #: 20 failures a minute is far above a misconfigured agent's (one every push interval)
    #: and far below anything that could guess a 256-bit token
    auth_failure_limit: Annotated[int, msgspec.Meta(ge=0)] = 20
    auth_failure_window_seconds: Positive = 60.0
    auth_failure_sources: PositiveInt = 10_000
    max_body_bytes: PositiveInt = 8 * 1024 * 1024
    max_decompressed_bytes: PositiveInt = 64 * 1024 * 1024
    #: HTTPS and mTLS (default: plain HTTP; put a TLS proxy in front, or set this)
    tls: TlsSettings = msgspec.field(default_factory=TlsSettings)
    #: this collector's cluster (or region): the rows it writes in a database that several
    #: collectors share carry it, its loops read only its rows, and every remote-written
    #: series has it as its ``cluster`` label (``storage.clusters``: letters, digits, . _ -)
    cluster: str = DEFAULT_CLUSTER
    #: the state: a SQLite file (the embedded default), or, written as a postgresql:// URL
    #: in the file's ``database`` key, a PostgreSQL server, held in ``database_url``
    database: Path = Path("/var/lib/gpuwarden/collector.db")
    database_url: str | None = None
    #: the PostgreSQL password, read from this file at start (else libpq's PGPASSWORD or
    #: ~/.pgpass); never in the URL, so never in a log line
    database_password_file: Path | None = None
    step_seconds: PositiveInt = 10
    recent_hours: PositiveInt = 6
    #: metrics that keep a long window (14 days of 1-minute means) besides the ones the loaded
    #: rules read at long resolution (``detect.catalog.LONG_READS``); every other series keeps
    #: only its recent window (``recent_hours``), which is what makes 10,000 GPUs fit in memory
    long_metrics: tuple[str, ...] = ()
    #: metrics that keep a recent window (``recent_hours`` at ``step_seconds``) besides the
    #: ones the loaded rules, the accounting, the status page and /metrics read over time
    #: (``detect.catalog.recent_metrics``); every other series keeps its latest value only
    #: (what /metrics shows). ``["*"]`` keeps every metric's recent window, as before
    recent_metrics: tuple[str, ...] = ()
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
    #: the WindowStore is written to ``snapshot_file`` this often and at shutdown, and read
    #: back at start, so a restart does not start blind (0: never; ``store.snapshot``)
    snapshot_seconds: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    #: default: ``<database>.window.npz`` next to the database (``<database>.<cluster>.window.npz``
    #: for a cluster other than ``default``; none for ``:memory:``)
    snapshot_file: Path | None = None
    idle_threshold_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.05
    grid_intensity_grams_per_kwh: Annotated[float, msgspec.Meta(ge=0)] = 400.0
    #: per cluster (``gpuwarden.cluster``) and per region (``cloud.region``) overrides of
    #: ``grid_intensity_grams_per_kwh`` (g CO2e/kWh; a cluster's first, then its region's)
    grid_intensity_clusters: Mapping[str, Annotated[float, msgspec.Meta(ge=0)]] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    grid_intensity_regions: Mapping[str, Annotated[float, msgspec.Meta(ge=0)]] = msgspec.field(
        default_factory=lambda: MappingProxyType({})
    )
    #: prices per GPU-hour by GPU model, tier and cluster (``accounting.prices``); written as
    #: a ``PricesSection``, held as the effective table (default: the built-in table)
    prices: PriceTable = msgspec.field(default_factory=PriceTable)
    #: monthly budgets per team and project (``budgets.config``); written as a
    #: ``BudgetsSection``, held with the prices' currency (default: none)
    budgets: Budgets = msgspec.field(default_factory=Budgets)
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
    #: an OTLP request that would wait longer than this before it is worked on (the event
    #: loop's lag, or its wait for a worker thread) is answered 503 + Retry-After. Half the
    #: agent's default timeout: an answer after the agent's timeout reaches nobody, and the
    #: lag is measured a timer period late (web.shed)
    max_queue_wait_seconds: Positive = AGENT_TIMEOUT_SECONDS / 2
    #: new series one token may create per hour (a bucket refilling continuously); the
    #: series a node already has are never refused by it
    max_new_series_per_source_hour: PositiveInt = 100_000
    #: series the whole collector creates per second, on average (a bucket of one second's
    #: worth): while it is spent, a request of a node with no series yet is answered 503 +
    #: Retry-After and kept in the agent's spool, so a fleet's first contact is spread instead
    #: of queued (10,000 GPUs: 43 s). Known nodes are never refused by it (ingest.creation_pace)
    max_new_series_per_second: PositiveInt = 10_000
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
    #: folder (or files) of policy YAML (docs/policies.md); default: none, so no policies
    policies_dir: Path | None = None
    #: admission webhook and Slurm hook: team/model labels, review size (docs/admission.md)
    admission: AdmissionSettings = msgspec.field(default_factory=AdmissionSettings)
    detection_seconds: Positive = 60.0
    #: "<#channel> <incoming-webhook URL>" per line; "<service> <integration key>" per line
    slack_webhooks_file: Path | None = None
    pagerduty_keys_file: Path | None = None
    pagerduty_events_url: str = "https://events.pagerduty.com/v2/enqueue"
    #: remediation policy (dry-run by default), links, approval secret, escalation routes
    remediation: RemediationSettings = msgspec.field(default_factory=RemediationSettings)
    #: incident alerts: Alertmanager URLs, re-send interval, grouping, routing by severity/team
    alerting: AlertingSettings = msgspec.field(default_factory=AlertingSettings)
    #: people on the web: session key and lifetime, trusted reverse proxies and their roles
    signin: SignInSettings = msgspec.field(default_factory=SignInSettings)
    #: history in a Prometheus-compatible TSDB by remote-write through a durable queue (off)
    remote_write: RemoteWriteSettings | None = None
    #: active/standby on a shared PostgreSQL (off: this process leads alone)
    ha: HaSettings = msgspec.field(default_factory=HaSettings)
    #: each team's entitled share of the GPUs, judged by the fairness rules and shown on
    #: /metrics and in ``report fairness`` (``fairness.settings``)
    fairness: FairnessSettings = msgspec.field(default_factory=FairnessSettings)

    def __post_init__(self) -> None:
        """The checks across keys, in one place (the actuators' in ``actuator_problem``)."""
        problem = cluster_problem(self.cluster)
        if problem is not None:
            raise ConfigError(f"cluster: {problem}")
        if self.max_body_bytes <= 0 or self.max_decompressed_bytes < self.max_body_bytes:
            raise ConfigError("need 0 < max_body_bytes <= max_decompressed_bytes")
        if self.database_url is not None:
            if not is_postgresql_url(self.database_url):
                raise ConfigError(f"database_url: not a postgresql:// URL: {self.database_url!r}")
            if has_password(self.database_url):
                raise ConfigError(
                    f"database: {redact_url(self.database_url)}: a password in the URL would be "
                    "shown wherever the setting is; put it in database_password_file or PGPASSWORD"
                )
        elif self.database_password_file is not None:
            raise ConfigError("database_password_file: only for a postgresql:// database")
        if self.ha.enabled and self.database_url is None:
            raise ConfigError(
                "ha.enabled: needs a postgresql:// database shared by the replicas; a SQLite "
                "file belongs to one process (without ha it simply leads)"
            )
        if self.tokens and self.allow_unauthenticated:
            raise ConfigError(
                "allow_unauthenticated makes every caller an anonymous admin, which a "
                "tokens_file cannot restrict: set one or the other"
            )
        super().__post_init__()

    def __repr__(self) -> str:
        return redacted_repr(self, "tokens")

    @property
    def database_location(self) -> str:
        """Where the state lives, for messages: the PostgreSQL URL or the SQLite file."""
        return self.database_url if self.database_url is not None else str(self.database)

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
    def snapshot_path(self) -> Path | None:
        """Where the WindowStore's snapshot lives (None: no snapshots)."""
        if self.snapshot_seconds <= 0:
            return None
        if self.snapshot_file is not None:
            return self.snapshot_file
        if str(self.database) == ":memory:":
            return None
        # Collectors of several clusters may share one SQLite file; each keeps its own window.
        cluster = "" if self.cluster == DEFAULT_CLUSTER else f".{self.cluster}"
        return self.database.with_name(f"{self.database.name}{cluster}.window.npz")

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


def parse_tokens(text: str, where: str) -> TokenTable:
    """Parse a tokens file (:func:`gpuwarden.collector.credentials.parse_tokens`).

    Raises:
        ConfigError: one line naming ``where`` and the line, never the token.
    """
    try:
        return parse_tokens_text(text, where)
    except CredentialsError as exc:
        raise ConfigError(str(exc)) from None


def _tokens(written: object, where: str, key: str) -> TokenTable:
    """``tokens_file``: the file's credentials."""
    path = convert(written, Path, where, section=key)
    try:
        return parse_tokens(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise ConfigError(f"{where}: {key} {path}: {exc.strerror}") from None


def _tls(written: object, where: str, key: str) -> TlsSettings:
    """``tls``: the section, with every file it names readable now rather than at the first
    handshake (whether they hold a usable certificate and key is checked at start)."""
    tls = convert(written, TlsSettings, where, section=key)
    for name, path in tls.files().items():
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise ConfigError(
                f"{where}: {key}.{name}: cannot read {path}: {exc.strerror} "
                "(name a readable PEM file)"
            ) from None
    return tls


def _password_file(written: object, where: str, key: str) -> Path:
    """``database_password_file``: a file readable now (its text is read at connect)."""
    path = convert(written, Path, where, section=key)
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{where}: {key}: cannot read {path}: {exc.strerror}") from None
    return path


def _signin(written: object, where: str, key: str) -> SignInSettings:
    """``signin``: the section, with its session key file checked now (fail at start)."""
    settings = convert(written, SignInSettings, where, section=key)
    path = settings.session_key_file
    if path is not None:
        try:
            size = len(path.read_bytes().strip())
        except OSError as exc:
            raise ConfigError(f"{where}: {key}.session_key_file {path}: {exc.strerror}") from None
        if size < MIN_SESSION_KEY_BYTES:
            raise ConfigError(
                f"{where}: {key}.session_key_file {path}: "
                f"needs {MIN_SESSION_KEY_BYTES}+ bytes (e.g. `head -c 48 /dev/urandom | base64`)"
            )
    return settings


def _remediation(written: object, where: str, key: str) -> RemediationSettings:
    """``remediation``: written with the policy's keys beside the links'."""
    return convert(written, RemediationSection, where, section=key).settings()


def _prices(written: object, where: str, key: str) -> PriceTable:
    """``prices``: the section as written, held as the effective table naming its file."""
    return convert(written, PricesSection, where, section=key).table(source=where)


def _budgets(written: object, where: str, key: str) -> BudgetsSection:
    """``budgets``: the section as written (held once the prices' currency is known)."""
    return convert(written, BudgetsSection, where, section=key)


#: Keys written in one form and held in another: key → its reader, (written, file, key) → held,
#: which checks what is written through the schema too. The held value then passes through.
_READERS: Mapping[str, Callable[[object, str, str], object]] = MappingProxyType(
    {
        "tokens_file": _tokens,
        "kubernetes_routes": traffic_targets,
        "remediation": _remediation,
        "signin": _signin,
        "prices": _prices,
        "tls": _tls,
        "database_password_file": _password_file,
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
    written = data.get("database")
    if isinstance(written, str) and is_postgresql_url(written):
        data["database_url"] = data.pop("database")  # `database: postgresql://...`
    for key, read in _READERS.items():
        if key in data:
            data[key] = read(data[key], where, key)
    budgets = data.pop("budgets", None)
    config = convert(data, CollectorConfig, where)
    if budgets is None:
        return config
    section = _budgets(budgets, where, "budgets")
    return msgspec.structs.replace(config, budgets=section.budgets(config.prices.currency))
