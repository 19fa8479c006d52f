"""Fixtures: a private single-node Slurm cluster."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.slurm.cluster import SlurmCluster, missing_binaries


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd once per session on private ports; stop them after.

    Skips when the Debian packages (slurmctld, slurmd, slurm-client, munge) are missing or when
    not root (the daemons run as root and ``mknod`` makes the fake GPU devices).
    """
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm/munge programs not installed: {', '.join(missing)}")
    if os.geteuid() != 0:
        pytest.skip("the private Slurm cluster must run as root (daemons, mknod)")
    with SlurmCluster() as cluster:
        yield cluster
