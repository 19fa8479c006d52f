"""Peer outliers: the group screen ``detect_bench`` adds when its backgrounds are real peers.

Bench only: no detector uses it (``straggler`` computes its own one-sided band against a
baseline's spread). Vectorised over groups like the screen primitives it is built from
(:mod:`gpuwarden.collector.detect.numerics.screen`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.detect.numerics import screen


@dataclass(frozen=True)
class PeerOutliers:
    """Per member: an outlier flag, and the fraction of its judged slots outside the band."""

    outlier: screen.BoolVector | screen.BoolMatrix
    fraction_outside: screen.FloatVector | screen.FloatMatrix


def peer_outliers(
    x: npt.ArrayLike,
    tolerance: float,
    outside_fraction: float,
    *,
    min_peers: int = 3,
    min_scale: float = screen.DEFAULT_MIN_SCALE,
) -> PeerOutliers:
    """Datadog-style MAD outliers: members outside ``median ± tolerance·scale`` too often.

    At every slot, the band is the point-wise median of the known members ± ``tolerance`` times
    their robust scale (``screen.robust_scale``). A member is an outlier when more than
    ``outside_fraction`` of its judged slots fall outside. A slot is judged for a member only
    where the member is known and at least ``min_peers`` members are known; a member with no
    judged slot has NaN fraction and is never an outlier.

    Args:
        x: members × time for one group, or groups × members × time for many groups at once.
        tolerance: half-width of the band in robust sigmas of the group.
        outside_fraction: a member is an outlier above this fraction of judged slots outside.
        min_peers: fewest known members for a slot to be judged.
        min_scale: absolute floor on the group's scale, in the series' unit.
    """
    values = np.asarray(x, dtype=np.float64)
    if values.ndim not in (2, 3):
        raise ValueError(f"expected members × time or groups × members × time, got {values.shape}")
    center = screen.nanmedian(values, axis=-2)
    scale = screen.robust_scale(values, center, axis=-2, min_scale=min_scale)
    known = ~np.isnan(values)
    peers = np.sum(known, axis=-2, keepdims=True)
    judged = known & (peers >= min_peers)
    with np.errstate(invalid="ignore"):
        # NaN compares False: a missing sample or an unscaled slot is never "outside".
        outside = judged & (
            np.abs(values - np.expand_dims(center, -2)) > tolerance * np.expand_dims(scale, -2)
        )
    n_judged = judged.sum(axis=-1)
    fraction = np.where(n_judged > 0, outside.sum(axis=-1) / np.maximum(n_judged, 1), np.nan)
    with np.errstate(invalid="ignore"):
        flag = (n_judged > 0) & (fraction > outside_fraction)
    return PeerOutliers(outlier=flag, fraction_outside=fraction)
