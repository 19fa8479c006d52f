"""``level_shift``: a series moved to a new level and stayed there (two stages, any metric).

Each cycle reads every selected series at the store's full resolution: a ``baseline_seconds``
history and the ``window_seconds`` after it, the newest slot excluded (not complete yet).

0. **Tenure** (:mod:`.level_shift_jobs`): a series of a GPU is judged from its holder's newest
   change on (a job starting or ending is not a shift); a tenure that covers less than half of
   the baseline or the window is UNKNOWN.
1. **Screen** (:func:`.level_shift_screen.screen_shifts`, numpy over all rows at once, in
   blocks): shifted, like a break, on the rule's ``direction`` (the level now against the
   baseline's median *and* the window's mean residual), by at least ``min_change``, to a level
   of at least ``ignore_below`` (utilisation fallen to idle is the idle rules' finding), and for
   longer than twice the longest phase the series came back from (a training job's checkpoints
   and evaluations). A serving job's candidate goes on only when its model's request rate does
   not explain it (:func:`.level_shift_jobs.traffic_explains`); without a request rate it is
   UNKNOWN.
2. **Confirm** (:func:`.confirm.confirm_shifts`) the candidates only, with statsmodels: STL
   (when ``season_seconds`` is set), a break test on the deseasonalised, AR(1)-prewhitened
   residuals and the interval of an AR(1)+constant SARIMAX. The fits are kept per series, one
   cache per store, and reused for ``confirm.FitCache.refit_every`` cycles; reused candidates are
   judged in one numpy pass. At most ``max_fits`` fits run per cycle (about 70 ms each with
   STL): new series first, then refits that are due, the strongest candidates first. A new
   series over the budget is UNKNOWN until a later cycle fits it; a due refit over it reuses
   its fit once more, so refits spread over cycles instead of all landing in one. The confirm
   holds the direction too: a window whose mean residual lies on the other side is not
   confirmed.
3. **Fold by job**: the GPUs of one job make one finding about the job (subject ``job:<key>``,
   evidence listing the GPUs that shifted); a series nobody holds keeps its own finding.

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

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.drift import DIRECTIONS
from gpuwarden.collector.detect.findings import Finding, Verdict, new_finding
from gpuwarden.collector.detect.level_shift_jobs import (
    Judged,
    Tenure,
    fold_by_job,
    model_rates,
    tenures,
    traffic_explains,
    traffic_ratio,
)
from gpuwarden.collector.detect.level_shift_screen import (
    BLOCK_ROWS,
    Screened,
    ShiftScreen,
    screen_shifts,
)
from gpuwarden.collector.detect.metric_anomaly import (
    series_facts,
    series_identity,
    series_selected,
    series_subject,
)
from gpuwarden.collector.detect.numerics.confirm import Confirmation, FitCache, confirm_shifts
from gpuwarden.collector.rules.durations import format_duration
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, integer, number, text
from gpuwarden.collector.store.types import SeriesInfo

__all__ = ["BLOCK_ROWS", "DETECTOR", "LevelShiftParams", "Screened", "ShiftScreen", "screen_shifts"]

FloatMatrix = npt.NDArray[np.float64]
FloatVector = npt.NDArray[np.float64]
BoolVector = npt.NDArray[np.bool_]

MIN_KNOWN = 0.5
POINTS = 120
REFIT_EVERY = 20
FIT_CAPACITY = 16_384
"""Fits kept per store (all level_shift rules): a few hundred bytes each (the seasonal profile
and three parameters), so the candidates of a 10,000-GPU fleet stay in memory between cycles."""


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
    """Engine runner: one finding per job holding a selected series' GPU, and one per series
    whose GPU nobody holds (see :mod:`.level_shift_jobs`)."""
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
        season_slots=round(season_s / step) if season_s > 0 else 0,
    )
    end = math.floor(now / step) * step  # the current slot is not complete yet
    start = end - baseline_s - window_s
    labels = dict(rule.selector.labels) or None
    judged: list[Judged] = []
    for metric in rule.selector.metrics:
        matrix = store.matrix(metric, selector=labels, start=start, end=end)
        rows = [i for i, info in enumerate(matrix.series) if series_selected(rule, info.attributes)]
        if not rows:
            continue
        values = np.asarray(matrix.values[rows], dtype=np.float64)
        infos = [matrix.series[i] for i in rows]
        held = tenures(ctx, infos, values, matrix.times, step, (start, end))
        for i, tenure in enumerate(held):
            values[i, ~tenure.mask] = np.nan  # judged within the current holder's tenure
        served = {m for m in (_serving_model(ctx, t.holder) for t in held) if m is not None}
        rates = model_rates(ctx, served, start, end, values.shape[1])
        split = int(np.sum(matrix.times < end - window_s))
        judged += _judge_metric(
            ctx, rule, infos, matrix.times + step, values, split, params,
            period=round(season_s / step) if season_s > 0 else None,
            first_slot=round(float(matrix.times[0]) / step) if len(matrix.times) else 0,
            max_fits=p.max_fits, step=step, held=held, rates=rates,
        )  # fmt: skip
    return fold_by_job(ctx, rule, judged)


def _serving_model(ctx: DetectionContext, holder: str) -> str | None:
    job = ctx.job(holder) if holder else None
    return job.model if job is not None and job.model else None


@dataclass(frozen=True, slots=True)
class _Traffic:
    """The traffic check of a metric's candidates held by serving jobs (row → ...)."""

    ratio: dict[int, float]
    explained: set[int]
    unknown: set[int]


