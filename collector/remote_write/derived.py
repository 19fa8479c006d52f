"""Derived series for the TSDB: each job's GPU-hours, energy and cost from the accounting.

The same families, labels and rolling window as the collector's ``/metrics``
(``gpuwarden_job_gpu_hours{job_key,team,model,kind}``, ``gpuwarden_job_energy_kwh``,
``gpuwarden_job_cost_usd``), sampled at ``now`` each accounting period: a site without a
Prometheus scraping the collector gets the same history in its TSDB. Read from the storage's
rollups (one grouped query), so it costs what one ``/metrics`` scrape's accounting does.
"""

from __future__ import annotations

from gpuwarden.collector.remote_write.naming import labels
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import RollupDimension, RollupTotal

WINDOW_SECONDS = 24 * 3600.0
MAX_JOBS = 500
"""The largest jobs by allocated GPU-hours, as ``/metrics`` caps them."""
GROUP: tuple[RollupDimension, ...] = ("job_key", "team", "model")
_MEASURES = (  # RollupTotal field, name, divisor to the family's unit
    ("energy_joules", "gpuwarden_job_energy_kwh", 3.6e6),
    ("cost", "gpuwarden_job_cost_usd", 1.0),
)

DerivedSample = tuple[tuple[tuple[str, str], ...], int, float]
"""(labels, milliseconds, value)."""


def job_samples(
    storage: Storage,
    now: float,
    *,
    window_seconds: float = WINDOW_SECONDS,
    max_jobs: int = MAX_JOBS,
) -> list[DerivedSample]:
    """Each job's totals over the last ``window_seconds`` as samples at ``now``."""
    totals = storage.rollups(since=now - window_seconds, until=now, by=GROUP)
    jobs = [t for t in totals if t.group["job_key"] is not None]
    jobs.sort(key=lambda t: (-t.gpu_seconds_allocated, str(t.group["job_key"])))
    t_ms = int(now * 1000)
    out: list[DerivedSample] = []
    for total in jobs[:max_jobs]:
        group = [(d, total.group[d]) for d in GROUP]
        for kind, seconds in _hours(total):
            series = labels("gpuwarden_job_gpu_hours", [*group, ("kind", kind)])
            out.append((series, t_ms, seconds / 3600))
        for attr, name, divisor in _MEASURES:
            value = getattr(total, attr)
            if value is not None:  # missing inputs stay missing, never 0
                out.append((labels(name, group), t_ms, value / divisor))
    return out


def _hours(total: RollupTotal) -> tuple[tuple[str, float], ...]:
    return (
        ("allocated", total.gpu_seconds_allocated),
        ("busy", total.gpu_seconds_busy),
        ("idle", total.gpu_seconds_idle),
    )
