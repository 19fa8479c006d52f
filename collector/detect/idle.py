"""Idle allocated GPUs, screened for every GPU at once on the store's series × time matrix.

A GPU is idle when a job holds it for the whole window and every sample in the window is below
the threshold, with at least ``min_coverage`` of the window's slots sampled. A window with too
few samples is UNKNOWN: missing data never counts as idle, and never as healthy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.detect.findings import Verdict

FloatMatrix = npt.NDArray[np.floating[Any]]
BoolMatrix = npt.NDArray[np.bool_]


def idle_verdicts(
    utilization: FloatMatrix,
    held: BoolMatrix,
    *,
    threshold_ratio: float,
    min_coverage: float = 0.8,
) -> npt.NDArray[np.int8]:
    """Per GPU (row): FIRING, CLEAR or UNKNOWN over the window the columns span.

    Args:
        utilization: GPUs × slots, NaN where no sample arrived.
        held: GPUs × slots, True where a job held the GPU.
        threshold_ratio: utilisation below this is idle.
        min_coverage: fraction of slots that must have a sample for any verdict.
    """
    if utilization.shape != held.shape:
        raise ValueError(f"shapes differ: {utilization.shape} vs {held.shape}")
    if not 0 < min_coverage <= 1:
        raise ValueError("min_coverage must be in (0, 1]")
    known = ~np.isnan(utilization)
    n_slots = utilization.shape[1]
    coverage = known.sum(axis=1) / n_slots if n_slots else np.zeros(utilization.shape[0])
    busy_seen = (known & (np.nan_to_num(utilization, nan=0.0) >= threshold_ratio)).any(axis=1)
    held_all = held.all(axis=1) if n_slots else np.zeros(utilization.shape[0], dtype=bool)
    verdict = np.full(utilization.shape[0], Verdict.UNKNOWN, dtype=np.int8)
    enough = coverage >= min_coverage
    verdict[~held_all] = Verdict.CLEAR  # not allocated for the whole window: not this rule's case
    verdict[held_all & busy_seen] = Verdict.CLEAR  # one busy sample clears the window
    verdict[held_all & enough & ~busy_seen] = Verdict.FIRING
    return verdict
