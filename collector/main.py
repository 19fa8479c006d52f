"""``gpuwarden collector``: load the config, fail fast on bad settings, serve until stopped."""

from __future__ import annotations

import errno
import logging
import ssl
import sys
from pathlib import Path

from aiohttp import web

from gpuwarden.agent.config import ConfigError
from gpuwarden.collector.app import create_app
from gpuwarden.collector.build import build_service, load_configured_rules
from gpuwarden.collector.config import load_collector_config
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.rules import RuleError
from gpuwarden.collector.storage import StorageError

log = logging.getLogger(__name__)


def run_collector(config_path: Path | None, *, host: str | None, port: int | None) -> int:
    """Run the collector in the foreground; return the exit code."""
    try:
        config = load_collector_config(config_path, {"host": host, "port": port})
    except ConfigError as exc:
        print(f"gpuwarden collector: configuration error: {exc}", file=sys.stderr)
        return 2
    if not config.tokens and not config.allow_unauthenticated:
        print(
            "gpuwarden collector: no agent tokens configured; set tokens_file in the config "
            "(lines '<agent-name> <token>'), or allow_unauthenticated: true for a lab setup",
            file=sys.stderr,
        )
        return 2
    ssl_context = None
    if config.tls_cert_file is not None and config.tls_key_file is not None:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(str(config.tls_cert_file), str(config.tls_key_file))
    try:
        rules = load_configured_rules(config)
    except RuleError as exc:
        print(
            f"gpuwarden collector: bad rules, not starting: {exc} "
            "(fix the file, or set skip_bad_rules: true to start without the bad rules)",
            file=sys.stderr,
        )
        return 2
    for problem in rules.problems:
        log.error("rule skipped: %s", problem)
    try:
        service = build_service(config)
    except (OSError, StorageError) as exc:
        print(
            f"gpuwarden collector: cannot open the database {config.database}: {exc}",
            file=sys.stderr,
        )
        return 1
    try:
        web.run_app(
            create_app(
                config,
                service=service,
                detection=DetectionEngine(service, rules),
                rule_problems=[str(p) for p in rules.problems],
            ),
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
    finally:
        service.storage.close()
    return 0
