"""``level_shift``: a series moved to a new level and stayed there (two stages, any metric).

Each cycle reads every selected series at the store's full resolution: a ``baseline_seconds``
history and the ``window_seconds`` after it, the newest slot excluded (not complete yet).

1. **Screen** (:func:`screen_shifts`, numpy over all rows at once, in blocks): a row is a
   candidate when it shifted *and* the shift looks like a break. Shifted: the EWMA-smoothed
   window is more than ``z_above`` robust sigmas (of the smoothed baseline) away for
   ``hold_seconds`` of known slots in a row, or the window's mean AR(1) one-step residual lies
   where the confirm's 99 % prediction interval would put it outside (``screen.ar1_tests``: a
   bursty series with wide robust sigmas still shifts its mean). Break: the CUSUM of the raw
   robust z alarms, and the confirm's break statistic on prewhitened residuals passes
   ``BREAK_SUP`` (well under the confirm's 1.63). Optionally only one direction counts, and
   only a change of at least ``min_change`` (in the metric's unit) between the baseline's mean
   and the mean of the newest ``hold_seconds``, and only to a new level of at least
   ``ignore_below`` (utilisation that fell to idle is the idle rules' finding, not this one's).
2. **Confirm** (:func:`.confirm.confirm_shifts`) the candidates only, with statsmodels: STL
   (when ``season_seconds`` is set), a break test on the deseasonalised, AR(1)-prewhitened
   residuals and the interval of an AR(1)+constant SARIMAX. The fits are kept per series, one
   cache per store, and reused for ``confirm.FitCache.refit_every`` cycles; reused candidates are
   judged in one numpy pass. At most ``max_fits`` fits run per cycle (about 70 ms each with
   STL): new series first, then refits that are due, the strongest candidates first. A new
   series over the budget is UNKNOWN until a later cycle fits it; a due refit over it reuses
   its fit once more, so refits spread over cycles instead of all landing in one.

``bench/detect_bench.py`` measures exactly this screen and confirm on 10,000 series against
the naive loop (statsmodels on every series).

Missing data is never healthy: a series with less than half of its baseline or window known,
or nothing known in the newest ``hold_seconds``, is UNKNOWN.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import norm

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.drift import DIRECTIONS
from gpuwarden.collector.detect.findings import Finding, Verdict, new_finding
from gpuwarden.collector.detect.metric_anomaly import (
    series_facts,
    series_identity,
    series_selected,
    series_subject,
)
from gpuwarden.collector.detect.numerics import screen
from gpuwarden.collector.detect.numerics.confirm import Confirmation, FitCache, confirm_shifts
from gpuwarden.collector.rules.durations import format_duration
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, integer, number, text
from gpuwarden.collector.store.types import SeriesInfo

FloatMatrix = npt.NDArray[np.float64]
FloatVector = npt.NDArray[np.float64]
BoolVector = npt.NDArray[np.bool_]

EWMA_ALPHA = 0.1
CUSUM_DRIFT, CUSUM_THRESHOLD, CUSUM_CLIP = 1.0, 20.0, 5.0
INTERVAL_ALPHA = 0.01
"""The confirm's prediction interval is 99 %: the screen's mean-residual branch uses the same."""
BREAK_SUP = 1.0
"""Screen cut on the break statistic, well below the confirm's (1.63, p = 0.01): the confirm
tests the STL remainder, the screen the raw series; measured on both of ``detect_bench``'s
backgrounds to keep every shift the confirm finds."""
BLOCK_ROWS = 2000
"""Rows per screen block: block-sized temporaries are recycled by the allocator, where each fresh
full-size one (29 MB for 10,000 × 720) costs about 60 ms of page faults the first time."""
MIN_KNOWN = 0.5
POINTS = 120
REFIT_EVERY = 20
FIT_CAPACITY = 16_384
"""Fits kept per store (all level_shift rules): a few hundred bytes each (the seasonal profile
and three parameters), so the candidates of a 10,000-GPU fleet stay in memory between cycles."""


@dataclass(frozen=True, slots=True)
class ShiftScreen:
    """Stage one's parameters, in slots and the metric's unit."""

    hold_slots: int = 36
    z_above: float = 6.0
    min_scale: float = 0.01
    min_change: float = 0.0
    direction: str = "both"
    ignore_below: float = -math.inf
    """A series whose new level (mean of the newest ``hold_slots``) is below this is not a
    candidate: e.g. utilisation that fell to idle, which the idle rules own."""

    def __post_init__(self) -> None:
        if self.hold_slots < 1 or self.z_above <= 0 or self.min_scale <= 0 or self.min_change < 0:
            raise ValueError("hold_slots, z_above and min_scale must be > 0, min_change >= 0")
        if self.direction not in ("both", "increase", "decrease"):
            raise ValueError(f"direction must be both, increase or decrease, not {self.direction}")


@dataclass(frozen=True, slots=True)
class Screened:
    """Per row: candidate or not, and the screen's numbers (NaN where not computed)."""

    candidate: BoolVector
    shift_z: FloatVector
    """z of the window's mean AR(1) residual against the baseline (sign = direction)."""
    break_sup: FloatVector
    level: FloatVector
    """Mean of the newest ``hold_slots``: the level now."""
    baseline_mean: FloatVector
    """Mean of the baseline: the level before."""

    @property
    def change(self) -> FloatVector:
        """The level now minus the level before, in the metric's unit."""
        return self.level - self.baseline_mean


