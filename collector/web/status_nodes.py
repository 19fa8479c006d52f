"""The status page's view of silent nodes: its own module, so the page keeps one small hook.

A node silent for longer than the store's staleness bound is shown as silent with the age of
its last sample; its GPUs are not "reporting" and its power and utilisation are not counted
(``gpu_statuses`` already leaves stale readings out: this module says why they are missing).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.gpus import GpuStatus
from gpuwarden.collector.web.liveness import node_liveness


def _age(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def node_freshness(
    service: CollectorService, now: float, gpus: Sequence[GpuStatus], rows: list[dict[str, object]]
) -> dict[str, object]:
    """Mark each node row (``rows``: dicts with ``name``) reporting or silent, in place, and
    return the fleet tiles: GPUs reporting (a fresh reading) and the silent nodes."""
    live = {n.node: n for n in node_liveness(service, now)}
    silent = []
    for row in rows:
        node = live.get(str(row["name"]))
        if node is not None and node.up:
            row["state"] = "reporting"
            continue
        row["state"] = f"silent {_age(node.age_seconds)}" if node is not None else "silent"
        row["silent"] = True
        row["utilization"] = row["power"] = "—"
        silent.append(str(row["name"]))
    return {
        "gpus_reporting": sum(1 for g in gpus if g.readings),
        "silent_nodes": silent,
    }