def _traffic(
    ctx: DetectionContext,
    screened: Screened,
    rows: npt.NDArray[np.int64],
    values: FloatMatrix,
    split: int,
    held: list[Tenure],
    rates: dict[str, FloatVector],
    params: ShiftScreen,
) -> _Traffic:
    """A serving job's candidate is judged further only when its traffic does not explain it."""
    ratio: dict[int, float] = {}
    for i in rows.tolist():
        model = _serving_model(ctx, held[i].holder)
        if model is not None:
            before = np.zeros(values.shape[1], dtype=np.bool_)
            before[:split] = ~np.isnan(values[i, :split])
            ratio[i] = traffic_ratio(rates.get(model), before, params.hold_slots)
    explained = {
        i for i, r in ratio.items()
        if math.isfinite(r) and traffic_explains(
            float(screened.level[i]), float(screened.baseline_level[i]), r,
            params.direction, params.min_change,
        )
    }  # fmt: skip
    return _Traffic(ratio, explained, {i for i, r in ratio.items() if not math.isfinite(r)})


def _confirm(
    ctx: DetectionContext,
    keys: list[Hashable],
    baseline: FloatMatrix,
    window: FloatMatrix,
    candidates: npt.NDArray[np.int64],
    strength: FloatVector,
    *,
    period: int | None,
    first_slot: int,
    max_fits: int,
    direction: str,
) -> tuple[dict[int, Confirmation], set[int]]:
    """The confirm's verdicts of the candidates it ran on, and the new series it deferred.

    Candidates with a young kept fit cost next to nothing. Fits cost ~70 ms each, so at most
    ``max_fits`` run: new series first, then refits that are due, strongest first in each. A
    due refit over the budget reuses its fit once more; a new series over it waits (UNKNOWN).
    """
    cache = ctx.cache(new_fit_cache)
    young = np.array([cache.peek(keys[i], period) for i in candidates], dtype=np.bool_)
    kept = np.array([cache.kept(keys[i], period) for i in candidates], dtype=np.bool_)
    order = np.argsort(-np.nan_to_num(np.abs(strength[candidates]), nan=0.0), kind="stable")
    new, due = candidates[order][~kept[order]], candidates[order][(kept & ~young)[order]]
    for i in due[max(max_fits - new.size, 0) :].tolist():
        cache.postpone(keys[i])
    deferred = set(new[max_fits:].tolist())
    chosen = np.array(sorted(set(candidates.tolist()) - deferred), dtype=np.int64)
    if not chosen.size:
        return {}, deferred
    results = confirm_shifts(
        baseline[chosen], window[chosen], period,
        keys=[keys[i] for i in chosen], cache=cache, start=first_slot, direction=direction,
    )  # fmt: skip
    return dict(zip(chosen.tolist(), results, strict=True)), deferred


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
    held: list[Tenure],
    rates: dict[str, FloatVector],
) -> list[Judged]:
    baseline, window = values[:, :split], values[:, split:]
    known_base = np.mean(~np.isnan(baseline), axis=1) if split else np.zeros(len(infos))
    known_window = np.mean(~np.isnan(window), axis=1) if window.shape[1] else np.zeros(len(infos))
    fresh = ~np.isnan(window[:, -params.hold_slots :]).all(axis=1)
    judged = (known_base >= MIN_KNOWN) & (known_window >= MIN_KNOWN) & fresh
    screened = screen_shifts(baseline, window, params)
    screened_rows = np.flatnonzero(screened.candidate & judged)
    traffic = _traffic(ctx, screened, screened_rows, values, split, held, rates, params)
    blocked = traffic.explained | traffic.unknown
    candidates = np.array([i for i in screened_rows.tolist() if i not in blocked], dtype=np.int64)
    keys: list[Hashable] = [(rule.id, series_subject(info)) for info in infos]
    verdicts, deferred = _confirm(
        ctx, keys, baseline, window, candidates, screened.shift_z,
        period=period, first_slot=first_slot, max_fits=max_fits, direction=params.direction,
    )  # fmt: skip
    window_start = float(times[split - 1]) if split else float(times[0])
    out = []
    for i, info in enumerate(infos):
        tenure = held[i]
        evidence = _base_evidence(info, known_base[i], known_window[i])
        if tenure.holder:
            evidence["job"] = tenure.holder
        if i in traffic.ratio:
            evidence["traffic_ratio"] = _num(traffic.ratio[i])
        pending = i in deferred or i in traffic.unknown
        if not judged[i]:
            verdict, summary = Verdict.UNKNOWN, _unjudged(tenure, evidence)
        elif i in deferred:
            verdict, summary = Verdict.UNKNOWN, f"screened, not confirmed yet (max_fits={max_fits})"
        elif i in traffic.unknown:
            model = _serving_model(ctx, tenure.holder)
            verdict, summary = (
                Verdict.UNKNOWN,
                (
                    f"serving job {tenure.holder} ({model}): no request rate of its model to tell "
                    "its traffic from a change of its own"
                ),
            )
        else:
            evidence |= _screen_evidence(screened, i, candidate=i in verdicts)
            evidence["traffic_explains"] = i in traffic.explained
            verdict, summary = Verdict.CLEAR, ""
            result = verdicts.get(i)
            if result is not None:
                evidence |= _confirm_evidence(result)
                if result.confirmed:
                    verdict = Verdict.FIRING
                    summary = _firing_summary(info, screened, i, result, params, step)
        finding = _finding(rule, info, verdict, summary, evidence, times, values[i], window_start)
        out.append(
            Judged(
                info, tenure.holder, tenure.previous, verdict, summary, evidence, pending, finding
            )
        )
    return out


