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

from bench.truth.evaluate import evaluate, rules_by_detector
from bench.truth.report import table
from bench.truth.splits import SPLITS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.truth", description=__doc__)
    parser.add_argument("--split", choices=sorted(SPLITS), default="heldout")
    parser.add_argument("--detectors", nargs="*", default=[], help="detector names (default: all)")
    parser.add_argument("--seed-count", type=int, default=2, help="seeds per fleet family (1-50)")
    parser.add_argument("--quick", action="store_true", help="one seed of the quick families")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    began = time.perf_counter()
    result = evaluate(args.split, args.seed_count, args.detectors, quick=args.quick)
    for note in result.notes:
        print(note)
    for detector, rules in rules_by_detector(args.detectors).items():
        scores = [result.scores[r] for r in rules if r in result.scores]
        print(table(detector, scores), end="\n\n")
    print(
        f"split {args.split}, seeds {result.seeds}; {len(result.fleets)} fleets, "
        f"{result.gpu_days:.2f} GPU-days; {time.perf_counter() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