def screen_shifts(baseline: FloatMatrix, window: FloatMatrix, params: ShiftScreen) -> Screened:
    """Stage one on every row of ``baseline`` and ``window`` (series × slots, NaN = missing)."""
    if baseline.shape[0] != window.shape[0]:
        raise ValueError(f"baseline has {baseline.shape[0]} rows, window has {window.shape[0]}")
    parts = [
        _screen_block(baseline[i : i + BLOCK_ROWS], window[i : i + BLOCK_ROWS], params)
        for i in range(0, baseline.shape[0], BLOCK_ROWS)
    ]
    if not parts:
        empty = np.zeros(0)
        return Screened(np.zeros(0, dtype=np.bool_), empty, empty, empty, empty)
    return Screened(*(np.concatenate(column) for column in zip(*parts, strict=True)))


def _screen_block(
    baseline: FloatMatrix, window: FloatMatrix, params: ShiftScreen
) -> tuple[BoolVector, FloatVector, FloatVector, FloatVector, FloatVector]:
    split = baseline.shape[1]
    smooth = screen.ewma(np.concatenate([baseline, window], axis=1), alpha=EWMA_ALPHA)
    z_smooth = screen.robust_z(smooth[:, split:], smooth[:, :split], min_scale=params.min_scale)
    window_known = ~np.isnan(window)
    held = screen.held_for(np.abs(z_smooth) > params.z_above, params.hold_slots, known=window_known)
    tests = screen.ar1_tests(baseline, window, min_scale=params.min_scale)
    # The confirm's interval (window residuals only) cuts at q; shift_z also counts the
    # baseline level's error, so the same cut is q / sqrt(1 + n / m).
    ratio = window.shape[1] / max(split - 1, 1)
    interval_z = float(norm.ppf(1 - INTERVAL_ALPHA / 2)) / math.sqrt(1 + ratio)
    z = screen.robust_z(window, baseline, min_scale=params.min_scale)
    drift = screen.cusum(np.clip(z, -CUSUM_CLIP, CUSUM_CLIP), CUSUM_DRIFT, CUSUM_THRESHOLD)
    with np.errstate(invalid="ignore"):
        level, before = screen.row_mean(window[:, -params.hold_slots :]), screen.row_mean(baseline)
        change = level - before
        shifted = held.any(axis=1) | (np.abs(tests.shift_z) > interval_z)
        candidate = shifted & drift.alarm.any(axis=1) & (tests.break_sup > BREAK_SUP)
        if params.min_change > 0:
            candidate &= np.abs(change) >= params.min_change
        if params.ignore_below > -math.inf:
            candidate &= level >= params.ignore_below
        if params.direction == "increase":
            candidate &= tests.shift_z > 0
        elif params.direction == "decrease":
            candidate &= tests.shift_z < 0
    return candidate, tests.shift_z, tests.break_sup, level, before


def new_fit_cache() -> FitCache:
    """The fit cache of one detection context (``ctx.cache(new_fit_cache)``)."""
    return FitCache(FIT_CAPACITY, refit_every=REFIT_EVERY)


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelShiftParams:
    """Parameters of ``level_shift``."""

    window_seconds: float = duration(
        "1h", "10m", "3h", "Window judged (full resolution: the store's recent ring)."
    )
    baseline_seconds: float = duration(
        "1h", "10m", "3h", "History before the window it is compared with."
    )
    hold_seconds: float = duration(
        "6m", "1m", "3h", "How long the smoothed shift must hold (known samples)."
    )
    z_above: float = number(
        6.0, 2.0, 50.0, "Robust sigmas of the smoothed baseline that count as shifted."
    )
    direction: str = text("both", "Which change counts.", choices=DIRECTIONS)
    min_change: float = number(
        0.0,
        0.0,
        1e12,
        "Smallest change that counts: the mean of the last hold_seconds against the baseline's "
        "mean (metric's unit).",
    )
    ignore_below: float = number(
        -1e12,
        -1e12,
        1e12,
        "A shift to a new level below this is left to other rules (e.g. utilisation fallen to "
        "idle: the idle rules'); default: none.",
    )
    noise_floor: float = number(
        0.01, 1e-9, 1e12, "Smallest noise sigma assumed (metric's unit): flat series."
    )
    season_seconds: float = duration(
        "0s", "0s", "3h", "Seasonal period STL removes before confirming (0: none)."
    )
    max_fits: int = integer(
        100,
        1,
        10_000,
        "Statsmodels fits per cycle (about 70 ms each): new series first, then due refits; "
        "the rest wait.",
    )


