"""Distribution drift: false alarms on A/A data and detection of real and injected shifts.

Run: ``.venv/bin/python -m bench.distribution_eval [--seeds 10]``

1. Azure LLM inference 2023 (../shared/data): prompt-size histograms per window. A/A: the code
   trace's first half is the reference, its second half the current windows. Shift: the same
   reference, the conversation trace's second half as current windows. Per method and window:
   share of current windows judged drifted, findings (FIRING episodes, persistence 3), and the
   window of the first finding.
2. Synthetic seasonal latency (lognormal, median x0.2..x1.8 over the day, 2,000 requests an hour),
   10 days of hourly windows, reference 5 days: FIRING episodes per series-week on A/A data with
   and without ``same_phase``, and the delay to find a 30 % latency step.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.collector.detect.distribution import METHODS, DriftTracker
from gpuwarden.collector.detect.findings import Verdict

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "azure_llm_inference_2023"
TOKEN_BOUNDS = tuple(float(x) for x in np.round(2 ** np.arange(4, 15.5, 0.5)))
LATENCY_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
HOUR = 3600.0


def token_windows(kind: str, window: float) -> list[np.ndarray]:
    frame = pd.read_csv(DATA / f"AzureLLMInferenceTrace_{kind}.csv")
    t = pd.to_datetime(frame["TIMESTAMP"]).astype("int64").to_numpy() / 1e9
    t -= t.min()
    values = frame["ContextTokens"].to_numpy()
    out = []
    for k in range(int(t.max() // window)):
        inside = (t >= k * window) & (t < (k + 1) * window)
        buckets = np.searchsorted(TOKEN_BOUNDS, values[inside], side="left")
        out.append(np.bincount(buckets, minlength=len(TOKEN_BOUNDS) + 1).astype(float))
    return out


def replay(
    windows: list[np.ndarray],
    bounds: tuple[float, ...],
    *,
    method: str,
    window: float,
    reference_seconds: float,
    same_phase: bool,
    floor: float,
    judged_from: int,
) -> tuple[list[Verdict], list[Verdict]]:
    """Per-window verdicts and finding verdicts from window ``judged_from`` on."""
    tracker = DriftTracker(
        method=method,
        floor=floor,
        window_seconds=window,
        reference_seconds=reference_seconds,
        same_phase=same_phase,
        persistence=3,
    )
    per_window, findings = [], []
    for i, counts in enumerate(windows):
        result = tracker.add(i * window, counts, bounds)
        if i >= judged_from:
            per_window.append(result.verdict)
            findings.append(tracker.verdict)
    return per_window, findings


def episodes(findings: list[Verdict]) -> int:
    """Times the finding went to FIRING."""
    before = Verdict.CLEAR
    count = 0
    for v in findings:
        count += int(v is Verdict.FIRING and before is not Verdict.FIRING)
        before = v
    return count


def azure() -> None:
    print("## Azure LLM 2023 prompt sizes (ContextTokens), persistence 3, floor 0")
    print(
        "| window | method | A/A drifted windows | A/A findings | shift drifted | first finding |"
    )
    print("|---|---|---|---|---|---|")
    for window in (60.0, 120.0, 300.0):
        code, conv = token_windows("code", window), token_windows("conv", window)
        half = len(code) // 2
        for method in METHODS:
            common = {
                "method": method,
                "window": window,
                "reference_seconds": 1e9,
                "same_phase": False,
                "floor": 0.0,
                "judged_from": half,
            }
            aa_w, aa_f = replay(code, TOKEN_BOUNDS, **common)  # type: ignore[arg-type]
            sh_w, sh_f = replay(code[:half] + conv[half:], TOKEN_BOUNDS, **common)  # type: ignore[arg-type]
            judged = [v for v in aa_w if v is not Verdict.UNKNOWN]
            first = next((i + 1 for i, v in enumerate(sh_f) if v is Verdict.FIRING), None)
            if not judged:
                print(
                    f"| {window:.0f} s | {method} | unknown: {half} reference windows give too "
                    "few A/A distances to calibrate | | | |"
                )
                continue
            print(
                f"| {window:.0f} s | {method} | "
                f"{sum(v is Verdict.FIRING for v in judged)}/{len(judged)} | {episodes(aa_f)} | "
                f"{sum(v is Verdict.FIRING for v in sh_w)}/{len(sh_w)} | "
                f"{'window ' + str(first) if first else 'never'} |"
            )


def seasonal(seed: int, shift_from: int | None, days: int = 10) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for h in range(days * 24):
        median = 0.2 * (1 + 0.8 * np.sin(2 * np.pi * h / 24))
        if shift_from is not None and h >= shift_from:
            median *= 1.3
        sample = rng.lognormal(np.log(median), 0.5, size=2000)
        buckets = np.searchsorted(LATENCY_BOUNDS, sample, side="left")
        out.append(np.bincount(buckets, minlength=len(LATENCY_BOUNDS) + 1).astype(float))
    return out


def synthetic(seeds: int) -> None:
    print()
    print(f"## Synthetic seasonal latency, {seeds} seeds x 10 days, hourly windows, reference 5 d")
    print("| method | same_phase | A/A findings per series-week | 30 % step found after (h) |")
    print("|---|---|---|---|")
    warmup = 5 * 24
    onset = 8 * 24 + 6
    for method in ("jensen_shannon", "ks"):
        for same_phase in (True, False):
            false, delays = 0, []
            for seed in range(seeds):
                common = {
                    "method": method,
                    "window": HOUR,
                    "reference_seconds": 5 * 86400,
                    "same_phase": same_phase,
                    "floor": 0.1 if method == "jensen_shannon" else 0.05,
                    "judged_from": warmup,
                }
                _, aa = replay(seasonal(seed, None), LATENCY_BOUNDS, **common)  # type: ignore[arg-type]
                false += episodes(aa)
                _, shifted = replay(seasonal(seed, onset), LATENCY_BOUNDS, **common)  # type: ignore[arg-type]
                after = shifted[onset - warmup :]
                hit = next((i + 1 for i, v in enumerate(after) if v is Verdict.FIRING), None)
                if hit is not None:
                    delays.append(hit)
            weeks = seeds * (10 * 24 - warmup) / (7 * 24)
            found = (
                f"{np.median(delays):.0f} (median; {len(delays)}/{seeds} found)"
                if delays
                else "never"
            )
            print(f"| {method} | {same_phase} | {false / weeks:.2f} | {found} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    started = time.perf_counter()
    if DATA.exists():
        azure()
    else:
        print(f"(Azure trace not found at {DATA}: skipped)")
    synthetic(args.seeds)
    print(f"\n{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
