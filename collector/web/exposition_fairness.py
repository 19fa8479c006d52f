"""Fairness families for ``/metrics``: each team's share used vs target, queue waits, pending
jobs and preemptions over the accounting window (default 24 h), per team and per queue.

Read at scrape time from the jobs the collector knows (``squeue``, Kubernetes pods, the API;
each job's latest attempt), Kueue's Workloads in place of their pods (the registry's last
list, :mod:`~gpuwarden.collector.fairness.kueue`), through
:func:`~gpuwarden.collector.fairness.figures.fairness_figures`; targets from
``fairness.targets`` (equal shares of the teams seen when none is set). A figure without data
(no waits, no use) is a missing sample, never 0. The families are gauges over the window:
``preemptions`` counts the window's, it is not a counter.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from gpuwarden.collector.fairness.figures import WAIT_QUANTILES, GroupFigures, fairness_figures
from gpuwarden.collector.fairness.kueue import runs_with_workloads
from gpuwarden.collector.service import CollectorService

Figure = Callable[[GroupFigures], float | None]
#: (team family, queue family or None, what it is, the figure)
_FIGURES: tuple[tuple[str, str | None, str, Figure], ...] = (
    (
        "gpuwarden_fairness_share_used_ratio",
        "gpuwarden_fairness_queue_share_used_ratio",
        "Share of the GPU-seconds used",
        lambda g: g.share_used_ratio,
    ),
    (
        "gpuwarden_fairness_share_target_ratio",
        None,
        "Entitled share (fairness.targets; equal shares when none is set)",
        lambda g: g.share_target_ratio,
    ),
    (
        "gpuwarden_fairness_gpu_hours",
        "gpuwarden_fairness_queue_gpu_hours",
        "GPU-hours used",
        lambda g: g.gpu_hours,
    ),
    (
        "gpuwarden_fairness_pending_jobs",
        "gpuwarden_fairness_queue_pending_jobs",
        "Jobs pending at scrape time",
        lambda g: float(g.pending),
    ),
    (
        "gpuwarden_fairness_preemptions",
        "gpuwarden_fairness_queue_preemptions",
        "Jobs preempted",
        lambda g: float(g.preemptions),
    ),
    (
        "gpuwarden_fairness_preempted_gpu_hours",
        "gpuwarden_fairness_queue_preempted_gpu_hours",
        "GPU-hours of the preempted runs",
        lambda g: g.preempted_gpu_hours,
    ),
    (
        "gpuwarden_fairness_wait_seconds",
        "gpuwarden_fairness_queue_wait_seconds",
        "Queue wait quantiles: start - eligible (or submit), pending jobs with their wait so far",
        lambda g: None,  # by quantile, below
    ),
)
_WAITS: dict[float, Figure] = {
    WAIT_QUANTILES[0]: lambda g: g.wait_p50_seconds,
    WAIT_QUANTILES[1]: lambda g: g.wait_p95_seconds,
}


def fairness_families(service: CollectorService, now: float, window_seconds: float) -> list[Metric]:
    """The ``gpuwarden_fairness_*`` families over ``[now - window_seconds, now)``."""
    runs = runs_with_workloads(
        service.registry.known(), service.registry.kueue_workloads(), since=now - window_seconds
    )
    targets = service.fleet.accounting.fairness_targets
    figures = fairness_figures(runs, since=now - window_seconds, until=now, targets=targets)
    window = f"over the last {window_seconds / 3600:g} h"
    out: list[Metric] = []
    for kind, groups in (("team", figures.teams), ("queue", figures.queues)):
        for team_family, queue_family, what, figure in _FIGURES:
            name = team_family if kind == "team" else queue_family
            if name is None:
                continue
            waits = name.endswith("_wait_seconds")
            labels = [kind, "quantile"] if waits else [kind]
            family = GaugeMetricFamily(name, f"{what}, by {kind}, {window}.", labels=labels)
            for group in groups:
                for quantile, read in _WAITS.items() if waits else ((None, figure),):
                    value = read(group)
                    if value is not None:
                        suffix = [] if quantile is None else [f"{quantile:g}"]
                        family.add_metric([group.group, *suffix], value)
            out.append(family)
    return out
