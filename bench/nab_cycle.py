"""NAB at the production shape: the shipped ``model-traffic-anomaly`` rule, cycle by cycle.

Run from the repository root: ``.venv/bin/python -m bench.nab_cycle [--split B|A|all]
[--files NAME ...] [--cycle-seconds 60] [--jobs 1] [--save runs.jsonl]``; ``--load runs.jsonl``
scores saved runs without replaying. Not a test: it prints figures. About 12 ms of scoring per
cycle, one cycle per NAB row at the default 60 s cycle: split B (23 files, about 150,000 rows)
takes about half an hour of one core, shortest files first.

``bench/nab_score.py`` scores ``anomaly.score_series`` file-at-once: every row judged against
the whole file before it, and every row above the threshold a detection. The collector does
not run it that way. The shipped rule (``rules/default.yaml``, ``model-traffic-anomaly``)
reads the newest ``history_seconds`` (12 h) of a model's request rate at one-minute resolution
each detection cycle (every ``detection_seconds``, 60 s), rescores that window from scratch,
and fires when a score in the newest ``recent_seconds`` (3 min) reaches ``score_above``; the
incident tracker opens an incident on a firing cycle and resolves it after 3 clear cycles.

Here each NAB file is that model's traffic: row ``i`` is minute ``i`` (the detector works in
rows; NAB's 5-minute rows become minutes), sent as a cumulative ``gpuwarden.model.requests``
counter (``value * 60`` requests per minute, so the store's per-minute rate is the value) through
``CollectorService.accept`` into a real ``WindowStore``; a ``DetectionEngine`` holding only the
shipped rule, with its shipped parameters, runs ``run_cycle`` on a simulated clock every cycle,
and incidents go to a real SQLite storage. A counter cannot fall, so a file with negative values
is shifted up by its minimum (the scorer is shift-invariant: shapes, quantisation ranges and
steps do not move).

Two production scores per file, both scored with ``bench/nab.py``:

* **incidents** (what pages someone): a detection at row ``i`` when the cycle that closed
  minute ``i`` opened an incident;
* **firing cycles**: a detection at row ``i`` when that cycle's finding was FIRING (the rule's
  raw output, before the tracker's hysteresis).

Both use the shipped threshold, which was chosen on split A (``bench/nab_split.py``). Split B
is the headline; ``--split A`` or ``all`` are for comparison only.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench import nab, nab_split
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.detect.incidents import IncidentTracker
from gpuwarden.collector.detect.numerics import anomaly
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import Rule, RuleSet

NAB_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "nab"
RULE_ID = "model-traffic-anomaly"
METRIC = "gpuwarden.model.requests"
MINUTE = 60
T0 = 1_767_225_600  # midnight UTC: every minute and cycle boundary is aligned
NS = 1_000_000_000


@dataclass(frozen=True)
class CycleRun:
    """One NAB file replayed through the engine: the rows whose cycle opened or fired."""

    name: str
    rows: int
    cycles: int
    opened: tuple[int, ...]
    firing: tuple[int, ...]
    seconds: float


class _Clock:
    """The simulated time the service, the engine and the tracker all read."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def shipped_rule() -> Rule:
    """``model-traffic-anomaly`` exactly as ``rules/default.yaml`` ships it."""
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    rule = rules.get(RULE_ID)
    if rule is None:
        raise LookupError(f"the default rules have no {RULE_ID!r}")
    return rule


def threshold_of(rule: Rule) -> float:
    """The rule's ``score_above``: its alarm threshold."""
    value = rule.parameters["score_above"]
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{rule.id}: score_above is {value!r}, not a number")
    return float(value)


def request_points(name: str, values: npt.NDArray[np.float64]) -> list[NumberPoint]:
    """One cumulative request counter point per row (mid-minute), plus a zero just before row 0.

    The zero gives row 0 an increase (a counter's first point has none). Values are shifted up
    by their minimum when it is negative: a counter cannot fall.
    """
    shift = max(0.0, -float(np.min(values))) if values.size else 0.0
    totals = np.concatenate(([0.0], np.cumsum((values + shift) * MINUTE)))
    times = T0 + MINUTE * np.arange(-1, len(values)) + MINUTE // 2
    resource: dict[str, str | int | float | bool] = {"host.name": "nab", "service.name": "nab"}
    attributes: dict[str, str | int | float | bool] = {"model": name, "outcome": "success"}
    return [
        NumberPoint(resource, METRIC, "{request}", "sum", True, attributes, int(t) * NS, float(v))
        for t, v in zip(times.tolist(), totals.tolist(), strict=True)
    ]


