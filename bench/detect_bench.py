"""Cost of two-stage detection: vectorised screen on every series, statsmodels on candidates only.

Run: ``.venv/bin/python bench/detect_bench.py [--series 10000] [--naive-sample 100] [--seed 0]
[--background gentd26|synthetic] [--missing 0.01] [--inject-fraction 0.01] [--cycles 21]``.
Not a test: it prints figures, each as soon as it is measured. About 6 min with the defaults on
two cores (GenTD26), 1 min synthetic.

Data: 10,000 GPUs × 2 h of 10 s samples (720 columns; plus what the steady-state cycles move
on): the first hour is the baseline, the second the window under test (the 1 h screened).
Backgrounds are GenTD26 per-pod GPU utilisation
(``../shared/data/alibaba_gentd26/pod_gpu_duty_cycle_anon.csv.gz``, percent at 57 s, scaled to a
0-1 duty cycle) cut at random 2 h offsets of its 128 long-enough pods (so series overlap),
linearly resampled to 10 s and given 0.01 measurement noise; with ``--background synthetic`` (or
without the data), busy/idle square waves shared by the 8 GPUs of a node. ``--missing`` of the
samples are then dropped (NaN, as scrape gaps). ``--inject-fraction`` of the series (default 1 %;
series / injected bounds the speed-up of any screen at full recall) get a level shift in
the window (±0.25 duty cycle or 6 robust sigmas, whichever is larger, from a random slot between
60 and 240 of the 360).

What runs is the ``level_shift`` detector's two stages (``collector/detect/level_shift.py``),
with its default screen parameters and a 20 min STL period. Prints: (a) the screen time
(``level_shift.screen_shifts``: EWMA robust z vs the baseline hour held for 6 min or the mean
AR(1) residual outside the confirm's interval, with a CUSUM alarm and a break statistic; or a
peer outlier in its node of 8 GPUs when the backgrounds are real peers) and its recall and
precision against the injected shifts; (b) the confirm stage (``confirm.confirm_shifts``: STL +
prewhitened break test + SARIMAX interval) on the candidates, total and per candidate, and the
confirmed recall and precision; (c) the naive loop, the same statsmodels confirm on every series,
timed on a sample (half injected, half clean) and extrapolated to all series (printed as such),
with its recall and false confirmations on that sample next to the two-stage ones on the same
series; (d) the speed-up naive / (screen + confirm) of that first cycle, where every fit is new;
(e) the steady state: ``--cycles`` more cycles, each ``--cycle-slots`` slots (default 6, one
minute) later, as the engine runs every cycle. The shifted series stay candidates and their
confirm reuses the fits kept per series (``confirm.FitCache``: STL's seasonal profile and the
SARIMAX parameters, refitted after 20 uses; the reused rows judged together in numpy, as the
detector does), while the naive loop refits every series every
cycle. The default, 21 cycles, is one whole refit period (20 reuses, then the refit of every fit
the first cycle made), so the mean per cycle carries the refits' share. Printed per cycle, with
the recall of both on the sampled series at the last cycle, and next to a naive loop that also
kept a fit for every series (its reuse timed on the sample, its refits' share added). No asserts.
"""

from __future__ import annotations

import os

# The statsmodels fits are tiny: a second BLAS thread only burns the other core (measured on two
# cores: 74 vs 81 ms wall, 74 vs 132 ms CPU per confirm). Set before numpy loads; overridable.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import sys
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench.* too

import numpy as np

from bench.peer_outliers import peer_outliers
from gpuwarden.agent.traces import GENTD26_DUTY_CYCLE_FILE, gentd26_series
from gpuwarden.collector.detect import level_shift
from gpuwarden.collector.detect.numerics import screen
from gpuwarden.collector.detect.numerics.confirm import FitCache, confirm_shift, confirm_shifts

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba_gentd26"
COLUMNS = 360  # 1 h of 10 s samples
GROUP = 8  # GPUs per node: the peer group
PERIOD = 120  # STL period (20 min: the synthetic busy/idle cycle), same for both stages
SCREEN = level_shift.ShiftScreen()
"""The level_shift detector's screen with its default parameters (utilisation units)."""
REFIT_EVERY = level_shift.REFIT_EVERY
SCREEN_REPEATS = 3
T = TypeVar("T")


