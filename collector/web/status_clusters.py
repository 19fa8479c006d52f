"""The organisation on the status page: one row per cluster sharing this collector's database.

Several collectors (one per cluster or region, ``cluster:`` in each config) may write to one
PostgreSQL; each one's ``/status`` then shows every cluster side by side over the last 24 h:
GPUs with accounting, GPU-hours, idle GPU-hours, cost and open incidents. A database holding
one cluster shows no such table (the page is that cluster's). Read from the accounting rollups
(two grouped queries) and the open-incident counts, never from another collector.
Rendered by ``templates/status.html``.
"""

from __future__ import annotations

from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.clusters import ALL_CLUSTERS
from gpuwarden.collector.storage.records import IncidentState

WINDOW_SECONDS = 24 * 3600.0


def clusters_context(storage: Storage, now: float) -> list[dict[str, object]]:
    """One row per cluster with accounting in the window or open incidents (empty when there
    is only one), by name."""
    since = now - WINDOW_SECONDS
    totals = storage.rollups(since=since, until=now, by=("cluster",), cluster=ALL_CLUSTERS)
    gpus: dict[str, int] = {}
    for row in storage.rollups(
        since=since, until=now, by=("cluster", "gpu_uuid"), cluster=ALL_CLUSTERS
    ):
        name = str(row.group["cluster"])
        gpus[name] = gpus.get(name, 0) + 1
    open_incidents = storage.incident_counts(state=IncidentState.OPEN)
    by_name = {str(t.group["cluster"]): t for t in totals}
    names = sorted(set(by_name) | set(open_incidents))
    if len(names) <= 1:
        return []
    rows: list[dict[str, object]] = []
    for name in names:
        total = by_name.get(name)
        rows.append(
            {
                "name": name,
                "own": name == storage.cluster,
                "gpus": gpus.get(name, 0),
                "gpu_hours": _hours(None if total is None else total.gpu_seconds_allocated),
                "idle_hours": _hours(None if total is None else total.gpu_seconds_idle),
                "cost": "—"
                if total is None or total.cost is None
                else f"{total.cost:,.2f} {total.currency or ''}".rstrip(),
                "open_incidents": open_incidents.get(name, 0),
            }
        )
    return rows


def _hours(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds / 3600:,.2f}"
