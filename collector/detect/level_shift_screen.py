"""Stage one of ``level_shift``: screen every series at once (numpy, in blocks).

A row is a candidate when it shifted *and* the shift looks like a break, on the side the rule
asks for, and the new level has outlasted the phases the series came back from. Shifted: the
EWMA-smoothed window is more than ``z_above`` robust sigmas (of the smoothed baseline) away for
``hold_slots`` of known slots in a row, or the window's mean AR(1) one-step residual lies where
the confirm's 99 % prediction interval would put it outside (``screen.ar1_tests``: a bursty
series with wide robust sigmas still shifts its mean). Break: the CUSUM of the raw robust z
alarms, and the confirm's break statistic on prewhitened residuals passes ``BREAK_SUP`` (well
under the confirm's 1.63). Then: a change of at least ``min_change`` between the baseline's
median (robust to the dips it holds) and the mean of the newest ``hold_slots``; a new level of
at least ``ignore_below``; the change *and* the window's mean residual on the rule's side; and
the new level held longer than ``PHASE_MARGIN`` times the longest excursion to it that the
series came back from (a training job's checkpoints and evaluations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import norm

from gpuwarden.collector.detect.numerics import screen

FloatMatrix = npt.NDArray[np.float64]
FloatVector = npt.NDArray[np.float64]
BoolVector = npt.NDArray[np.bool_]

EWMA_ALPHA = 0.1
CUSUM_DRIFT, CUSUM_THRESHOLD, CUSUM_CLIP = 1.0, 20.0, 5.0
INTERVAL_ALPHA = 0.01
"""The confirm's prediction interval is 99 %: the screen's mean-residual branch uses the same."""
BREAK_SUP = 1.0
"""Screen cut on the break statistic, well below the confirm's (1.63, p = 0.01): the confirm
tests the STL remainder, the screen the raw series; measured on both of ``detect_bench``'s
backgrounds to keep every shift the confirm finds."""
BLOCK_ROWS = 2000
"""Rows per screen block: block-sized temporaries are recycled by the allocator, where each fresh
full-size one (29 MB for 10,000 × 720) costs about 60 ms of page faults the first time."""
PHASE_MARGIN = 2.0
"""How much longer than the longest excursion it came back from a new level must have held.
Checkpoint dips (2-5 min) and evaluation phases (10-15 min) of ``tests/
test_detect_level_shift_jobs.py``'s generated training jobs vary by ±15 % and sometimes run
back to back (a dip right after an evaluation): 1.5 left the back-to-back case at the edge, 2
clears it; a real slowdown is reported after twice the job's longest phase."""


@dataclass(frozen=True, slots=True)
class ShiftScreen:
    """Stage one's parameters, in slots and the metric's unit."""

    hold_slots: int = 36
    z_above: float = 6.0
    min_scale: float = 0.01
    min_change: float = 0.0
    direction: str = "both"
    season_slots: int = 0
    """The seasonal period in slots (0: none): the excursions are read on the mean over one
    period, which a seasonal swing does not move."""
    ignore_below: float = -math.inf
    """A series whose new level (mean of the newest ``hold_slots``) is below this is not a
    candidate: e.g. utilisation that fell to idle, which the idle rules own."""

    def __post_init__(self) -> None:
        if self.hold_slots < 1 or self.z_above <= 0 or self.min_scale <= 0 or self.min_change < 0:
            raise ValueError("hold_slots, z_above and min_scale must be > 0, min_change >= 0")
        if self.direction not in ("both", "increase", "decrease"):
            raise ValueError(f"direction must be both, increase or decrease, not {self.direction}")


@dataclass(frozen=True, slots=True)
class Screened:
    """Per row: candidate or not, and the screen's numbers (NaN where not computed)."""

    candidate: BoolVector
    shift_z: FloatVector
    """z of the window's mean AR(1) residual against the baseline (sign = direction)."""
    break_sup: FloatVector
    level: FloatVector
    """Mean of the newest ``hold_slots``: the level now."""
    baseline_level: FloatVector
    """Median of the baseline: the level before (robust to the phases it holds)."""

    @property
    def change(self) -> FloatVector:
        """The level now minus the level before, in the metric's unit."""
        return self.level - self.baseline_level


def screen_shifts(baseline: FloatMatrix, window: FloatMatrix, params: ShiftScreen) -> Screened:
    """Stage one on every row of ``baseline`` and ``window`` (series × slots, NaN = missing)."""
    if baseline.shape[0] != window.shape[0]:
        raise ValueError(f"baseline has {baseline.shape[0]} rows, window has {window.shape[0]}")
    parts = [
        _screen_block(baseline[i : i + BLOCK_ROWS], window[i : i + BLOCK_ROWS], params)
        for i in range(0, baseline.shape[0], BLOCK_ROWS)
    ]
    if not parts:
        empty = np.zeros(0)
        return Screened(np.zeros(0, dtype=np.bool_), empty, empty, empty, empty)
    return Screened(*(np.concatenate(column) for column in zip(*parts, strict=True)))


