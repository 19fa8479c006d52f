"""NAB scores of the stored reference detectors and of ours, held-out split first.

Run: ``.venv/bin/python -m bench.nab_score [--detector-dir DIR] [--nab-dir DIR]`` (about 30 s).

**Headline: split B, held out.** Our detector (``gpuwarden.collector.detect.numerics.anomaly
.score_series``, file-at-once and causal) is scored at ``DEFAULT_THRESHOLD`` on the 23 real files
of split B, which chose no constant. Split A (35 files) chose the threshold and the stream
settings; ``bench/nab_split.py`` defines both splits and says what was tuned where, and this
script prints the files of each. The all-58-files score at the fixed threshold mixes the two.

**NAB leaderboard protocol (in-sample threshold).** NAB's published numbers tune one threshold
per detector and profile on all 58 files and score the same 58 files. The reference detectors
(HTM ``numenta``, windowedGaussian, null; stored outputs in ``reference_detector_scores``) are
printed that way (their thresholds are NAB's ``config/thresholds.json``), per category and on
split B, each subset normalised with the null and perfect scores of its own files, thresholds
not re-tuned. Ours is printed that way too, on one line labelled so, next to its thresholds.

TP/FP/FN are for the standard profile: windows detected, alarms outside windows after the
probationary rows, windows missed. The production shape of the shipped rule (sliding windows
rescored every cycle through the engine) is ``bench/nab_cycle.py``.

``--detector-dir`` holds either ``<detector>_anomaly_scores.csv[.gz]`` files (``file,timestamp,
anomaly_score``, as in ``../shared/data/nab/reference_detector_scores``) or NAB results folders
``<detector>/<category>/<detector>_<file>.csv``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

from bench import nab, nab_split
from gpuwarden.collector.detect.numerics import anomaly

NAB_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "nab"
DETECTORS = ("numenta", "windowedGaussian", "null")
LABELS = {"numenta": "HTM (numenta)", "windowedGaussian": "windowedGaussian", "null": "null"}
CATEGORIES = ("realAWSCloudwatch", "realKnownCause")
COLUMNS = ("standard", "low FP", "low FN")


def detector_source(directory: Path, detector: str) -> Path:
    for candidate in (
        directory / f"{detector}_anomaly_scores.csv.gz",
        directory / f"{detector}_anomaly_scores.csv",
        directory / detector,
    ):
        if candidate.exists():
            return candidate
    raise SystemExit(f"no results for {detector} in {directory}")


def run_ours(
    nab_dir: Path, windows: dict[str, tuple[nab.Window, ...]]
) -> dict[str, nab.DetectorOutput]:
    """Our detector's scores on every labelled data file (missing values score 0 for NAB)."""
    outputs = {}
    for name in sorted(windows):
        stamps, values = nab.load_data_file(nab_dir / "data" / name)
        scores = anomaly.score_series(stamps, values)
        outputs[name] = nab.DetectorOutput(stamps, np.nan_to_num(scores, nan=0.0))
    return outputs


def print_splits(windows: dict[str, tuple[nab.Window, ...]]) -> None:
    """The files of each split (defined in ``bench/nab_split.py``)."""
    for key, files in zip("AB", nab_split.split_files(windows), strict=True):
        print(f"{nab_split.SPLIT_TITLES[key]}, {len(files)} files (bench/nab_split.py):")
        for category, names in itertools.groupby(files, key=lambda n: n.split("/", 1)[0]):
            short = [n.split("/", 1)[1].removesuffix(".csv") for n in names]
            print(textwrap.fill(", ".join(short), width=100, initial_indent=f"  {category}: ",
                                subsequent_indent="    "))  # fmt: skip


def _score_line(
    title: str,
    label: str,
    outputs: dict[str, nab.DetectorOutput],
    windows: dict[str, tuple[nab.Window, ...]],
    profiles: dict[str, nab.Profile],
    thresholds: dict[str, float],
    files: list[str],
) -> str:
    n_windows = sum(len(windows[f]) for f in files)
    results = [
        nab.score_detector(
            outputs, windows=windows, profile=profiles[name], threshold=thresholds[name],
            files=files,
        )
        for name in nab.PROFILE_NAMES
    ]  # fmt: skip
    line = f"{f'{title} ({len(files)} files, {n_windows} win)':<50} {label:<17}"
    line += "".join(f"{r.normalized:>9.2f}" for r in results)
    return line + f"{results[0].tp:>6}{results[0].fp:>6}{results[0].fn:>6}"


