"""Multi-window, multi-burn-rate SLO alerts (Google SRE workbook, chapter "Alerting on SLOs").

The error budget of an objective ``o`` is ``1 - o``; a window's burn rate is its bad-event ratio
divided by the budget (burn 1 spends exactly the budget over the period). A pair (long window,
short window, rate) fires when *both* windows burn faster than the rate: the long window proves the
burn is significant, the short one that it is still going on (so the alert resets quickly). With
99.9 % over 30 days, 1h/5m at 14.4 means 2 % of the budget gone in an hour, 6h/30m at 6 means 5 %.

Two SLOs per model deployment: errors (the ``outcome`` attribute of ``gpuwarden.model.requests``
in the rule's ``error_outcomes``; the objective is ``1 - slo_error_ratio`` of the deployment when it
has one, else the rule's) and, when the deployment has ``slo_latency_p99_seconds``, latency (bad
events are requests slower than the threshold, counted from ``gpuwarden.model.request.latency``
bucket counts; objective 0.99, since a p99 promise is "99 % of requests faster than this").

Missing data is never "fine": a window with less than ``MIN_COVERAGE`` of its minutes covered has
no burn rate, and a verdict that needs it is UNKNOWN. Coverage is read from the request counter
(the same server sends the latency histogram); latency windows longer than the store's recent
window (where histograms live) are UNKNOWN, so only the short pairs judge a latency SLO. Windows
longer than the recent window read the 1-minute long ring (per-minute mean rates x 60 s). The
budget left is judged on what the store still holds of the period (``budget_coverage_ratio``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, JsonScalar, Verdict, new_finding
from gpuwarden.collector.rules.durations import format_duration
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, durations, number, numbers, texts
from gpuwarden.collector.storage.records import ModelDeployment
from gpuwarden.collector.store.types import SeriesInfo, SeriesKey
from gpuwarden.collector.store.window import WindowStore

REQUESTS = "gpuwarden.model.requests"
LATENCY = "gpuwarden.model.request.latency"
MIN_COVERAGE = 0.8
"""Share of a window's minutes that must hold data for the window to have a burn rate."""
LATENCY_OBJECTIVE = 0.99
COVERAGE_BIN_SECONDS = 60.0


# --- the arithmetic ------------------------------------------------------------------------------


def burn_rate(bad: float, total: float, objective: float) -> float:
    """Bad-event ratio over the error budget ``1 - objective`` (no events: no burn)."""
    if total <= 0:
        return 0.0
    return (bad / total) / (1.0 - objective)


@dataclass(frozen=True, slots=True)
class PairVerdict:
    """One (long, short, rate) pair judged: burn rates are None where data was missing."""

    long_seconds: float
    short_seconds: float
    threshold: float
    long_burn: float | None
    short_burn: float | None

    @property
    def verdict(self) -> Verdict:
        """FIRING when both windows exceed the rate; CLEAR when one known window does not."""
        known = [b for b in (self.long_burn, self.short_burn) if b is not None]
        if any(b <= self.threshold for b in known):
            return Verdict.CLEAR
        if len(known) < 2:
            return Verdict.UNKNOWN
        return Verdict.FIRING


def judge_pairs(pairs: Sequence[PairVerdict]) -> Verdict:
    """FIRING if any pair fires; else UNKNOWN if any pair could not be judged; else CLEAR."""
    verdicts = [p.verdict for p in pairs]
    if Verdict.FIRING in verdicts:
        return Verdict.FIRING
    if Verdict.UNKNOWN in verdicts:
        return Verdict.UNKNOWN
    return Verdict.CLEAR


def budget_remaining(bad: float, total: float, objective: float) -> float:
    """Share of the error budget left after ``bad`` of ``total`` events (negative: overspent)."""
    return 1.0 - burn_rate(bad, total, objective)


def share_above(
    threshold: float, bounds: Sequence[float], counts: npt.NDArray[np.float64]
) -> float:
    """Observations above ``threshold`` in explicit-bucket counts (linear inside a bucket).

    Bucket ``i`` is ``(bounds[i-1], bounds[i]]``, the first starting at 0 (latencies), the last
    ``(bounds[-1], +Inf)``. Returns a count, not a ratio.
    """
    above = 0.0
    for i, count in enumerate(counts.tolist()):
        lo = 0.0 if i == 0 else float(bounds[i - 1])
        hi = float(bounds[i]) if i < len(bounds) else math.inf
        if lo >= threshold:
            above += count
        elif hi > threshold:
            above += count if math.isinf(hi) else count * (hi - threshold) / (hi - lo)
    return above


