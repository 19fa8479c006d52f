"""Reloading a running collector: the tokens, the rules and the TLS certificate, in one step
shared by ``POST /v1/admin/reload`` and SIGHUP.

The configuration file is read again (through the ``source`` the collector was started with)
and two of its parts are swapped in, each on its own:

* **tokens**: the ``tokens_file`` it names. The table in force lives in a small holder
  (:class:`LiveTokens`) that the authentication middleware reads per request, so the swap is one
  assignment: the next request is checked against the new table. A file that does not load, or
  one that names no token (it would lock everyone out), keeps the old table.
* **rules**: the rule files it names, loaded and checked like at start, then handed to the
  detection engine, the remediator (which checks the action kinds first: a bad one keeps the
  old rules everywhere), the alert dispatcher, the Alertmanager receiver and the runbook pages.
  Rules that do not load keep the old ones, one log line per problem; under
  ``skip_bad_rules`` the good ones are swapped in and the bad ones listed, as at start.
* **tls**: the certificate and key are loaded again into the serving context (see
  :func:`~.tls.reload_certificate`); a pair that does not load keeps the old one.

Other settings (ports, storage, notifiers...) need a restart. Every reload is audited with its
actor (the admin's name, or ``SIGHUP``), and answers what was reloaded and what was kept.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gpuwarden.collector.config import CollectorConfig, ConfigError, TlsSettings
from gpuwarden.collector.credentials import CredentialsError, TokenTable
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.ingest.alertmanager import AlertReceiver
from gpuwarden.collector.remediate.policy import PolicyError
from gpuwarden.collector.rules.model import RuleError, RuleSet
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import AuditEntry
from gpuwarden.collector.web.remediation_setup import Remediation
from gpuwarden.collector.web.tls import reload_certificate

log = logging.getLogger(__name__)

SIGHUP_ACTOR = "SIGHUP"


@dataclass
class LiveTokens:
    """The bearer tokens in force: the configuration's at start, swapped whole by a reload."""

    table: TokenTable


@dataclass(frozen=True, slots=True)
class ReloadReport:
    """What one reload did: the parts swapped in, and the parts kept with the reasons."""

    reloaded: tuple[str, ...] = ()
    kept: dict[str, list[str]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        """The API's answer."""
        return {"reloaded": list(self.reloaded), "kept": self.kept, **self.counts}


class Reloader:
    """Reloads what the collector can change while it runs (see the module).

    Args:
        source: reads the configuration again (``CollectorConfig`` or ``ConfigError``).
        tokens: the holder the authentication middleware reads.
        load_rules: the rule set a configuration names (``RuleError`` when it does not load).
        storage: where the audit goes (None: logged only).
        detection, remediation, alert_receiver: the rules' users that run here.
        tls: the serving context and its settings, when serving HTTPS.
        clock: wall clock.
    """

    def __init__(
        self,
        *,
        source: Callable[[], CollectorConfig],
        tokens: LiveTokens,
        load_rules: Callable[[CollectorConfig], RuleSet],
        storage: Storage | None = None,
        detection: DetectionEngine | None = None,
        remediation: Remediation | None = None,
        alert_receiver: AlertReceiver | None = None,
        tls: tuple[ssl.SSLContext, TlsSettings] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._tokens = tokens
        self._load_rules = load_rules
        self._storage = storage
        self._detection = detection
        self._remediation = remediation
        self._receiver = alert_receiver
        self._tls = tls
        self._clock = clock
        self._lock = threading.Lock()

    def reload(self, actor: str) -> ReloadReport:
        """Reload tokens, rules and certificate; audited under ``actor``. Blocks (files)."""
        with self._lock:
            reloaded: list[str] = []
            kept: dict[str, list[str]] = {}
            counts: dict[str, int] = {}
            try:
                config: CollectorConfig | None = self._source()
            except (ConfigError, CredentialsError, OSError) as exc:
                config = None
                kept["config"] = [str(exc)]
            if config is not None:
                self._swap_tokens(config, reloaded, kept, counts)
                self._swap_rules(config, reloaded, kept, counts)
            if self._tls is not None:
                if reload_certificate(*self._tls):
                    reloaded.append("tls")
                else:
                    kept["tls"] = ["the certificate and key did not load (see the log)"]
            report = ReloadReport(tuple(reloaded), kept, counts)
        for part, problems in kept.items():
            for problem in problems:
                log.error("reload by %s: %s kept: %s", actor, part, problem)
        log.info("reload by %s: reloaded %s", actor, ", ".join(reloaded) or "nothing")
        self._audit(actor, report)
        return report

    def _swap_tokens(
        self,
        config: CollectorConfig,
        reloaded: list[str],
        kept: dict[str, list[str]],
        counts: dict[str, int],
    ) -> None:
        if config.allow_unauthenticated:
            return  # no tokens to check: every caller is the anonymous admin
        if not config.tokens:
            kept["tokens"] = [
                f"the configuration names no token (every caller would be refused); "
                f"keeping the {len(self._tokens.table)} in force"
            ]
            return
        self._tokens.table = config.tokens  # one assignment: the next request sees it
        reloaded.append("tokens")
        counts["tokens"] = len(config.tokens)

    def _swap_rules(
        self,
        config: CollectorConfig,
        reloaded: list[str],
        kept: dict[str, list[str]],
        counts: dict[str, int],
    ) -> None:
        if self._detection is None and self._remediation is None and self._receiver is None:
            return
        try:
            rules = self._load_rules(config)
            enabled = rules.enabled()
            if self._remediation is not None:
                self._remediation.remediator.replace_rules(enabled)  # checks first
        except (RuleError, PolicyError) as exc:
            kept["rules"] = [str(exc)]
            return
        if self._detection is not None:
            self._detection.replace_rules(rules)
        if self._remediation is not None:
            if self._remediation.dispatcher is not None:
                self._remediation.dispatcher.replace_rules(enabled)
            self._remediation.rules.clear()
            self._remediation.rules.update((rule.id, rule) for rule in enabled)
        if self._receiver is not None:
            self._receiver.replace_rules(enabled)
        reloaded.append("rules")
        counts["rules"] = len(enabled)
        if rules.problems:
            kept["skipped_rules"] = [str(p) for p in rules.problems]

    def _audit(self, actor: str, report: ReloadReport) -> None:
        if self._storage is None:
            return
        entry = AuditEntry(
            time=self._clock(),
            actor=actor,
            action="reload",
            target="collector",
            reason="SIGHUP" if actor == SIGHUP_ACTOR else "POST /v1/admin/reload",
            verdict="allowed",
            dry_run=False,
            result="partial" if report.kept else "ok",
            inputs=report.json(),
        )
        try:
            self._storage.append_audit(entry)
        except Exception:  # the reload happened; a lost audit line must not hide that
            log.exception("reload by %s: the audit entry was not written", actor)


def reload_on_sighup(app: web.Application, reloader: Reloader) -> None:
    """While ``app`` runs, SIGHUP runs ``reloader`` in a worker thread (main thread only).

    The one SIGHUP handler of the process: a second ``add_signal_handler`` for the same signal
    would replace the first, so every reload (tokens, rules, certificate) is in this one.
    """
    running: set[asyncio.Future[ReloadReport]] = set()

    def on_signal() -> None:
        task = asyncio.ensure_future(asyncio.to_thread(reloader.reload, SIGHUP_ACTOR))
        running.add(task)
        task.add_done_callback(running.discard)

    async def handle_sighup(_app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, on_signal)
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGHUP)

    app.cleanup_ctx.append(handle_sighup)
