"""A causal univariate anomaly scorer: one series in, a score in [0, 1) per point out.

This is the project's anomaly/drift detector (scored on NAB by ``bench/nab_score.py``). A point's
score uses only that point and the ones before it, so the scores of a prefix do not change when
more data arrives (``tests/test_anomaly.py`` checks this).

Three evidence streams (:mod:`~gpuwarden.collector.detect.numerics.anomaly_streams`), each a
different kind of surprise:

* **shape** - the mean distance from the last ``knn_window_rows`` values to their
  ``knn_neighbours`` nearest matches among the previous ``knn_reference_rows`` shapes (a
  nearest-neighbour nonconformity, after KNN CAD): a pattern that recent history has not shown;
* **novelty** - the share of contexts (the last 1..``context_max_order`` values, quantised into
  ``context_levels`` bins sized on the first ``context_warmup_rows`` known values, whose contexts
  are learnt before anything scores) never seen before: a new level, transition or short
  pattern, in the spirit of the contextual and relative-entropy detectors; once a pattern has
  been seen, noise and seasons stop scoring. It may still alarm once or twice in the few hundred
  rows after the warm-up, while its record builds up;
* **step** - how far the first difference is from the median of the previous ``baseline_rows``
  differences, in robust sigmas (median/MAD): a sudden jump, even inside the normal range.

**Suppression is scale-free.** Each stream is divided by its own record: the largest earlier
value, decayed by half every ``half_life_rows`` of age (the step stream's ``step_half_life_factor``
times longer), and never below the stream's floor. A point scores only when it breaks that record
by a ratio ``r > 1``; the score is ``r / (r + 1)`` of the strongest stream, else 0. An anomaly
therefore alarms when it starts and stays quiet while it lasts (NAB rewards the earliest detection
in a window and charges every alarm outside one), a large past excursion mutes similar ones for a
while, and the ratio is comparable across series of any unit or noise level, so one global
threshold works. The ratio never saturates: no ties at the top of the score range.

Missing values (NaN) score NaN: a gap is neither normal nor anomalous; the shape stream carries
the last value over a gap and the others skip it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpuwarden.collector.detect.numerics import anomaly_streams, screen

FloatVector = npt.NDArray[np.float64]


@dataclass(frozen=True)
class AnomalyParams:
    """Knobs of :func:`score_series`; counts are in rows (samples), not seconds."""

    knn_window_rows: int = 5  # length of a shape
    knn_reference_rows: int = 1500  # past shapes a shape is compared with
    knn_neighbours: int = 5
    knn_min_reference_rows: int = 100  # no shape score before this many past shapes
    knn_floor: float = 1e-12  # shape distances are compared with at least this
    context_levels: int = 12  # quantisation bins over the 1-99 % range of the first rows
    context_max_order: int = 4  # contexts of the last 1..4 values
    context_warmup_rows: int = 300  # the bins are sized on this many first known values
    novelty_floor: float = 0.5  # the novelty record to beat is never below this share
    baseline_rows: int = 500  # rolling past window for the median/MAD of the step stream
    step_floor_z: float = 3.0  # the step record to beat is never below this many robust sigmas
    half_life_rows: float = 2500.0  # a past record counts half after this many rows
    step_half_life_factor: float = 1.75
    warmup_rows: int = 300  # no score before this row: the streams have too little history
    min_baseline_rows: int = 20

    def __post_init__(self) -> None:
        """Reject values that cannot work."""
        rows = (self.knn_window_rows, self.knn_reference_rows, self.knn_neighbours)
        if min(*rows, self.baseline_rows, self.context_warmup_rows) < 1:
            raise ValueError("window lengths and counts must be >= 1 row")
        if self.knn_neighbours > self.knn_reference_rows:
            raise ValueError("knn_neighbours cannot exceed knn_reference_rows")
        if self.context_levels < 1 or self.context_max_order < 1:
            raise ValueError("context_levels and context_max_order must be >= 1")
        if self.warmup_rows < 0 or self.min_baseline_rows < 2:
            raise ValueError("warmup_rows must be >= 0 and min_baseline_rows >= 2")
        if min(self.novelty_floor, self.step_floor_z, self.half_life_rows, self.knn_floor) <= 0:
            raise ValueError("floors and half_life_rows must be > 0")


DEFAULT_PARAMS = AnomalyParams()
# Alarm threshold, fixed before scoring NAB: the standard-profile optimum on split A (the 11
# artificial files + every other real file, sorted by name; 35 files; 0.53288), rounded down
# so the optimum itself alarms. Scores are r / (r + 1), so this is "break the decayed record
# by 14 %". The stream settings above were
# also chosen by their split-A score (a plateau: levels 6-12, orders 3-5 and half-lives of
# 1,500-2,500 rows all score within 2 points). See bench/nab_score.py.
DEFAULT_THRESHOLD = 0.5328


def rolling_robust_z(series: pd.Series, window_rows: int, min_rows: int) -> FloatVector:
    """|x[t] - median| / scale, median and scale over the ``window_rows`` rows before ``t``.

    Scale is 1.4826·MAD, else 1.2533·mean |dev| when the MAD is 0, floored at 1e-6·(1 + |median|).
    NaN where fewer than ``min_rows`` past values are known, or where ``x[t]`` is missing.
    """
    past = series.shift(1)
    median = past.rolling(window_rows, min_periods=min_rows).median()
    past_dev = (past - median).abs()
    mad = past_dev.rolling(window_rows, min_periods=min_rows).median() * screen.MAD_TO_SIGMA
    mean_ad = past_dev.rolling(window_rows, min_periods=min_rows).mean() * screen.MEAN_AD_TO_SIGMA
    scale = mad.where(mad > 0, mean_ad)
    floor = 1e-6 * (1.0 + median.abs())
    scale = scale.where(~(scale < floor), floor)  # NaN (no baseline yet) stays NaN
    z: FloatVector = ((series - median).abs() / scale).to_numpy(dtype=np.float64)
    return z


def stream_ratios(x: FloatVector, params: AnomalyParams) -> FloatVector:
    """Each stream over its decayed record, one row per stream (shape, novelty, step)."""
    shape = anomaly_streams.knn_distance(
        x,
        params.knn_window_rows,
        params.knn_reference_rows,
        params.knn_neighbours,
        params.knn_min_reference_rows,
    )
    novelty = anomaly_streams.context_novelty(
        x, params.context_levels, params.context_max_order, params.context_warmup_rows
    )
    step = rolling_robust_z(pd.Series(x).diff(), params.baseline_rows, params.min_baseline_rows)
    half_life = params.half_life_rows
    return np.vstack(
        [
            # A shape distance has the series' unit, so its floor is tiny: any clear distance
            # after exact repetition (a flat line) is a record.
            anomaly_streams.decaying_record_ratio(shape, half_life, params.knn_floor),
            anomaly_streams.decaying_record_ratio(novelty, half_life, params.novelty_floor),
            anomaly_streams.decaying_record_ratio(
                step, half_life * params.step_half_life_factor, params.step_floor_z
            ),
        ]
    )


def score_series(
    timestamps: npt.NDArray[np.generic] | None,
    values: npt.ArrayLike,
    params: AnomalyParams = DEFAULT_PARAMS,
) -> FloatVector:
    """Anomaly score per point, causal, in [0, 1): 0 = nothing new, > 0.5 = a broken record.

    Args:
        timestamps: one per value (checked for length only: the detector works in rows, so
            resample irregular series first); ``None`` to skip the check.
        values: the series; NaN = missing (scores NaN).
        params: window lengths and thresholds.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"expected one series (1-D), got shape {x.shape}")
    if timestamps is not None and len(timestamps) != len(x):
        raise ValueError(f"{len(timestamps)} timestamps for {len(x)} values")
    if len(x) == 0:
        return np.zeros(0)
    ratio = stream_ratios(x, params).max(axis=0)
    scores = np.where(ratio > 1.0, ratio / (ratio + 1.0), 0.0)
    scores[: params.warmup_rows] = 0.0  # too little history to call anything new
    return np.where(np.isnan(x), np.nan, scores)
