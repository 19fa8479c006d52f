"""A causal univariate anomaly scorer: one series in, a score in [0, 1) per point out.

This is the project's anomaly/drift detector (scored on NAB by ``bench/nab_score.py``). A point's
score uses only that point and the ones before it, so the scores of a prefix do not change when
more data arrives (``tests/test_anomaly.py`` checks this).

Three evidence streams, each a robust z built from the screen primitives' conventions:

* **level** - how far the value is from the median of the previous ``baseline_rows`` values, in
  robust sigmas (median/MAD over a rolling past window);
* **step** - the same for the first difference (a sudden jump, even inside the normal range);
* **drift** - a two-sided CUSUM (:func:`screen.cusum`) of the AR(1)-prewhitened residuals'
  robust z (phi from the first ``warmup_rows``), which accumulates small persistent shifts that no
  single point shows.

**Suppression is scale-free.** Each stream is divided by its own maximum over the previous
``holdoff_rows`` points (at least ``floor_z``): a point only scores when it breaks the recent
record, by ratio ``r > 1``; the score is ``r / (r + 1)`` of the strongest stream, else 0. An anomaly
therefore alarms when it starts and stays quiet while it lasts (NAB charges every alarm outside a
window), and the ratio is comparable across series of any unit or noise level, so one global
threshold works. The ratio never saturates: no ties at the top of the score range.

Missing values (NaN) score NaN: a gap is neither normal nor anomalous, and rolling statistics
skip it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpuwarden.collector.detect import screen

FloatVector = npt.NDArray[np.float64]


@dataclass(frozen=True)
class AnomalyParams:
    """Knobs of :func:`score_series`; counts are in rows (samples), not seconds."""

    baseline_rows: int = 500  # rolling past window for the median/MAD of each stream
    holdoff_rows: int = 400  # a stream must beat its own maximum over this many past rows
    step_holdoff_rows: int = 700
    warmup_rows: int = 150  # AR(1) phi and centre are estimated on these first rows only
    floor_z: float = 3.0  # the record to beat is never below this many robust sigmas
    cusum_floor_factor: float = 3.0  # the CUSUM stream's floor is floor_z times this
    cusum_drift: float = 2.0
    cusum_threshold: float = 30.0  # the CUSUM restarts after exceeding this
    z_clip: float = 5.0  # residual z fed to the CUSUM is clipped: one outlier cannot trip it
    min_baseline_rows: int = 20

    def __post_init__(self) -> None:
        """Reject values that cannot work."""
        if min(self.baseline_rows, self.holdoff_rows, self.step_holdoff_rows) < 1:
            raise ValueError("window lengths must be >= 1 row")
        if self.warmup_rows < 2 or self.min_baseline_rows < 2:
            raise ValueError("warmup_rows and min_baseline_rows must be >= 2")
        if self.floor_z <= 0 or self.z_clip <= 0:
            raise ValueError("floor_z and z_clip must be > 0")


DEFAULT_PARAMS = AnomalyParams()
# Alarm threshold, fixed before scoring NAB: the standard-profile optimum on split A (the 11
# artificial files + every other real file, sorted by name; 35 files), rounded. Scores are
# r / (r + 1), so this is "break the recent record by 28 %". See bench/nab_score.py.
DEFAULT_THRESHOLD = 0.5618


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


def record_ratio(z: FloatVector, holdoff_rows: int, floor: float) -> FloatVector:
    """``z[t]`` over the maximum of the previous ``holdoff_rows`` values (at least ``floor``)."""
    known = np.nan_to_num(z, nan=0.0)
    previous = pd.Series(known).shift(1).rolling(holdoff_rows, min_periods=1).max()
    record = np.maximum(previous.fillna(floor).to_numpy(dtype=np.float64), floor)
    ratio: FloatVector = known / record
    return ratio


def cusum_stream(values: FloatVector, params: AnomalyParams) -> FloatVector:
    """The larger side of a CUSUM on clipped robust z of AR(1) residuals (phi from warm-up)."""
    warm = values[: params.warmup_rows]
    centred = values - (np.nanmean(warm) if np.isfinite(warm).any() else 0.0)
    _, phi = screen.ar1_prewhiten(warm)
    residual = np.full(values.shape, np.nan)
    residual[1:] = centred[1:] - phi[0] * centred[:-1]
    series = pd.Series(residual)
    z = rolling_robust_z(series, params.baseline_rows, params.min_baseline_rows)
    past_median = (
        series.shift(1).rolling(params.baseline_rows, min_periods=params.min_baseline_rows).median()
    )
    signed = np.clip(z * np.sign(residual - past_median.to_numpy()), -params.z_clip, params.z_clip)
    stats = screen.cusum(signed, params.cusum_drift, params.cusum_threshold)
    worst: FloatVector = np.fmax(stats.upper[0], stats.lower[0])
    return worst


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
    series = pd.Series(x)
    level = rolling_robust_z(series, params.baseline_rows, params.min_baseline_rows)
    step = rolling_robust_z(series.diff(), params.baseline_rows, params.min_baseline_rows)
    ratios = np.vstack(
        [
            record_ratio(level, params.holdoff_rows, params.floor_z),
            record_ratio(step, params.step_holdoff_rows, params.floor_z),
            record_ratio(
                cusum_stream(x, params),
                params.holdoff_rows,
                params.floor_z * params.cusum_floor_factor,
            ),
        ]
    )
    ratio = ratios.max(axis=0)
    scores = np.where(ratio > 1.0, ratio / (ratio + 1.0), 0.0)
    scores[: params.warmup_rows] = 0.0  # AR(1) state is not estimated yet
    return np.where(np.isnan(x), np.nan, scores)
