"""Which recomputed accounting rows may replace the stored ones: never a period with less data.

Accounting recomputes its last periods at every run, so late and spooled samples land in them.
A recomputed period is only as good as the window it was read from: after a restart (a
``kill -9``, an upgrade) the window is empty or holds only what the agents resent, and the same
period read again knows less than when it was first written. Writing it anyway turned known
busy time into "no data" at every restart (issue 16: a job's unknown GPU-hours grew 0.006 →
0.65 over five restarts while its busy hours fell). So a GPU's recomputed period replaces the
stored one only when it knows at least as much of the GPU's time: its sampled (busy + idle)
seconds are at least the stored rows'. With as much data the recomputed rows win (a job the
registry learnt since, a late sample that moved a slot from idle to busy); with less, the stored
rows stay.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from gpuwarden.collector.storage.records import AccountingRow

Scope = tuple[float, str]
"""(period start, GPU UUID): the unit a batch of rows replaces in storage."""

KNOWN_TOLERANCE_SECONDS = 1e-6
"""Sums of float seconds that differ by less than this are equal (rounding, not data)."""


def known_seconds(rows: Iterable[AccountingRow]) -> dict[Scope, float]:
    """Sampled (busy + idle) GPU seconds per (period, GPU) of ``rows``."""
    known: dict[Scope, float] = defaultdict(float)
    for row in rows:
        known[(row.period_start, row.gpu_uuid)] += row.gpu_seconds_busy + row.gpu_seconds_idle
    return dict(known)


def not_less_informed(
    recomputed: Sequence[AccountingRow], stored: Iterable[AccountingRow]
) -> list[AccountingRow]:
    """The rows of ``recomputed`` whose (period, GPU) knows at least as much as ``stored``.

    A scope missing from ``stored`` is new and always kept; a scope missing from ``recomputed``
    is not written at all, so its stored rows stay as they are.
    """
    before = known_seconds(stored)
    after = known_seconds(recomputed)
    keep = {
        scope
        for scope, seconds in after.items()
        if seconds + KNOWN_TOLERANCE_SECONDS >= before.get(scope, 0.0)
    }
    return [row for row in recomputed if (row.period_start, row.gpu_uuid) in keep]
