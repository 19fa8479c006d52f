"""One evaluation: build the split's fleets, replay each through the collector (in worker
processes, one fleet each), score every shipped rule against the planted episodes."""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from bench.truth.runner import FleetRun, run_fleet, shipped_rules
from bench.truth.score import FleetOutcome, RuleScore, score_rule
from bench.truth.splits import FAMILIES, chosen_families, seeds
from bench.truth.traces import GENTD26, gentd26_available, gentd26_fleet

TRACE_FAMILY = "trace-gentd26"


def rules_by_detector(detectors: Sequence[str] = ()) -> dict[str, list[str]]:
    """Shipped rule ids by detector (only ``detectors`` when given; pushed rules left out)."""
    out: dict[str, list[str]] = {}
    for rule in shipped_rules().enabled():
        if rule.detector == "alertmanager" or (detectors and rule.detector not in detectors):
            continue
        out.setdefault(rule.detector, []).append(rule.id)
    return out


@dataclass(frozen=True, slots=True)
class FleetResult:
    """What one fleet's replay left for scoring (plain data: it crosses processes)."""

    outcome: FleetOutcome
    cycles: int
    failed_rules: tuple[str, ...]
    seconds: float
    """Wall time of the replay."""


def outcome(run: FleetRun, seconds: float) -> FleetResult:
    f = run.fleet
    return FleetResult(
        FleetOutcome(f.name, f.family, f.episodes, run.incidents, f.gpu_days, f.start),
        run.cycles,
        run.failed_rules,
        seconds,
    )


def quiet() -> None:
    """Worker start-up: only errors are logged (the detectors log every incident they open)."""
    logging.basicConfig(level=logging.ERROR)


def replay(family: str, seed: int) -> FleetResult:
    """Build fleet ``family`` from ``seed`` and replay it (a worker's job)."""
    began = time.perf_counter()
    if family == TRACE_FAMILY:
        fleet = gentd26_fleet()
    else:
        fleet = next(f.build for f in FAMILIES if f.name == family)(seed)
    run = run_fleet(fleet)
    return outcome(run, time.perf_counter() - began)


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Scores by rule id, and what was run."""

    scores: dict[str, RuleScore]
    fleets: tuple[FleetResult, ...]
    """The generated fleets (scored)."""
    traces: tuple[FleetResult, ...]
    """The real traces (unlabelled: incidents per GPU-day only)."""
    seeds: tuple[int, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def gpu_days(self) -> float:
        return sum(r.outcome.gpu_days for r in self.fleets)


def evaluate(
    split: str, seed_count: int, detectors: Sequence[str] = (), *, quick: bool = False,
    workers: int = 2, traces: bool = True,
) -> Evaluation:  # fmt: skip
    """Run the split's fleets for ``detectors`` (all when empty) and score their rules; with
    ``traces`` (never in ``quick``), also replay the real traces when their folder exists."""
    chosen = seeds(split, 1 if quick else seed_count)
    jobs = [(f.name, s) for f in chosen_families(detectors, quick=quick) for s in chosen]
    notes = []
    if traces and not quick:
        if gentd26_available():
            jobs.insert(0, (TRACE_FAMILY, 0))  # the longest job first
        else:
            notes.append(f"real traces skipped: {GENTD26} not found (see ../shared/data)")
    if workers > 1 and len(jobs) > 1:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context, initializer=quiet) as pool:
            results = tuple(pool.map(replay, *zip(*jobs, strict=True)))
    else:
        results = tuple(replay(name, s) for name, s in jobs)
    notes += [
        f"{r.outcome.name}: rules failed in some cycle: {', '.join(r.failed_rules)}"
        for r in results
        if r.failed_rules
    ]
    generated = tuple(r for r in results if r.outcome.family != TRACE_FAMILY)
    outcomes = [r.outcome for r in generated]
    scores = {
        rule: score_rule(rule, outcomes)
        for rules in rules_by_detector(detectors).values()
        for rule in rules
    }
    real = tuple(r for r in results if r.outcome.family == TRACE_FAMILY)
    return Evaluation(scores, generated, real, tuple(chosen), tuple(notes))
