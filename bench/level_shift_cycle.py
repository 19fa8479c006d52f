"""The level_shift rule through the collector, at fleet scale: what one engine cycle costs.

Run from the repository root: ``.venv/bin/python -m bench.level_shift_cycle [--series 10000]
[--cycles 21] [--max-fits 100] [--background gentd26|synthetic] [--seed 0]``. About 5 min
with the defaults on two cores. Not a test: it prints figures.

``bench/detect_bench.py`` measures the detector's two stages on arrays, next to the naive loop.
This one runs the rule as the engine does: the points go through ``CollectorService.accept``
(one request per 10 s timestamp) into the ``WindowStore``, and ``run_level_shift`` reads the
store's series × time matrix, so the store read and the findings (one per series per cycle)
are counted too.

Data: ``detect_bench``'s backgrounds and injected shifts (10,000 GPUs, GenTD26 duty cycles or
synthetic square waves, 1 % of samples missing, 1 % of series shifted), as ``hw.gpu.utilization``
of GPU ``hw.id`` on node ``host.name``. The rule is the default ``level_shift`` rule with the
parameters ``detect_bench``'s screen uses (both directions, no minimum change, no idle floor, a
20 min STL period) and ``--max-fits`` fits per cycle (the rule's default, 100). After 2 h of
data, a first cycle, then ``--cycles`` cycles one minute (6 samples) apart.

Prints per cycle: the wall time of ``run_level_shift`` and of its store read alone, the fits
it ran, and how many series it found FIRING or left UNKNOWN (new candidates waiting for a fit);
then the mean over the cycles where no candidate waited any more (caught up after the start),
and the recall of the injected shifts at the last cycle.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as detect_bench: tiny fits, one thread

import argparse
import dataclasses
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from bench.detect_bench import COLUMNS, PERIOD, backgrounds, inject
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect import level_shift
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import Selector
from gpuwarden.collector.store.types import AttrValue

METRIC = "hw.gpu.utilization"
STEP = 10
T0 = 1_767_225_600
NS = 1_000_000_000


def say(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=level_shift.REFIT_EVERY + 1)
    parser.add_argument("--max-fits", type=int, default=100)
    parser.add_argument("--background", choices=("gentd26", "synthetic"), default="gentd26")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    rng = np.random.default_rng(args.seed)
    series = args.series - args.series % 8
    width = 2 * COLUMNS + args.cycles * 6
    data, source, _ = backgrounds(rng, series, args.background, width)
    injected = inject(rng, data)
    data[rng.random(data.shape) < 0.01] = np.nan
    say(f"backgrounds: {source}; {series} GPUs, {len(injected)} injected level shifts")

    rule = next(
        r
        for r in load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir()).rules
        if r.detector == "level_shift"
    )
    rule = dataclasses.replace(
        rule,
        selector=Selector(metrics=(METRIC,)),
        parameters={
            **rule.parameters,
            "direction": "both",
            "min_change": 0.0,
            "ignore_below": -1e12,
            "season_seconds": float(PERIOD * STEP),
            "max_fits": args.max_fits,
        },
    )
    now = [float(T0)]
    with tempfile.TemporaryDirectory() as tmp:
        config = CollectorConfig(database=Path(tmp) / "c.db", recent_hours=3)
        svc = build_service(config, clock=lambda: now[0])
        resources: list[dict[str, AttrValue]] = [
            {"host.name": f"node-{i // 8:05d}"} for i in range(series)
        ]
        attributes: list[dict[str, AttrValue]] = [{"hw.id": f"GPU-{i:06d}"} for i in range(series)]

        def feed(columns: range) -> float:
            began = time.perf_counter()
            for col in columns:
                t = T0 + col * STEP
                now[0] = t + 1.0
                values = data[:, col]
                points = [
                    NumberPoint(resources[i], METRIC, "1", "gauge", False, attributes[i],
                                t * NS, float(values[i]))
                    for i in np.flatnonzero(np.isfinite(values)).tolist()
                ]  # fmt: skip
                svc.accept(points, "agents")
            return time.perf_counter() - began

        fed = feed(range(2 * COLUMNS))
        say(f"fed 2 h ({2 * COLUMNS} timestamps, {np.isfinite(data[:, : 2 * COLUMNS]).sum():,} "
            f"points) through CollectorService.accept in {fed:.0f} s")  # fmt: skip
        truth = {f"GPU-{i:06d}" for i in injected.tolist()}
        walls: list[float] = []
        last_found: set[str] = set()
        for cycle in range(args.cycles + 1):
            if cycle:
                start = 2 * COLUMNS + (cycle - 1) * 6
                feed(range(start, start + 6))
            end = now[0] + STEP  # the newest slot has its sample
            began = time.perf_counter()
            svc.store.matrix(METRIC, start=end - 7200, end=end)
            read = time.perf_counter() - began
            fits_before = svc.detection_view.cache(level_shift.new_fit_cache).fitted
            began = time.perf_counter()
            findings = level_shift.DETECTOR.detect(svc.detection_view, rule, end)
            wall = time.perf_counter() - began
            fits = svc.detection_view.cache(level_shift.new_fit_cache).fitted - fits_before
            firing = {str(f.evidence["gpu"]) for f in findings if f.verdict is Verdict.FIRING}
            waiting = sum(
                f.verdict is Verdict.UNKNOWN and "max_fits" in f.summary for f in findings
            )
            say(f"cycle {cycle}: run_level_shift {wall:.2f} s (store read {read:.2f} s), "
                f"{fits} fits, {len(findings)} findings: {len(firing)} FIRING "
                f"({len(firing & truth)} injected), {waiting} waiting for a fit")  # fmt: skip
            if cycle and not waiting:
                walls.append(wall)  # caught up: no candidate waits for its first fit
            last_found = firing
        if walls:
            mean, top = float(np.mean(walls)), float(np.max(walls))
            recall = len(last_found & truth) / len(truth)
            say(
                f"{len(walls)} cycles with no candidate waiting for a fit: mean {mean:.2f} s, "
                f"max {top:.2f} s; recall of the injected shifts at the last cycle {recall:.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
