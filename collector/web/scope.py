"""A read's cluster scope (``?cluster=NAME|*``) and reading per cluster, for the JSON API.

A collector's API answers about its own cluster unless ``?cluster=`` names another cluster on
the shared database or ``*`` (every one). Rows do not carry their cluster, so an
organisation-wide read goes cluster by cluster and labels each row with its cluster's name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.clusters import ALL_CLUSTERS, check_scope

T = TypeVar("T")


def scope_of(query: str | None, storage: Storage) -> str:
    """The scope a request asks for: its ``?cluster=`` value checked, else the store's cluster.

    Raises:
        ValueError: the value is neither a cluster name nor ``*``.
    """
    return storage.cluster if query is None else check_scope(query)


def per_cluster(
    storage: Storage, scope: str, read: Callable[[str], Sequence[T]]
) -> list[tuple[str, T]]:
    """``read(cluster)`` for the scope's cluster, or for every cluster on the database, each row
    with its cluster's name (in cluster order: the caller sorts)."""
    names = storage.cluster_names() if scope == ALL_CLUSTERS else [scope]
    return [(name, row) for name in names for row in read(name)]
