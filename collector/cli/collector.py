"""``gpuwarden collector``: load the config, fail fast on bad settings, serve until stopped."""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import ssl
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from aiohttp import web

from gpuwarden.agent.config import ConfigError
from gpuwarden.collector.build import (
    build_actuators,
    build_http_client,
    build_notifiers,
    build_remediation,
    build_service,
    load_configured_rules,
    open_storage,
)
from gpuwarden.collector.config import CollectorConfig, load_collector_config
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.extras import MissingExtraError
from gpuwarden.collector.ingest.prom_map_columns import PromTranslator
from gpuwarden.collector.remediate.policy import PolicyError
from gpuwarden.collector.rules.model import RuleError
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.base import StorageError
from gpuwarden.collector.storage.sql_lease import LeaseRecords
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.auth import exposure_warning
from gpuwarden.collector.web.keys import RELOADER
from gpuwarden.collector.web.reload import reload_on_sighup
from gpuwarden.collector.web.tls import server_context

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _StartupRefusedError(Exception):
    """Start-up stops here: ``message`` for the operator, ``code`` for the shell."""

    code: int
    message: str


def _config(config_path: Path | None, host: str | None, port: int | None) -> CollectorConfig:
    try:
        config = load_collector_config(config_path, {"host": host, "port": port})
    except ConfigError as exc:
        raise _StartupRefusedError(2, f"configuration error: {exc}") from None
    if not config.tokens and not config.allow_unauthenticated:
        raise _StartupRefusedError(
            2,
            "no tokens configured; set tokens_file in the config (lines '<role> <subject> "
            "<token or sha256:hex> [nodes=a,b]', made by 'gpuwarden collector token'), or "
            "allow_unauthenticated: true for a loopback lab setup",
        )
    if (warning := exposure_warning(config)) is not None:
        log.warning("%s", warning)
    return config


def _ssl_context(config: CollectorConfig) -> ssl.SSLContext | None:
    """The HTTPS context when ``tls`` is set (a pair that does not load stops the start)."""
    if not config.tls.enabled:
        if not _is_loopback(config.host):
            log.warning(
                "serving plain HTTP on %s: tokens cross the network in clear; set tls "
                "(cert_file, key_file) or put a TLS-terminating proxy in front",
                config.host,
            )
        return None
    try:
        return server_context(config.tls)
    except ConfigError as exc:
        raise _StartupRefusedError(2, f"configuration error: {exc}") from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _missing_extra(exc: MissingExtraError, config_path: Path | None) -> _StartupRefusedError:
    """One line naming where the setting came from and the extra to install."""
    where = "environment" if exc.environment else str(config_path or "<defaults>")
    return _StartupRefusedError(2, f"{where}: {exc}")


def _app(
    config: CollectorConfig,
    environ: Mapping[str, str],
    config_path: Path | None,
    *,
    reload_source: Callable[[], CollectorConfig],
    ssl_context: ssl.SSLContext | None,
) -> web.Application:
    """Rules, core and remediation; raises ``_StartupRefusedError`` with the reason."""
    try:
        rules = load_configured_rules(config)
    except RuleError as exc:
        raise _StartupRefusedError(
            2,
            f"bad rules, not starting: {exc} "
            "(fix the file, or set skip_bad_rules: true to start without the bad rules)",
        ) from None
    for problem in rules.problems:
        log.error("rule skipped: %s", problem)
    http = build_http_client(environ)  # one pooled client for every outgoing HTTP call
    try:
        service = build_service(config, http=http, rules=rules)
    except MissingExtraError as exc:
        raise _missing_extra(exc, config_path) from None
    except ConfigError as exc:  # a job source's client settings that do not load
        raise _StartupRefusedError(2, f"configuration error: {exc}") from None
    except (OSError, StorageError) as exc:
        message = f"cannot open the database {config.database_location}: {exc}"
        raise _StartupRefusedError(1, message) from None
    try:
        remediation = build_remediation(
            config,
            service,
            rules,
            actuators=build_actuators(config, environ, jobs=service.registry.get, http=http),
            notifiers=build_notifiers(config, environ, http=http),
            environ=environ,
        )
    except MissingExtraError as exc:
        service.storage.close()
        raise _missing_extra(exc, config_path) from None
    except (PolicyError, ValueError, ConfigError) as exc:
        service.storage.close()
        raise _StartupRefusedError(2, f"remediation: {exc}") from None
    lease_store = _lease_store(config, service)
    service.fork_accounting()  # minutes of Python over every GPU, off the GIL ingest needs
    app = create_app(
        config,
        service=service,
        # each cycle in a forked child: detection never takes ingest's core (detect.fork)
        detection=DetectionEngine(
            service.detection_view, rules, storage=service.storage, fork=True
        ),
        remediation=remediation,
        rule_problems=[str(p) for p in rules.problems],
        reload_source=reload_source,
        tls_context=ssl_context,
        rules=rules,
        prom_translate=PromTranslator(),  # the dcgm-exporter and model-server table
        lease_store=lease_store,
    )

    async def close_storage(_app: web.Application) -> None:
        service.storage.close()
        if lease_store is not None:
            lease_store.close()
        http.close()

    app.on_cleanup.append(close_storage)
    return app


