"""Model drift: table-driven verdicts on synthetic histograms, gaps, and the store path."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.drift import detect_drift
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.model_series import Binned, quantiles
from gpuwarden.collector.detect.numerics.drift import DriftParams
from gpuwarden.collector.detect.numerics.drift_noise import min_requests, quantile_noise
from gpuwarden.collector.ingest.otlp import HistogramPoint
from gpuwarden.collector.rules.loader import default_rules_dir
from gpuwarden.collector.store.histograms import histogram_quantile
from gpuwarden.collector.store.types import Kind
from tests.detectors import make_rule, run_rule

BIN = 15.0
BOUNDS = tuple(float(b) for b in np.geomspace(0.05, 50.0, 61))
HOURS = 4
N = int(HOURS * 3600 / BIN)
PARAMS = DriftParams(
    statistic="p99",
    direction="increase",
    window_seconds=300.0,
    history_seconds=HOURS * 3600.0,
    season_seconds=0.0,
    threshold=4.0,
    min_relative_change=0.1,
    bin_seconds=BIN,
)

DRIFT_RULE = make_rule("model_drift")


def histogram_bins(factor: np.ndarray, seed: int = 0, per_bin: int = 150) -> np.ndarray:
    """Bins × (buckets + sum) of lognormal latencies (median 1 s) times ``factor`` per bin."""
    rng = np.random.default_rng(seed)
    which = np.repeat(np.arange(factor.size), per_bin)
    values = rng.lognormal(0.0, 0.4, which.size) * factor[which]
    nb = len(BOUNDS) + 1
    b = np.searchsorted(BOUNDS, values, side="left")
    counts = np.bincount(which * nb + b, minlength=factor.size * nb).reshape(factor.size, nb)
    sums = np.bincount(which, weights=values, minlength=factor.size)
    return np.column_stack([counts.astype(np.float64), sums])


def times() -> np.ndarray:
    return np.asarray(np.arange(N) * BIN, dtype=np.float64)


def step(at: int, size: float) -> np.ndarray:
    f = np.ones(N)
    f[N - at :] = size
    return f


def gap(parts: np.ndarray, first: int, last: int) -> np.ndarray:
    out = parts.copy()
    out[first:last] = np.nan
    return out


# (name, factor per bin, gap [first, last) as bins from the end or None, params, expected)
CASES = [
    ("flat", np.ones(N), None, PARAMS, Verdict.CLEAR),
    ("30 % step 4 min ago", step(16, 1.3), None, PARAMS, Verdict.FIRING),
    ("30 % step 30 s ago: not held long enough", step(2, 1.3), None, PARAMS, Verdict.CLEAR),
    ("30 % drop, direction increase", step(16, 0.7), None, PARAMS, Verdict.CLEAR),
    ("30 % drop 6 min ago, direction decrease", step(24, 0.7), None,
     replace(PARAMS, direction="decrease"), Verdict.FIRING),
    ("30 % drop 6 min ago, direction both", step(24, 0.7), None, replace(PARAMS, direction="both"),
     Verdict.FIRING),
    ("5 % step: below min_relative_change", step(16, 1.05), None, PARAMS, Verdict.CLEAR),
    ("30 % step but threshold 50", step(16, 1.3), None, replace(PARAMS, threshold=50.0),
     Verdict.CLEAR),
    ("current window missing", step(16, 1.3), (20, 0), PARAMS, Verdict.UNKNOWN),
    ("current window half missing, rest flat", np.ones(N), (10, 0), PARAMS, Verdict.CLEAR),
    ("current window mostly missing", step(16, 1.3), (16, 0), PARAMS, Verdict.UNKNOWN),
    ("history missing", step(16, 1.3), (N, 30), PARAMS, Verdict.UNKNOWN),
    ("gap in the middle of history, then a step", step(16, 1.3), (N // 2, N // 4), PARAMS,
     Verdict.FIRING),
    ("p50 statistic, 30 % step", step(16, 1.3), None, replace(PARAMS, statistic="p50"),
     Verdict.FIRING),
    ("mean statistic, 30 % step", step(16, 1.3), None, replace(PARAMS, statistic="mean"),
     Verdict.FIRING),
    ("rate is not a histogram statistic", step(16, 1.3), None, replace(PARAMS, statistic="rate"),
     Verdict.UNKNOWN),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "factor", "missing", "params", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_drift_verdicts(name, factor, missing, params, expected):
    parts = histogram_bins(factor)
    if missing is not None:
        parts = gap(parts, N - missing[0], N - missing[1])
    subject = Binned("m", "lat", Kind.HISTOGRAM, times(), parts, BIN, BOUNDS)
    (finding,) = detect_drift([subject], params, rule=DRIFT_RULE)
    assert finding.verdict is expected, (name, dict(finding.evidence), finding.summary)
    if expected is Verdict.FIRING:
        ev = finding.evidence
        for key in ("window_seconds", "baseline", "threshold", "score", "relative_change"):
            assert isinstance(ev[key], float), key
        assert finding.points
        assert finding.subject == f"m/lat/{params.statistic}"


# (name, requests per bin over history, requests per bin in the last 20 bins, factor, expected,
#  reason in the summary or None)
TRAFFIC_CASES = [
    ("busy, 30 % step", 150, 150, 1.3, Verdict.FIRING, None),
    ("quiet now (100 requests), 60 % step", 150, 5, 1.6, Verdict.UNKNOWN, "too few requests"),
    ("quiet now, no step", 150, 5, 1.0, Verdict.UNKNOWN, "too few requests"),
    ("quiet history, busy now: history too short", 5, 150, 1.3, Verdict.UNKNOWN, "short history"),
    ("600 requests now: 30 % step within p99 noise", 150, 30, 1.3, Verdict.CLEAR, None),
    ("600 requests now: 60 % step beyond it", 150, 30, 1.6, Verdict.FIRING, None),
    ("no requests at all now (a gap, not quiet)", 150, 0, 1.0, Verdict.UNKNOWN, "no data"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "busy", "now", "size", "expected", "reason"),
    TRAFFIC_CASES,
    ids=[c[0] for c in TRAFFIC_CASES],
)
def test_low_traffic_windows_are_not_judged(name, busy, now, size, expected, reason):
    factor = step(20, size)
    parts = np.vstack(
        [histogram_bins(factor[:-20], per_bin=busy), histogram_bins(factor[-20:], 1, per_bin=now)]
    )
    if now == 0:
        parts[-20:] = np.nan
    subject = Binned("m", "lat", Kind.HISTOGRAM, times(), parts, BIN, BOUNDS)
    (finding,) = detect_drift([subject], PARAMS, rule=DRIFT_RULE)
    assert finding.verdict is expected, (name, finding.summary, dict(finding.evidence))
    if reason is not None:
        assert reason in finding.summary


def test_min_requests_per_statistic():
    assert [min_requests(s) for s in ("p99", "p95", "p50", "mean", "rate")] == [200, 40, 4, 2, 0]


def noise_of(parts: np.ndarray, statistic: str = "p99") -> np.ndarray:
    n = parts.shape[0]
    subject = Binned("m", "l", Kind.HISTOGRAM, times()[:n], parts, BIN, BOUNDS)
    return quantile_noise(subject, statistic, 20)


def test_quantile_noise_shrinks_with_requests():
    few = noise_of(histogram_bins(np.ones(40), per_bin=30))
    many = noise_of(histogram_bins(np.ones(40), per_bin=600))
    assert np.all(np.isnan(few[:19]))  # no full window yet
    assert 3 < np.nanmedian(few) / np.nanmedian(many) < 6  # ~sqrt(20) = 4.5
    assert np.nanmedian(noise_of(histogram_bins(np.ones(40)), "p50")) < np.nanmedian(many)


def test_quantile_noise_is_wide_when_the_quantile_sits_in_a_thin_tail():
    rng = np.random.default_rng(2)
    n = 12_000
    smooth = rng.lognormal(0.0, 0.4, n)  # p99 ≈ 2.5 s on a dense slope
    thin = np.where(rng.random(n) < 0.012, rng.uniform(15.0, 25.0, n), smooth)  # 1.2 % at 15-25 s
    relative = []
    for values in (smooth, thin):
        parts = np.zeros((20, len(BOUNDS) + 2))
        parts[-1, :-1] = np.bincount(np.searchsorted(BOUNDS, values), minlength=len(BOUNDS) + 1)
        parts[-1, -1] = values.sum()
        relative.append(noise_of(parts)[-1] / np.quantile(values, 0.99))
    assert relative[1] > 2 * relative[0], relative


def test_a_noisy_window_needs_a_bigger_move():
    # the current window's own sampling noise is a floor under the history's scale: with 600
    # requests a 20 % rise of p99 is within noise, with 3,000 it is not
    factor = step(20, 1.2)
    expected = {30: Verdict.CLEAR, 150: Verdict.FIRING}
    for now, verdict in expected.items():
        parts = np.vstack(
            [histogram_bins(factor[:-20], per_bin=150), histogram_bins(factor[-20:], 1, now)]
        )
        subject = Binned("m", "lat", Kind.HISTOGRAM, times(), parts, BIN, BOUNDS)
        (finding,) = detect_drift([subject], PARAMS, rule=DRIFT_RULE)
        assert finding.verdict is verdict, (now, dict(finding.evidence))
        assert isinstance(finding.evidence["noise"], float)


def test_missing_data_is_never_clear_nor_firing():
    parts = np.full((N, len(BOUNDS) + 2), np.nan)
    subject = Binned("m", "lat", Kind.HISTOGRAM, times(), parts, BIN, BOUNDS)
    (finding,) = detect_drift([subject], PARAMS, rule=DRIFT_RULE)
    assert finding.verdict is Verdict.UNKNOWN


def test_seasonal_baseline_absorbs_a_daily_pattern_and_still_finds_a_step():
    season = 3600.0  # a 1 h "day" so the test stays small: 4 h of history hold 3 seasons
    t = times()
    daily = 1.0 + 0.5 * (np.sin(2 * np.pi * t / season) > 0.95)  # a sharp 50 % peak each season
    params = replace(PARAMS, season_seconds=season)
    # judge right after a peak starts: a plain baseline would call the peak itself a drift
    start = int(np.flatnonzero(np.diff((daily > 1).astype(int)) == 1)[-1]) + 17
    stepped = daily.copy()
    stepped[start - 16 :] *= 1.3
    for factor, expected in ((daily, Verdict.CLEAR), (stepped, Verdict.FIRING)):
        sub = Binned(
            "m", "lat", Kind.HISTOGRAM, t[:start], histogram_bins(factor)[:start], BIN, BOUNDS
        )
        (found,) = detect_drift([sub], params, rule=DRIFT_RULE)
        assert found.evidence["baseline_kind"] == "seasonal"
        if expected is Verdict.CLEAR:
            plain = detect_drift([sub], PARAMS, rule=DRIFT_RULE)[0]
            assert plain.verdict is Verdict.FIRING  # what the season is there to prevent
        assert found.verdict is expected, dict(found.evidence)


def test_vectorised_quantiles_match_the_store():
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 20, size=(50, len(BOUNDS) + 1)).astype(np.float64)
    counts[3] = 0
    for q in (0.5, 0.95, 0.99):
        got = quantiles(q, BOUNDS, counts)
        want = [histogram_quantile(q, BOUNDS, row) for row in counts]
        np.testing.assert_allclose(got, want, equal_nan=True)


# --- through the store -----------------------------------------------------------------------

T0 = 1_767_225_600.0
STEP = 10


def feed(svc, factor: np.ndarray, model: str = "llama") -> None:
    parts = histogram_bins(factor, seed=11, per_bin=100)
    cumulative = np.cumsum(np.nan_to_num(parts), axis=0)
    for i in range(factor.size):
        svc.accept_histograms(
            [
                HistogramPoint(
                    resource={"host.name": "gpu-1"},
                    metric="gpuwarden.model.request.latency",
                    unit="s",
                    attributes={"model": model},
                    time_unix_nano=int((T0 + (i + 1) * STEP) * 1e9),
                    bounds=BOUNDS,
                    bucket_counts=tuple(int(c) for c in cumulative[i, :-1]),
                    sum_value=float(cumulative[i, -1]),
                )
            ],
            "test",
        )


@pytest.fixture
def rule():
    rules = load_rules([default_rules_dir()], runbooks_dir=None)
    base = rules.get("model-latency-drift")
    assert base is not None
    params = dict(base.parameters)
    params.update(
        window_seconds=300.0,
        history_seconds=3 * 3600.0,
        season_seconds=0.0,
        statistic="p99",
        min_relative_change=0.1,
    )
    return replace(base, parameters=params)


@pytest.mark.parametrize(("size", "expected"), [(1.0, Verdict.CLEAR), (1.3, Verdict.FIRING)])
def test_runner_reads_histograms_from_the_store(tmp_path: Path, rule, size, expected):
    n = 3 * 360  # 3 h of 10 s points
    end = T0 + (n + 1) * STEP
    svc = build_service(
        CollectorConfig(database=tmp_path / "c.db", recent_hours=6), clock=lambda: end
    )
    factor = np.ones(n)
    factor[-24:] = size  # the last 4 min
    feed(svc, factor)
    found = run_rule(svc, rule, end)
    assert [f.subject for f in found] == ["llama/gpuwarden.model.request.latency/p99"]
    assert found[0].verdict is expected, dict(found[0].evidence)
    # an hour later with no new points: the window is empty, so UNKNOWN (never healthy)
    later = run_rule(svc, rule, end + 3600)
    assert later[0].verdict is Verdict.UNKNOWN


def test_confirm_fits_are_reused_then_refitted():
    """Consecutive cycles filter the new history with the kept AR(1) parameters; every
    ``refit_every`` cycles the model is fitted again; verdicts match fresh fits."""
    from gpuwarden.collector.detect.numerics.drift import DriftFits

    fits = DriftFits(refit_every=3)
    parts = histogram_bins(step(30, 1.3))
    for cycle in range(7):
        end = N - 6 + cycle  # the window slides one bin per cycle, the step stays inside it
        subject = Binned("m", "lat", Kind.HISTOGRAM, times()[:end], parts[:end], BIN, BOUNDS)
        (kept,) = detect_drift([subject], PARAMS, rule=DRIFT_RULE, fits=fits)
        (fresh,) = detect_drift([subject], PARAMS, rule=DRIFT_RULE)
        assert (kept.verdict, fresh.verdict) == (Verdict.FIRING, Verdict.FIRING), cycle
    assert (fits.fitted, fits.reused) == (2, 5)  # fit, 3 reuses, refit, 2 reuses


def bimodal(rng: np.random.Generator, size: int, slow: float = 0.14) -> np.ndarray:
    """Per-bin throughput of a worker whose batches are sometimes 4x slower (PAI job 4)."""
    return np.where(rng.random(size) < slow, 1.0, rng.normal(4.5, 0.3, size))


# (name, per-bin history, direction, expected threshold: (low, high))
SKEW_CASES = [
    ("symmetric bins keep the threshold", np.random.default_rng(1).normal(5, 1, 2000),
     "decrease", (3.8, 4.2)),
    ("a heavy slow tail raises it for decrease", bimodal(np.random.default_rng(2), 2000),
     "decrease", (4.6, 5.4)),
    ("the same tail is harmless for increase", bimodal(np.random.default_rng(2), 2000),
     "increase", (4.0, 4.0)),
    ("and counts for both", bimodal(np.random.default_rng(2), 2000), "both", (4.6, 5.4)),
    ("too few bins to judge", bimodal(np.random.default_rng(3), 40), "decrease", (4.0, 4.0)),
    ("no per-bin values", np.full(500, np.nan), "decrease", (4.0, 4.0)),
    ("extreme skew is capped", np.r_[np.zeros(1990), np.full(10, 100.0)], "increase",
     (6.5, 6.5)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "history", "direction", "expected"), SKEW_CASES, ids=[c[0] for c in SKEW_CASES]
)
def test_skew_threshold(name, history, direction, expected):
    from gpuwarden.collector.detect.numerics.drift import skew_threshold

    (got,) = skew_threshold(history[np.newaxis, :], 4.0, direction, 20)
    assert expected[0] - 1e-9 <= got <= expected[1] + 1e-9, name


def test_a_dip_a_skewed_worker_makes_by_chance_is_not_a_change():
    """The same window statistics: a 4.5-sigma dip is a candidate when the bins are symmetric,
    and not when they show the heavy slow tail that makes such dips routine."""
    from gpuwarden.collector.detect.numerics.drift import evaluate

    rng = np.random.default_rng(4)
    bins, window = 600, 20
    y = 100.0 + rng.normal(0, 1.0, bins)
    y[-3:] = 100.0 - 4.5 * 1.4826 * np.median(np.abs(y[:-40] - np.median(y[:-40])))
    params = replace(PARAMS, direction="decrease", min_relative_change=0.01)
    rows = y[np.newaxis, :]

    def judged(per_bin: np.ndarray | None):
        return evaluate(rows, params, window_bins=window, bin_seconds=BIN, bin_values=per_bin)

    plain = judged(None)
    symmetric = judged(rng.normal(100, 30, (1, bins)))
    skewed = judged(100 + 30 * bimodal(rng, bins)[np.newaxis, :])
    assert plain.screen.candidate[0]
    assert symmetric.screen.candidate[0]
    assert not skewed.screen.candidate[0]
    assert skewed.verdicts[0] == int(Verdict.CLEAR)


def test_a_counter_rate_is_judged_with_the_threshold_its_bins_call_for():
    """Through ``detect_drift``: a throughput counter whose batches are sometimes 4x slower is
    judged with a raised threshold (in its evidence); a symmetric one with the rule's."""
    rng = np.random.default_rng(5)
    params = replace(PARAMS, statistic="rate", direction="decrease")
    found = {}
    for name, increments in (
        ("skewed", 15.0 * bimodal(rng, N)),
        ("symmetric", rng.normal(60.0, 3.0, N)),
    ):
        parts = np.column_stack([increments, np.zeros(N)])
        subject = Binned(name, "samples", Kind.COUNTER, times(), parts, BIN)
        (found[name],) = detect_drift([subject], params, rule=DRIFT_RULE)
    assert found["symmetric"].evidence["threshold"] == 4.0
    assert found["skewed"].evidence["threshold"] > 4.5  # type: ignore[operator]
    assert {f.verdict for f in found.values()} == {Verdict.CLEAR}
