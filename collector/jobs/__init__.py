"""Scheduler adapters for the collector's job registry: one module per scheduler boundary.

Each adapter implements :class:`~gpuwarden.collector.jobs.model.JobSource`. ``slurm`` drives the
Slurm
CLI (``squeue --json``); ``kubernetes`` lists pods through the official client. Neither is
imported here, so that importing the package pulls in no scheduler's dependencies.
"""

from __future__ import annotations


class JobSourceError(RuntimeError):
    """The scheduler could not be asked or gave an answer we cannot read.

    The registry keeps the last good list when a poll raises this; the message says what failed
    (exit status and the tail of stderr, or the API status and reason).
    """
