"""NAB scores of the stored reference detectors, by our own scorer (``collector/detect/nab.py``).

Run: ``.venv/bin/python bench/nab_score.py [--detector-dir DIR] [--nab-dir DIR]`` (about 3 s).

Prints the normalised score (null = 0, perfect = 100) of HTM (``numenta``), windowedGaussian and
null for the three NAB profiles on the whole corpus (58 files, 116 windows), then on the
realAWSCloudwatch and realKnownCause categories alone: a category keeps only its files and is
normalised with the null and perfect scores of those files. Every score uses NAB's stored global
threshold for the detector and profile (``config/thresholds.json``), which NAB tuned on the whole
corpus (in-sample); the thresholds are not re-tuned per category. TP/FP/FN are for the standard
profile: windows detected, alarms outside windows after the probationary rows, windows missed.

``--detector-dir`` holds either ``<detector>_anomaly_scores.csv[.gz]`` files (``file,timestamp,
anomaly_score``, as in ``../shared/data/nab/reference_detector_scores``) or NAB results folders
``<detector>/<category>/<detector>_<file>.csv``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpuwarden.collector.detect import nab

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nab-dir", type=Path, default=NAB_DIR, help="labels/ and config/")
    parser.add_argument("--detector-dir", type=Path, default=None, help="detector outputs")
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
