"""Cluster names: which cluster's rows a collector reads and writes in a shared database.

One collector (or HA pair) runs per cluster or region; several may share one PostgreSQL (or,
on one host, one SQLite file). Every cluster-scoped row carries its collector's ``cluster``
(migration 9), and a store reads and writes only its own cluster's rows unless a read asks for
:data:`ALL_CLUSTERS` (the organisation-wide views: ``report costs``, ``/status``, the API's
``?cluster=``).

A name is written into the ``cluster`` label of every remote-written series, so it must be a
label value that reads well in PromQL and on a page: 1 to 63 characters, letters, digits,
``.``, ``_`` and ``-``, starting with a letter or digit. ``*`` is therefore never a name, and
stands for every cluster.
"""

from __future__ import annotations

import re

DEFAULT_CLUSTER = "default"
"""The cluster of a collector whose config names none (and of every row written before
clusters existed)."""

ALL_CLUSTERS = "*"
"""A read's scope meaning every cluster on the database."""

MAX_CLUSTER_CHARS = 63
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def cluster_problem(name: str) -> str | None:
    """Why ``name`` cannot be a cluster name, or ``None`` when it can."""
    if _NAME.fullmatch(name) is None:
        return (
            f"{name!r} is not a cluster name: 1 to {MAX_CLUSTER_CHARS} letters, digits, '.', "
            "'_' or '-', starting with a letter or digit"
        )
    return None


def check_cluster(name: str) -> str:
    """``name`` if it is a valid cluster name.

    Raises:
        ValueError: it is not (the message says what a name may hold).
    """
    problem = cluster_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return name


def check_scope(text: str) -> str:
    """A read's scope as written (an API's ``?cluster=``): a cluster name or ``*``.

    Raises:
        ValueError: neither.
    """
    return text if text == ALL_CLUSTERS else check_cluster(text)


def scope_sql(cluster: str, column: str = "cluster") -> tuple[str, tuple[str, ...]]:
    """The ``WHERE`` condition (and its parameters) that keeps the rows of ``cluster``, or
    every row for :data:`ALL_CLUSTERS`."""
    if cluster == ALL_CLUSTERS:
        return "1 = 1", ()
    return f"{column} = ?", (check_cluster(cluster),)
