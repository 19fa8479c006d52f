"""Cost of two-stage detection: vectorised screen on every series, statsmodels on candidates only.

Run: ``.venv/bin/python bench/detect_bench.py [--series 10000] [--naive-sample 200] [--seed 0]``.

Data: 10,000 GPUs × 2 h of 10 s samples (720 columns): the first hour is the baseline, the second
the window under test. Backgrounds are GenTD26 per-pod GPU duty cycles (``../shared/data/
alibaba_gentd26/pod_gpu_duty_cycle_anon.csv.gz``, 57 s samples) cut at random 2 h offsets,
linearly resampled to 10 s and given 0.01 measurement noise; without the data, synthetic
busy/idle square waves. 1 % of the series get an injected level shift in the window (±0.25 duty
cycle or 6 robust sigmas, whichever is larger, from a random slot between 60 and 240).

Prints (a) the screen time (robust z vs the baseline hour + CUSUM + held_for + peer outliers in
groups of 8 GPUs), (b) the confirm stage (``confirm.confirm_shift``: STL + prewhitened break test +
SARIMAX interval) on the candidates, (c) the naive loop running the same statsmodels confirm on
every series, timed on a sample and extrapolated to all series (printed as such), and (d) recall
on the injected shifts and false confirmations on the clean series for both. No asserts.
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.collector.detect import screen
from gpuwarden.collector.detect.confirm import confirm_shift

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba_gentd26"
COLUMNS = 360  # 1 h of 10 s samples
GROUP = 8  # GPUs per node: the peer group
PERIOD = 60  # STL period (10 min) for both the confirm stage and the naive loop


def gentd26_pods() -> np.ndarray | None:
    """Pods × 57 s samples of GPU duty cycle (NaN where absent), or None without the data."""
    path = DATA / "pod_gpu_duty_cycle_anon.csv.gz"
    if not path.exists():
        return None
    frame = pd.read_csv(path)
    wide = frame.pivot_table(
        index="container_ip", columns="timestamp_anon", values="value", aggfunc="mean"
    )
    return wide.to_numpy(dtype=np.float64)


def backgrounds(rng: np.random.Generator, series: int) -> tuple[np.ndarray, str]:
    """Series × 720 duty cycles in [0, 1]."""
    pods = gentd26_pods()
    fine = np.arange(2 * COLUMNS) * 10.0
    out = np.empty((series, 2 * COLUMNS))
    if pods is None:
        phase = rng.integers(0, 120, size=(series, 1))
        busy = ((np.arange(2 * COLUMNS) + phase) // 60) % 2
        level = rng.uniform(0.2, 0.9, size=(series, 1))
        out = busy * level + rng.normal(0, 0.03, size=out.shape)
        return np.clip(out, 0, 1), "synthetic busy/idle square waves"
    span = int(np.ceil(2 * COLUMNS * 10 / 57)) + 2
    usable = [p for p in pods if np.isfinite(p).sum() >= span]
    for i in range(series):
        pod = usable[int(rng.integers(len(usable)))]
        known = pod[np.isfinite(pod)]
        start = int(rng.integers(0, len(known) - span))
        coarse = known[start : start + span]
        out[i] = np.interp(fine, np.arange(span) * 57.0, coarse)
    out += rng.normal(0, 0.01, size=out.shape)
    return np.clip(out, 0, 1), f"GenTD26 duty cycles ({len(usable)} pods), resampled to 10 s"


def inject(rng: np.random.Generator, data: np.ndarray) -> np.ndarray:
    """Level shifts in 1 % of the series' second hour; returns the injected row indices."""
    rows = rng.choice(data.shape[0], size=max(1, data.shape[0] // 100), replace=False)
    base = data[rows, :COLUMNS]
    scale = screen.robust_scale(base, screen.nanmedian(base, axis=1), axis=1, min_scale=0.01)
    for row, sigma in zip(rows, scale, strict=True):
        start = COLUMNS + int(rng.integers(60, 240))
        size = max(0.25, 6 * float(sigma))
        sign = 1.0 if data[row, COLUMNS:].mean() < 0.5 else -1.0
        data[row, start:] = np.clip(data[row, start:] + sign * size, 0, 1)
    return np.sort(rows)


def screen_all(data: np.ndarray) -> np.ndarray:
    """Stage one on every series at once: candidate row indices."""
    baseline, window = data[:, :COLUMNS], data[:, COLUMNS:]
    z = screen.robust_z(window, baseline, min_scale=0.01)
    drift = screen.cusum(np.clip(z, -5, 5), drift=1.0, threshold=20.0).alarm.any(axis=1)
    held = screen.held_for(np.abs(z) > 4, 12).any(axis=1)
    groups = window.reshape(-1, GROUP, COLUMNS)
    peers = screen.peer_outliers(groups, tolerance=4.0, outside_fraction=0.3, min_scale=0.01)
    peer = peers.outlier.reshape(-1)
    return np.flatnonzero((drift & held) | peer)


def confirm_rows(data: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Stage two on ``rows``: the ones statsmodels confirms."""
    confirmed = [
        row
        for row in rows
        if confirm_shift(data[row, :COLUMNS], data[row, COLUMNS:], PERIOD).confirmed
    ]
    return np.array(confirmed, dtype=np.int64)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--naive-sample", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # statsmodels convergence chatter on flat idle series
    rng = np.random.default_rng(args.seed)
    series = args.series - args.series % GROUP
    data, source = backgrounds(rng, series)
    injected = inject(rng, data)
    truth = np.zeros(series, dtype=bool)
    truth[injected] = True

    started = time.perf_counter()
    candidates = screen_all(data)
    screen_s = time.perf_counter() - started
    started = time.perf_counter()
    confirmed = confirm_rows(data, candidates)
    confirm_s = time.perf_counter() - started

    # Naive: the same statsmodels confirm on every series. Timed on a sample (half injected,
    # half clean, so its recall is measured on every injected series we can afford).
    clean = np.flatnonzero(~truth)
    half = args.naive_sample // 2
    sample = np.concatenate(
        [injected[:half], rng.choice(clean, size=args.naive_sample - len(injected[:half]))]
    )
    started = time.perf_counter()
    naive_hits = confirm_rows(data, sample)
    naive_per_series = (time.perf_counter() - started) / len(sample)
    naive_s = naive_per_series * series

    two_stage_s = screen_s + confirm_s
    hit = np.isin(injected, confirmed)
    naive_injected = injected[:half]
    naive_recall = np.isin(naive_injected, naive_hits).mean()
    two_recall_same = np.isin(naive_injected, confirmed).mean()
    naive_clean = sample[~truth[sample]]
    naive_false = np.isin(naive_clean, naive_hits).mean()
    two_false = (~truth[confirmed]).sum() / (~truth).sum()

    print(f"data: {series} GPUs × {COLUMNS} slots of 10 s (plus a 1 h baseline); {source}")
    print(f"injected level shifts: {len(injected)} series (1 %)")
    print()
    print(f"{'stage':<52}{'seconds':>10}{'series':>9}")
    print(f"{'(a) screen: robust z + CUSUM + held_for + peer MAD':<52}{screen_s:>10.3f}{series:>9}")
    print(f"{'(b) confirm: STL + break test + SARIMAX interval':<52}{confirm_s:>10.3f}")
    print(f"{'    on candidates':<52}{'':>10}{len(candidates):>9}")
    print(f"{'two-stage total':<52}{two_stage_s:>10.3f}")
    label = f"(c) naive confirm on every series (extrapolated from {len(sample)})"
    print(f"{label:<52}{naive_s:>10.1f}{series:>9}")
    print(f"{'speed-up naive / two-stage':<52}{naive_s / two_stage_s:>10.0f}×")
    print()
    print("(d) quality")
    print(f"  two-stage recall, all {len(injected)} injected:           {hit.mean():.3f}")
    print(
        f"  recall on the {len(naive_injected)} injected in the naive sample: "
        f"two-stage {two_recall_same:.3f}, naive {naive_recall:.3f}"
    )
    print(
        f"  false confirmations on clean series: two-stage {two_false:.4f} "
        f"(of {(~truth).sum()}), naive {naive_false:.4f} (of {len(naive_clean)} sampled)"
    )
    print(f"  screen candidates that were injected: {truth[candidates].sum()} of {len(candidates)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
