"""``python -m bench.truth.model_eval``: the model-serving families, one detector's rules at a time.

The harness's ``python -m bench.truth`` runs every shipped rule on every fleet. On the model
fleets that is too slow: ``model-latency-drift`` alone costs seconds per cycle with one model
(its 14-day baseline at 10 s bins; ``SEED_CAP``). This runner replays each model family through
the same path (``run_fleet``: ``CollectorService`` → ``DetectionEngine.run_cycle`` → SQLite
incidents) with only the shipped rules of the detectors it evaluates, loaded unmodified from
``rules/default.yaml``; rules do not interact inside the engine, so a rule's incidents are the
same as in a full run. Scoring is the harness's (:func:`bench.truth.score.score_rule`), tables
are its (:func:`bench.truth.report.table`).

For ``deploy_regression`` it also prints how many rolled-back regressions saw their incident
resolve within 2 h of the rollback (:func:`model_fleets.rollback_resolutions`).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence

from bench.truth import model_fleets
from bench.truth.evaluate import outcome
from bench.truth.model import Fleet
from bench.truth.report import table
from bench.truth.runner import FleetRun, run_fleet, shipped_rules
from bench.truth.score import matches, score_rule
from bench.truth.splits import SPLITS, seeds
from gpuwarden.collector.rules.model import RuleSet

Build = Callable[[int], Fleet]
PLAN: dict[str, tuple[tuple[Build, ...], tuple[Build, ...]]] = {
    "deploy_regression": (
        (model_fleets.deploy_rollback_fleet,),
        (model_fleets.busy_deploy_fleet, model_fleets.busy_model_diurnal_fleet),
    ),
    "slo_burn": (
        (model_fleets.slo_burn_fleet, model_fleets.slo_burn_slow_fleet),
        (model_fleets.busy_slo_blips_fleet, model_fleets.busy_model_diurnal_fleet),
    ),
    "demand_forecast": (
        (model_fleets.demand_growth_fleet,),
        (model_fleets.busy_model_diurnal_fleet,),
    ),
    "model_drift": (
        (model_fleets.latency_drift_fleet,),
        (model_fleets.busy_model_diurnal_fleet,),
    ),
    "distribution_drift": (
        (model_fleets.latency_drift_week_fleet,),
        (model_fleets.busy_model_diurnal_week_fleet,),
    ),
}
"""Detector → (families with its episodes, busy families it is judged on)."""


def rules_of(detector: str) -> RuleSet:
    """The shipped rules of one detector, unmodified."""
    return RuleSet(tuple(r for r in shipped_rules().enabled() if r.detector == detector))


def run_detector(detector: str, seed_list: Sequence[int]) -> list[FleetRun]:
    """Every fleet of the detector's plan, for each seed, through its shipped rules."""
    episodes, busy = PLAN[detector]
    rules = rules_of(detector)
    return [run_fleet(build(seed), rules) for build in (*episodes, *busy) for seed in seed_list]


SEED_CAP = {"model_drift": 1}
"""Model detectors ``python -m bench.truth`` runs on fewer seeds than asked, and how many:
``model_drift`` costs seconds per cycle (its 14-day baseline is read at 10 s bins; one held-out
seed took 891 s on a shared machine), so the default run judges it on one seed."""


def report_detector(detector: str, split: str, seed_list: Sequence[int]) -> str:
    """One model detector's table over its families, with its extra lines."""
    began = time.perf_counter()
    runs = run_detector(detector, seed_list)
    outcomes = [outcome(run, 0.0).outcome for run in runs]
    scores = [score_rule(rule.id, outcomes) for rule in rules_of(detector).rules]
    lines = [table(detector, scores)]
    lines += [
        f"  {run.fleet.name}: rules failed in some cycle: {run.failed_rules}"
        for run in runs
        if run.failed_rules
    ]
    if detector == "deploy_regression":
        pairs = [(run.fleet.episodes, run.resolved) for run in runs]
        total, resolved, minutes = model_fleets.rollback_resolutions(pairs)
        waits = ", ".join(f"{m:.0f}" for m in minutes) or "-"
        lines.append(f"  rolled back: {total}; incident resolved within 2 h of the rollback: "
                     f"{resolved} (minutes after the rollback: {waits})")  # fmt: skip
    if detector == "demand_forecast":
        leads = [
            (episode.end - incident.time) / 60
            for run in runs
            for episode in run.fleet.episodes
            for incident in run.incidents
            if matches(incident, episode)
        ]
        shown = ", ".join(f"{m:.0f}" for m in leads) or "-"
        lines.append(f"  minutes from each matching incident to demand reaching 80 %: {shown}")
    days = sum(run.fleet.gpu_days for run in runs)
    lines.append(f"  split {split}, seeds {list(seed_list)}; {len(runs)} fleets, {days:.2f} "
                 f"GPU-days (2 GPUs per model: model-days = GPU-days / 2); "
                 f"{time.perf_counter() - began:.0f} s")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.truth.model_eval", description=__doc__)
    parser.add_argument("--split", choices=sorted(SPLITS), default="heldout")
    parser.add_argument("--detectors", nargs="*", default=list(PLAN), choices=list(PLAN))
    parser.add_argument("--seed-count", type=int, default=1, help="seeds per family (1-50)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    seed_list = seeds(args.split, args.seed_count)
    for detector in args.detectors:
        print(report_detector(detector, args.split, seed_list), end="\n\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
