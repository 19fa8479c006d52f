"""The collector's aiohttp application: one factory, one authentication middleware.

:func:`create_app` puts the shared state in the typed keys of :mod:`~.keys`, installs the
:func:`~.auth.authentication` middleware and lets each route module add its routes
(``setup_*``), each declaring who may call them. The service's loops run in a ``cleanup_ctx``.
Route modules import the keys and the core, never each other nor this module.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence

from aiohttp import web

from gpuwarden.collector.budgets.spend import DailySpend
from gpuwarden.collector.build import load_configured_rules
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.detect.readiness import RuleBoard
from gpuwarden.collector.ha.leadership import LeaseElection, lease_name
from gpuwarden.collector.ingest.sink import MetricsSink, SeriesLog
from gpuwarden.collector.rules.model import RuleProblem, RuleSet
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.sql_lease import LeaseRecords
from gpuwarden.collector.web import tasks
from gpuwarden.collector.web.access_log import RedactingAccessLogger, server_logger
from gpuwarden.collector.web.admin import setup_admin
from gpuwarden.collector.web.admission import setup_admission
from gpuwarden.collector.web.api import setup_api
from gpuwarden.collector.web.auth import authentication
from gpuwarden.collector.web.exposition import setup_metrics
from gpuwarden.collector.web.guard import body_guard, header_guard, setup_guards
from gpuwarden.collector.web.keys import (
    ADMISSION_STATS,
    ALERT_RECEIVER,
    AUTH_STATS,
    CONFIG,
    CREDENTIAL_SOURCES,
    DAILY_SPEND,
    LEADERSHIP,
    LOOP_LAG,
    RELOADER,
    REMEDIATION,
    ROUTE_ACCESS,
    RULE_BOARD,
    SERVICE,
    SINK,
    SKIPPED_RULES,
    STATS,
    THROTTLE,
    TOKENS,
    AdmissionStats,
    AuthStats,
    IngestStats,
)
from gpuwarden.collector.web.login import setup_signin
from gpuwarden.collector.web.receiver import setup_receiver
from gpuwarden.collector.web.reload import LiveTokens, Reloader
from gpuwarden.collector.web.remediation import setup_remediation
from gpuwarden.collector.web.remediation_setup import Remediation
from gpuwarden.collector.web.remote_write_receiver import Translator, setup_remote_write
from gpuwarden.collector.web.shed import LoopLag, lag_monitor
from gpuwarden.collector.web.silences import setup_silences
from gpuwarden.collector.web.static import setup_static
from gpuwarden.collector.web.status_page import setup_status_page
from gpuwarden.collector.web.throttle import FailureThrottle


def create_app(
    config: CollectorConfig,
    sink: MetricsSink | None = None,
    *,
    service: CollectorService | None = None,
    background: bool = True,
    detection: DetectionEngine | None = None,
    remediation: Remediation | None = None,
    rule_problems: Sequence[str] = (),
    reload_source: Callable[[], CollectorConfig] | None = None,
    tls_context: ssl.SSLContext | None = None,
    rules: RuleSet | None = None,
    prom_translate: Translator | None = None,
    lease_store: LeaseRecords | None = None,
) -> web.Application:
    """Build the collector application.

    With a ``service`` the points go to its WindowStore, the JSON API, ``/metrics`` and the
    status page are served, and, unless ``background`` is false (tests drive it themselves), job
    polling, accounting, detection, remediation and alerting run while the app serves. Without
    one, points go to ``sink`` (an in-memory series log by default). With a ``remediation``, its
    runbook, approval and API routes are served. ``rule_problems`` are the rules skipped under
    ``skip_bad_rules``: ``/readyz`` lists them and stays 200 (the other rules run). ``rules``
    (default: the detection engine's) are judged for readiness on ``/readyz`` and ``/status``.

    With ``ha.enabled`` the replica takes part in the leader election (``collector.ha``): the
    leader-only loops run while it leads, and ``/readyz``, ``/status`` and ``/metrics`` say
    who leads. ``lease_store`` (a second connection to the same database, which the caller
    closes) renews the lease without waiting behind the service's own transactions.

    ``POST /v1/admin/reload`` (and SIGHUP, with :func:`~.reload.reload_on_sighup`) reads the
    configuration again through ``reload_source`` (default: ``config`` as it is, so the rule
    files are read again and the tokens stay) and swaps in its tokens and rules, and reloads
    the certificate of ``tls_context`` when serving HTTPS.

    With ``prom_translate`` (the mapping of Prometheus series onto our metrics), Prometheus
    remote-write is received on ``POST /api/v1/write`` (``remote_write_receiver``).
    """
    # We inflate bodies ourselves, with a cap: aiohttp's own decompression has none. aiohttp
    # closes a connection without a whole request head within ``keepalive_timeout`` of its
    # start or of its previous answer: that is the header read timeout (``web.guard``). The
    # handler arguments apply however the app is served (``run_app``, a runner in tests).
    app = web.Application(
        client_max_size=config.max_body_bytes,
        handler_args={
            "auto_decompress": False,
            "keepalive_timeout": config.header_timeout_seconds,
            "access_log_class": RedactingAccessLogger,
            "logger": server_logger(),
        },
        middlewares=[header_guard, authentication, body_guard],
    )
    setup_guards(app)  # CSP & co. on every response; body waits end when the stop begins
    app[CONFIG] = config
    app[STATS] = IngestStats()
    app[LOOP_LAG] = LoopLag()
    app.cleanup_ctx.append(lag_monitor(app[LOOP_LAG]))  # what ingest's shedding reads
    app[ROUTE_ACCESS] = {}
    app[AUTH_STATS] = AuthStats()
    app[ADMISSION_STATS] = AdmissionStats()  # web.admission counts, /metrics shows
    app[CREDENTIAL_SOURCES] = []
    app[TOKENS] = LiveTokens(config.tokens)
    app[THROTTLE] = FailureThrottle(
        config.auth_failure_limit,
        config.auth_failure_window_seconds,
        config.auth_failure_sources,
    )
    setup_signin(app)  # sessions and proxy identities for the pages (status, runbooks, approvals)
    election: LeaseElection | None = None
    if service is not None:
        app[SERVICE] = service
        app[SINK] = service
        app[DAILY_SPEND] = DailySpend(service.storage)
        election = _election(config, service, detection, remediation, lease_store)
        if election is not None:  # active/standby: /readyz, /status and /metrics say who leads
            app[LEADERSHIP] = election
        setup_api(app)
        setup_metrics(app)
        setup_status_page(app)
        setup_silences(app)
        setup_admission(app)  # the Kubernetes webhook and the Slurm hook (limit policies)
        app[SKIPPED_RULES] = tuple(rule_problems)
        if rules is None:
            rules = RuleSet(tuple(detection.rules) if detection is not None else ())
        problems: tuple[RuleProblem | str, ...] = rules.problems or tuple(rule_problems)
        histograms_since = None
        if service.warm is not None:  # gauges came back from the TSDB, histograms cannot
            restored = service.restored
            histograms_since = (
                restored.held_since
                if restored is not None and restored.histograms and restored.held_since
                else service.clock()
            )
        app[RULE_BOARD] = RuleBoard(
            rules.rules,
            problems,
            service.store,
            started_at=service.clock(),
            clock=service.clock,
            histograms_since=histograms_since,
        )
    else:
        app[SINK] = sink if sink is not None else SeriesLog()
    if remediation is not None:
        app[REMEDIATION] = remediation
        setup_remediation(app)
    setup_receiver(app)
    if prom_translate is not None:
        setup_remote_write(app, prom_translate)
    setup_static(app)
    app[RELOADER] = Reloader(
        source=reload_source or (lambda: config),
        tokens=app[TOKENS],
        load_rules=load_configured_rules,
        storage=service.storage if service is not None else None,
        detection=detection,
        remediation=remediation,
        alert_receiver=app.get(ALERT_RECEIVER),
        tls=(tls_context, config.tls) if tls_context is not None else None,
    )
    setup_admin(app)
    if service is not None and background:
        app.on_shutdown.append(tasks.announce_stop)
        app.cleanup_ctx.append(
            tasks.background(
                job_poll_seconds=config.job_poll_seconds,
                accounting_seconds=config.accounting_period_seconds,
                scrape_seconds=config.scrape_seconds,
                detection=detection,
                detection_seconds=config.detection_seconds,
                remediator=remediation.remediator if remediation is not None else None,
                remediation_seconds=config.remediation.interval_seconds,
                dispatcher=remediation.dispatcher if remediation is not None else None,
                alerting_seconds=config.alerting.interval_seconds,
                snapshot_seconds=config.snapshot_seconds,
                leadership=election,
                election=election,
                election_seconds=config.ha.renew_interval_seconds,
            )
        )
    return app


def _election(
    config: CollectorConfig,
    service: CollectorService,
    detection: DetectionEngine | None,
    remediation: Remediation | None,
    lease_store: LeaseRecords | None,
) -> LeaseElection | None:
    """The lease election when ``ha`` is on (``collector.ha``); a new leader first adopts the
    actions the old one left executing."""
    if not config.ha.enabled:
        return None
    storage = service.storage
    if not isinstance(storage, LeaseRecords):
        raise TypeError(f"ha: the storage {type(storage).__name__} has no leader lease")
    hooks = [remediation.remediator.adopt_orphans] if remediation is not None else []
    election = LeaseElection(
        storage,
        config.ha.replica(),
        config.ha.lease_seconds,
        name=lease_name(config.cluster),
        on_acquired=hooks,
        lease_store=lease_store,
    )
    if detection is not None:  # a cycle stops at the next rule once the lease is lost
        detection.proceed = election.leading
    if remediation is not None:  # a leader paused past its lease calls and sends nothing more
        remediation.remediator.act_only_while(election.confirmed)
        if remediation.dispatcher is not None:
            remediation.dispatcher.send_only_while(election.confirmed)
    return election
