"""Distribution drift of OTel histograms, with thresholds calibrated on A/A windows of history.

Each completed, aligned window of a model's histogram (``window_seconds`` long, bucket counts summed
over the model's series) is compared with a reference: the pooled windows of the past
``reference_seconds`` — only those at the same phase of the day when ``same_phase`` is set, since
seasonality alone makes adjacent windows "drift". Four distances between bucketed distributions:

- ``jensen_shannon``: the Jensen-Shannon distance (square root of the divergence, base 2, 0..1);
- ``wasserstein``: the 1-Wasserstein distance between the bucketed CDFs (linear inside a bucket),
  divided by the reference's standard deviation so that it has no unit;
- ``psi``: the population stability index (empty buckets smoothed);
- ``ks``: the Kolmogorov-Smirnov statistic at the bucket bounds (a distance, not a p-value).

The measured pitfall (reference notes §4): on autocorrelated, seasonal telemetry a fixed threshold
or p-value fires on windows where nothing changed, and distances grow as samples shrink. So the
threshold is calibrated on the series' own history: each reference window is compared, exactly as
the current one will be, with the pool of the others (leave-one-out, same phase): those are A/A
distances, and the threshold is their ``AA_QUANTILE`` quantile, never below the rule's
``threshold`` (a floor). A window drifts when its distance exceeds that; a finding fires after
``persistence`` consecutive drifted windows. A window without data (or with fewer than
``MIN_OBSERVATIONS``) breaks the streak and is UNKNOWN; so is a series until its history holds
``MIN_AA_SAMPLES`` A/A distances.

The store keeps histograms for its recent window only (6 h by default), so the per-window bucket
counts are kept here, per service and rule, bounded (``MAX_TRACKERS``, ``reference_seconds``). They
are rebuilt from the recent window after a restart.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy.spatial.distance import jensenshannon

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, JsonScalar, Verdict, new_finding
from gpuwarden.collector.detect.slo import (
    histogram_keys,
    model_of,
    recent_seconds,
    rule_models,
)
from gpuwarden.collector.rules.durations import format_duration
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, flag, integer, number, text
from gpuwarden.collector.store.histograms import histogram_quantile
from gpuwarden.collector.store.types import SeriesKey

Counts = npt.NDArray[np.float64]
METHODS = ("jensen_shannon", "wasserstein", "psi", "ks")
DAY = 86400.0
AA_QUANTILE = 0.99
MIN_AA_SAMPLES = 10
MIN_REFERENCE_WINDOWS = 2
MIN_OBSERVATIONS = 30.0
MAX_TRACKERS = 10_000
PSI_EPSILON = 1e-4


# --- distances -----------------------------------------------------------------------------------


def _edges(bounds: Sequence[float]) -> npt.NDArray[np.float64]:
    """Bucket edges: the first from 0 (or one width below), the open one as wide as the last."""
    b = np.asarray(bounds, dtype=np.float64)
    width = b[-1] - b[-2] if b.size > 1 else max(abs(b[-1]), 1.0)
    low = 0.0 if b[0] > 0 else b[0] - width
    return np.concatenate(([low], b, [b[-1] + width]))


def _wasserstein(p: Counts, q: Counts, bounds: Sequence[float]) -> float:
    edges = _edges(bounds)
    widths = np.diff(edges)
    d = np.concatenate(([0.0], np.cumsum(p - q)))  # CDF difference at the edges, linear between
    a, b = d[:-1], d[1:]
    same = a * b >= 0
    with np.errstate(invalid="ignore", divide="ignore"):
        crossing = (a * a + b * b) / (2 * (np.abs(a) + np.abs(b)))
    area = np.where(same, (np.abs(a) + np.abs(b)) / 2, np.nan_to_num(crossing))
    w1 = float((area * widths).sum())
    mids = (edges[:-1] + edges[1:]) / 2
    mean = float((q * mids).sum())
    sd = math.sqrt(max(float((q * (mids - mean) ** 2).sum()), 0.0))
    return w1 / sd if sd > 0 else (0.0 if w1 == 0 else math.inf)


def distance(method: str, current: Counts, reference: Counts, bounds: Sequence[float]) -> float:
    """The ``method`` distance between two bucket-count vectors of the same bounds."""
    p = current / current.sum()
    q = reference / reference.sum()
    if method == "jensen_shannon":
        return float(jensenshannon(p, q, base=2))
    if method == "ks":
        return float(np.abs(np.cumsum(p - q)).max())
    if method == "psi":
        ps = np.clip(p, PSI_EPSILON, None)
        qs = np.clip(q, PSI_EPSILON, None)
        return float(((ps - qs) * np.log(ps / qs)).sum())
    if method == "wasserstein":
        return _wasserstein(p, q, bounds)
    raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")


# --- windows, reference and calibration ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    """One completed window's bucket counts (``None``: no usable data)."""

    start: float
    counts: Counts | None


