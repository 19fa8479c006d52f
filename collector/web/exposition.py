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
  in neither family.

A missing reading is a missing sample, never 0. Each section (GPUs, accounting, health) is
isolated: a failing one is logged and reported as ``gpuwarden_collector_scrape_success{section}
0`` while the others are still served.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuwarden.collector.accounting.gpu_time import UNALLOCATED
from gpuwarden.collector.remediate.states import BREAKER_SCOPE
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import IncidentState, RollupTotal
from gpuwarden.collector.web.app import STATS, IngestStats
from gpuwarden.collector.web.exposition_models import model_families

log = logging.getLogger(__name__)

DEFAULT_ACCOUNTING_WINDOW_SECONDS = 24 * 3600.0
DEFAULT_MAX_JOBS = 500
GPU_LABELS = ("node", "gpu", "gpu_model", "job_key", "team", "model")
"""``job_key``, not ``job``: Prometheus owns ``job`` (the scrape job) and would rename ours."""
KINDS = ("allocated", "busy", "idle")
_JOB_MEASURES = (  # RollupTotal field, family, what it is, divisor to the family's unit
    ("energy_joules", "gpuwarden_job_energy_kwh", "Energy in kWh", 3.6e6),
    ("cost_usd", "gpuwarden_job_cost_usd", "Cost in US dollars", 1.0),
    ("carbon_grams", "gpuwarden_job_carbon_kg", "Carbon in kg CO2e", 1000.0),
)
METRICS_REGISTRY = web.AppKey("metrics_registry", CollectorRegistry)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One per-GPU number, exposed as ``gpuwarden_gpu_<key>``, from the store's ``metric``.

    ``defaults``: attributes that, when a series has them, must have this value (``hw.temperature``
    of the die, not of the memory); a series without them matches, as older agents send none.
    """

    key: str
    metric: str
    documentation: str
    defaults: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def prometheus_name(self) -> str:
        """The family's name."""
        return f"gpuwarden_gpu_{self.key}"


_GPU = MappingProxyType({"hw.type": "gpu"})
# fmt: off
GPU_READINGS: tuple[GpuReading, ...] = (
    GpuReading("utilization_ratio", "hw.gpu.utilization",
               "Fraction of the last sample period in which a kernel ran.",
               MappingProxyType({"hw.gpu.task": "general"})),
    GpuReading("memory_used_bytes", "hw.gpu.memory.usage", "GPU memory in use."),
    GpuReading("memory_total_bytes", "hw.gpu.memory.limit", "Total GPU memory."),
    GpuReading("power_watts", "hw.power", "GPU power draw.", _GPU),
    GpuReading("temperature_celsius", "hw.temperature", "GPU die temperature.",
               MappingProxyType({**_GPU, "hw.sensor_location": "gpu"})),
)
# fmt: on


@dataclass(frozen=True, slots=True)
class GpuStatus:
    """A GPU as the collector sees it now: identity, latest readings, state and current job.

    ``readings`` maps a :data:`GPU_READINGS` key to its latest value (absent: no recent
    sample); ``states`` maps each ``hw.state`` to its one-hot value; ``job_key``, ``team`` and
    ``model_name`` describe the job holding the GPU at the latest slot (None: none, or unknown).
    """

    node: str
    uuid: str
    index: int | None
    model: str
    parent_uuid: str | None
    readings: Mapping[str, float]
    states: Mapping[str, float]
    job_key: str | None
    team: str | None
    model_name: str | None

    @property
    def state(self) -> str | None:
        """The current ``hw.state`` (the one whose one-hot value is 1), if reported."""
        current = [name for name, value in sorted(self.states.items()) if value >= 0.5]
        return current[0] if current else None


def _matches(attrs: Mapping[str, object], defaults: Mapping[str, str]) -> bool:
    return all(str(attrs.get(k, wanted)) == wanted for k, wanted in defaults.items())


def _latest_by_gpu(
    service: CollectorService, metric: str, defaults: Mapping[str, str]
) -> Iterator[tuple[tuple[str, str], Mapping[str, object], float]]:
    latest = service.store.latest(metric)
    for info, value in zip(latest.series, latest.values.tolist(), strict=True):
        attrs = info.attributes
        if math.isfinite(value) and _matches(attrs, defaults):
            yield (str(attrs.get("host.name", "")), str(attrs.get("hw.id", ""))), attrs, value


def _owners(service: CollectorService, now: float) -> dict[tuple[str, str], str]:
    """(node, uuid) → the job holding the largest share of the GPU in the latest slot."""
    best: dict[tuple[str, str], tuple[float, str]] = {}
    for use in service.usage(now - service.store.step_seconds, now):
        if use.job_key == UNALLOCATED or use.gpu_seconds_allocated <= 0:
            continue
        key = (use.node, use.gpu_uuid)
        candidate = (use.gpu_seconds_allocated, use.job_key)
        best[key] = max(best.get(key, candidate), candidate)
    return {key: job_key for key, (_, job_key) in best.items()}