def _unjudged(tenure: Tenure, evidence: dict[str, object]) -> str:
    """Why a series with too little data is UNKNOWN (its holder changed, or data is missing)."""
    if tenure.since is None:
        return "too little data in the baseline or the window"
    evidence["tenure_start"] = tenure.since
    return (
        f"the GPU changed holder ({tenure.previous or 'nobody'} -> {tenure.holder or 'nobody'}): "
        "judged once the new tenure covers half the baseline and the window"
    )


def _screen_evidence(screened: Screened, i: int, *, candidate: bool) -> dict[str, object]:
    return {
        "level": _num(screened.level[i]),
        "baseline_level": _num(screened.baseline_level[i]),
        "change": _num(screened.change[i]),
        "shift_z": _num(screened.shift_z[i]),
        "break_sup": _num(screened.break_sup[i]),
        "candidate": candidate,
    }


def _firing_summary(
    info: SeriesInfo, screened: Screened, i: int, result: Confirmation, params: ShiftScreen,
    step: float,
) -> str:  # fmt: skip
    hold = format_duration(params.hold_slots * step)
    level, before = screened.level[i], screened.baseline_level[i]
    return (
        f"{series_subject(info)}: {level:.4g} over the last {hold}, against {before:.4g} over "
        f"the baseline ({level - before:+.4g}); break p={result.p_value:.2g}, mean residual at "
        f"{result.score:.1f}× the 99 % prediction interval's half-width"
    )


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