def say(text: str = "") -> None:
    print(text, flush=True)


def timed(fn: Callable[[], T]) -> tuple[T, float, float]:
    """``fn()``, its wall seconds and its CPU seconds (this process; insensitive to the load
    other processes put on the machine, which the wall time is not)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def gentd26_pods() -> np.ndarray | None:
    """Pods × 57 s samples of GPU duty cycle in [0, 1] (NaN where absent), or None."""
    path = DATA / GENTD26_DUTY_CYCLE_FILE
    if not path.exists():
        return None
    series = gentd26_series(path, float)
    times = sorted({t for rows in series.values() for t, _ in rows})
    column = {t: i for i, t in enumerate(times)}
    wide = np.full((len(series), len(times)), np.nan)
    for row, pod in enumerate(sorted(series)):
        seen: dict[float, list[float]] = {}
        for t, value in series[pod]:
            seen.setdefault(t, []).append(value)
        for t, values in seen.items():  # a pod sampled twice in one tick: their mean
            wide[row, column[t]] = sum(values) / len(values)
    return wide / 100.0  # the trace is in percent


def backgrounds(
    rng: np.random.Generator, series: int, kind: str, width: int = 2 * COLUMNS
) -> tuple[np.ndarray, str, bool]:
    """Series × ``width`` duty cycles in [0, 1], a description, and whether groups of 8 are
    peers."""
    pods = gentd26_pods() if kind == "gentd26" else None
    fine = np.arange(width) * 10.0
    out = np.empty((series, width))
    if pods is None:
        # A node's 8 GPUs run one job: same phase and level, independent noise (real peers).
        phase = np.repeat(rng.integers(0, 120, size=(series // GROUP, 1)), GROUP, axis=0)
        level = np.repeat(rng.uniform(0.2, 0.9, size=(series // GROUP, 1)), GROUP, axis=0)
        busy = ((np.arange(width) + phase) // 60) % 2
        out = 0.1 + busy * level + rng.normal(0, 0.03, size=out.shape)
        text = "synthetic busy/idle square waves, 8-GPU peer groups"
        if kind == "gentd26":
            text += f" (GenTD26 not found at {DATA})"
        return np.clip(out, 0, 1), text, True
    span = int(np.ceil(width * 10 / 57)) + 2
    usable = [p for p in pods if np.isfinite(p).sum() >= span]
    for i in range(series):
        pod = usable[int(rng.integers(len(usable)))]
        known = pod[np.isfinite(pod)]
        start = int(rng.integers(0, len(known) - span))
        coarse = known[start : start + span]
        out[i] = np.interp(fine, np.arange(span) * 57.0, coarse)
    out += rng.normal(0, 0.01, size=out.shape)
    text = f"GenTD26 duty cycles (2 h cuts of {len(usable)} pods), resampled to 10 s; no peers"
    return np.clip(out, 0, 1), text, False


def inject(rng: np.random.Generator, data: np.ndarray, fraction: float = 0.01) -> np.ndarray:
    """Level shifts in ``fraction`` of the series' second hour; the injected row indices."""
    count = max(1, round(data.shape[0] * fraction))
    rows = rng.choice(data.shape[0], size=count, replace=False)
    base = data[rows, :COLUMNS]
    scale = screen.robust_scale(base, screen.nanmedian(base, axis=1), axis=1, min_scale=0.01)
    for row, sigma in zip(rows, scale, strict=True):
        start = COLUMNS + int(rng.integers(60, 240))
        size = max(0.25, 6 * float(sigma))
        sign = 1.0 if np.nanmean(data[row, COLUMNS:]) < 0.5 else -1.0
        data[row, start:] = np.clip(data[row, start:] + sign * size, 0, 1)
    return np.sort(rows)


