"""NAB scores of the stored reference detectors, by our own scorer (``bench/nab.py``).

Run: ``.venv/bin/python bench/nab_score.py [--detector-dir DIR] [--nab-dir DIR]`` (about 20 s).

Prints the normalised score (null = 0, perfect = 100) of HTM (``numenta``), windowedGaussian and
null for the three NAB profiles on the whole corpus (58 files, 116 windows), then on the
realAWSCloudwatch and realKnownCause categories alone: a category keeps only its files and is
normalised with the null and perfect scores of those files. Every score uses NAB's stored global
threshold for the detector and profile (``config/thresholds.json``), which NAB tuned on the whole
corpus (in-sample); the thresholds are not re-tuned per category. TP/FP/FN are for the standard
profile: windows detected, alarms outside windows after the probationary rows, windows missed.

Then ours: ``gpuwarden.collector.detect.numerics.anomaly.score_series`` run on the 58 data files
(causal, about 15 s), scored at ``DEFAULT_THRESHOLD``, fixed before scoring as the standard-profile
optimum on split A (the artificial files + every other real file by name); split B (the other
real files) is held out and printed alone. The in-sample optimum over all 58 files is printed
too, labelled so.

``--detector-dir`` holds either ``<detector>_anomaly_scores.csv[.gz]`` files (``file,timestamp,
anomaly_score``, as in ``../shared/data/nab/reference_detector_scores``) or NAB results folders
``<detector>/<category>/<detector>_<file>.csv``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench import nab
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


def split_files(windows: dict[str, tuple[nab.Window, ...]]) -> tuple[list[str], list[str]]:
    """Split A (artificial + every other real file, by name) and split B (the other real files)."""
    names = sorted(windows)
    real = [n for n in names if not n.startswith("artificial")]
    return [n for n in names if n.startswith("artificial")] + real[0::2], real[1::2]


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


def print_ours(
    outputs: dict[str, nab.DetectorOutput],
    windows: dict[str, tuple[nab.Window, ...]],
    profiles: dict[str, nab.Profile],
) -> None:
    """Ours at the fixed threshold per scope, then the in-sample optimum (labelled)."""
    split_a, split_b = split_files(windows)
    scopes: list[tuple[str, list[str]]] = [("all", sorted(windows))]
    scopes += [(cat, nab.category_files(windows, cat)) for cat in CATEGORIES]
    scopes += [("split A (picks threshold)", split_a), ("split B (held out)", split_b)]
    threshold = anomaly.DEFAULT_THRESHOLD
    print(f"ours (anomaly.score_series), threshold fixed before scoring = {threshold}")
    for scope, files in scopes:
        n_windows = sum(len(windows[f]) for f in files)
        title = f"{scope} ({len(files)} files, {n_windows} win)"
        results = [
            nab.score_detector(
                outputs, windows=windows, profile=profiles[name], threshold=threshold, files=files
            )
            for name in nab.PROFILE_NAMES
        ]
        line = f"{title:<38} {'ours (fixed)':<17}"
        line += "".join(f"{r.normalized:>9.2f}" for r in results)
        print(line + f"{results[0].tp:>6}{results[0].fp:>6}{results[0].fn:>6}")
    line = f"{'all, IN-SAMPLE optimum per profile':<38} {'ours (tuned)':<17}"
    chosen = []
    for name in nab.PROFILE_NAMES:
        sweep = nab.sweep_thresholds(outputs, windows=windows, profile=profiles[name])
        best, raw = sweep.best()
        line += f"{nab.normalized_score(raw, sweep.null_raw, sweep.perfect_raw):>9.2f}"
        chosen.append(f"{name}={best:.4f}")
    print(line)
    print(f"{'':<38} in-sample thresholds: {', '.join(chosen)}")


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

    scopes: list[tuple[str, list[str]]] = [("all", sorted(windows))]
    scopes += [(cat, nab.category_files(windows, cat)) for cat in CATEGORIES]
    header = f"{'scope':<38} {'detector':<17}" + "".join(f"{c:>9}" for c in COLUMNS)
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
            line = f"{title:<38} {LABELS[det]:<17}"
            line += "".join(f"{r.normalized:>9.2f}" for r in results)
            line += f"{results[0].tp:>6}{results[0].fp:>6}{results[0].fn:>6}"
            print(line)
            if scope == "all" and det in published:
                ref = "".join(f"{published[det][name]:>9.2f}" for name in nab.PROFILE_NAMES)
                print(f"{'':<38} {'  published':<17}{ref}")
    print()
    print(
        "thresholds: NAB's global per-profile thresholds (config/thresholds.json), tuned in-sample "
        "on all 58 files; categories are normalised over their own files, not re-tuned."
    )
    if not args.skip_ours:
        print()
        started = time.perf_counter()
        ours = run_ours(nab_dir, windows)
        elapsed = time.perf_counter() - started
        print_ours(ours, windows, profiles)
        print(f"our detector ran on {len(ours)} files in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