# --- reading the store ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WindowCounts:
    """Events of one model in one window; ``None`` totals when coverage was too low."""

    total: float | None
    bad: float | None
    coverage: float


def model_of(info: SeriesInfo) -> str | None:
    """The ``model`` attribute of a series, as text."""
    value = info.attributes.get("model")
    return None if value is None else str(value)


def recent_seconds(store: WindowStore) -> float:
    """How far back the store's recent ring (and its histograms) reach."""
    return float(store.recent_seconds)


def request_matrix(
    store: WindowStore, labels: Mapping[str, str], start: float, end: float
) -> tuple[npt.NDArray[np.float64], tuple[SeriesInfo, ...], float]:
    """Per-slot request increases over ``[start, end)``: recent ring, else the 1-min long ring.

    Returns (values series x slots, series, slot seconds).
    """
    recent = store.increase_matrix(REQUESTS, selector=labels or None, start=start, end=end)
    if recent.times.size and recent.times[0] <= start + store.step_seconds:
        return recent.values.astype(np.float64), recent.series, float(store.step_seconds)
    long = store.matrix(REQUESTS, selector=labels or None, start=start, end=end, resolution="long")
    step = float(long.step_seconds)
    return long.values.astype(np.float64) * step, long.series, step  # mean rates → increases


def coverage(values: npt.NDArray[np.float64], slot_seconds: float, window_seconds: float) -> float:
    """Share of the window's minutes in which at least one series has a slot with data."""
    if values.size == 0 or window_seconds <= 0:
        return 0.0
    seen = np.asarray(~np.isnan(values).all(axis=0), dtype=bool)
    per_bin = max(1, round(COVERAGE_BIN_SECONDS / slot_seconds))
    bins = max(1, round(window_seconds / (slot_seconds * per_bin)))
    padded = np.zeros(bins * per_bin, dtype=bool)
    padded[-seen.size :] = seen[-padded.size :]
    return float(padded.reshape(bins, per_bin).any(axis=1).mean())


def error_counts(
    store: WindowStore,
    labels: Mapping[str, str],
    error_outcomes: Sequence[str],
    start: float,
    end: float,
    *,
    min_coverage: float = MIN_COVERAGE,
) -> dict[str, WindowCounts]:
    """Per model: requests and errors over the window (vectorised over all series).

    A model whose window has less than ``min_coverage`` of its minutes covered gets ``None``s.
    """
    values, series, step = request_matrix(store, labels, start, end)
    out: dict[str, WindowCounts] = {}
    models: dict[str, list[int]] = {}
    for i, info in enumerate(series):
        name = model_of(info)
        if name is not None:
            models.setdefault(name, []).append(i)
    for name, rows in models.items():
        block = values[rows]
        cov = coverage(block, step, end - start)
        if cov < min_coverage or cov == 0.0:
            out[name] = WindowCounts(None, None, cov)
            continue
        bad_rows = [
            j
            for j, r in enumerate(rows)
            if str(series[r].attributes.get("outcome")) in error_outcomes
        ]
        total = float(np.nansum(block))
        bad = float(np.nansum(block[bad_rows])) if bad_rows else 0.0
        out[name] = WindowCounts(total, bad, cov)
    return out


def latency_counts(
    store: WindowStore,
    keys: Sequence[SeriesKey],
    threshold_seconds: float,
    start: float,
    end: float,
) -> tuple[float, float] | None:
    """(requests, requests slower than the threshold) over the window from the histograms."""
    total = slow = 0.0
    seen = False
    for key in keys:
        counts = store.bucket_counts(key, start, end)
        if counts is None:
            continue
        seen = True
        total += counts.count
        slow += share_above(threshold_seconds, counts.bounds, counts.counts)
    return (total, slow) if seen else None


def histogram_keys(store: WindowStore, metric: str, labels: Mapping[str, str]) -> list[SeriesInfo]:
    """The histogram series of ``metric`` matching ``labels``."""
    return list(store.histogram_series(metric, labels or None))