def _screen_block(
    baseline: FloatMatrix, window: FloatMatrix, params: ShiftScreen
) -> tuple[BoolVector, FloatVector, FloatVector, FloatVector, FloatVector]:
    split = baseline.shape[1]
    raw = np.concatenate([baseline, window], axis=1)
    smooth = screen.ewma(raw, alpha=EWMA_ALPHA)
    z_smooth = screen.robust_z(smooth[:, split:], smooth[:, :split], min_scale=params.min_scale)
    window_known = ~np.isnan(window)
    held = screen.held_for(np.abs(z_smooth) > params.z_above, params.hold_slots, known=window_known)
    tests = screen.ar1_tests(baseline, window, min_scale=params.min_scale)
    # The confirm's interval (window residuals only) cuts at q; shift_z also counts the
    # baseline level's error, so the same cut is q / sqrt(1 + n / m).
    ratio = window.shape[1] / max(split - 1, 1)
    interval_z = float(norm.ppf(1 - INTERVAL_ALPHA / 2)) / math.sqrt(1 + ratio)
    z = screen.robust_z(window, baseline, min_scale=params.min_scale)
    drift = screen.cusum(np.clip(z, -CUSUM_CLIP, CUSUM_CLIP), CUSUM_DRIFT, CUSUM_THRESHOLD)
    with np.errstate(invalid="ignore"):
        level = screen.row_mean(window[:, -params.hold_slots :])
        before = screen.nanmedian(baseline, axis=1)  # robust: phases in the baseline
        change = level - before
        shifted = held.any(axis=1) | (np.abs(tests.shift_z) > interval_z)
        candidate = shifted & drift.alarm.any(axis=1) & (tests.break_sup > BREAK_SUP)
        candidate &= np.abs(change) >= params.min_change
        if params.ignore_below > -math.inf:
            candidate &= level >= params.ignore_below
        # The direction holds on both of the screen's numbers: the level now against the level
        # before, and the window's mean residual (the confirm's test) on the same side.
        side = np.sign(change)
        if params.direction == "increase":
            candidate &= side > 0
        elif params.direction == "decrease":
            candidate &= side < 0
        candidate &= (side != 0) & (np.sign(tests.shift_z) == side)
        level_of = smooth if params.season_slots < 2 else _period_mean(raw, params.season_slots)
        candidate &= _outlasts_phases(level_of, before, change, params.hold_slots)
    return candidate, tests.shift_z, tests.break_sup, level, before


def _period_mean(values: FloatMatrix, period: int) -> FloatMatrix:
    """Per row, the mean of the known values over the trailing ``period`` slots (NaN until a
    slot has none known)."""
    known = ~np.isnan(values)
    zero = np.zeros((values.shape[0], 1))
    sums = np.concatenate([zero, np.cumsum(np.where(known, values, 0.0), axis=1)], axis=1)
    counts = np.concatenate([zero, np.cumsum(known, axis=1, dtype=np.float64)], axis=1)
    lag = np.maximum(np.arange(1, values.shape[1] + 1) - period, 0)
    total, count = sums[:, 1:] - sums[:, lag], counts[:, 1:] - counts[:, lag]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(count > 0, total / count, np.nan), dtype=np.float64)


def _outlasts_phases(
    smooth: FloatMatrix, before: FloatVector, change: FloatVector, hold_slots: int
) -> BoolVector:
    """Whether the new level has held for ``hold_slots`` *and* ``PHASE_MARGIN`` times the
    longest excursion to it that the series came back from in the baseline and window.

    A training job's checkpoints and evaluations are such excursions: minutes long, recurring,
    each one ended by a return to the old level. A level shift is one that lasts longer than
    anything the series has done and undone. The excursion is read on the EWMA-smoothed series
    with hysteresis: in below halfway to the new level, out above a quarter of the way (the
    mirror image for a rise), so noise about halfway neither ends it nor opens a new one.
    """
    side = np.where(np.sign(change) == 0, 1.0, np.sign(change))[:, np.newaxis]
    with np.errstate(invalid="ignore"):
        found = screen.excursions(
            -side * smooth,
            enter=-side[:, 0] * (before + change / 2),
            leave=-side[:, 0] * (before + change / 4),
        )
    current = found.current
    return (current >= hold_slots) & (current >= PHASE_MARGIN * found.longest_before)
