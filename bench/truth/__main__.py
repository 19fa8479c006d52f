"""``python -m bench.truth``: the labelled evaluation of every detector (see docs/evaluation.md).

Prints one table per detector: precision, recall, median and p90 detection delay, and false
incidents per GPU-day on busy fleets (no episode), overall and on the diurnal-serving and
checkpoint-dip fleets. Exit 0 (the command reports; the tests hold the bar).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from bench.truth import model_eval
from bench.truth.evaluate import evaluate, rules_by_detector
from bench.truth.report import false_incidents, summary, table, trace_table
from bench.truth.splits import SPLITS, seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.truth", description=__doc__)
    parser.add_argument("--split", choices=sorted(SPLITS), default="heldout")
    parser.add_argument("--detectors", nargs="*", default=[], help="detector names (default: all)")
    parser.add_argument("--seed-count", type=int, default=2, help="seeds per fleet family (1-50)")
    parser.add_argument("--quick", action="store_true", help="one seed of the quick families")
    parser.add_argument("--workers", type=int, default=2, help="fleets replayed at once")
    parser.add_argument("--verbose", action="store_true", help="also list every fleet's run")
    parser.add_argument(
        "--show-false", action="store_true", help="also list every incident that matched no episode"
    )
    args = parser.parse_args(argv)
    unknown = set(args.detectors) - set(rules_by_detector())
    if unknown:
        known = ", ".join(sorted(rules_by_detector()))
        parser.error(f"unknown detector(s) {', '.join(sorted(unknown))}: one of {known}")
    if not 1 <= args.seed_count <= 50:
        parser.error("--seed-count is 1-50")
    logging.basicConfig(level=logging.ERROR)
    began = time.perf_counter()
    result = evaluate(
        args.split, args.seed_count, args.detectors, quick=args.quick, workers=args.workers
    )
    for note in result.notes:
        print(note)
    for detector, rules in rules_by_detector(args.detectors).items():
        if detector in model_eval.PLAN:
            continue  # the model fleets below
        scores = [result.scores[r] for r in rules if r in result.scores]
        print(table(detector, scores), end="\n\n")
    print(summary(list(result.scores.values())), end="\n\n")
    if args.show_false:
        outcomes = [r.outcome for r in result.fleets]
        print(false_incidents(outcomes, list(result.scores)), end="\n\n")
    if result.traces:
        rules = [r for rules in rules_by_detector(args.detectors).values() for r in rules]
        print(trace_table([t.outcome for t in result.traces], rules), end="\n\n")
    if args.verbose:
        for r in (*result.fleets, *result.traces):
            o = r.outcome
            print(f"{o.name:24} {len(o.episodes):3d} episodes {len(o.incidents):4d} incidents "
                  f"{r.cycles:4d} cycles {r.seconds:6.1f} s")  # fmt: skip
    if not args.quick:  # the model-serving fleets: each detector with its own shipped rules
        chosen = [d for d in model_eval.PLAN if not args.detectors or d in args.detectors]
        for detector in chosen:
            count = min(args.seed_count, model_eval.SEED_CAP.get(detector, args.seed_count))
            report = model_eval.report_detector(detector, args.split, seeds(args.split, count))
            print(report, end="\n\n", flush=True)
    print(
        f"split {args.split}, seeds {result.seeds}; {len(result.fleets)} fleets, "
        f"{result.gpu_days:.2f} GPU-days; {time.perf_counter() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
