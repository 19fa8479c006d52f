"""Which nodes are reporting: each node's last-seen time, its age and whether it is up.

Read by ``/metrics`` (``gpuwarden_node_up``, ``gpuwarden_node_last_seen_age_seconds``) and the
status page alike, so the two agree. A node is up while its newest point, from any series, is at
most the store's ``staleness_seconds`` old; after that it is silent, and its series are stale:
left out of ``/metrics``, unknown to detectors. A node leaves this list when the store evicts its
last series (``WindowStore.evict_stale``, the recent window by default). No routes here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.collector.service import CollectorService


@dataclass(frozen=True, slots=True)
class NodeLiveness:
    """One node's freshness at ``now``."""

    node: str
    last_seen: float
    """Unix seconds of the node's newest point."""
    age_seconds: float
    """``now - last_seen`` (never below 0: a node ahead of the clock is reporting)."""
    up: bool
    """The age is within the staleness bound."""


def node_liveness(service: CollectorService, now: float) -> list[NodeLiveness]:
    """Every node the store holds a series of, sorted by name (blocking: a store read)."""
    store = service.store
    bound = store.staleness_seconds
    out = []
    for node, seen in sorted(store.last_seen_by_host().items()):
        age = max(0.0, now - seen)
        out.append(NodeLiveness(node=node, last_seen=seen, age_seconds=age, up=age <= bound))
    return out
