"""When a GPU was there to be charged, and what its samples say about the slots between them.

Accounting charges a GPU only between its first and its last sample (its *span*): time before
a node's first sample or after its last is nobody's, not "no data". Inside the span, a slot
without a utilisation sample is covered by the next sample when the two samples around it are
close (NVML's utilisation is the average over the period before the sample, and agents miss a
round now and then); a longer gap is *no data*, accounted apart and never billed to a job.

Energy comes from the energy counter: the store keeps each slot's increase over the time since
the counter's previous point as a rate (W), so a gap's energy arrives with the point after it.
:func:`spread_back` gives every slot of the gap that rate, so a slot's energy is the power the
GPU actually drew then; the energy of a span adds up to the counter's increase over it and no
slot ever holds more than its own share (no job is charged a gap's energy for one slot).

Pure functions over one GPU's slot row, so they are exact and testable without a store.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.floating[Any]]
BoolArray = npt.NDArray[np.bool_]

GAP_INTERVALS = 3.0
"""A gap longer than this many of the GPU's own sampling intervals (median) is no data."""


def span(sampled: BoolArray) -> BoolArray:
    """Slots from the first sampled slot to the last, both included (nothing if none)."""
    present = np.zeros(len(sampled), dtype=bool)
    hits = np.flatnonzero(sampled)
    if hits.size:
        present[hits[0] : hits[-1] + 1] = True
    return present


def max_gap_seconds(sampled: BoolArray, step_seconds: float, floor_seconds: float) -> float:
    """The longest spacing of two samples that still counts as data for this GPU.

    ``floor_seconds``, or :data:`GAP_INTERVALS` times the median spacing of the GPU's samples
    if larger, so an agent configured with a long interval is not "no data" between rounds.
    """
    hits = np.flatnonzero(sampled)
    if hits.size < 2:
        return floor_seconds
    typical = float(np.median(np.diff(hits))) * step_seconds
    return max(floor_seconds, GAP_INTERVALS * typical)


def fill_short_gaps(values: FloatArray, step_seconds: float, max_gap: float) -> FloatArray:
    """``values`` with each NaN run between two samples at most ``max_gap`` seconds apart
    taken from the sample after it; longer gaps and the ends stay NaN."""
    out = np.array(values, dtype=np.float64)
    hits = np.flatnonzero(~np.isnan(out))
    if hits.size < 2:
        return out
    for before, after in itertools.pairwise(hits.tolist()):
        if after - before > 1 and (after - before) * step_seconds <= max_gap:
            out[before + 1 : after] = out[after]
    return out


def hold_through_short_gaps(
    seen: BoolArray, step_seconds: float, floor_seconds: float
) -> BoolArray:
    """``seen`` with each run of unset slots between two set slots set too, when the two are at
    most :func:`max_gap_seconds` apart: a job seen on a GPU before and after a missed round (or a
    scrape interval longer than the store's step) held it in between. Longer gaps and the ends
    stay unset."""
    out = np.array(seen, dtype=bool)
    hits = np.flatnonzero(out)
    if hits.size < 2 or hits[-1] - hits[0] + 1 == hits.size:
        return out  # nothing between two sightings is missing (the usual case)
    max_gap = max_gap_seconds(out, step_seconds, floor_seconds)
    spacing = np.diff(hits)
    for at in np.flatnonzero((spacing > 1) & (spacing * step_seconds <= max_gap)).tolist():
        out[hits[at] + 1 : hits[at + 1]] = True
    return out


def spread_back(rates: FloatArray) -> FloatArray:
    """Each NaN slot takes the next known rate (the one whose increase covers it)."""
    out = np.array(rates, dtype=np.float64)
    known = ~np.isnan(out)
    if not known.any():
        return out
    n = len(out)
    # index of the next known slot at or after each slot (n where none)
    nxt = np.where(known, np.arange(n), n)
    nxt = np.minimum.accumulate(nxt[::-1])[::-1]
    has = nxt < n
    out[has] = out[nxt[has]]
    return out