def screen_all(data: np.ndarray, use_peers: bool) -> np.ndarray:
    """Stage one on every series: candidate row indices.

    The ``level_shift`` detector's screen (:func:`level_shift.screen_shifts`, default
    parameters: hold 6 min at 6 robust sigmas, both directions) on baseline hour and window;
    when the groups are real peers, or a peer outlier in its node. In blocks of whole peer
    groups, as the detector's screen blocks its rows.
    """
    found = []
    for start in range(0, data.shape[0], level_shift.BLOCK_ROWS):
        block = data[start : start + level_shift.BLOCK_ROWS]
        base, window = block[:, :COLUMNS], block[:, COLUMNS:]
        candidate = level_shift.screen_shifts(base, window, SCREEN).candidate
        if use_peers:
            groups = window.reshape(-1, GROUP, COLUMNS)
            peers = peer_outliers(groups, tolerance=4.0, outside_fraction=0.3, min_scale=0.01)
            candidate |= peers.outlier.reshape(-1)
        found.append(start + np.flatnonzero(candidate))
    return np.concatenate(found)


def confirm_rows(
    data: np.ndarray, rows: np.ndarray, cache: FitCache | None = None, start: int = 0
) -> np.ndarray:
    """Stage two on ``rows`` of a 2 h view starting at slot ``start``: the ones statsmodels
    confirms. With ``cache``, each row's fit is kept (key: the row) and reused, the reused ones
    judged together (``confirm.confirm_shifts``, as the detector does); without, one by one."""
    if cache is None:
        confirmed = [
            row
            for row in rows.tolist()
            if confirm_shift(data[row, :COLUMNS], data[row, COLUMNS:], PERIOD).confirmed
        ]
        return np.array(confirmed, dtype=np.int64)
    results = confirm_shifts(
        data[rows, :COLUMNS], data[rows, COLUMNS:], PERIOD,
        keys=rows.tolist(), cache=cache, start=start,
    )  # fmt: skip
    return rows[np.array([r.confirmed for r in results], dtype=np.bool_)].astype(np.int64)