def _lease_store(config: CollectorConfig, service: CollectorService) -> LeaseRecords | None:
    """With ``ha``: a connection of the election's own, so that renewing the lease never waits
    behind the service's transactions (``collector.ha.leadership``)."""
    if not config.ha.enabled:
        return None
    try:
        store = open_storage(config)
    except StorageError as exc:
        service.storage.close()
        raise _StartupRefusedError(1, f"ha: cannot open the lease connection: {exc}") from None
    if not isinstance(store, LeaseRecords):  # pragma: no cover - ha needs PostgreSQL (config)
        store.close()
        service.storage.close()
        raise _StartupRefusedError(2, "ha: the database has no leader lease")
    return store


def run_collector(
    config_path: Path | None,
    *,
    host: str | None,
    port: int | None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run the collector in the foreground; return the exit code.

    SIGINT or SIGTERM stops it: the loops finish a running step (up to
    ``tasks.STOP_TIMEOUT_SECONDS``, then it is abandoned), remote-write flushes and the snapshot
    is written (up to ``tasks.FINAL_SAVE_SECONDS``), then the database closes and the process
    leaves with exit code 0 at once (:func:`_exit_now`). SIGHUP reads the configuration file
    again and swaps in its tokens and rules, and with ``tls`` (HTTPS) reloads the certificate
    and key, like ``POST /v1/admin/reload``. A busy port is one line and exit
    code 1, a configuration it refuses (a certificate that does not load too) exit code 2.
    """
    environ = os.environ if environ is None else environ
    try:
        config = _config(config_path, host, port)
        ssl_context = _ssl_context(config)
        app = _app(
            config,
            environ,
            config_path,
            reload_source=lambda: load_collector_config(config_path, {"host": host, "port": port}),
            ssl_context=ssl_context,
        )
    except _StartupRefusedError as refused:
        print(f"gpuwarden collector: {refused.message}", file=sys.stderr)
        return refused.code
    reload_on_sighup(app, app[RELOADER])  # the one SIGHUP handler: tokens, rules, certificate
    try:
        web.run_app(
            app,
            host=config.host,
            port=config.port,
            ssl_context=ssl_context,
            print=lambda line: log.info("%s", line),
        )
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            print(
                f"gpuwarden collector: {config.host}:{config.port} is in use; choose another "
                "port with --port or stop the other process",
                file=sys.stderr,
            )
            return 1
        raise
    return _exit_now(0)


def _exit_now(code: int) -> NoReturn:
    """Leave the process at once after an orderly stop.

    By then the app has answered its requests, stopped its loops, flushed remote-write, written
    the snapshot and closed the database. What the interpreter's own teardown would add is
    freeing a large store object by object while an abandoned detection cycle's daemon thread
    competes for the GIL: 4.4 s at 1,000 GPUs (``bench/capacity.py``), enough to take SIGTERM
    past its 10 s. The logs and the standard streams are flushed first; no exit handler has
    work left.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