def print_ours(
    outputs: dict[str, nab.DetectorOutput],
    windows: dict[str, tuple[nab.Window, ...]],
    profiles: dict[str, nab.Profile],
) -> None:
    """Held-out split first, then the tuning split and all files, then the leaderboard protocol."""
    split_a, split_b = nab_split.split_files(windows)
    threshold = anomaly.DEFAULT_THRESHOLD
    fixed = dict.fromkeys(nab.PROFILE_NAMES, threshold)
    print(f"ours (anomaly.score_series, file-at-once), threshold {threshold} fixed on split A")
    print(f"HEADLINE: {nab_split.SPLIT_TITLES[nab_split.SPLIT_B]}")
    print(f"{'scope':<50} {'detector':<17}" + "".join(f"{c:>9}" for c in COLUMNS)
          + f"{'TP':>6}{'FP':>6}{'FN':>6}")  # fmt: skip
    scopes: list[tuple[str, list[str]]] = [
        ("split B, held out", split_b),
        ("split A, tuning (in-sample)", split_a),
        ("all (35 of 58 chose the threshold)", sorted(windows)),
    ]
    for scope, files in scopes:
        print(_score_line(scope, "ours (fixed)", outputs, windows, profiles, fixed, files))
    print("NAB leaderboard protocol (in-sample threshold): one threshold per profile swept on "
          "the files it scores")  # fmt: skip
    for scope, files in (("all", sorted(windows)), ("split B alone", split_b)):
        line = f"{f'{scope} ({len(files)} files)':<50} {'ours (in-sample)':<17}"
        chosen = []
        for name in nab.PROFILE_NAMES:
            sweep = nab.sweep_thresholds(
                outputs, windows=windows, profile=profiles[name], files=files
            )
            best, raw = sweep.best()
            line += f"{nab.normalized_score(raw, sweep.null_raw, sweep.perfect_raw):>9.2f}"
            chosen.append(f"{name}={best:.4f}")
        print(line)
        print(f"{'':<50} in-sample thresholds: {', '.join(chosen)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nab-dir", type=Path, default=NAB_DIR, help="labels/ and config/")
    parser.add_argument("--detector-dir", type=Path, default=None, help="detector outputs")
    parser.add_argument("--skip-ours", action="store_true", help="only the stored detectors")
    args = parser.parse_args(argv)
    nab_dir: Path = args.nab_dir
    detector_dir: Path = args.detector_dir or nab_dir / "reference_detector_scores"
    if not (nab_dir / "labels" / "combined_windows.json").exists():
        print(f"NAB data not found under {nab_dir}", file=sys.stderr)
        return 1

    windows = nab.load_windows(nab_dir / "labels" / "combined_windows.json")
    profiles = nab.load_profiles(nab_dir / "config" / "profiles.json")
    thresholds = nab.load_thresholds(nab_dir / "config" / "thresholds.json")
    published_path = nab_dir / "results" / "final_results.json"
    published = json.loads(published_path.read_text()) if published_path.exists() else {}
    outputs = {
        det: nab.load_detector_results(detector_source(detector_dir, det)) for det in DETECTORS
    }

    print_splits(windows)
    print()
    if not args.skip_ours:
        started = time.perf_counter()
        ours = run_ours(nab_dir, windows)
        elapsed = time.perf_counter() - started
        print_ours(ours, windows, profiles)
        print(f"our detector ran on {len(ours)} files in {elapsed:.1f} s")
        print()
    scopes: list[tuple[str, list[str]]] = [("all", sorted(windows))]
    scopes += [(cat, nab.category_files(windows, cat)) for cat in CATEGORIES]
    scopes += [("split B, held out", nab_split.split_files(windows)[1])]
    print("reference detectors, NAB leaderboard protocol (in-sample threshold: NAB's "
          "config/thresholds.json, tuned on all 58 files)")  # fmt: skip
    header = f"{'scope':<50} {'detector':<17}" + "".join(f"{c:>9}" for c in COLUMNS)
    header += f"{'TP':>6}{'FP':>6}{'FN':>6}  (TP/FP/FN: standard)"
    print(header)
    print("-" * (len(header) - 22))
    for scope, files in scopes:
        n_windows = sum(len(windows[f]) for f in files)
        title = f"{scope} ({len(files)} files, {n_windows} win)"
        for det in DETECTORS:
            results = [
                nab.score_detector(
                    outputs[det],
                    windows=windows,
                    profile=profiles[name],
                    threshold=thresholds[det][name],
                    files=files,
                )
                for name in nab.PROFILE_NAMES
            ]
            line = f"{title:<50} {LABELS[det]:<17}"
            line += "".join(f"{r.normalized:>9.2f}" for r in results)
            line += f"{results[0].tp:>6}{results[0].fp:>6}{results[0].fn:>6}"
            print(line)
            if scope == "all" and det in published:
                ref = "".join(f"{published[det][name]:>9.2f}" for name in nab.PROFILE_NAMES)
                print(f"{'':<50} {'  published':<17}{ref}")
    print("(subsets are normalised over their own files; thresholds are not re-tuned per subset)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