def _check(p: LevelShiftParams) -> tuple[str, str] | None:
    total = p.window_seconds + p.baseline_seconds
    if p.hold_seconds > p.window_seconds:
        return (
            "hold_seconds",
            f"must not exceed window_seconds ({format_duration(p.window_seconds)})",
        )
    if p.season_seconds > 0 and total < 2 * p.season_seconds:
        return "season_seconds", (
            f"baseline and window ({format_duration(total)}) must cover two seasons to remove one"
        )
    return None


def run_level_shift(
    ctx: DetectionContext, rule: Rule, p: LevelShiftParams, now: float
) -> list[Finding]:
    """Engine runner: one finding per selected series of the rule's metrics."""
    store = ctx.store
    step = float(store.step_seconds)
    window_s, baseline_s, season_s = p.window_seconds, p.baseline_seconds, p.season_seconds
    params = ShiftScreen(
        hold_slots=max(1, round(p.hold_seconds / step)),
        z_above=p.z_above,
        min_scale=p.noise_floor,
        min_change=p.min_change,
        direction=p.direction,
        ignore_below=p.ignore_below,
    )
    max_fits = p.max_fits
    end = math.floor(now / step) * step  # the current slot is not complete yet
    start = end - baseline_s - window_s
    labels = dict(rule.selector.labels) or None
    findings: list[Finding] = []
    for metric in rule.selector.metrics:
        matrix = store.matrix(metric, selector=labels, start=start, end=end)
        rows = [i for i, info in enumerate(matrix.series) if series_selected(rule, info.attributes)]
        if not rows:
            continue
        values = np.asarray(matrix.values[rows], dtype=np.float64)
        infos = [matrix.series[i] for i in rows]
        split = int(np.sum(matrix.times < end - window_s))
        findings += _judge_metric(
            ctx, rule, infos, matrix.times + step, values, split, params,
            period=round(season_s / step) if season_s > 0 else None,
            first_slot=round(float(matrix.times[0]) / step) if len(matrix.times) else 0,
            max_fits=max_fits, step=step,
        )  # fmt: skip
    return findings


def _judge_metric(
    ctx: DetectionContext,
    rule: Rule,
    infos: list[SeriesInfo],
    times: FloatVector,
    values: FloatMatrix,
    split: int,
    params: ShiftScreen,
    *,
    period: int | None,
    first_slot: int,
    max_fits: int,
    step: float,
) -> list[Finding]:
    baseline, window = values[:, :split], values[:, split:]
    known_base = np.mean(~np.isnan(baseline), axis=1) if split else np.zeros(len(infos))
    known_window = np.mean(~np.isnan(window), axis=1) if window.shape[1] else np.zeros(len(infos))
    fresh = ~np.isnan(window[:, -params.hold_slots :]).all(axis=1)
    judged = (known_base >= MIN_KNOWN) & (known_window >= MIN_KNOWN) & fresh
    screened = screen_shifts(baseline, window, params)
    candidates = np.flatnonzero(screened.candidate & judged)
    cache = ctx.cache(new_fit_cache)
    keys: list[Hashable] = [(rule.id, series_subject(info)) for info in infos]
    # Candidates with a young kept fit cost next to nothing. Fits cost ~70 ms each, so at most
    # max_fits run: new series first, then refits that are due, strongest first in each. A due
    # refit over the budget reuses its fit once more; a new series over it waits (UNKNOWN).
    young = np.array([cache.peek(keys[i], period) for i in candidates], dtype=np.bool_)
    kept = np.array([cache.kept(keys[i], period) for i in candidates], dtype=np.bool_)
    strength = np.nan_to_num(np.abs(screened.shift_z[candidates]), nan=0.0)
    order = np.argsort(-strength, kind="stable")
    new, due = candidates[order][~kept[order]], candidates[order][(kept & ~young)[order]]
    for i in due[max(max_fits - new.size, 0) :].tolist():
        cache.postpone(keys[i])
    deferred = set(new[max_fits:].tolist())
    chosen = np.array(sorted(set(candidates.tolist()) - deferred), dtype=np.int64)
    verdicts: dict[int, Confirmation] = {}
    if chosen.size:
        results = confirm_shifts(
            baseline[chosen], window[chosen], period,
            keys=[keys[i] for i in chosen], cache=cache, start=first_slot,
        )  # fmt: skip
        verdicts = dict(zip(chosen.tolist(), results, strict=True))
    window_start = float(times[split - 1]) if split else float(times[0])
    out = []
    for i, info in enumerate(infos):
        evidence = _base_evidence(info, known_base[i], known_window[i])
        if not judged[i]:
            verdict, summary = Verdict.UNKNOWN, "too little data in the baseline or the window"
        elif i in deferred:
            verdict, summary = Verdict.UNKNOWN, f"screened, not confirmed yet (max_fits={max_fits})"
        else:
            verdict, summary = Verdict.CLEAR, ""
            evidence |= {
                "level": _num(screened.level[i]),
                "baseline_mean": _num(screened.baseline_mean[i]),
                "change": _num(screened.change[i]),
                "shift_z": _num(screened.shift_z[i]),
                "break_sup": _num(screened.break_sup[i]),
                "candidate": bool(i in verdicts),
            }
            result = verdicts.get(i)
            if result is not None:
                evidence |= _confirm_evidence(result)
                if result.confirmed:
                    verdict = Verdict.FIRING
                    hold = format_duration(params.hold_slots * step)
                    level, before = screened.level[i], screened.baseline_mean[i]
                    summary = (
                        f"{series_subject(info)}: {level:.4g} over the last {hold}, against "
                        f"{before:.4g} over the baseline ({level - before:+.4g}); break "
                        f"p={result.p_value:.2g}, mean residual at {result.score:.1f}× the "
                        "99 % prediction interval's half-width"
                    )
        out.append(_finding(rule, info, verdict, summary, evidence, times, values[i], window_start))
    return out


