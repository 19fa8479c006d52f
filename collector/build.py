"""Assemble the collector's core from its configuration (the composition root)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gpuwarden.agent.config import ConfigError
from gpuwarden.collector.accounting.gpu_time import AccountingConfig
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules, long_metrics, recent_metrics
from gpuwarden.collector.extras import needs_extra
from gpuwarden.collector.ingest.creation_pace import CreationPace
from gpuwarden.collector.ingest.otlp_limits import IngestLimits
from gpuwarden.collector.ingest.rounds_seen import RoundsLedger
from gpuwarden.collector.jobs import JobSourceError
from gpuwarden.collector.jobs.model import JobSource
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.remote_write.settings import RemoteWriteSettings
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import RuleSet
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.base import Storage, StorageError
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.web import exposition_models, status_page
from gpuwarden.collector.web.remediation_setup import Remediation, create_remediation

if TYPE_CHECKING:
    from gpuwarden.collector.alerts.model import Notifier
    from gpuwarden.collector.clients.http import HttpClient
    from gpuwarden.collector.policy.guard import PolicyGuard
    from gpuwarden.collector.remediate.actuators.base import Actuator
    from gpuwarden.collector.remediate.actuators.build import JobLookup
    from gpuwarden.collector.remote_write.reader import TsdbReader
    from gpuwarden.collector.remote_write.writer import HistoryWriter


def load_configured_rules(config: CollectorConfig) -> RuleSet:
    """The rule set the config names (default: the packaged rules and runbooks).

    Raises ``RuleError`` naming the file and key unless ``skip_bad_rules`` is set, in which case
    the bad rules are in ``RuleSet.problems`` and the rest load.
    """
    paths = list(config.rules) or [default_rules_dir()]
    runbooks = config.runbooks_dir or default_runbooks_dir()
    return load_rules(paths, runbooks_dir=runbooks, skip_bad=config.skip_bad_rules)


def build_http_client(environ: Mapping[str, str] | None = None) -> HttpClient:
    """The one pooled HTTP client the collector's notifiers, actuators and scrapes share, going
    through the proxies ``environ`` names (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``)."""
    from gpuwarden.collector.clients.http import HttpClient, Proxies

    return HttpClient(proxies=Proxies.from_environment(environ or {}))


def build_actuators(
    config: CollectorConfig,
    environ: Mapping[str, str],
    *,
    jobs: JobLookup | None = None,
    http: HttpClient | None = None,
) -> list[Actuator]:
    """The actuators the config enables (:mod:`~gpuwarden.collector.remediate.actuators.build`)."""
    from gpuwarden.collector.remediate.actuators.build import build_actuators as build

    return build(config.actuators, environ, jobs=jobs, http=http)


def build_notifiers(
    config: CollectorConfig, environ: Mapping[str, str], *, http: HttpClient | None = None
) -> dict[str, Notifier]:
    """The notifiers the config enables, by route scheme.

    Slack: ``slack_webhooks_file`` (``<#channel> <URL>`` lines) and/or the environment's
    ``GPUWARDEN_SLACK_WEBHOOK_URL`` for every other channel. PagerDuty: ``pagerduty_keys_file``
    (``<service> <integration key>`` lines). Alertmanager: ``alerting.alertmanagers``. Webhooks
    (``webhook:<name>`` routes): the ``webhooks`` the action uses too. Secrets stay out of logs
    and error messages. The HTTP notifiers share ``http`` (Slack posts through slack_sdk).
    """
    from gpuwarden.collector.config import parse_secrets

    notifiers: dict[str, Notifier] = {}
    hooks = (
        parse_secrets(config.slack_webhooks_file, "webhook URL")
        if config.slack_webhooks_file
        else {}
    )
    default_hook = environ.get("GPUWARDEN_SLACK_WEBHOOK_URL")
    if hooks or default_hook:
        setting = "slack_webhooks_file" if hooks else "GPUWARDEN_SLACK_WEBHOOK_URL"
        with needs_extra("slack", setting, environment=not hooks):
            from gpuwarden.collector.notify.slack_notifier import SlackNotifier

        notifiers["slack"] = SlackNotifier(hooks, default_webhook=default_hook)
    if config.pagerduty_keys_file:
        from gpuwarden.collector.notify.pagerduty_notifier import PagerDutyNotifier

        keys = parse_secrets(config.pagerduty_keys_file, "integration key")
        notifiers["pagerduty"] = PagerDutyNotifier(
            keys, events_url=config.pagerduty_events_url, http=http
        )
    if config.webhooks:
        from gpuwarden.collector.notify.webhook_notifier import WebhookNotifier
        from gpuwarden.collector.remediate.actuators.build import load_webhooks

        notifiers["webhook"] = WebhookNotifier(load_webhooks(config.webhooks, environ), http=http)
    if config.alerting.alertmanagers:
        from gpuwarden.collector.notify.alertmanager_notifier import AlertmanagerNotifier

        notifiers["alertmanager"] = AlertmanagerNotifier(
            config.alerting.alertmanagers,
            hold_seconds=3 * config.alerting.resend_seconds,
            http=http,
        )
    return notifiers


def build_remediation(
    config: CollectorConfig,
    service: CollectorService,
    rules: RuleSet,
    *,
    actuators: Sequence[Actuator],
    notifiers: Mapping[str, Notifier],
    environ: Mapping[str, str],
    clock: Callable[[], float] = time.time,
) -> Remediation:
    """The remediator, runbook pages and approval links for ``rules`` (dry-run by default).

    Raises ``PolicyError`` for a rule naming an unknown action kind, ``ValueError`` for an
    unreadable or short approval secret.
    """
    return create_remediation(
        service.storage,
        rules.enabled(),
        config.remediation,
        actuators=actuators,
        notifiers=notifiers,
        runbooks_dir=config.runbooks_dir or default_runbooks_dir(),
        environ=environ,
        # what automation could act on: jobs, nodes and model deployments
        alerting=config.alerting,
        fleet_size=lambda: (
            (len(service.registry.jobs()) + len(service.nodes) + len(service.storage.models()))
            or None
        ),
        clock=clock,
        guard=build_policy_guard(config, service, rules, clock=clock),
    )


def build_policy_guard(
    config: CollectorConfig,
    service: CollectorService,
    rules: RuleSet,
    *,
    clock: Callable[[], float] = time.time,
) -> PolicyGuard | None:
    """The policies of ``policies_dir`` as the remediator asks them (``None``: none set).

    Raises ``PolicyError`` (a ``ValueError``) naming the file, policy and key of the first
    mistake: a collector does not start with policies it cannot read.
    """
    if config.policies_dir is None:
        return None
    from gpuwarden.collector.accounting.report import cost_lines
    from gpuwarden.collector.policy.breaches import RULE_ID, BreachBook
    from gpuwarden.collector.policy.evaluate import period_start
    from gpuwarden.collector.policy.guard import PolicyGuard
    from gpuwarden.collector.policy.loader import load_policies
    from gpuwarden.collector.policy.model import CapPeriod

    policies = load_policies([config.policies_dir])

    # Spend changes once per accounting period: each period's answer is kept until the next.
    answers: dict[tuple[CapPeriod, int], Mapping[str, float]] = {}

    def spend(period: CapPeriod, now: float) -> Mapping[str, float]:
        """Spend per team so far this UTC day or month (``gpuwarden report costs --by team``)."""
        key = (period, int(now // config.accounting_period_seconds))
        if key not in answers:
            for old in [k for k in answers if k[1] != key[1]]:
                del answers[old]
            lines = cost_lines(
                service.storage, since=period_start(period, now), until=now, by="team"
            )
            answers[key] = {line.group: line.cost for line in lines if line.cost is not None}
        return answers[key]

    rule = next((r for r in rules.enabled() if r.id == RULE_ID), None)
    return PolicyGuard(
        policies.policies,
        jobs=service.registry,
        spend=spend,
        breaches=BreachBook(service.storage, rule),
        cluster=config.cluster,
        clock=clock,
    )


def build_history(
    settings: RemoteWriteSettings | None,
    *,
    http: HttpClient | None = None,
    limits: IngestLimits | None = None,
    cluster: str | None = None,
) -> HistoryWriter | None:
    """The remote-write history writer ``remote_write:`` describes (None: not configured),
    labelling every series with ``cluster``.

    Its queue folder is created now; the bearer token is read from its file now (fail at start).
    """
    if settings is None:
        return None
    from gpuwarden.collector.remote_write.intake_log import IntakeLog
    from gpuwarden.collector.remote_write.queue import DiskQueue
    from gpuwarden.collector.remote_write.sender import RemoteWriteSender
    from gpuwarden.collector.remote_write.writer import HistoryWriter

    headers = _remote_write_headers(settings)
    try:
        queue = DiskQueue(settings.queue_dir, max_bytes=settings.max_queue_bytes)
        log = IntakeLog(settings.queue_dir)
    except OSError as exc:
        raise ConfigError(f"remote_write.queue_dir {settings.queue_dir}: {exc.strerror}") from None
    sender = RemoteWriteSender(
        queue,
        http if http is not None else build_http_client(),
        settings.url,
        headers=headers,
        timeout_seconds=settings.timeout_seconds,
        max_backoff_seconds=settings.max_backoff_seconds,
    )
    return HistoryWriter(
        queue,
        sender,
        batch_samples=settings.batch_samples,
        flush_seconds=settings.flush_seconds,
        log=log,
        limits=limits if limits is not None else IngestLimits(),
        cluster=cluster,
    )


def _remote_write_headers(settings: RemoteWriteSettings) -> dict[str, str]:
    """The configured headers plus the bearer token read from its file now (fail at start)."""
    headers = dict(settings.headers)
    if settings.bearer_token_file is not None:
        try:
            token = settings.bearer_token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                f"remote_write.bearer_token_file {settings.bearer_token_file}: {exc.strerror}"
            ) from None
        headers["Authorization"] = f"Bearer {token}"
    return headers


def open_storage(config: CollectorConfig, *, clock: Callable[[], float] = time.time) -> Storage:
    """The storage the config names: PostgreSQL for a ``postgresql://`` database, else the
    SQLite file (its folder created).

    Raises:
        StorageError: the database cannot be opened or reached (one line, no password).
        OSError: the SQLite file's folder cannot be created.
    """
    if config.database_url is None:
        if config.database.parent and str(config.database) != ":memory:":
            config.database.parent.mkdir(parents=True, exist_ok=True)
        return SqliteStorage(config.database, clock=clock, cluster=config.cluster)
    with needs_extra("collector", "database"):
        from gpuwarden.collector.storage.postgres import PostgresStorage
    password = None
    if config.database_password_file is not None:
        try:
            text = config.database_password_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise StorageError(
                f"database_password_file {config.database_password_file}: {exc.strerror}"
            ) from None
        password = text.strip("\r\n")  # the file's line ending is not part of the password
    return PostgresStorage(
        config.database_url, clock=clock, password=password, cluster=config.cluster
    )


SERVICE_RANGE_READS = status_page.RANGE_READS | exposition_models.RANGE_READS
"""What the web pages read over a time range (the rules' and the fleet's reads come from
``detect.catalog.recent_metrics``)."""


def build_service(
    config: CollectorConfig,
    *,
    clock: Callable[[], float] = time.time,
    job_sources: Sequence[tuple[str, JobSource]] | None = None,
    http: HttpClient | None = None,
    rules: RuleSet | None = None,
) -> CollectorService:
    """The store, storage, job registry and accounting the config describes (model-server
    scrapes through ``http``).

    The store keeps a long window for the metrics ``rules`` (default: the configured rules)
    read at long resolution, plus ``long_metrics``; known before the snapshot and the TSDB
    fill it, so their long history comes back (``detect.catalog.long_metrics``). It keeps a
    recent window for the metrics something reads over a time range (the rules, the fleet's
    accounting, the status page, /metrics), plus ``recent_metrics``; every other series keeps
    its latest value only (``detect.catalog.recent_metrics``).
    """
    if rules is None:
        rules = load_configured_rules(config)
    long_kept = long_metrics(
        rules.enabled(), recent_seconds=config.recent_hours * 3600, extra=config.long_metrics
    )
    recent_kept = None
    if "*" not in config.recent_metrics:
        recent_kept = recent_metrics(
            rules.enabled(),
            recent_seconds=config.recent_hours * 3600,
            extra=(*config.recent_metrics, *long_kept, *SERVICE_RANGE_READS),
        )
    storage = open_storage(config, clock=clock)
    workload_reader = None
    if job_sources is None:
        job_sources = []
        if config.slurm_cluster:
            from gpuwarden.collector.jobs.slurm import SlurmJobSource

            job_sources.append(("slurm", SlurmJobSource(cluster=config.slurm_cluster)))
        if config.kubernetes_kubeconfig is not None or config.kubernetes_in_cluster:
            setting = (
                "kubernetes_in_cluster" if config.kubernetes_in_cluster else "kubernetes_kubeconfig"
            )
            from gpuwarden.collector.jobs.kube_client import KubeApis, load_client

            with needs_extra("kubernetes", setting):
                from gpuwarden.collector.jobs.kubernetes import KubernetesJobSource
                from gpuwarden.collector.jobs.kueue_workloads import KueueWorkloadReader

                try:
                    client = load_client(
                        kubeconfig=config.kubernetes_kubeconfig,
                        context=config.kubernetes_context,
                        in_cluster=config.kubernetes_in_cluster,
                    )
                except JobSourceError as exc:
                    raise ConfigError(f"kubernetes: {exc}") from None
            apis = KubeApis(client)
            source = KubernetesJobSource(apis.core(), namespace=config.kubernetes_namespace)
            job_sources.append(("kubernetes", source))
            workload_reader = KueueWorkloadReader(
                apis.custom_objects(), namespace=config.kubernetes_namespace
            )
    scraper = None
    if config.model_servers:
        from gpuwarden.collector.ingest.scrape import ModelServerScraper, ScrapeTarget

        try:
            targets = [
                ScrapeTarget(
                    url=t.url,
                    server=t.server,
                    model=t.model,
                    node=t.node,
                )
                for t in config.model_servers
            ]
        except ValueError as exc:
            raise ConfigError(f"model_servers: {exc}") from None
        scraper = ModelServerScraper(targets, clock=clock, http=http)
    service = CollectorService(
        scraper=scraper,
        store=WindowStore(
            step_seconds=config.step_seconds,
            recent_seconds=config.recent_hours * 3600,
            max_series=config.max_series,
            staleness_seconds=config.staleness_seconds,
            long_metrics=long_kept,
            recent_metrics=recent_kept,
            clock=clock,
        ),
        storage=storage,
        registry=JobRegistry(storage, job_sources, workload_reader=workload_reader),
        accounting=AccountingConfig(
            idle_threshold_ratio=config.idle_threshold_ratio,
            grid_intensity_grams_per_kwh=config.grid_intensity_grams_per_kwh,
            grid_intensity_clusters=config.grid_intensity_clusters,
            grid_intensity_regions=config.grid_intensity_regions,
            prices=config.prices,
            budgets=config.budgets,
            fairness_targets=config.fairness.targets,
        ),
        period_seconds=config.accounting_period_seconds,
        clock=clock,
        max_new_series_per_source_hour=config.max_new_series_per_source_hour,
        pace=CreationPace(config.max_new_series_per_second),
        limits=config.ingest_limits,
        snapshot_path=config.snapshot_path,
        history=build_history(
            config.remote_write,
            http=http,
            limits=config.ingest_limits,
            cluster=config.cluster,
        ),
    )
    if config.database_url is not None:  # other collectors may store this agent's rounds too
        service.intake.rounds_ledger = RoundsLedger(read_through=True)
    service.restore_snapshot()  # warm start: the window as the last snapshot left it
    settings = config.remote_write
    if settings is not None and settings.read_url is not None:
        # then what the snapshot does not cover (all of it without one), from the TSDB
        service.warm_from_tsdb(
            build_reader(settings, http=http, cluster=config.cluster),
            settings.warm_start_lookback_seconds,
            settings.warm_start_long_lookback_seconds,
        )
    return service


def build_reader(
    settings: RemoteWriteSettings, *, http: HttpClient | None = None, cluster: str | None = None
) -> TsdbReader:
    """The TSDB reader of ``remote_write.read_url`` (same headers and token as the writes), of
    ``cluster``'s series only when given (the collector's own: its writes carry the label)."""
    from gpuwarden.collector.remote_write.reader import reader_for

    if settings.read_url is None:
        raise ConfigError("remote_write.read_url is not set")
    return reader_for(
        settings.read_api,
        http if http is not None else build_http_client(),
        settings.read_url,
        headers=_remote_write_headers(settings),
        timeout_seconds=settings.timeout_seconds,
        page_seconds=settings.read_page_seconds,
        max_samples=settings.read_max_samples,
        cluster=cluster,
    )
