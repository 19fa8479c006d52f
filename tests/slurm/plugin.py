"""Fixtures: a private single-node Slurm cluster, and one that keeps job accounting."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.slurm.cluster import SlurmCluster, missing_binaries


def _skip_unless_runnable(*, accounting: bool) -> None:
    missing = missing_binaries(accounting=accounting)
    if missing:
        pytest.skip(f"Slurm/munge/MariaDB programs not installed: {', '.join(missing)}")
    if os.geteuid() != 0:
        pytest.skip("the private Slurm cluster must run as root (daemons, mknod)")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd once per session on private ports; stop them after.

    Skips when the Debian packages (slurmctld, slurmd, slurm-client, munge) are missing or when
    not root (the daemons run as root and ``mknod`` makes the fake GPU devices).
    """
    _skip_unless_runnable(accounting=False)
    with SlurmCluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_accounting_cluster() -> Iterator[SlurmCluster]:
    """A cluster that keeps job accounting (``sacct``): MariaDB and slurmdbd besides the
    daemons above, on loopback, and partitions ``batch`` (default) and ``urgent`` (preempts
    ``batch`` by requeueing). Opt-in: only tests that ask for it start it.

    Skips as ``slurm_cluster`` does, and also when slurmdbd or MariaDB (Debian packages
    ``slurmdbd``, ``mariadb-server``) are missing.
    """
    _skip_unless_runnable(accounting=True)
    with SlurmCluster(accounting=True) as cluster:
        yield cluster