def phase_of(start: float, window_seconds: float, same_phase: bool) -> int:
    """The window's slot of the day when comparing like with like, else 0 (all windows alike)."""
    if not same_phase or window_seconds >= DAY:
        return 0
    return int((start % DAY) // window_seconds)


@dataclass(frozen=True, slots=True)
class Calibration:
    """The threshold a window's distance is judged against, and where it came from."""

    threshold: float
    aa_quantile: float
    aa_samples: int
    floor: float


def _pools(history: Sequence[Window], window_seconds: float, same_phase: bool) -> dict[int, Counts]:
    pools: dict[int, Counts] = {}
    for w in history:
        if w.counts is not None:
            key = phase_of(w.start, window_seconds, same_phase)
            pools[key] = pools.get(key, 0) + w.counts
    return pools


def aa_distances(
    history: Sequence[Window],
    bounds: Sequence[float],
    *,
    method: str,
    window_seconds: float,
    same_phase: bool,
) -> list[float]:
    """Each history window against the pool of the others of its phase (leave one out)."""
    pools = _pools(history, window_seconds, same_phase)
    members: dict[int, int] = {}
    for w in history:
        if w.counts is not None:
            key = phase_of(w.start, window_seconds, same_phase)
            members[key] = members.get(key, 0) + 1
    out = []
    for w in history:
        if w.counts is None:
            continue
        key = phase_of(w.start, window_seconds, same_phase)
        if members[key] - 1 < MIN_REFERENCE_WINDOWS:
            continue
        rest = pools[key] - w.counts
        if rest.sum() > 0:
            out.append(distance(method, w.counts, rest, bounds))
    return out


def calibrate(distances: Sequence[float], floor: float) -> Calibration | None:
    """The A/A quantile (never below ``floor``); None with too few A/A distances."""
    finite = [d for d in distances if math.isfinite(d)]
    if len(finite) < MIN_AA_SAMPLES:
        return None
    q = float(np.quantile(finite, AA_QUANTILE))
    return Calibration(threshold=max(q, floor), aa_quantile=q, aa_samples=len(finite), floor=floor)


@dataclass(frozen=True, slots=True)
class WindowResult:
    """What one window was judged."""

    start: float
    verdict: Verdict
    """FIRING: drifted (beyond the calibrated threshold); CLEAR: did not; UNKNOWN: no judgement."""
    distance: float | None = None
    calibration: Calibration | None = None
    observations: float = 0.0
    reference_observations: float = 0.0
    reference_windows: int = 0
    p50: float | None = None
    reference_p50: float | None = None


@dataclass
class DriftTracker:
    """Windows of one series, their drift verdicts and the streak of drifted ones."""

    method: str
    floor: float
    window_seconds: float
    reference_seconds: float
    same_phase: bool
    persistence: int
    bounds: tuple[float, ...] = ()
    history: deque[Window] = field(default_factory=deque)
    pending: list[Window] = field(default_factory=list)
    results: deque[WindowResult] = field(default_factory=lambda: deque(maxlen=48))
    streak: int = 0

    def add(self, start: float, counts: Counts | None, bounds: Sequence[float]) -> WindowResult:
        """Judge the window starting at ``start`` against the history, then keep it.

        A drifted window is held back from the reference (and so from the A/A calibration) while
        its streak lasts: a drift must not teach the threshold that drift is normal. When the
        streak ends short of ``persistence`` the held windows were the ordinary tail and join the
        history; when it reached ``persistence`` they were the drift and are dropped. A drift that
        outlasts ``reference_seconds`` empties the reference (UNKNOWN) and becomes the new normal.
        """
        bounds = tuple(float(b) for b in bounds)
        if bounds != self.bounds:  # new bucket layout: nothing before it compares
            self.history.clear()
            self.pending.clear()
            self.bounds = bounds
            self.streak = 0
        if counts is not None and float(counts.sum()) < MIN_OBSERVATIONS:
            counts = None
        result = self._judge(start, counts)
        window = Window(start, counts)
        if result.verdict is Verdict.FIRING:
            self.streak += 1
            self.pending.append(window)
        else:
            if self.streak < self.persistence:
                self.history.extend(self.pending)
            self.pending.clear()
            self.streak = 0
            self.history.append(window)
        horizon = start + self.window_seconds - self.reference_seconds
        while self.history and self.history[0].start < horizon:
            self.history.popleft()
        self.results.append(result)
        return result

    @property
    def last_start(self) -> float | None:
        """Start of the newest window taken."""
        return self.results[-1].start if self.results else None

    def _judge(self, start: float, counts: Counts | None) -> WindowResult:
        if counts is None:
            return WindowResult(start, Verdict.UNKNOWN)
        window_seconds, same_phase = self.window_seconds, self.same_phase
        key = phase_of(start, window_seconds, same_phase)
        same = [
            w.counts
            for w in self.history
            if w.counts is not None and phase_of(w.start, window_seconds, same_phase) == key
        ]
        observations = float(counts.sum())
        if len(same) < MIN_REFERENCE_WINDOWS:
            return WindowResult(start, Verdict.UNKNOWN, observations=observations)
        reference = np.sum(same, axis=0)
        calibration = calibrate(
            aa_distances(
                self.history,
                self.bounds,
                method=self.method,
                window_seconds=window_seconds,
                same_phase=same_phase,
            ),
            self.floor,
        )
        d = distance(self.method, counts, reference, self.bounds)
        if calibration is None:
            verdict = Verdict.UNKNOWN
        else:
            verdict = Verdict.FIRING if d > calibration.threshold else Verdict.CLEAR
        return WindowResult(
            start,
            verdict,
            distance=d,
            calibration=calibration,
            observations=observations,
            reference_observations=float(reference.sum()),
            reference_windows=len(same),
            p50=histogram_quantile(0.5, self.bounds, counts),
            reference_p50=histogram_quantile(0.5, self.bounds, reference),
        )

    @property
    def verdict(self) -> Verdict:
        """FIRING after ``persistence`` drifted windows in a row; else the newest window's say."""
        if self.streak >= self.persistence:
            return Verdict.FIRING
        if not self.results or self.results[-1].verdict is Verdict.UNKNOWN:
            return Verdict.UNKNOWN
        return Verdict.CLEAR


# --- the runner ----------------------------------------------------------------------------------

_TrackerKey = tuple[str, str, str, int]  # rule id, model, metric, hash of the parameters


class _Trackers(dict[_TrackerKey, DriftTracker]):
    """The drift trackers of one detection context, oldest first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DistributionDriftParams:
    """Parameters of ``distribution_drift``."""

    method: str = text("jensen_shannon", "Distance or test.", choices=METHODS)
    threshold: float = number(0.1, 0.0, 10.0, "Distance above which a window drifted.")
    window_seconds: float = duration("1h", "5m", "1w", "Window judged.")
    reference_seconds: float = duration("1w", "1h", "90d", "Reference period.")
    same_phase: bool = flag(
        True, "Compare with the same hour of day in the reference (seasonality)."
    )
    persistence: int = integer(3, 1, 100, "Consecutive drifted windows before a finding.")


def _check(p: DistributionDriftParams) -> tuple[str, str] | None:
    if p.reference_seconds <= p.window_seconds:
        window = format_duration(p.window_seconds)
        return "reference_seconds", f"must be longer than window_seconds ({window})"
    return None


def _window_counts(
    ctx: DetectionContext, keys: Sequence[SeriesKey], start: float, end: float
) -> tuple[tuple[float, ...], Counts | None]:
    """Bucket counts of one window summed over series (those with the most common bounds)."""
    by_bounds: dict[tuple[float, ...], Counts] = {}
    for key in keys:
        got = ctx.store.bucket_counts(key, start, end)
        if got is not None:
            by_bounds[got.bounds] = by_bounds.get(got.bounds, 0) + got.counts
    if not by_bounds:
        return (), None
    bounds = max(by_bounds, key=lambda b: float(by_bounds[b].sum()))
    return bounds, by_bounds[bounds]


def run_distribution_drift(
    ctx: DetectionContext, rule: Rule, p: DistributionDriftParams, now: float
) -> list[Finding]:
    """One finding per selected model and histogram metric; takes every newly completed window."""
    method, window = p.method, p.window_seconds
    labels = dict(rule.selector.labels)
    metrics = rule.selector.metrics or ("gpuwarden.model.request.latency",)
    trackers = ctx.cache(_Trackers)
    last_end = math.floor(now / window) * window
    earliest = now - recent_seconds(ctx.store) + ctx.store.step_seconds
    findings = []
    for metric in metrics:
        series = histogram_keys(ctx.store, metric, labels)
        by_model: dict[str, list[SeriesKey]] = {}
        for info in series:
            name = model_of(info)
            if name is not None:
                by_model.setdefault(name, []).append(info.key)
        for name, deployment in rule_models(ctx, rule, set(by_model)).items():
            key = (rule.id, name, metric, hash(p))
            tracker = trackers.get(key)
            if tracker is None:
                if len(trackers) >= MAX_TRACKERS:
                    del trackers[next(iter(trackers))]
                tracker = DriftTracker(
                    method=method,
                    floor=p.threshold,
                    window_seconds=window,
                    reference_seconds=p.reference_seconds,
                    same_phase=p.same_phase,
                    persistence=p.persistence,
                )
                trackers[key] = tracker
            first = math.ceil(earliest / window) * window
            if tracker.last_start is not None:
                first = max(first, tracker.last_start + window)
            start = first
            while start + window <= last_end:
                bounds, counts = _window_counts(ctx, by_model.get(name, []), start, start + window)
                tracker.add(start, counts, bounds or tracker.bounds)
                start += window
            team = deployment.labels.get("team") if deployment else None
            findings.append(_finding(rule, name, metric, team, tracker, last_end))
    return findings


def _finding(
    rule: Rule, model: str, metric: str, team: str | None, tracker: DriftTracker, end: float
) -> Finding:
    last = tracker.results[-1] if tracker.results else None
    cal = last.calibration if last else None
    verdict = tracker.verdict
    evidence: dict[str, JsonScalar] = {
        "model": model,
        "team": team,
        "metric": metric,
        "method": tracker.method,
        "distance": last.distance if last else None,
        "threshold": cal.threshold if cal else None,
        "aa_quantile": cal.aa_quantile if cal else None,
        "aa_samples": cal.aa_samples if cal else 0,
        "threshold_floor": tracker.floor,
        "drifted_windows_in_a_row": tracker.streak,
        "persistence": tracker.persistence,
        "window_seconds": tracker.window_seconds,
        "same_phase": tracker.same_phase,
        "observations": last.observations if last else 0.0,
        "reference_observations": last.reference_observations if last else 0.0,
        "reference_windows": last.reference_windows if last else 0,
        "p50": last.p50 if last else None,
        "reference_p50": last.reference_p50 if last else None,
    }
    if verdict is Verdict.FIRING and last and cal:
        summary = (
            f"{model} {metric}: distribution drifted for {tracker.streak} windows "
            f"({tracker.method} {last.distance:.3f} > {cal.threshold:.3f})"
        )
    elif verdict is Verdict.UNKNOWN:
        summary = f"{model} {metric}: not enough data or history to judge drift"
    else:
        summary = f"{model} {metric}: distribution within its usual range"
    start = last.start if last else end - tracker.window_seconds
    return new_finding(
        rule,
        subject=f"{model}:{metric}",
        verdict=verdict,
        window=(start, start + tracker.window_seconds),
        facts=Facts(team=team, model=model),
        summary=summary,
        evidence=evidence,
        points=tuple(
            (r.start + tracker.window_seconds, r.distance)
            for r in tracker.results
            if r.distance is not None
        ),
    )


DETECTOR = Detector(
    spec=spec_of(
        "distribution_drift",
        "A histogram's distribution moved away from its reference.",
        subjects=(Subject.DEPLOYMENT,),
        signals=("gpuwarden.model.request.latency", "gpuwarden.model.time_to_first_token"),
        params=DistributionDriftParams,
        selector=("metrics", "teams", "models", "labels"),
        requires=("metrics",),
        check=_check,
    ),
    params=DistributionDriftParams,
    run=run_distribution_drift,
)
