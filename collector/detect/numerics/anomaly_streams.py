"""Evidence streams and record suppression for :mod:`gpuwarden.collector.detect.numerics.anomaly`.

Every function here is causal: the output at row ``t`` depends on rows ``<= t`` only, and is
computed element by element (no matrix product whose rounding could depend on how many rows
follow), so the scores of a prefix are bit-identical whatever comes after it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

FloatVector = npt.NDArray[np.float64]

_KNN_BLOCK_ROWS = 512  # query rows per block: bounds memory at block x reference_rows floats


def knn_distance(
    values: FloatVector,
    window_rows: int,
    reference_rows: int,
    neighbours: int,
    min_reference_rows: int,
) -> FloatVector:
    """Mean distance from the shape ending at ``t`` to its ``neighbours`` nearest past shapes.

    A shape is the ``window_rows`` values ending at a row (gaps carried forward). The candidates
    are the ``reference_rows`` shapes that end at least ``window_rows`` rows before ``t`` (so they
    do not overlap it): a conformal-style nonconformity in the spirit of KNN CAD (Burnaev and
    Ishimtsev, 2016). It is large when the recent pattern has no close match in recent history,
    whatever the level or unit of the series. NaN until ``min_reference_rows`` (and at least
    ``neighbours``) candidates exist, and where ``values`` is NaN.
    """
    out = np.full(values.shape, np.nan)
    known = np.flatnonzero(np.isfinite(values))
    if known.size == 0:
        return out
    first = int(known[0])
    filled = pd.Series(values[first:]).ffill().to_numpy(dtype=np.float64)
    if filled.size < window_rows:
        return out
    shapes: FloatVector = np.lib.stride_tricks.sliding_window_view(filled, window_rows)
    alpha = _knn_alpha(shapes, window_rows, reference_rows, neighbours, min_reference_rows)
    out[first + window_rows - 1 :] = alpha
    return np.where(np.isnan(values), np.nan, out)


def _knn_alpha(
    shapes: FloatVector, gap: int, reference_rows: int, neighbours: int, min_reference_rows: int
) -> FloatVector:
    count = shapes.shape[0]
    alpha = np.full(count, np.nan)
    for q0 in range(0, count, _KNN_BLOCK_ROWS):
        q1 = min(count, q0 + _KNN_BLOCK_ROWS)
        r0, r1 = max(0, q0 - gap - reference_rows + 1), max(0, q1 - gap)
        if r1 - r0 < neighbours:
            continue
        d2 = np.zeros((q1 - q0, r1 - r0))
        for lag in range(shapes.shape[1]):  # elementwise, so a row never depends on the block
            d2 += np.subtract.outer(shapes[q0:q1, lag], shapes[r0:r1, lag]) ** 2
        query = np.arange(q0, q1)[:, np.newaxis]
        ref = np.arange(r0, r1)[np.newaxis, :]
        valid = (ref <= query - gap) & (ref > query - gap - reference_rows)
        d2[~valid] = np.inf
        nearest = np.partition(d2, neighbours - 1, axis=1)[:, :neighbours]
        block = np.sqrt(nearest).mean(axis=1)
        block[valid.sum(axis=1) < max(neighbours, min_reference_rows)] = np.nan
        alpha[q0:q1] = block
    return alpha


def context_novelty(
    values: FloatVector, levels: int, max_order: int, warmup_rows: int
) -> FloatVector:
    """Fraction of orders ``1..max_order`` whose context (last k quantised values) is new.

    Values are quantised into bins of width ``(q99 - q1) / levels`` of the first ``warmup_rows``
    known values (unbounded: a value outside that range gets a new bin). The contexts of those
    rows are learnt once they are all known; from then on, at each known row the contexts of the
    last 1, 2, ... ``max_order`` known bins are looked up in what has been seen so far and then
    remembered, and the score is the share never seen before. A new level, a new transition or
    a new short pattern all score, repetition of anything seen does not, so noise and
    seasonality stop scoring once learnt. NaN during the warm-up and where ``values`` is NaN.
    """
    out = np.full(values.shape, np.nan)
    known_rows = np.flatnonzero(np.isfinite(values))
    if known_rows.size <= warmup_rows:
        return out  # the bins would depend on rows still to come
    head = values[known_rows[:warmup_rows]]
    low, high = np.quantile(head, [0.01, 0.99])
    width = (high - low) / levels
    if not width > 0:  # a flat start: any change at all is a new level
        width = 1e-6 * (1.0 + abs(low))
    bins = np.floor((values[known_rows] - low) / width).astype(np.int64).tolist()
    seen: list[set[tuple[int, ...]]] = [set() for _ in range(max_order)]
    novelty = np.empty(len(bins))
    for i in range(len(bins)):
        new = 0
        for order in range(1, min(max_order, i + 1) + 1):
            context = tuple(bins[i - order + 1 : i + 1])
            if context not in seen[order - 1]:
                new += 1
                seen[order - 1].add(context)
        novelty[i] = new / max_order
    novelty[:warmup_rows] = np.nan
    out[known_rows] = novelty
    return out


def decaying_record_ratio(z: FloatVector, half_life_rows: float, floor: float) -> FloatVector:
    """``z[t]`` over the largest earlier value decayed by its age, at least ``floor``.

    The record at ``t`` is ``max over s < t of z[s] * 2 ** (-(t - s) / half_life_rows)``: a big
    past excursion keeps suppressing alarms for a while, a small one soon stops mattering. As a
    running maximum of ``log z[s] + lambda * s`` it is one ``maximum.accumulate``. NaN counts as 0.
    """
    known = np.nan_to_num(z, nan=0.0)
    rate = np.log(2.0) / half_life_rows
    rows = np.arange(known.size, dtype=np.float64)
    with np.errstate(divide="ignore"):
        lifted = np.log(known) + rate * rows
    best_before = np.concatenate(([-np.inf], np.maximum.accumulate(lifted)[:-1]))
    record = np.maximum(np.exp(best_before - rate * rows), floor)
    ratio: FloatVector = known / record
    return ratio
