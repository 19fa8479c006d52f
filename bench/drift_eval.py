"""Model-drift detector on real backgrounds: detection delay of injected steps/ramps, A/A alerts.

Run: ``.venv/bin/python bench/drift_eval.py [--seeds 25] [--injections 40]`` (a few minutes).

Backgrounds (``../shared/data``):

* **GenTD26 latency** (``alibaba_gentd26/pipeline_inference_data_anon.csv.gz``: 34,421 end-to-end
  latencies of a production Stable-Diffusion cluster, 57 s ticks, 22.8 h). Resampled to 15 s bins
  as a request stream: bin ``t`` gets ``Poisson(rate(t)·15 s)`` requests whose latencies are drawn
  (smoothed bootstrap: times ``exp(0.05·N(0,1))``) from the real latencies within ±15 min of
  ``t``, so the latency distribution follows the real one through the day. ``rate(t)`` either
  follows the real density of latency records (scaled to a mean of 10 req/s: busy hours ~27
  req/s, quiet ones ~0.5 req/s; ``traffic=real``) or is a flat 10 req/s (``traffic=flat``).
  ``traffic=stationary`` is the A/A with no change by construction: a flat 10 req/s whose
  latencies are drawn from the whole day's records, so the real day's own excursions (a slow
  group of ~10 requests at 6.9 h moves the p99 by +22 % for 6 min) are not in it. Each
  bin's latencies are bucketed as vLLM's ``e2e_request_latency_seconds`` histogram does (its
  default bounds, 0.3 s … 7680 s), the detector reads p99 of the merged buckets of each window.
* **PAI throughput** (``alibaba_pai_minibatch/job_4_norm.csv``: 10 workers × 2,183 mini-batch
  records). Each record becomes one 15 s bin of a throughput counter (increase =
  15 s × 1000 / ``batch_time_norm``): real values, no resampling noise; ~9.1 h per worker. Jobs
  1-3 hold ~1 h per worker, shorter than the history the detector needs, and are not used.

Injections: a 20 % step (latency × 1.2; throughput × 0.8) or a ramp to 20 % over 30 min, at a
random bin with at least the detector's history before it; the delay is from the change to the
end of the first bin whose cycle fires (cycles every 15 s). A/A: no injection, every 15 s cycle
from the first judgeable one to the end; an alert is a rising edge of FIRING. The rate per series
per week is ``alerts / series-hours × 168``; with no alert the 95 % upper bound (rule of three)
``3 / series-hours × 168`` is printed too. GenTD26 A/A repeats the resampling with ``--seeds``
seeds: they share the one real day, so they are not independent weeks of real traffic.

Every cycle runs the detector's own code (``drift.window_statistic`` and
``numerics.drift.evaluate``: the vectorised screen over all cycles at once, statsmodels
confirmation of the candidates) on arrays, without going through the store
(``tests/test_detect_drift.py`` checks that path end to end).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from gpuwarden.agent.traces import GENTD26_LATENCY_FILE, gentd26_cells
from gpuwarden.collector.detect.drift import bin_values, window_statistic
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.model_series import Binned
from gpuwarden.collector.detect.numerics.drift import DriftParams, evaluate
from gpuwarden.collector.detect.numerics.drift_noise import quantile_noise
from gpuwarden.collector.store.types import Kind

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
BIN = 15.0
VLLM_E2E_BOUNDS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINE_BOUNDS = tuple(float(b) for b in np.geomspace(0.5, 500.0, 73))  # ~10 % buckets
POOL_SECONDS = 900.0
POOL_RECORDS = 400
MEAN_RATE = 10.0
JITTER = 0.05
CHUNK = 200

LATENCY = DriftParams(
    statistic="p99",
    direction="increase",
    window_seconds=300.0,
    history_seconds=6 * 3600.0,
    season_seconds=0.0,
    threshold=4.0,
    min_relative_change=0.15,
    bin_seconds=BIN,
)
THROUGHPUT = replace(LATENCY, statistic="rate", direction="decrease", history_seconds=2 * 3600.0)


@dataclass(frozen=True)
class Latencies:
    """The real latency records, sorted by time, and the 15 s grid over them."""

    times: np.ndarray
    seconds: np.ndarray
    grid: np.ndarray


def load_gentd26() -> Latencies:
    cells = list(gentd26_cells(DATA / "alibaba_gentd26" / GENTD26_LATENCY_FILE))
    t = np.array([float(c.timestamp) for c in cells])
    ms = np.array([float(c.value) for c in cells])
    order = np.argsort(t, kind="quicksort")  # as pandas' sort_values did (ties: not stable)
    t = t[order]
    t = t - math.floor(t[0] / BIN) * BIN
    grid = np.arange(0.0, t[-1] + BIN, BIN)
    return Latencies(times=t, seconds=ms[order] / 1e3, grid=grid)


def latency_parts(
    lat: Latencies,
    rng: np.random.Generator,
    *,
    traffic: str,
    bounds: tuple[float, ...],
    factor: np.ndarray,
) -> np.ndarray:
    """Bins × (buckets + sum) of a resampled request stream; ``factor`` scales each bin."""
    centers = lat.grid + BIN / 2
    if traffic == "stationary":  # no change by construction: every bin draws from the whole day
        n = rng.poisson(np.full(centers.size, MEAN_RATE) * BIN)
        which = np.repeat(np.arange(centers.size), n)
        pick = rng.integers(0, lat.times.size, size=which.size)
        values = lat.seconds[pick] * np.exp(JITTER * rng.standard_normal(which.size))
        values = values * factor[which]
        b = np.searchsorted(np.asarray(bounds), values, side="left")
        nb = len(bounds) + 1
        counts = np.bincount(which * nb + b, minlength=centers.size * nb)
        sums = np.bincount(which, weights=values, minlength=centers.size)
        return np.column_stack([counts.reshape(centers.size, nb).astype(np.float64), sums])
    if traffic == "real":
        lo = np.searchsorted(lat.times, centers - POOL_SECONDS)
        hi = np.searchsorted(lat.times, centers + POOL_SECONDS)
        density = (hi - lo) / (2 * POOL_SECONDS)
        rate = density * MEAN_RATE / density.mean()
    else:
        rate = np.full(centers.size, MEAN_RATE)
    mid = np.searchsorted(lat.times, centers)
    lo = np.clip(mid - POOL_RECORDS // 2, 0, lat.times.size - POOL_RECORDS)
    hi = lo + POOL_RECORDS
    n = rng.poisson(rate * BIN)
    which = np.repeat(np.arange(centers.size), n)
    pick = lo[which] + (rng.random(which.size) * (hi - lo)[which]).astype(np.int64)
    values = lat.seconds[pick] * np.exp(JITTER * rng.standard_normal(which.size)) * factor[which]
    b = np.searchsorted(np.asarray(bounds), values, side="left")
    nb = len(bounds) + 1
    counts = np.bincount(which * nb + b, minlength=centers.size * nb).reshape(centers.size, nb)
    sums = np.bincount(which, weights=values, minlength=centers.size)
    return np.column_stack([counts.astype(np.float64), sums])


def load_pai() -> dict[str, np.ndarray]:
    df = pd.read_csv(DATA / "alibaba_pai_minibatch" / "job_4_norm.csv")
    out = {}
    for worker, rows in df.sort_values("time").groupby("worker"):
        out[f"job4/worker{worker}"] = rows["batch_time_norm"].to_numpy(dtype=np.float64)
    return out


def throughput_parts(batch_time: np.ndarray, factor: np.ndarray) -> np.ndarray:
    inc = BIN * 1000.0 / batch_time * factor
    return np.column_stack([inc, np.zeros_like(inc)])


@dataclass(frozen=True)
class Replay:
    """Per cycle: verdict, screen z and relative change, requests in the window."""

    verdicts: np.ndarray
    z: np.ndarray
    relative_change: np.ndarray
    requests: np.ndarray


def replay(binned: Binned, params: DriftParams, cycles: np.ndarray) -> Replay:
    """Judge each cycle (bin index: the cycle runs once that bin is complete)."""
    window_bins = round(params.window_seconds / BIN)
    history_bins = round(params.history_seconds / BIN)
    y = window_statistic(binned, params, window_bins)
    noise = quantile_noise(binned, params.statistic, window_bins)
    per_bin = bin_values(binned, params.statistic)
    out = Replay(
        np.full(cycles.size, int(Verdict.UNKNOWN), dtype=np.int8),
        np.full(cycles.size, np.nan),
        np.full(cycles.size, np.nan),
        np.full(cycles.size, np.nan),
    )
    if binned.kind is Kind.HISTOGRAM:
        csum = np.concatenate([[0.0], np.cumsum(np.nan_to_num(binned.parts[:, :-1]).sum(axis=1))])
        out.requests[:] = csum[cycles + 1] - csum[np.maximum(cycles + 1 - window_bins, 0)]
    for start in range(0, cycles.size, CHUNK):
        chunk = cycles[start : start + CHUNK]
        rows = np.stack([y[c - history_bins + 1 : c + 1] for c in chunk])
        noise_rows = np.stack([noise[c - history_bins + 1 : c + 1] for c in chunk])
        bin_rows = np.stack([per_bin[c - history_bins + 1 : c + 1] for c in chunk])
        got = evaluate(
            rows,
            params,
            window_bins=window_bins,
            bin_seconds=BIN,
            noise=noise_rows,
            bin_values=bin_rows,
        )
        part = slice(start, start + chunk.size)
        out.verdicts[part] = got.verdicts
        out.z[part] = got.screen.z
        out.relative_change[part] = got.screen.relative_change
    return out


def episodes_of(run: Replay, cycles: np.ndarray) -> list[str]:
    """One line per A/A alert episode: hour of the day, duration, peak z and change, requests."""
    firing = run.verdicts == int(Verdict.FIRING)
    on = np.flatnonzero(firing)
    lines: list[str] = []
    if on.size == 0:
        return lines
    breaks = np.flatnonzero(np.diff(on) > MERGE_BINS)
    for group in np.split(on, breaks + 1):
        first, last = int(group[0]), int(group[-1])
        span = slice(first, last + 1)
        requests = run.requests[span]
        lines.append(
            f"{cycles[first] * BIN / 3600:5.2f} h, {(last - first + 1) * BIN / 60:4.1f} min "
            f"({group.size} FIRING cycles), peak z {np.nanmax(run.z[span]):.1f}, "
            f"peak change {100 * np.nanmax(np.abs(run.relative_change[span])):.0f} %"
            + (
                f", requests/window {np.median(requests):.0f}"
                if np.isfinite(requests).all()
                else ""
            )
        )
    return lines


MERGE_BINS = 120
"""Alerts closer than 30 min to the end of the previous one are one episode (one incident)."""


def alerts(verdicts: np.ndarray) -> tuple[int, int]:
    """(rising edges of FIRING, episodes: edges more than ``MERGE_BINS`` after the last FIRING)."""
    firing = verdicts == int(Verdict.FIRING)
    on = np.flatnonzero(firing)
    edges = np.flatnonzero(firing & ~np.concatenate([[False], firing[:-1]]))
    episodes = 0
    for e in edges.tolist():
        before = on[on < e]
        if before.size == 0 or e - int(before[-1]) > MERGE_BINS:
            episodes += 1
    return int(edges.size), episodes


def first_cycles(n_bins: int, params: DriftParams) -> int:
    return round(params.history_seconds / BIN) - 1


def delay_of(verdicts: np.ndarray, cycles: np.ndarray, onset: int) -> float:
    after = np.flatnonzero((cycles >= onset) & (verdicts == int(Verdict.FIRING)))
    if after.size == 0:
        return math.inf
    return float((cycles[after[0]] + 1 - onset) * BIN)


def summarize(name: str, delays: list[float], limit: float = 300.0) -> None:
    d = np.array(delays)
    found = d[np.isfinite(d)]
    within = np.count_nonzero(d <= limit)
    q = np.percentile(found, [0, 25, 50, 75, 90, 100]) if found.size else [math.nan] * 6
    print(
        f"  {name:<34} n={d.size:3d}  within {limit / 60:.0f} min: {within}/{d.size} "
        f"({100 * within / d.size:.0f} %)  found at all: {found.size}/{d.size}  "
        f"delay s min/p25/p50/p75/p90/max = " + "/".join(f"{v:.0f}" for v in q)
    )


def rate_line(name: str, n_alerts: int, series_hours: float, unknown: float, episodes: int) -> None:
    per_week = n_alerts / series_hours * 168
    bound = max(n_alerts, 3) / series_hours * 168 if n_alerts == 0 else math.nan
    extra = f"  (0 alerts: 95 % upper bound {bound:.2f}/week)" if n_alerts == 0 else ""
    print(
        f"  {name:<34} alerts={n_alerts:3d} over {series_hours:7.1f} series-h "
        f"= {per_week:.2f} per series-week{extra}; episodes (30 min merge) {episodes} "
        f"= {episodes / series_hours * 168:.2f} per series-week; "
        f"UNKNOWN cycles {100 * unknown:.1f} %"
    )


def gentd26(args: argparse.Namespace) -> None:
    lat = load_gentd26()
    n = lat.grid.size
    params = replace(LATENCY)
    first = first_cycles(n, params)
    cycles = np.arange(first, n)
    print(
        f"GenTD26 p99 latency, 15 s bins: {n} bins = {n * BIN / 3600:.1f} h; window "
        f"{params.window_seconds:.0f} s, history {params.history_seconds / 3600:.0f} h, "
        f"threshold {params.threshold}, min change {params.min_relative_change}, "
        f"hold {params.hold_bins} bins"
    )
    ones = np.ones(n)
    layouts = {"fine": FINE_BOUNDS, "vllm": VLLM_E2E_BOUNDS}
    for bounds_name in args.buckets:
        bounds = layouts[bounds_name]
        for traffic in args.traffic:
            label = f"{traffic} traffic, {bounds_name} buckets"
            t0 = time.perf_counter()
            total = unknown = 0
            n_alerts = n_episodes = 0
            when: list[str] = []
            first_episodes: list[str] = []
            for seed in range(args.seeds):
                rng = np.random.default_rng(seed)
                parts = latency_parts(lat, rng, traffic=traffic, bounds=bounds, factor=ones)
                binned = Binned("gentd26", "latency", Kind.HISTOGRAM, lat.grid, parts, BIN, bounds)
                run = replay(binned, params, cycles)
                verdicts = run.verdicts
                if seed == 0:
                    first_episodes = episodes_of(run, cycles)
                a, e = alerts(verdicts)
                n_alerts, n_episodes = n_alerts + a, n_episodes + e
                fired = cycles[verdicts == int(Verdict.FIRING)]
                when.append(",".join(sorted({f"{h:.0f}" for h in fired * BIN / 3600})))
                unknown += int(np.count_nonzero(verdicts == int(Verdict.UNKNOWN)))
                total += verdicts.size
            hours = total * BIN / 3600
            rate_line(f"A/A {label}", n_alerts, hours, unknown / total, n_episodes)
            print(f"    hours of the day with FIRING cycles, per seed: {' | '.join(when)}")
            for line in first_episodes:
                print(f"    seed 0 episode: {line}")
            for kind in ("step", "ramp"):
                delays = []
                rng = np.random.default_rng(1000)
                for k in range(args.injections):
                    onset = int(rng.integers(first + 40, n - 120))
                    factor = ones.copy()
                    if kind == "step":
                        factor[onset:] = 1.2
                    else:
                        ramp = np.clip((np.arange(n) - onset) / (1800 / BIN), 0.0, 1.0)
                        factor = 1.0 + 0.2 * ramp
                    parts = latency_parts(
                        lat,
                        np.random.default_rng(5000 + k),
                        traffic=traffic,
                        bounds=bounds,
                        factor=factor,
                    )
                    binned = Binned(
                        "gentd26", "latency", Kind.HISTOGRAM, lat.grid, parts, BIN, bounds
                    )
                    window = np.arange(onset - 20, min(n, onset + (80 if kind == "step" else 160)))
                    verdicts = replay(binned, params, window).verdicts
                    delays.append(delay_of(verdicts, window, onset))
                summarize(f"20 % {kind} {label}", delays, 300.0 if kind == "step" else 1800.0)
            print(f"    ({time.perf_counter() - t0:.1f} s)")


def pai(args: argparse.Namespace) -> None:
    series = load_pai()
    params = THROUGHPUT
    print(
        f"PAI job 4 throughput (rate of a counter), one record per 15 s bin: {len(series)} "
        f"workers; window {params.window_seconds:.0f} s, history "
        f"{params.history_seconds / 3600:.0f} h, direction {params.direction}"
    )
    total = unknown = n_alerts = n_episodes = 0
    per_worker = []
    episode_lines: list[str] = []
    step_delays: list[float] = []
    ramp_delays: list[float] = []
    rng = np.random.default_rng(7)
    for name, batch in series.items():
        n = batch.size
        times = np.arange(n, dtype=np.float64) * BIN
        first = first_cycles(n, params)
        cycles = np.arange(first, n)
        parts = np.asarray(throughput_parts(batch, np.ones(n)), dtype=np.float64)
        binned = Binned(name, "throughput", Kind.COUNTER, times, parts, BIN)
        run = replay(binned, params, cycles)
        verdicts = run.verdicts
        episode_lines.extend(f"{name.split('/')[1]}: {line}" for line in episodes_of(run, cycles))
        a, e = alerts(verdicts)
        n_alerts += a
        n_episodes += e
        per_worker.append(f"{name.split('/')[1]}:{a}")
        unknown += int(np.count_nonzero(verdicts == int(Verdict.UNKNOWN)))
        total += verdicts.size
        for k in range(max(1, args.injections // len(series))):
            onset = int(rng.integers(first + 40, n - 120))
            for kind, out in (("step", step_delays), ("ramp", ramp_delays)):
                factor = np.ones(n)
                if kind == "step":
                    factor[onset:] = 0.8
                else:
                    factor = 1.0 - 0.2 * np.clip((np.arange(n) - onset) / (1800 / BIN), 0, 1)
                b2 = replace(binned, parts=throughput_parts(batch, factor))
                window = np.arange(onset - 20, min(n, onset + (80 if kind == "step" else 160)))
                verdicts = replay(b2, params, window).verdicts
                out.append(delay_of(verdicts, window, onset))
            del k
    rate_line("A/A job 4 (all workers)", n_alerts, total * BIN / 3600, unknown / total, n_episodes)
    print(f"    alerts per worker: {' '.join(per_worker)}")
    for line in episode_lines:
        print(f"    episode {line}")
    # No change by construction: each worker's own batch times drawn independently (its slow
    # phases, which the real A/A above alerts on, are spread evenly over the run).
    total = unknown = n_alerts = n_episodes = 0
    for seed in range(args.seeds):
        draw = np.random.default_rng(9000 + seed)
        for name, batch in series.items():
            n = batch.size
            known = batch[np.isfinite(batch)]
            shuffled = draw.choice(known, size=n, replace=True)
            first = first_cycles(n, params)
            cycles = np.arange(first, n)
            parts = np.asarray(throughput_parts(shuffled, np.ones(n)), dtype=np.float64)
            times = np.arange(n, dtype=np.float64) * BIN
            run = replay(
                Binned(name, "throughput", Kind.COUNTER, times, parts, BIN), params, cycles
            )
            a, e = alerts(run.verdicts)
            n_alerts, n_episodes = n_alerts + a, n_episodes + e
            unknown += int(np.count_nonzero(run.verdicts == int(Verdict.UNKNOWN)))
            total += run.verdicts.size
    rate_line(
        f"A/A job 4, i.i.d. resampled ({args.seeds} seeds)",
        n_alerts,
        total * BIN / 3600,
        unknown / max(total, 1),
        n_episodes,
    )
    summarize("20 % step (throughput x 0.8)", step_delays, 300.0)
    summarize("20 % ramp over 30 min", ramp_delays, 1800.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=25, help="GenTD26 A/A resamplings")
    parser.add_argument("--injections", type=int, default=40, help="injections per setting")
    parser.add_argument("--only", choices=("gentd26", "pai"), default=None)
    parser.add_argument("--buckets", nargs="+", choices=("fine", "vllm"), default=["fine", "vllm"])
    parser.add_argument(
        "--traffic",
        nargs="+",
        choices=("stationary", "flat", "real"),
        default=["stationary", "flat", "real"],
    )
    args = parser.parse_args()
    if not (DATA / "alibaba_gentd26").is_dir():
        print(f"data not found under {DATA}")
        return 1
    t0 = time.perf_counter()
    if args.only in (None, "gentd26"):
        gentd26(args)
    if args.only in (None, "pai"):
        pai(args)
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
