"""One evaluation: build the split's fleets, replay each through the collector, score every
shipped rule against the planted episodes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.truth.runner import FleetRun, run_fleet, shipped_rules
from bench.truth.score import FleetOutcome, RuleScore, score_rule
from bench.truth.splits import fleets, seeds


def rules_by_detector(detectors: Sequence[str] = ()) -> dict[str, list[str]]:
    """Shipped rule ids by detector (only ``detectors`` when given; pushed rules left out)."""
    out: dict[str, list[str]] = {}
    for rule in shipped_rules().enabled():
        if rule.detector == "alertmanager" or (detectors and rule.detector not in detectors):
            continue
        out.setdefault(rule.detector, []).append(rule.id)
    return out


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Scores by rule id, and what was run."""

    scores: dict[str, RuleScore]
    fleets: tuple[FleetRun, ...]
    seeds: tuple[int, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def gpu_days(self) -> float:
        return sum(run.fleet.gpu_days for run in self.fleets)


def outcome(run: FleetRun) -> FleetOutcome:
    f = run.fleet
    return FleetOutcome(f.name, f.family, f.episodes, run.incidents, f.gpu_days)


def evaluate(
    split: str, seed_count: int, detectors: Sequence[str] = (), *, quick: bool = False
) -> Evaluation:
    """Run the split's fleets for ``detectors`` (all when empty) and score their rules."""
    runs = tuple(run_fleet(f) for f in fleets(split, seed_count, detectors, quick=quick))
    notes = [
        f"{run.fleet.name}: rules failed in some cycle: {', '.join(run.failed_rules)}"
        for run in runs
        if run.failed_rules
    ]
    outcomes = [outcome(run) for run in runs]
    scores = {
        rule: score_rule(rule, outcomes)
        for rules in rules_by_detector(detectors).values()
        for rule in rules
    }
    return Evaluation(scores, runs, tuple(seeds(split, 1 if quick else seed_count)), tuple(notes))
