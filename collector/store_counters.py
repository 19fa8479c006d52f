"""Cumulative counters to increases and rates, vectorised over one batch of points.

A counter's increase over the interval ending at raw point ``(t_i, v_i)`` is ``v_i - v_{i-1}``;
when that is negative the counter was reset (driver reload, agent restart), and it is assumed
to have restarted from 0, so the increase is ``v_i``. Its rate is the increase over
``(t_i - t_{i-1})`` seconds. A series' first point has neither: its start is unknown.

Points at or before the series' newest raw point are ignored: a replay duplicates one, and a
late point's increase is already part of the newer point's delta (only a reset hidden between the
two could make that lossy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

_T = TypeVar("_T", bound=np.generic)

NO_TIME = -1
"""``last_time_ns`` of a series that has no raw point yet."""


@dataclass(frozen=True, slots=True, eq=False)
class CounterSteps:
    """The batch's counter points that moved their series forward, sorted by (row, time)."""

    rows: npt.NDArray[np.int64]
    times_ns: npt.NDArray[np.int64]
    increases: npt.NDArray[np.float64]
    """NaN for a series' first point."""
    rates_per_second: npt.NDArray[np.float64]
    out_of_order: int
    resets: int


def _shifted(
    values: npt.NDArray[_T], first: npt.NDArray[np.bool_], previous: npt.NDArray[_T]
) -> npt.NDArray[_T]:
    """Each element's predecessor in its row's run; ``previous`` (per run) at a run's start."""
    out = np.empty_like(values)
    out[1:] = values[:-1]
    out[first] = previous
    return out


def counter_steps(
    rows: npt.NDArray[np.int64],
    times_ns: npt.NDArray[np.int64],
    values: npt.NDArray[np.float64],
    last_time_ns: npt.NDArray[np.int64],
    last_value: npt.NDArray[np.float64],
) -> CounterSteps:
    """Increases and rates of a batch of raw counter points; advances the per-row raw state.

    Args:
        rows: series row of each point (any order, repeats allowed).
        times_ns: point times.
        values: raw cumulative values.
        last_time_ns: per-row time of the newest raw point (``NO_TIME`` if none); updated.
        last_value: per-row newest raw value (NaN if none); updated.
    """
    n = rows.size
    # Sort by row, then time, then arrival, so an exact duplicate keeps the last one sent.
    order = np.lexsort((np.arange(n), times_ns, rows))
    r, t, v = rows[order], times_ns[order], values[order]
    keep = t > last_time_ns[r]
    keep[:-1] &= (r[:-1] != r[1:]) | (t[:-1] != t[1:])
    r, t, v = r[keep], t[keep], v[keep]
    out_of_order = n - r.size

    first = np.ones(r.size, dtype=bool)
    first[1:] = r[1:] != r[:-1]
    prev_t = _shifted(t, first, last_time_ns[r[first]])
    prev_v = _shifted(v, first, last_value[r[first]])
    delta = v - prev_v
    reset = delta < 0  # NaN (no previous point) compares False
    increases = np.where(reset, v, delta)
    with np.errstate(invalid="ignore"):
        rates = increases / ((t - prev_t).astype(np.float64) / 1e9)

    last = np.ones(r.size, dtype=bool)
    last[:-1] = r[:-1] != r[1:]
    last_time_ns[r[last]] = t[last]
    last_value[r[last]] = v[last]
    return CounterSteps(
        rows=r,
        times_ns=t,
        increases=increases,
        rates_per_second=rates,
        out_of_order=out_of_order,
        resets=int(reset.sum()),
    )