def recall_precision(found: np.ndarray, truth: np.ndarray) -> str:
    hits = int(truth[found].sum())
    precision = f"{hits / len(found):.3f}" if len(found) else "n/a"
    return (
        f"recall {hits / truth.sum():.3f} ({hits}/{truth.sum()} injected), "
        f"precision {precision} ({hits}/{len(found)})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--naive-sample", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--background", choices=("gentd26", "synthetic"), default="gentd26")
    parser.add_argument("--missing", type=float, default=0.01, help="fraction of samples NaN")
    parser.add_argument(
        "--inject-fraction",
        type=float,
        default=0.01,
        help="fraction of series with a level shift (series / injected bounds the speed-up)",
    )
    parser.add_argument(
        "--cycles",
        type=int,
        default=REFIT_EVERY + 1,
        help="steady-state cycles after the first (default: one refit period)",
    )
    parser.add_argument(
        "--cycle-slots", type=int, default=6, help="slots between cycles (10 s each)"
    )
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # statsmodels convergence chatter on flat idle series
    rng = np.random.default_rng(args.seed)
    series = args.series - args.series % GROUP
    width = 2 * COLUMNS + args.cycles * args.cycle_slots
    full, source, peers = backgrounds(rng, series, args.background, width)
    injected = inject(rng, full, args.inject_fraction)
    full[rng.random(full.shape) < args.missing] = np.nan
    data = np.ascontiguousarray(full[:, : 2 * COLUMNS])  # what the first cycle reads
    truth = np.zeros(series, dtype=bool)
    truth[injected] = True
    say(f"backgrounds: {source}")
    say(
        f"data: {series} GPUs × {COLUMNS} slots of 10 s (plus a 1 h baseline), "
        f"{np.isnan(data).mean():.1%} missing; {len(injected)} injected level shifts"
    )

    # (a) screen. The first call is what one detector cycle pays; repeats show the warm cost.
    candidates, screen_s, screen_cpu = timed(lambda: screen_all(data, peers))
    warm_s = min(timed(lambda: screen_all(data, peers))[1] for _ in range(SCREEN_REPEATS))
    say(
        f"(a) screen, all {series} series: {screen_s:.3f} s (cpu {screen_cpu:.3f} s; "
        f"warm best of {SCREEN_REPEATS}: {warm_s:.3f} s)"
    )
    say(f"    candidates: {len(candidates)} ({len(candidates) / series:.1%} of series)")
    say(f"    screen {recall_precision(candidates, truth)}")

    # (b) confirm the candidates only.
    say(f"(b) confirm (STL + break test + SARIMAX) on {len(candidates)} candidates ...")
    cache = FitCache(capacity=series, refit_every=REFIT_EVERY)  # what the next cycles reuse
    confirmed, confirm_s, confirm_cpu = timed(lambda: confirm_rows(data, candidates, cache))
    per_candidate = confirm_s / max(len(candidates), 1)
    say(
        f"    confirm: {confirm_s:.1f} s total (cpu {confirm_cpu:.1f} s), "
        f"{per_candidate * 1000:.1f} ms per candidate"
    )
    say(f"    confirmed: {len(confirmed)}; {recall_precision(confirmed, truth)}")
    two_stage_s, two_stage_cpu = screen_s + confirm_s, screen_cpu + confirm_cpu
    say(f"    two-stage total: {two_stage_s:.1f} s (cpu {two_stage_cpu:.1f} s)")

    # (c) naive: the same confirm on every series, timed on a sample (half injected, half
    # clean, so its recall is measured on as many injected series as we can afford).
    half = min(args.naive_sample // 2, len(injected))
    naive_injected = rng.choice(injected, size=half, replace=False)
    naive_clean = rng.choice(np.flatnonzero(~truth), size=args.naive_sample - half, replace=False)
    sample = np.concatenate([naive_injected, naive_clean])
    say(f"(c) naive confirm on a sample of {len(sample)} series ({half} injected) ...")
    naive_hits, naive_sample_s, naive_sample_cpu = timed(lambda: confirm_rows(data, sample))
    naive_per_series = naive_sample_s / len(sample)
    naive_s, naive_cpu = naive_per_series * series, naive_sample_cpu / len(sample) * series
    say(
        f"    naive: {naive_per_series * 1000:.1f} ms per series, {naive_s:.0f} s "
        f"(cpu {naive_cpu:.0f} s) extrapolated to all {series} series"
    )
    naive_recall = np.isin(naive_injected, naive_hits).mean()
    naive_false = np.isin(naive_clean, naive_hits).mean()
    two_recall = np.isin(naive_injected, confirmed).mean()
    two_false = np.isin(naive_clean, confirmed).mean()
    say(
        f"    on the {half} sampled injected, recall: naive {naive_recall:.3f}, "
        f"two-stage {two_recall:.3f}"
    )
    say(
        f"    on the {len(naive_clean)} sampled clean, false confirmations: "
        f"naive {naive_false:.3f}, two-stage {two_false:.3f}"
    )
    est_fp = naive_false * (~truth).sum()
    est_tp = naive_recall * truth.sum()
    if est_tp + est_fp > 0:
        say(f"    naive precision over all series (estimated): {est_tp / (est_tp + est_fp):.3f}")

    # (d) the ratio, with the recalls it was bought at.
    ratio = naive_s / two_stage_s
    equal = "equal" if two_recall == naive_recall else "NOT equal"
    say(
        f"(d) speed-up naive / (screen + confirm): {naive_s:.0f} / {two_stage_s:.1f} s "
        f"= {ratio:.0f}× at recall two-stage {two_recall:.3f} vs naive {naive_recall:.3f} "
        f"({equal}, same {half} injected series)"
    )
    cpu_ratio = naive_cpu / two_stage_cpu
    say(f"    on CPU seconds: {naive_cpu:.0f} / {two_stage_cpu:.1f} s = {cpu_ratio:.0f}×")
    ceiling = naive_s / (screen_s + len(injected) * naive_per_series)
    say(
        f"    for scale: a screen passing exactly the {len(injected)} injected would give "
        f"{ceiling:.0f}× (series / injected = {series / len(injected):.0f}× bounds any screen "
        "at full recall)"
    )
    if args.cycles > 0:
        steady_state(args, full, peers, truth, cache, naive_per_series, sample, half)
    return 0


def steady_state(
    args: argparse.Namespace,
    full: np.ndarray,
    peers: bool,
    truth: np.ndarray,
    cache: FitCache,
    naive_per_series: float,
    sample: np.ndarray,
    half: int,
) -> None:
    """(e) The next cycles: the window moves on, the shifted series stay candidates and their
    confirm reuses the fits kept in the first cycle; the naive loop refits every series."""
    series, slots = full.shape[0], args.cycle_slots
    say(
        f"(e) steady state: {args.cycles} more cycles, each {slots * 10} s later; screen all, "
        f"confirm the candidates reusing the fits kept per series (refit every "
        f"{cache.refit_every} uses)"
    )
    walls, cpus = [], []
    confirmed = np.array([], dtype=np.int64)
    view = full[:, : 2 * COLUMNS]
    for cycle in range(1, args.cycles + 1):
        offset = cycle * slots
        view = np.ascontiguousarray(full[:, offset : offset + 2 * COLUMNS])
        fitted, reused = cache.fitted, cache.reused
        found, screen_s, screen_cpu = timed(partial(screen_all, view, peers))
        confirmed, confirm_s, confirm_cpu = timed(partial(confirm_rows, view, found, cache, offset))
        walls.append(screen_s + confirm_s)
        cpus.append(screen_cpu + confirm_cpu)
        say(
            f"    cycle {cycle}: screen {screen_s:.3f} s, {len(found)} candidates "
            f"({cache.reused - reused} reused fits, {cache.fitted - fitted} fitted), confirm "
            f"{confirm_s:.2f} s; total {walls[-1]:.2f} s; confirmed "
            f"{recall_precision(confirmed, truth)}"
        )
    # Equal recall, measured on the last cycle: the naive loop (fresh fits) on the sample.
    offset = args.cycles * slots
    naive_hits = confirm_rows(view, sample, None, offset)
    naive_recall = np.isin(sample[:half], naive_hits).mean()
    two_recall = np.isin(sample[:half], confirmed).mean()
    naive_false = np.isin(sample[half:], naive_hits).mean()
    two_false = np.isin(sample[half:], confirmed).mean()
    # A naive loop that also kept a fit per series (all of them in memory): timed on the sample.
    kept = FitCache(capacity=len(sample))
    previous = np.ascontiguousarray(full[:, offset - slots : offset - slots + 2 * COLUMNS])
    confirm_rows(previous, sample, kept, offset - slots)
    _, reuse_s, _ = timed(lambda: confirm_rows(view, sample, kept, offset))
    reuse_per_series = reuse_s / len(sample)
    # its refits too: one fresh fit per refit_every reuses, as the two-stage cycles paid
    period = cache.refit_every + 1
    kept_per_series = (reuse_per_series * cache.refit_every + naive_per_series) / period
    naive_reuse_s = kept_per_series * series
    wall, cpu = float(np.mean(walls)), float(np.mean(cpus))
    naive_s = naive_per_series * series
    equal = "equal" if two_recall == naive_recall else "NOT equal"
    say(
        f"    last cycle, on the sampled series: recall naive {naive_recall:.3f}, two-stage "
        f"{two_recall:.3f} ({equal}); false confirmations naive {naive_false:.3f}, two-stage "
        f"{two_false:.3f}"
    )
    say(
        f"    per steady cycle: two-stage {wall:.2f} s (cpu {cpu:.2f} s) vs naive, refitting "
        f"every series: {naive_s:.0f} s = {naive_s / wall:.0f}× ({equal} recall)"
    )
    say(
        f"    vs a naive loop that also kept a fit for every series ({reuse_per_series * 1000:.1f}"
        f" ms per reuse, {kept_per_series * 1000:.1f} ms per series and cycle with its refits, "
        f"{naive_reuse_s:.0f} s): {naive_reuse_s / wall:.0f}×"
    )


if __name__ == "__main__":
    raise SystemExit(main())
