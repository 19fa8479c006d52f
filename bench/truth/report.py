"""The evaluation's tables: one per detector (its shipped rules), as plain text."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.truth.score import RuleScore

FOCUS_FAMILIES = ("busy-diurnal", "busy-checkpoint")
"""Busy families reported on their own (the issue's target there is 0 false incidents)."""


def _num(value: float, fmt: str = ".3f") -> str:
    return "-" if math.isnan(value) else format(value, fmt)


def _minutes(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds / 60:.1f}"


def table(detector: str, scores: Sequence[RuleScore]) -> str:
    """One detector's table: a row per shipped rule of it."""
    lines = [
        f"== {detector}",
        f"{'rule':28} {'P':>6} {'R':>6} {'episodes':>9} {'incid.':>7} {'delay p50':>10} "
        f"{'p90 (min)':>9} {'false/GPU-day':>14} "
        + " ".join(f"{f + ' f/GPU-d':>24}" for f in FOCUS_FAMILIES),
    ]
    for s in scores:
        focus = []
        for family in FOCUS_FAMILIES:
            n, days = s.by_family.get(family, (0, 0.0))
            focus.append(f"{(_num(n / days) + f' ({n})') if days else '-':>24}")
        lines.append(
            f"{s.rule:28} {_num(s.precision):>6} {_num(s.recall):>6} "
            f"{f'{s.found}/{s.episodes}':>9} {f'{s.matched}/{s.incidents}':>7} "
            f"{_minutes(s.delay(0.5)):>10} {_minutes(s.delay(0.9)):>9} "
            f"{(_num(s.false_per_gpu_day) + f' ({s.busy_false})'):>14} " + " ".join(focus)
        )
    return "\n".join(lines)