def _num(value: float) -> float | None:
    return round(float(value), 6) if math.isfinite(value) else None


def _sig(value: float) -> float | None:
    """Three significant figures (a p-value of 1e-9 must not read 0)."""
    return float(f"{value:.3g}") if math.isfinite(value) else None


def _base_evidence(info: SeriesInfo, known_base: float, known_window: float) -> dict[str, object]:
    return {
        "metric": info.metric,
        "known_baseline": round(float(known_base), 4),
        "known_window": round(float(known_window), 4),
        **series_identity(info),
    }


def _confirm_evidence(result: Confirmation) -> dict[str, object]:
    return {
        "baseline": _num(result.baseline),
        "window_mean": _num(result.detail.get("window_mean", math.nan)),
        "p_value": _sig(result.p_value),
        "score": _num(result.score),
        "phi": _num(result.detail.get("phi", math.nan)),
        "reused_fit": bool(result.detail.get("reused_fit", 0.0)),
    }


def _finding(
    rule: Rule,
    info: SeriesInfo,
    verdict: Verdict,
    summary: str,
    evidence: dict[str, object],
    times: FloatVector,
    values: FloatVector,
    window_start: float,
) -> Finding:
    """The finding; a firing one with the baseline and window as up to ``POINTS`` means to plot
    (only firing findings' points are kept with an incident, and a fleet has thousands of the
    others each cycle)."""
    points = _plot_points(times, values) if verdict is Verdict.FIRING else ()
    return new_finding(
        rule,
        subject=series_subject(info),
        verdict=verdict,
        window=(window_start, float(times[-1]) if times.size else window_start),
        facts=series_facts(info.attributes),
        summary=summary,
        evidence={k: v for k, v in evidence.items() if isinstance(v, str | int | float | bool)},
        points=points,
    )


def _plot_points(times: FloatVector, values: FloatVector) -> tuple[tuple[float, float], ...]:
    """Means of consecutive slots, at most ``POINTS`` of them, each at its last slot's time."""
    groups = max(1, math.ceil(values.size / POINTS))
    usable = values.size - values.size % groups
    with np.errstate(invalid="ignore"):
        blocks = values[values.size - usable :].reshape(-1, groups)
        counts = (~np.isnan(blocks)).sum(axis=1)
        means = np.where(counts > 0, np.nansum(blocks, axis=1) / np.maximum(counts, 1), np.nan)
    at = times[values.size - usable :].reshape(-1, groups)[:, -1]
    return tuple((float(t), float(v)) for t, v in zip(at, means, strict=True) if math.isfinite(v))


DETECTOR = Detector(
    spec=spec_of(
        "level_shift",
        "A selected series moved to a new level and stayed there: screened on every series "
        "at once, confirmed with statsmodels (STL, prewhitened break test, AR(1) interval).",
        subjects=(Subject.JOB, Subject.NODE, Subject.DEPLOYMENT),
        signals=("hw.gpu.utilization", "hw.power", "hw.temperature"),
        params=LevelShiftParams,
        selector=("metrics", "teams", "jobs", "models", "nodes", "labels"),
        requires=("metrics",),
        check=_check,
    ),
    params=LevelShiftParams,
    run=run_level_shift,
)