def burn_points(
    store: WindowStore,
    labels: Mapping[str, str],
    error_outcomes: Sequence[str],
    start: float,
    end: float,
    bin_seconds: float,
) -> dict[str, list[tuple[float, float | None]]]:
    """Per model: (bin start, error ratio) over ``[start, end)`` in bins, to plot burn rates.

    The ratio is None for a bin without data; dividing by a budget makes it a burn rate.
    """
    values, series, step = request_matrix(store, labels, start, end)
    per_bin = max(1, round(bin_seconds / step))
    n = values.shape[1] // per_bin * per_bin
    out: dict[str, list[tuple[float, float | None]]] = {}
    models: dict[str, list[int]] = {}
    for i, info in enumerate(series):
        name = model_of(info)
        if name is not None:
            models.setdefault(name, []).append(i)
    offset = values.shape[1] - n  # whole bins ending at ``end``
    for name, rows in models.items():
        block = values[rows, offset:].reshape(len(rows), -1, per_bin)
        bad_rows = [
            j
            for j, r in enumerate(rows)
            if str(series[r].attributes.get("outcome")) in error_outcomes
        ]
        seen = np.asarray(~np.isnan(block).all(axis=(0, 2)), dtype=bool)
        total = np.nansum(block, axis=(0, 2))
        bad = np.nansum(block[bad_rows], axis=(0, 2)) if bad_rows else np.zeros(total.size)
        first = end - (n // per_bin) * per_bin * step
        out[name] = [
            (
                first + k * per_bin * step,
                (float(bad[k] / total[k]) if total[k] > 0 else 0.0) if seen[k] else None,
            )
            for k in range(total.size)
        ]
    return out


# --- the runner ----------------------------------------------------------------------------------


def rule_models(
    ctx: DetectionContext, rule: Rule, seen: set[str]
) -> dict[str, ModelDeployment | None]:
    """The model deployments the rule selects: known deployments plus models seen in data."""
    known = {m.name: m for m in ctx.deployments()}
    out: dict[str, ModelDeployment | None] = {}
    for name in sorted(set(known) | seen):
        deployment = known.get(name)
        team = deployment.labels.get("team") if deployment else None
        if rule.selector.models and not rule.selector.matches(model=name, team=team):
            continue
        out[name] = deployment
    return out


@dataclass(frozen=True, slots=True)
class _Slo:
    kind: str  # "errors" | "latency"
    objective: float
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SloBurnParams:
    """Parameters of ``slo_burn``."""

    objective: float = number(0.999, 0.5, 0.99999, "Share of good events promised.")
    period_seconds: float = duration("30d", "1d", "90d", "SLO period.")
    long_windows_seconds: tuple[float, ...] = durations(
        ("1h", "6h"), "1m", "90d", "Long window of each pair."
    )
    short_windows_seconds: tuple[float, ...] = durations(
        ("5m", "30m"), "1m", "90d", "Short window of each pair (about 1/12)."
    )
    burn_rates: tuple[float, ...] = numbers(
        (14.4, 6.0), 0.1, 1000.0, "Fires when both windows of a pair burn faster than this."
    )
    error_outcomes: tuple[str, ...] = texts(
        ("failure",), "Values of the 'outcome' attribute that count as errors."
    )


def _check(p: SloBurnParams) -> tuple[str, str] | None:
    longs, shorts, rates = p.long_windows_seconds, p.short_windows_seconds, p.burn_rates
    budget, period = 1.0 - p.objective, p.period_seconds
    if not longs or len(longs) != len(shorts) or len(longs) != len(rates):
        return "burn_rates", (
            "long_windows_seconds, short_windows_seconds and burn_rates must be non-empty lists "
            f"of one length (got {len(longs)}, {len(shorts)}, {len(rates)})"
        )
    for i, (long, short, rate) in enumerate(zip(longs, shorts, rates, strict=True)):
        if short >= long:
            return f"short_windows_seconds[{i}]", (
                f"must be shorter than its long window ({format_duration(long)})"
            )
        if long > period:
            return f"long_windows_seconds[{i}]", (
                f"must not exceed period_seconds ({format_duration(period)})"
            )
        if rate * budget > 1.0:
            return f"burn_rates[{i}]", (
                f"{rate:g} × error budget {budget:g} is an error ratio above 1: "
                "this pair can never fire"
            )
    return None


def run_slo_burn(ctx: DetectionContext, rule: Rule, p: SloBurnParams, now: float) -> list[Finding]:
    """One finding per selected model and SLO (errors; latency when the model has a p99 SLO)."""
    longs, shorts = p.long_windows_seconds, p.short_windows_seconds
    rates, outcomes = p.burn_rates, p.error_outcomes
    rule_objective, period = p.objective, p.period_seconds
    store = ctx.store
    end = math.floor(now / store.step_seconds) * store.step_seconds
    labels = dict(rule.selector.labels)
    windows = sorted(set(longs) | set(shorts))
    counts = {w: error_counts(store, labels, outcomes, end - w, end) for w in windows}
    # the budget is judged on what the store still holds of the period (its coverage is evidence)
    budget = error_counts(store, labels, outcomes, end - period, end, min_coverage=0.0)
    seen = {name for per_window in counts.values() for name in per_window}
    models = rule_models(ctx, rule, seen)
    reach = recent_seconds(store)
    latency_series = histogram_keys(store, LATENCY, labels) if models else []
    plot = burn_points(store, labels, outcomes, end - longs[0], end, shorts[0])
    findings = []
    for name, deployment in models.items():
        slos = [
            _Slo("errors", 1.0 - deployment.slo_error_ratio, "deployment")
            if deployment and deployment.slo_error_ratio is not None
            else _Slo("errors", rule_objective, "rule")
        ]
        if deployment and deployment.slo_latency_p99_seconds is not None:
            slos.append(_Slo("latency", LATENCY_OBJECTIVE, "deployment"))
        for slo in slos:
            burns: dict[float, float | None] = {}
            for w in windows:
                got = counts[w].get(name)
                if got is None or got.total is None or got.bad is None:
                    burns[w] = None
                elif slo.kind == "errors":
                    burns[w] = burn_rate(got.bad, got.total, slo.objective)
                else:
                    threshold = deployment.slo_latency_p99_seconds if deployment else None
                    keys = [i.key for i in latency_series if model_of(i) == name]
                    lat = (
                        latency_counts(store, keys, float(threshold), end - w, end)
                        if threshold is not None and w <= reach
                        else None
                    )
                    burns[w] = None if lat is None else burn_rate(lat[1], lat[0], slo.objective)
            points = tuple(
                (t, ratio / (1.0 - slo.objective))
                for t, ratio in plot.get(name, [])
                if ratio is not None and slo.kind == "errors"
            )
            findings.append(
                _finding(
                    rule, name, deployment, slo, longs, shorts, rates, burns, budget, end, points
                )
            )
    return findings


def _finding(
    rule: Rule,
    name: str,
    deployment: ModelDeployment | None,
    slo: _Slo,
    longs: Sequence[float],
    shorts: Sequence[float],
    rates: Sequence[float],
    burns: Mapping[float, float | None],
    budget: Mapping[str, WindowCounts],
    end: float,
    points: tuple[tuple[float, float], ...],
) -> Finding:
    pairs = [
        PairVerdict(lw, sw, r, burns[lw], burns[sw])
        for lw, sw, r in zip(longs, shorts, rates, strict=True)
    ]
    verdict = judge_pairs(pairs)
    evidence: dict[str, JsonScalar] = {
        "model": name,
        "team": deployment.labels.get("team") if deployment else None,
        "slo": slo.kind,
        "objective": slo.objective,
        "objective_source": slo.source,
        "error_budget_ratio": 1.0 - slo.objective,
    }
    for w, b in sorted(burns.items()):
        evidence[f"burn_rate_{_label(w)}"] = b
    fired = [q for q in pairs if q.verdict is Verdict.FIRING]
    for q in pairs:
        evidence[f"pair_{_label(q.long_seconds)}_{_label(q.short_seconds)}_threshold"] = q.threshold
    period = budget.get(name)
    if slo.kind == "errors" and period is not None and period.total is not None:
        evidence["budget_remaining_ratio"] = budget_remaining(
            period.bad or 0.0, period.total, slo.objective
        )
        evidence["budget_requests"] = period.total
        evidence["budget_errors"] = period.bad
    evidence["budget_coverage_ratio"] = period.coverage if period else 0.0
    if fired:
        top = max(fired, key=lambda q: q.threshold)
        summary = (
            f"{name}: {slo.kind} SLO {slo.objective:.4%} burning at "
            f"{top.long_burn:.1f}x over {_label(top.long_seconds)} and "
            f"{top.short_burn:.1f}x over {_label(top.short_seconds)} (threshold {top.threshold}x)"
        )
    elif verdict is Verdict.UNKNOWN:
        summary = f"{name}: {slo.kind} SLO burn unknown (missing data in a window)"
    else:
        summary = f"{name}: {slo.kind} SLO within budget"
    longest = max(longs)
    return new_finding(
        rule,
        subject=name if slo.kind == "errors" else f"{name}:latency",
        verdict=verdict,
        window=(end - longest, end),
        facts=Facts(team=deployment.labels.get("team") if deployment else None, model=name),
        summary=summary,
        evidence=evidence,
        points=points,
    )


def _label(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


DETECTOR = Detector(
    spec=spec_of(
        "slo_burn",
        "Multi-window, multi-burn-rate SLO alert (Google SRE workbook).",
        subjects=(Subject.DEPLOYMENT,),
        signals=("gpuwarden.model.requests",),
        params=SloBurnParams,
        selector=("teams", "models", "labels"),
        check=_check,
    ),
    params=SloBurnParams,
    run=run_slo_burn,
)
