"""Prometheus ``/metrics`` of the collector: the fleet's GPUs, per-job accounting, own health.

One custom collector (:class:`FleetMetrics`, the ``prometheus_client`` ``Collector`` protocol) reads
the :class:`CollectorService` at scrape time, registered on a ``CollectorRegistry`` of its own per
app (never the global one). The scrape runs in a worker thread: it reads the store and queries the
storage, both blocking.

Label cardinality is bounded:

* per-GPU gauges: one series per GPU (per GPU and state for ``gpuwarden_gpu_status``), labelled
  with the job holding the GPU at the latest slot, so at most one job per GPU at a time;
* per-job accounting (``gpuwarden_job_*``) over a rolling window (default 24 h): at most
  ``max_jobs`` jobs (default 500), the largest by allocated GPU-hours; ``gpuwarden_team_gpu_hours``
  sums every job, so team totals stay complete when jobs are left out, and
  ``gpuwarden_collector_accounting_jobs_omitted`` says how many were. Time allocated to no job is
  in neither family;
* the effective price table (``gpuwarden_price_per_gpu_hour``): one series per model, tier and
  cluster the config writes (the built-in table without a ``prices:`` section);
* fairness (``gpuwarden_fairness_*``, ``exposition_fairness``): one series per team and per
  queue with jobs in the accounting window (and per wait quantile).

Freshness (Prometheus staleness semantics): a series whose newest point is older than the
store's ``staleness_seconds`` is stale and simply absent here, so a stopped agent's GPUs vanish
from the ``gpuwarden_gpu_*`` readings instead of repeating their last value;
``gpuwarden_node_up`` (1/0) and ``gpuwarden_node_last_seen_age_seconds`` per node, and
``gpuwarden_gpu_last_seen_age_seconds`` per GPU, say who went silent and when.

A missing reading is a missing sample, never 0. Each section (GPUs, accounting, health) is
isolated: a failing one is logged and reported as ``gpuwarden_collector_scrape_success{section}
0`` while the others are still served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuwarden.collector.accounting.prices import DEFAULT_MODEL
from gpuwarden.collector.budgets.spend import DailySpend
from gpuwarden.collector.budgets.status import budget_statuses
from gpuwarden.collector.ha.leadership import Leadership
from gpuwarden.collector.remediate.states import BREAKER_SCOPE
from gpuwarden.collector.remote_write.metrics import remote_write_families
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import IncidentState, RollupTotal
from gpuwarden.collector.web.exposition_budgets import budget_families
from gpuwarden.collector.web.exposition_fairness import fairness_families
from gpuwarden.collector.web.exposition_models import model_families
from gpuwarden.collector.web.gpus import GPU_READINGS, gpu_statuses
from gpuwarden.collector.web.keys import (
    ADMISSION_STATS,
    AUTH_STATS,
    DAILY_SPEND,
    LEADERSHIP,
    LOOP_LAG,
    METRICS_REGISTRY,
    READERS,
    SERVICE,
    STATS,
    AdmissionStats,
    AuthStats,
    IngestStats,
    add_route,
)
from gpuwarden.collector.web.liveness import node_liveness
from gpuwarden.collector.web.shed import LoopLag

log = logging.getLogger(__name__)

DEFAULT_ACCOUNTING_WINDOW_SECONDS = 24 * 3600.0
DEFAULT_MAX_JOBS = 500
GPU_LABELS = ("node", "gpu", "gpu_model", "job_key", "team", "model")
"""``job_key``, not ``job``: Prometheus owns ``job`` (the scrape job) and would rename ours."""
KINDS = ("allocated", "busy", "idle")
PRICE_FAMILY = "gpuwarden_price_per_gpu_hour"
PRICE_LABELS = ("gpu_model", "tier", "currency", "cluster", "region")
_JOB_MEASURES = (  # RollupTotal field, family, what it is, divisor to the family's unit
    ("energy_joules", "gpuwarden_job_energy_kwh", "Energy in kWh", 3.6e6),
    # the family keeps its released name; its unit is gpuwarden_price_per_gpu_hour's currency
    ("cost", "gpuwarden_job_cost_usd", "Cost in the price table's currency", 1.0),
    ("carbon_grams", "gpuwarden_job_carbon_kg", "Carbon in kg CO2e", 1000.0),
)


class FleetMetrics:
    """The collector's Prometheus collector: read the service at scrape time.

    Args:
        service: the collector core.
        stats: the OTLP receiver's counters (``gpuwarden_collector_requests_total``), if any.
        auth: the refusals (``gpuwarden_collector_auth_refusals_total``), if any.
        admission: the admission verdicts (``gpuwarden_admission_reviews_total``), if any.
        accounting_window_seconds: rolling window of the per-job and per-team families.
        max_jobs: cap on jobs in the per-job families (largest by allocated GPU-hours).
        clock: Unix time in seconds (default: the service's clock).
    """

    def __init__(
        self,
        service: CollectorService,
        *,
        stats: IngestStats | None = None,
        auth: AuthStats | None = None,
        admission: AdmissionStats | None = None,
        lag: LoopLag | None = None,
        accounting_window_seconds: float = DEFAULT_ACCOUNTING_WINDOW_SECONDS,
        max_jobs: int = DEFAULT_MAX_JOBS,
        clock: Callable[[], float] | None = None,
        leadership: Leadership | None = None,
        daily: DailySpend | None = None,
    ) -> None:
        if accounting_window_seconds <= 0 or max_jobs < 0:
            raise ValueError("accounting_window_seconds must be > 0 and max_jobs >= 0")
        self._service = service
        self._stats = stats
        self._auth = auth
        self._admission = admission
        self._lag = lag
        self._window = accounting_window_seconds
        self._max_jobs = max_jobs
        self._clock = clock if clock is not None else service.clock
        self._leadership = leadership
        # the month's complete days, read once (shared with /status through the app)
        self._daily = daily if daily is not None else DailySpend(service.storage)

    def collect(self) -> Iterator[Metric]:
        """Every family; a failing section is logged and left out (scrape_success 0)."""
        now = self._clock()
        success = GaugeMetricFamily(
            "gpuwarden_collector_scrape_success",
            "1 when the section of this scrape was read, 0 when it failed (see the logs).",
            labels=["section"],
        )
        sections: tuple[tuple[str, Callable[[float], list[Metric]]], ...] = (
            ("gpus", self._gpus),
            ("nodes", self._nodes),
            ("accounting", self._accounting),
            ("prices", self._prices),
            ("budgets", self._budgets),
            ("models", self._models),
            ("fairness", lambda now: fairness_families(self._service, now, self._window)),
            ("incidents", self._incidents),
            ("remediation", self._remediation),
            ("health", self._health),
        )
        if self._service.history is not None:  # remote-write is on
            history = self._service.history
            sections += (("remote_write", lambda _now: remote_write_families(history)),)
        for name, section in sections:
            try:
                families = section(now)
            except Exception:  # one broad except per section: the other sections still serve
                log.exception("metrics section %s failed", name)
                success.add_metric([name], 0.0)
                continue
            success.add_metric([name], 1.0)
            yield from families
        if self._leadership is not None:
            lead = self._leadership.status()
            leader = GaugeMetricFamily(
                "gpuwarden_leader",
                "1 on the replica that runs detection, remediation and notifications (the "
                "lease holder), 0 on a standby.",
                labels=["replica"],
            )
            leader.add_metric([lead.replica], 1.0 if lead.leading else 0.0)
            yield leader
        yield success

    def _gpus(self, now: float) -> list[Metric]:
        gauges = {
            r.key: GaugeMetricFamily(r.prometheus_name, r.documentation, labels=GPU_LABELS)
            for r in GPU_READINGS
        }
        age = GaugeMetricFamily(
            "gpuwarden_gpu_last_seen_age_seconds",
            "Seconds since the GPU's newest reading or status (exported while the store holds "
            "the GPU, stale or not: the readings of a GPU older than the staleness bound are "
            "left out).",
            labels=["node", "gpu"],
        )
        status = GaugeMetricFamily(
            "gpuwarden_gpu_status",
            "1 for the GPU's current state (ok, degraded, failed), 0 for the others.",
            labels=[*GPU_LABELS, "state"],
        )
        for gpu in gpu_statuses(self._service, now):
            labels = [
                gpu.node,
                gpu.uuid,
                gpu.model,
                gpu.job_key or "",
                gpu.team or "",
                gpu.model_name or "",
            ]
            for name, value in gpu.readings.items():
                gauges[name].add_metric(labels, value)
            for state, value in sorted(gpu.states.items()):
                status.add_metric([*labels, state], value)
            if gpu.last_seen is not None:
                age.add_metric([gpu.node, gpu.uuid], max(0.0, now - gpu.last_seen))
        return [*gauges.values(), status, age]

    def _nodes(self, now: float) -> list[Metric]:
        bound = self._service.store.staleness_seconds
        up = GaugeMetricFamily(
            "gpuwarden_node_up",
            f"1 while the node's agent reports (newest point at most {bound:g} s old), 0 when "
            "it is silent: its series are then stale, left out of this page and unknown to "
            "detectors.",
            labels=["node"],
        )
        age = GaugeMetricFamily(
            "gpuwarden_node_last_seen_age_seconds",
            "Seconds since the node's newest point, from any of its series.",
            labels=["node"],
        )
        for node in node_liveness(self._service, now):
            up.add_metric([node.node], 1.0 if node.up else 0.0)
            age.add_metric([node.node], node.age_seconds)
        return [up, age]

    def _accounting(self, now: float) -> list[Metric]:
        totals = self._service.storage.rollups(
            since=now - self._window, until=now, by=("job_key", "team", "model")
        )
        jobs = [t for t in totals if t.group["job_key"] is not None]
        jobs.sort(key=lambda t: (-t.gpu_seconds_allocated, str(t.group["job_key"])))
        window = f"over the last {self._window / 3600:g} h"
        cap = f"; at most {self._max_jobs} jobs, the largest by allocated GPU-hours"
        labels = ["job_key", "team", "model"]
        gpu_hours = GaugeMetricFamily(
            "gpuwarden_job_gpu_hours",
            f"GPU-hours of a job {window} by kind (allocated, busy, idle){cap}.",
            labels=[*labels, "kind"],
        )
        measures = [
            (
                attr,
                divisor,
                GaugeMetricFamily(name, f"{what} of a job {window}{cap}.", labels=labels),
            )
            for attr, name, what, divisor in _JOB_MEASURES
        ]
        for total in jobs[: self._max_jobs]:
            values = [str(total.group[d] or "") for d in ("job_key", "team", "model")]
            for kind, seconds in zip(KINDS, _seconds(total), strict=True):
                gpu_hours.add_metric([*values, kind], seconds / 3600)
            for attr, divisor, family in measures:
                value = getattr(total, attr)
                if value is not None:  # missing inputs stay missing, never 0
                    family.add_metric(values, value / divisor)
        teams: dict[str, list[float]] = {}
        for total in jobs:
            sums = teams.setdefault(str(total.group["team"] or ""), [0.0] * len(KINDS))
            for i, seconds in enumerate(_seconds(total)):
                sums[i] += seconds
        team_hours = GaugeMetricFamily(
            "gpuwarden_team_gpu_hours",
            f"GPU-hours of a team's jobs {window} by kind (every job: not capped).",
            labels=["team", "kind"],
        )
        for team, sums in sorted(teams.items()):
            for kind, seconds in zip(KINDS, sums, strict=True):
                team_hours.add_metric([team, kind], seconds / 3600)
        omitted = GaugeMetricFamily(
            "gpuwarden_collector_accounting_jobs_omitted",
            f"Jobs left out of the gpuwarden_job_* families by the cap of {self._max_jobs}.",
            value=float(max(0, len(jobs) - self._max_jobs)),
        )
        return [gpu_hours, *(family for _, _, family in measures), team_hours, omitted]

    def _prices(self, _now: float) -> list[Metric]:
        table = self._service.accounting.prices
        family = GaugeMetricFamily(
            PRICE_FAMILY,
            "Price per GPU-hour the accounting charges, by GPU model (a "
            f"case-insensitive substring of hw.model; {DEFAULT_MODEL} for models not listed), "
            "tier, cluster and region (both empty: the whole fleet; a cluster's rows override its "
            "region's, which override the fleet's).",
            labels=list(PRICE_LABELS),
        )
        for row in table.rows():
            family.add_metric(
                [row.gpu_model, row.tier, table.currency, row.cluster, row.region],
                row.price_per_hour,
            )
        return [family]

    def _budgets(self, now: float) -> list[Metric]:
        budgets = self._service.accounting.budgets
        if not budgets.items:
            return []
        statuses = budget_statuses(budgets, self._daily, now)
        return budget_families(statuses, budgets.currency, budgets.interval_level)

    def _models(self, now: float) -> list[Metric]:
        return model_families(self._service, now)

    def _incidents(self, _now: float) -> list[Metric]:
        family = GaugeMetricFamily(
            "gpuwarden_incidents_open",
            "Open incidents by rule and severity (every rule of the rule set that has one).",
            labels=["rule", "severity"],
        )
        counts: dict[tuple[str, str], int] = {}
        for incident in self._service.storage.incidents(state=IncidentState.OPEN):
            key = (incident.rule_id, incident.severity)
            counts[key] = counts.get(key, 0) + 1
        for (rule, severity), count in sorted(counts.items()):
            family.add_metric([rule, severity], float(count))
        return [family]

    def _remediation(self, now: float) -> list[Metric]:
        storage = self._service.storage
        actions = GaugeMetricFamily(
            "gpuwarden_remediation_actions",
            "Remediation actions by kind, state, mode and dry-run (every action ever decided; "
            "states such as awaiting_approval, expired, dry_run, verified, rolled_back, "
            "escalated).",
            labels=["action", "state", "mode", "dry_run"],
        )
        counts: dict[tuple[str, str, str, str], int] = {}
        for record in storage.actions():
            key = (record.action, record.state, record.mode, str(record.dry_run).lower())
            counts[key] = counts.get(key, 0) + 1
        for labels, count in sorted(counts.items()):
            actions.add_metric(list(labels), float(count))
        breaker = GaugeMetricFamily(
            "gpuwarden_remediation_breaker_open",
            "1 while the blast-radius breaker has stopped automation (a human must reset it).",
            labels=["scope"],
        )
        state = storage.breaker(BREAKER_SCOPE)
        breaker.add_metric([BREAKER_SCOPE], float(state is not None and state.state == "open"))
        audit = GaugeMetricFamily(
            "gpuwarden_audit_entries_last_day",
            "Entries appended to the remediation audit log over the last 24 h.",
            value=float(len(storage.audit(since=now - 86400))),
        )
        pending = GaugeMetricFamily(
            "gpuwarden_notifications_pending",
            "Incident alerts a service has not accepted yet, by route scheme and status "
            "(retried with backoff; 'lost' once given up, while the incident stays open).",
            labels=["scheme", "status"],
        )
        waiting: dict[tuple[str, str], int] = {}
        for status in ("firing", "resolved", "lost"):
            for row in storage.notifications(status=status, delivered=False):
                where = (row.route.partition(":")[0], status)
                waiting[where] = waiting.get(where, 0) + 1
        for (scheme, status), count in sorted(waiting.items()):
            pending.add_metric([scheme, status], float(count))
        return [actions, breaker, audit, pending]

    def _health(self, now: float) -> list[Metric]:
        service = self._service
        totals = service.totals
        points = CounterMetricFamily(
            "gpuwarden_collector_points",
            "Data points the store accepted or rejected (non-finite, too old or new, over the "
            "series limit).",
            labels=["outcome"],
        )
        points.add_metric(["accepted"], float(totals.accepted))
        points.add_metric(["rejected"], float(totals.rejected))
        duplicates = CounterMetricFamily(
            "gpuwarden_collector_duplicate_rounds",
            "Agent rounds acknowledged without storing them: resent, and stored before.",
            value=float(totals.duplicate_rounds),
        )
        requests = CounterMetricFamily(
            "gpuwarden_collector_requests",
            "Ingest requests (OTLP, Prometheus remote-write) answered, by HTTP status code.",
            labels=["code"],
        )
        # A copy in one C call: the event loop may add a code while this thread reads.
        responses = dict(self._stats.responses) if self._stats is not None else {}
        for code, count in sorted(responses.items()):
            requests.add_metric([str(code)], float(count))
        received = CounterMetricFamily(
            "gpuwarden_collector_remote_write_samples",
            "Prometheus remote-write samples received, by outcome (unmapped_series: series).",
            labels=["outcome"],
        )
        outcomes = dict(self._stats.remote_write_samples) if self._stats is not None else {}
        for outcome, count in sorted(outcomes.items()):
            received.add_metric([outcome], float(count))
        shed = CounterMetricFamily(
            "gpuwarden_collector_requests_shed",
            "OTLP ingest requests answered 503 by reason: wait (they would wait longer than "
            "max_queue_wait_seconds), slots (max_inflight_requests), caller "
            "(max_inflight_per_token).",
            labels=["reason"],
        )
        for reason, count in sorted(dict(self._stats.shed if self._stats else {}).items()):
            shed.add_metric([reason], float(count))
        gone = CounterMetricFamily(
            "gpuwarden_collector_requests_abandoned",
            "OTLP ingest requests not worked on because their client had closed the "
            "connection (an agent that timed out).",
            value=float(self._stats.gone if self._stats is not None else 0),
        )
        waits = [
            GaugeMetricFamily(
                "gpuwarden_collector_event_loop_lag_seconds",
                "How late the event loop runs its timers: what an ingest request waits now "
                "before it is worked on.",
                value=lag.seconds(),
            )
            for lag in ([self._lag] if self._lag is not None else [])
        ]
        refusals = CounterMetricFamily(
            "gpuwarden_collector_auth_refusals",
            "Requests refused by authentication or roles, by method, route template, status "
            "(401 no valid credential, 403 role or node not allowed, 429 throttled) and reason.",
            labels=["method", "route", "status", "reason"],
        )
        refused = dict(self._auth.refusals) if self._auth is not None else {}
        for (method, route, status, reason), count in sorted(refused.items()):
            refusals.add_metric([method, route, str(status), reason], float(count))
        admissions = CounterMetricFamily(
            "gpuwarden_admission_reviews",
            "Admission checks answered (docs/admission.md), by source (kubernetes: the "
            "validating webhook, slurm: job_submit.lua) and verdict (allowed, denied, malformed).",
            labels=["source", "verdict"],
        )
        verdicts = dict(self._admission.verdicts) if self._admission is not None else {}
        for (source, verdict), count in sorted(verdicts.items()):
            admissions.add_metric([source, verdict], float(count))
        lag = GaugeMetricFamily(
            "gpuwarden_collector_lag_seconds",
            "Wall clock minus the time of the newest point received (absent before the first).",
        )
        if totals.last_point_unix > 0:
            lag.add_metric([], now - totals.last_point_unix)
        store = service.store
        simple = [
            GaugeMetricFamily(f"gpuwarden_collector_{name}", doc, value=float(value))
            for name, doc, value in (
                ("series", "Series in the window store.", store.series_count()),
                ("store_memory_bytes", "Bytes the window store holds.", store.memory_bytes()),
                ("nodes", "Nodes whose agents have reported.", len(service.nodes)),
                ("jobs", "Current jobs (schedulers and API).", len(service.registry.jobs())),
            )
        ]
        return [
            points, duplicates, requests, received, shed, gone, *waits, refusals, admissions,
            *simple, lag,
        ]  # fmt: skip


def _seconds(total: RollupTotal) -> tuple[float, float, float]:
    return (total.gpu_seconds_allocated, total.gpu_seconds_busy, total.gpu_seconds_idle)


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: the text format, or OpenMetrics when the scraper asks for it."""
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = await asyncio.to_thread(encoder, request.app[METRICS_REGISTRY])
    return web.Response(body=body, headers={"Content-Type": content_type})


def setup_metrics(
    app: web.Application,
    *,
    accounting_window_seconds: float = DEFAULT_ACCOUNTING_WINDOW_SECONDS,
    max_jobs: int = DEFAULT_MAX_JOBS,
    clock: Callable[[], float] | None = None,
) -> None:
    """Add ``GET /metrics`` (readers: the families name jobs, teams, nodes and costs) reading
    ``app[SERVICE]``.

    The receiver's counters come from ``app[STATS]``, the refusals from ``app[AUTH_STATS]``,
    when the app has them.
    """
    service = app[SERVICE]
    registry = CollectorRegistry()
    registry.register(
        FleetMetrics(
            service,
            stats=app.get(STATS),
            auth=app.get(AUTH_STATS),
            admission=app.get(ADMISSION_STATS),
            lag=app.get(LOOP_LAG),
            accounting_window_seconds=accounting_window_seconds,
            max_jobs=max_jobs,
            clock=clock if clock is not None else service.clock,
            leadership=app.get(LEADERSHIP),
            daily=app.get(DAILY_SPEND),
        )
    )
    app[METRICS_REGISTRY] = registry
    add_route(app, "GET", "/metrics", metrics, READERS)
