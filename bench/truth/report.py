"""The evaluation's tables: one per detector (its shipped rules), as plain text."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.truth.score import FleetOutcome, RuleScore, matches
from bench.truth.traces import FALSE_ON_SERVING

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


def trace_table(outcomes: Sequence[FleetOutcome], rules: Sequence[str]) -> str:
    """Incidents per GPU-day of every rule on the real traces (no labels; see bench.truth.traces:
    rules marked ``false`` cannot be right on serving pods, the others are shown, not judged)."""
    lines = []
    for fleet in outcomes:
        lines.append(f"== real trace {fleet.name} ({len(fleet.incidents)} incidents, "
                     f"{fleet.gpu_days:.2f} GPU-days; unlabelled)")  # fmt: skip
        lines.append(f"{'rule':28} {'incidents':>9} {'per GPU-day':>12}  judged")
        for rule in rules:
            n = sum(1 for i in fleet.incidents if i.rule == rule)
            rate = n / fleet.gpu_days if fleet.gpu_days else math.nan
            verdict = "false" if rule in FALSE_ON_SERVING else "not judged"
            lines.append(f"{rule:28} {n:>9} {_num(rate):>12}  {verdict}")
    return "\n".join(lines)


def summary(scores: Sequence[RuleScore]) -> str:
    """False incidents per GPU-day on the busy fleets, all rules together (the issue's target:
    at most 0.1 overall, 0 on diurnal serving and checkpoint dips)."""
    if not scores or not scores[0].busy_gpu_days:
        return "no busy fleet ran"
    days = scores[0].busy_gpu_days  # the same busy fleets for every rule
    total = sum(s.busy_false for s in scores)
    parts = [f"the rules above on busy fleets: {total / days:.3f} false incidents per GPU-day "
             f"({total} over {days:.2f} GPU-days)"]  # fmt: skip
    for family in sorted(scores[0].by_family):
        fam_days = scores[0].by_family[family][1]
        n = sum(s.by_family.get(family, (0, 0.0))[0] for s in scores)
        parts.append(f"  {family}: {n / fam_days:.3f} per GPU-day ({n} over {fam_days:.2f})")
    return "\n".join(parts)


def false_incidents(outcomes: Sequence[FleetOutcome], rules: Sequence[str]) -> str:
    """Every incident that matched no episode: fleet, rule, minute after the fleet's start,
    subject (for whoever fixes the detector)."""
    lines = ["== incidents that matched no episode"]
    for fleet in outcomes:
        lines.extend(
            f"{fleet.name:24} {i.rule:28} +{(i.time - fleet.start) / 60:7.1f} min  {i.subject}"
            for i in fleet.incidents
            if i.rule in rules and not any(matches(i, e) for e in fleet.episodes)
        )
    return "\n".join(lines)