def gpu_statuses(service: CollectorService, now: float) -> list[GpuStatus]:
    """Every GPU (and MIG device) with its latest readings and current job, by node and UUID.

    Blocking (store reads and the ownership of the latest slot): call it from a worker thread.
    MIG devices report the job of their parent GPU.
    """
    readings: dict[tuple[str, str], dict[str, float]] = {}
    for reading in GPU_READINGS:
        for key, _, value in _latest_by_gpu(service, reading.metric, reading.defaults):
            readings.setdefault(key, {})[reading.key] = value
    states: dict[tuple[str, str], dict[str, float]] = {}
    for key, attrs, value in _latest_by_gpu(service, "hw.status", {"hw.type": "gpu"}):
        if "hw.state" in attrs:
            states.setdefault(key, {})[str(attrs["hw.state"])] = value
    owners = _owners(service, now)
    out: dict[tuple[str, str], GpuStatus] = {}
    for ref in service.gpus():
        key = (ref.node, ref.uuid)
        if key in out:  # a changed info series (new driver, new index): one GPU all the same
            continue
        job_key = owners.get(key) or owners.get((ref.node, ref.parent_uuid or ""))
        job = service.registry.get(job_key) if job_key else None
        out[key] = GpuStatus(
            node=ref.node,
            uuid=ref.uuid,
            index=ref.index,
            model=ref.model,
            parent_uuid=ref.parent_uuid,
            readings=MappingProxyType(readings.get(key, {})),
            states=MappingProxyType(states.get(key, {})),
            job_key=job_key,
            team=job.team if job else None,
            model_name=job.model if job else None,
        )
    return [out[key] for key in sorted(out)]


class FleetMetrics:
    """The collector's Prometheus collector: read the service at scrape time.

    Args:
        service: the collector core.
        stats: the OTLP receiver's counters (``gpuwarden_collector_requests_total``), if any.
        accounting_window_seconds: rolling window of the per-job and per-team families.
        max_jobs: cap on jobs in the per-job families (largest by allocated GPU-hours).
        clock: Unix time in seconds (default: the service's clock).
    """

    def __init__(
        self,
        service: CollectorService,
        *,
        stats: IngestStats | None = None,
        accounting_window_seconds: float = DEFAULT_ACCOUNTING_WINDOW_SECONDS,
        max_jobs: int = DEFAULT_MAX_JOBS,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if accounting_window_seconds <= 0 or max_jobs < 0:
            raise ValueError("accounting_window_seconds must be > 0 and max_jobs >= 0")
        self._service = service
        self._stats = stats
        self._window = accounting_window_seconds
        self._max_jobs = max_jobs
        self._clock = clock if clock is not None else service.clock

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
            ("accounting", self._accounting),
            ("models", self._models),
            ("incidents", self._incidents),
            ("remediation", self._remediation),
            ("health", self._health),
        )
        for name, section in sections:
            try:
                families = section(now)
            except Exception:  # one broad except per section: the other sections still serve
                log.exception("metrics section %s failed", name)
                success.add_metric([name], 0.0)
                continue
            success.add_metric([name], 1.0)
            yield from families
        yield success

    def _gpus(self, now: float) -> list[Metric]:
        gauges = {
            r.key: GaugeMetricFamily(r.prometheus_name, r.documentation, labels=GPU_LABELS)
            for r in GPU_READINGS
        }
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
        return [*gauges.values(), status]

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
            "states such as awaiting_approval, dry_run, verified, rolled_back, escalated).",
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
        requests = CounterMetricFamily(
            "gpuwarden_collector_requests",
            "OTLP ingest requests answered, by HTTP status code.",
            labels=["code"],
        )
        # A copy in one C call: the event loop may add a code while this thread reads.
        responses = dict(self._stats.responses) if self._stats is not None else {}
        for code, count in sorted(responses.items()):
            requests.add_metric([str(code)], float(count))
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
        return [points, requests, *simple, lag]


def _seconds(total: RollupTotal) -> tuple[float, float, float]:
    return (total.gpu_seconds_allocated, total.gpu_seconds_busy, total.gpu_seconds_idle)


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: the text format, or OpenMetrics when the scraper asks for it."""
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = await asyncio.to_thread(encoder, request.app[METRICS_REGISTRY])
    return web.Response(body=body, headers={"Content-Type": content_type})


def setup_metrics(
    app: web.Application,
    service: CollectorService,
    *,
    accounting_window_seconds: float = DEFAULT_ACCOUNTING_WINDOW_SECONDS,
    max_jobs: int = DEFAULT_MAX_JOBS,
    clock: Callable[[], float] | None = None,
) -> None:
    """Add ``GET /metrics`` (no authentication, like node exporters) reading ``service``.

    Call it after ``app[STATS]`` is set. This module imports ``collector.app``, so ``app.py``
    must import it inside a function (or the composition root calls it), not at its top.
    """
    registry = CollectorRegistry()
    registry.register(
        FleetMetrics(
            service,
            stats=app.get(STATS),
            accounting_window_seconds=accounting_window_seconds,
            max_jobs=max_jobs,
            clock=clock if clock is not None else service.clock,
        )
    )
    app[METRICS_REGISTRY] = registry
    app.router.add_get("/metrics", metrics)
