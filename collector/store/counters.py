"""Cumulative counters to increases, vectorised over one batch of points, and their rates.

A counter's increase over the interval ending at raw point ``(t_i, v_i)`` is ``v_i - v_{i-1}``;
when that is negative the counter was reset (driver reload, agent restart), and it is assumed
to have restarted from 0, so the increase is ``v_i``. It covers ``t_i - t_{i-1}``. A series' first
point has neither: its start is unknown.

Points at or before the series' newest raw point are ignored: a replay duplicates one, and a
late point's increase is already part of the newer point's delta (only a reset hidden between the
two could make that lossy).

The store keeps, per slot, the sum of its points' increases (float32, in the counter's row of the
recent ring) and the time they cover (``uint16`` codes, see :func:`encode_dt`), so a slot reads as
the rate ``increase / covered seconds``: a point's delta over the time since the previous point
when the slot holds one (so a gap's increase is spread over the whole gap: no spike after a missed
export), the mean rate of its points when it holds several. Covered time is kept to the
millisecond up to 32.8 s and to 100 ms up to about 55 minutes; beyond, the slot has no rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

_T = TypeVar("_T", bound=np.generic)

NO_TIME = -1
"""``last_time_ns`` of a series that has no raw point yet."""

# Covered time as uint16: 0 unknown; 1..32767 milliseconds (exact below 32.8 s); 32768..65534
# in steps of 100 ms from 32.8 s up to about 55 min; 65535 longer (no rate).
_FINE_MAX = 32767
_COARSE_MS = 100
_COARSE_BASE = 32440  # code 32768 = 32,800 ms
_CODE_MAX = 65534
DT_LONG = 65535
"""The code of a gap longer than about 55 minutes: the increase is kept, the rate is NaN."""


@dataclass(frozen=True, slots=True, eq=False)
class CounterSteps:
    """The batch's counter points that moved their series forward, sorted by (row, time)."""

    rows: npt.NDArray[np.int64]
    times_ns: npt.NDArray[np.int64]
    increases: npt.NDArray[np.float64]
    """NaN for a series' first point."""
    dt_ns: npt.NDArray[np.int64]
    """Time since the series' previous raw point (meaningless where the increase is NaN)."""
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
    *,
    unique_rows: bool = False,
) -> CounterSteps:
    """Increases of a batch of raw counter points; advances the per-row raw state.

    Args:
        rows: series row of each point (any order, repeats allowed).
        times_ns: point times.
        values: raw cumulative values.
        last_time_ns: per-row time of the newest raw point (``NO_TIME`` if none); updated.
        last_value: per-row newest raw value (NaN if none); updated.
        unique_rows: the caller knows no row repeats (skips the sort).
    """
    n = rows.size
    if unique_rows:
        r, t, v = rows, times_ns, values
        keep = t > last_time_ns[r]
    else:
        # Sort by row, then time, then arrival, so an exact duplicate keeps the last one sent.
        order = np.lexsort((np.arange(n), times_ns, rows))
        r, t, v = rows[order], times_ns[order], values[order]
        keep = t > last_time_ns[r]
        keep[:-1] &= (r[:-1] != r[1:]) | (t[:-1] != t[1:])
    if not keep.all():
        r, t, v = r[keep], t[keep], v[keep]
    out_of_order = n - r.size

    if unique_rows:
        prev_t, prev_v = last_time_ns[r], last_value[r]
    else:
        first = np.ones(r.size, dtype=bool)
        first[1:] = r[1:] != r[:-1]
        prev_t = _shifted(t, first, last_time_ns[r[first]])
        prev_v = _shifted(v, first, last_value[r[first]])
    delta = v - prev_v
    reset = delta < 0  # NaN (no previous point) compares False
    increases = np.where(reset, v, delta)

    if unique_rows:
        last_time_ns[r] = t
        last_value[r] = v
    else:
        last = np.ones(r.size, dtype=bool)
        last[:-1] = r[:-1] != r[1:]
        last_time_ns[r[last]] = t[last]
        last_value[r[last]] = v[last]
    return CounterSteps(
        rows=r,
        times_ns=t,
        increases=increases,
        dt_ns=t - prev_t,
        out_of_order=out_of_order,
        resets=int(np.count_nonzero(reset)),
    )


def encode_dt(ms: npt.NDArray[np.int64]) -> npt.NDArray[np.uint16]:
    """Covered milliseconds as ``uint16`` codes (at least 1 ms; see the module's table)."""
    ms = np.maximum(ms, 1)
    if ms.size and ms.max() <= _FINE_MAX:
        return ms.astype(np.uint16)
    coarse = np.minimum((ms + _COARSE_MS // 2) // _COARSE_MS + _COARSE_BASE, DT_LONG)
    return np.where(ms <= _FINE_MAX, ms, np.maximum(coarse, _FINE_MAX + 1)).astype(np.uint16)


def decode_dt_ms(codes: npt.NDArray[np.uint16]) -> npt.NDArray[np.int64]:
    """Milliseconds of codes (0 for unknown; ``DT_LONG`` decodes past the coarse range)."""
    c = codes.astype(np.int64)
    return np.where(c <= _FINE_MAX, c, (c - _COARSE_BASE) * _COARSE_MS)


def ns_to_ms(dt_ns: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Nanoseconds rounded to milliseconds."""
    return (dt_ns + 500_000) // 1_000_000


def rates(
    increases: npt.NDArray[np.floating], codes: npt.NDArray[np.uint16]
) -> npt.NDArray[np.float32]:
    """Per-second rates of slot increases over their covered time (NaN: unknown or too long)."""
    seconds = decode_dt_ms(codes).astype(np.float64) / 1000.0
    seconds[(codes == 0) | (codes == DT_LONG)] = np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        return (increases.astype(np.float64) / seconds).astype(np.float32)
