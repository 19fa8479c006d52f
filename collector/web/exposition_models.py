"""Model-serving families for ``/metrics``: request rates, latency quantiles, queues, SLOs.

Read from the window store over the last ``MODEL_WINDOW_SECONDS`` and labelled by the ``model``
attribute (the scraper maps vLLM's ``model_name`` to it; workloads sending OTLP set it). A
model's series from several replicas are summed (rates) or merged bucket by bucket (latency),
so the quantile is the deployment's, not an average of replicas' quantiles.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import EventKind
from gpuwarden.collector.store.histograms import histogram_quantile

MODEL_WINDOW_SECONDS = 300.0
QUANTILES = (0.5, 0.95, 0.99)
REQUESTS = "gpuwarden.model.requests"
LATENCY = "gpuwarden.model.request.latency"
QUEUE = "gpuwarden.model.queue.size"
RANGE_READS = frozenset({REQUESTS})
"""What the families read over a time range (request increases): kept in the recent ring."""


def model_families(service: CollectorService, now: float) -> list[Metric]:
    """The ``gpuwarden_model_*`` families at ``now``."""
    start, end = now - MODEL_WINDOW_SECONDS, now
    return [
        _request_rates(service, start, end),
        _latency(service, start, end),
        _queue(service),
        *_deployments(service),
    ]


def _model(attributes: Mapping[str, object]) -> str | None:
    value = attributes.get("model")
    return str(value) if value is not None and value != "" else None


def _request_rates(service: CollectorService, start: float, end: float) -> Metric:
    family = GaugeMetricFamily(
        "gpuwarden_model_request_rate",
        f"Requests per second over the last {MODEL_WINDOW_SECONDS:g} s by model and outcome "
        "(success, failure, cancelled).",
        labels=["model", "outcome"],
    )
    increases = service.store.increase_matrix(REQUESTS, start=start, end=end)
    sums: dict[tuple[str, str], float] = {}
    for info, row in zip(increases.series, increases.values, strict=True):
        model = _model(info.attributes)
        if model is None or np.isnan(row).all():
            continue  # no data is not zero requests
        outcome = str(info.attributes.get("outcome", "success"))
        key = (model, outcome)
        sums[key] = sums.get(key, 0.0) + float(np.nansum(row))
    for (model, outcome), total in sorted(sums.items()):
        family.add_metric([model, outcome], total / (end - start))
    return family


def _latency(service: CollectorService, start: float, end: float) -> Metric:
    family = GaugeMetricFamily(
        "gpuwarden_model_latency_seconds",
        f"End-to-end request latency quantiles over the last {MODEL_WINDOW_SECONDS:g} s, "
        "from the model's histograms merged across replicas.",
        labels=["model", "quantile"],
    )
    merged: dict[str, tuple[tuple[float, ...], npt.NDArray[np.float64]]] = {}
    store = service.store
    for key in store.histogram_keys(LATENCY):
        model = _model(dict(key[1]))
        window = store.bucket_counts(key, start, end) if model else None
        if model is None or window is None:
            continue
        previous = merged.get(model)
        if previous is None:
            merged[model] = (window.bounds, window.counts.copy())
        elif previous[0] == window.bounds:
            previous[1][:] += window.counts
        # replicas with other bucket bounds cannot be merged exactly: the first layout wins
    for model, (bounds, counts) in sorted(merged.items()):
        for q in QUANTILES:
            value = histogram_quantile(q, bounds, counts)
            if not math.isnan(value):
                family.add_metric([model, f"{q:g}"], value)
    return family


def _queue(service: CollectorService) -> Metric:
    family = GaugeMetricFamily(
        "gpuwarden_model_queue_size",
        "Requests waiting or running, summed across a model's replicas (newest samples).",
        labels=["model", "state"],
    )
    latest = service.store.latest(QUEUE)
    sums: dict[tuple[str, str], float] = {}
    for info, value in zip(latest.series, latest.values, strict=True):
        model = _model(info.attributes)
        if model is None or math.isnan(float(value)):
            continue
        key = (model, str(info.attributes.get("state", "waiting")))
        sums[key] = sums.get(key, 0.0) + float(value)
    for (model, state), total in sorted(sums.items()):
        family.add_metric([model, state], total)
    return family


def _deployments(service: CollectorService) -> list[Metric]:
    replicas = GaugeMetricFamily(
        "gpuwarden_model_replicas", "Replicas of a model deployment.", labels=["model", "version"]
    )
    latency_slo = GaugeMetricFamily(
        "gpuwarden_model_slo_latency_p99_seconds",
        "The model's p99 latency objective.",
        labels=["model"],
    )
    error_slo = GaugeMetricFamily(
        "gpuwarden_model_slo_error_ratio",
        "The model's error-ratio objective (1 - availability target).",
        labels=["model"],
    )
    deployed = GaugeMetricFamily(
        "gpuwarden_model_deploy_time_seconds",
        "Unix time of the model's latest deploy (or rollback) event, by the version deployed.",
        labels=["model", "version"],
    )
    latest: dict[str, tuple[float, str]] = {}
    for event in service.storage.events(kinds=(EventKind.DEPLOY, EventKind.ROLLBACK)):
        # workloads' announcements record {"from", "to"}; API callers may send {"version"}
        version = str(event.attributes.get("to", event.attributes.get("version", "")))
        if event.time >= latest.get(event.subject, (-math.inf, ""))[0]:
            latest[event.subject] = (event.time, version)
    for name, (when, version) in sorted(latest.items()):
        deployed.add_metric([name, version], when)
    for model in service.storage.models():
        replicas.add_metric([model.name, model.version], float(model.replicas))
        if model.slo_latency_p99_seconds is not None:
            latency_slo.add_metric([model.name], model.slo_latency_p99_seconds)
        if model.slo_error_ratio is not None:
            error_slo.add_metric([model.name], model.slo_error_ratio)
    return [replicas, latency_slo, error_slo, deployed]