def replay(
    name: str,
    values: npt.NDArray[np.float64],
    *,
    rule: Rule | None = None,
    cycle_seconds: float | None = None,
    rows: int | None = None,
) -> CycleRun:
    """Feed ``values`` minute by minute into a real collector; run the engine every cycle.

    ``cycle_seconds`` defaults to the collector's ``detection_seconds`` and must be a whole
    number of minutes; ``rows`` stops after that many rows (tests).
    """
    config_defaults = CollectorConfig(database=Path(":memory:"))
    cycle = float(cycle_seconds or config_defaults.detection_seconds)
    if cycle <= 0 or cycle % MINUTE:
        raise ValueError(f"the cycle must be a positive number of minutes, got {cycle} s")
    every = round(cycle / MINUTE)
    used = values if rows is None else values[:rows]
    points = request_points(name, used)
    clock = _Clock(float(T0 - MINUTE))
    opened: list[int] = []
    firing: list[int] = []
    cycles = 0
    started = time.perf_counter()
    logging.getLogger(IncidentTracker.__module__).setLevel(logging.ERROR)  # one line per opening
    with tempfile.TemporaryDirectory(prefix="gpuwarden-nab-") as tmp:
        config = CollectorConfig(database=Path(tmp) / "nab.db")
        service = build_service(config, clock=clock, job_sources=[])
        engine = DetectionEngine(
            service.detection_view,
            RuleSet((rule or shipped_rule(),)),
            storage=service.storage,
            clock=clock,
        )
        try:
            for index, point in enumerate(points):
                clock.now = point.time_unix_nano / NS
                if service.accept([point], "nab") != 0:
                    raise ValueError(f"{name}: the store refused row {index - 1}")
                row = index - 1  # points[0] is the zero before row 0
                if row < 0 or (row + 1) % every:
                    continue
                clock.now = float(T0 + MINUTE * (row + 1))  # minute ``row`` is complete
                result = engine.run_cycle(clock.now)
                if result.failed_rules:
                    raise RuntimeError(f"{name}: {RULE_ID} failed at row {row}")
                cycles += 1
                if result.opened:
                    opened.append(row)
                if result.firing:
                    firing.append(row)
        finally:
            service.storage.close()
    return CycleRun(
        name=name,
        rows=len(used),
        cycles=cycles,
        opened=tuple(opened),
        firing=tuple(firing),
        seconds=time.perf_counter() - started,
    )


def replay_file(name: str, nab_dir: Path, cycle_seconds: float | None = None) -> CycleRun:
    """:func:`replay` on one NAB data file (``"category/file.csv"``)."""
    _, values = nab.load_data_file(nab_dir / "data" / name)
    return replay(name, values, cycle_seconds=cycle_seconds)


def as_outputs(
    runs: Sequence[CycleRun], nab_dir: Path, which: str
) -> dict[str, nab.DetectorOutput]:
    """Detections (``"opened"`` or ``"firing"`` rows) as NAB outputs: score 1 at a detection."""
    outputs = {}
    for run in runs:
        stamps, _ = nab.load_data_file(nab_dir / "data" / run.name)
        scores = np.zeros(len(stamps))
        scores[list(getattr(run, which))] = 1.0
        outputs[run.name] = nab.DetectorOutput(stamps, scores)
    return outputs


def file_at_once(files: Sequence[str], nab_dir: Path) -> dict[str, nab.DetectorOutput]:
    """``anomaly.score_series`` on each whole file (the shape ``bench/nab_score.py`` scores)."""
    outputs = {}
    for name in files:
        stamps, values = nab.load_data_file(nab_dir / "data" / name)
        scores = np.nan_to_num(anomaly.score_series(stamps, values), nan=0.0)
        outputs[name] = nab.DetectorOutput(stamps, scores)
    return outputs


def _line(title: str, results: Sequence[nab.DetectorScore]) -> str:
    cells = "".join(f"{r.normalized:>9.2f}" for r in results)
    return f"{title:<44}{cells}{results[0].tp:>6}{results[0].fp:>6}{results[0].fn:>6}"


def print_scores(runs: Sequence[CycleRun], nab_dir: Path, threshold: float, scope: str) -> None:
    """Both production scores and file-at-once, for the same files and the shipped threshold."""
    windows = nab.load_windows(nab_dir / "labels" / "combined_windows.json")
    profiles = nab.load_profiles(nab_dir / "config" / "profiles.json")
    files = [run.name for run in runs]
    n_windows = sum(len(windows[f]) for f in files)
    header = f"{scope} ({len(files)} files, {n_windows} windows)"
    print(f"{header:<44}{'standard':>9}{'low FP':>9}{'low FN':>9}{'TP':>6}{'FP':>6}{'FN':>6}")
    shapes = [
        ("production: incidents opened", as_outputs(runs, nab_dir, "opened"), 0.5),
        ("production: firing cycles", as_outputs(runs, nab_dir, "firing"), 0.5),
        ("file-at-once (bench/nab_score.py)", file_at_once(files, nab_dir), threshold),
    ]
    for title, outputs, cut in shapes:
        results = [
            nab.score_detector(
                outputs, windows=windows, profile=profiles[p], threshold=cut, files=files
            )
            for p in nab.PROFILE_NAMES
        ]
        print(_line(title, results))
    print("(TP/FP/FN: standard profile; FP counts scored detections outside every window)")


def select_files(windows: Sequence[str], split: str, files: Sequence[str] | None) -> list[str]:
    """The files to replay: ``--files`` if given, else a split (``A``, ``B`` or ``all``)."""
    if files:
        unknown = sorted(set(files) - set(windows))
        if unknown:
            raise SystemExit(f"not a labelled NAB file: {unknown[0]}")
        return sorted(files)
    split_a, split_b = nab_split.split_files(windows)
    return {"A": split_a, "B": split_b, "all": sorted(windows)}[split]


def load_runs(path: Path) -> list[CycleRun]:
    """Runs saved by ``--save`` (one JSON object per line, one line per finished file)."""
    runs = []
    for line in path.read_text().splitlines():
        if line.strip():
            body = json.loads(line)
            body["opened"], body["firing"] = tuple(body["opened"]), tuple(body["firing"])
            runs.append(CycleRun(**body))
    return runs


def replay_all(
    files: Sequence[str], nab_dir: Path, cycle: float | None, jobs: int, save: Path | None
) -> list[CycleRun]:
    """Replay ``files`` (shortest first), printing and saving each one as it finishes."""
    by_size = sorted(files, key=lambda f: (nab_dir / "data" / f).stat().st_size)
    runs = []
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(replay_file, f, nab_dir, cycle) for f in by_size]
        for future in futures:
            run = future.result()
            runs.append(run)
            print(
                f"  {run.name}: {run.rows} rows, {run.cycles} cycles, {len(run.opened)} "
                f"incidents, {len(run.firing)} firing cycles, {run.seconds:.0f} s",
                flush=True,
            )
            if save is not None:
                with save.open("a") as handle:
                    handle.write(json.dumps(asdict(run)) + "\n")
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nab-dir", type=Path, default=NAB_DIR)
    parser.add_argument("--split", choices=("A", "B", "all"), default="B")
    parser.add_argument("--files", nargs="*", default=None, help="category/file.csv names")
    parser.add_argument("--cycle-seconds", type=float, default=None, help="default: 60 (config)")
    parser.add_argument("--jobs", type=int, default=1, help="files replayed in parallel")
    parser.add_argument("--save", type=Path, default=None, help="append each file's detections")
    parser.add_argument("--load", type=Path, default=None, help="score saved runs, no replay")
    args = parser.parse_args(argv)
    nab_dir: Path = args.nab_dir
    labels = nab_dir / "labels" / "combined_windows.json"
    if not labels.exists():
        print(f"NAB data not found under {nab_dir}")
        return 1
    windows = nab.load_windows(labels)
    rule = shipped_rule()
    threshold = threshold_of(rule)
    if args.load is not None:
        runs = load_runs(args.load)
        done = {run.name for run in runs}
        split_a, split_b = nab_split.split_files(windows)
        held_out = sum(name in split_b for name in done)
        print(f"{args.load}: {len(runs)} files ({held_out} of split B's {len(split_b)}, "
              f"{len(done & set(split_a))} of split A)")  # fmt: skip
        print_scores(runs, nab_dir, threshold, "saved runs")
        return 0
    files = select_files(sorted(windows), args.split, args.files)
    scope = f"split {args.split}" if not args.files else "chosen files"
    if args.split == "B" and not args.files:
        scope = nab_split.SPLIT_TITLES[nab_split.SPLIT_B]
    cycle = args.cycle_seconds or CollectorConfig(database=Path(":memory:")).detection_seconds
    print(f"rule {RULE_ID} as shipped: {dict(rule.parameters)}; cycle {cycle:g} s")
    print(f"replaying {len(files)} files (one row per minute) through CollectorService + "
          f"DetectionEngine.run_cycle ...", flush=True)  # fmt: skip
    started = time.perf_counter()
    runs = replay_all(files, nab_dir, args.cycle_seconds, args.jobs, args.save)
    print(f"replayed in {time.perf_counter() - started:.0f} s")
    print_scores(runs, nab_dir, threshold, scope)
    if math.isfinite(threshold):
        print(f"threshold {threshold} (score_above) was chosen on split A; see bench/nab_split.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
