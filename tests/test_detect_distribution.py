"""Distribution drift from histograms: distances, A/A calibration, persistence, same phase.

Real data: the Azure LLM inference trace 2023 (code and conversation request sizes, as histograms).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.distribution import METHODS, DriftTracker, calibrate, distance
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import ParamValue, Rule
from tests.detectors import run_rule
from tests.test_detect_slo import make_service

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "azure_llm_inference_2023"
TOKEN_BOUNDS = tuple(float(x) for x in np.round(2 ** np.arange(4, 15.5, 0.5)))
LATENCY_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


# --- distances -----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_identical_distributions_are_at_distance_zero(method):
    c = np.array([5.0, 10.0, 20.0, 10.0, 5.0])
    assert distance(method, c, 3 * c, (1, 2, 3, 4)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    ("method", "current", "reference", "want"),
    [
        ("jensen_shannon", [0, 1, 0, 0, 0], [0, 0, 0, 1, 0], 1.0),  # disjoint: the maximum
        ("ks", [0, 1, 0, 0, 0], [0, 0, 0, 1, 0], 1.0),
        ("ks", [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], 0.5),
        # shifted by one bucket width (1): W1 = 1, over the reference's sd (0.5)
        ("wasserstein", [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], 2.0),
        (
            "psi",
            [0.4, 0.4, 0.1, 0.1, 0],
            [0.25, 0.25, 0.25, 0.25, 0],
            2 * 0.15 * np.log(0.4 / 0.25) + 2 * 0.15 * np.log(0.25 / 0.1),
        ),
    ],
)
def test_distances_on_known_pairs(method, current, reference, want):
    got = distance(method, np.array(current, float), np.array(reference, float), (1, 2, 3, 4))
    assert got == pytest.approx(want, rel=1e-9)


def test_the_rule_threshold_is_a_floor_under_the_aa_quantile():
    aa = [0.01 * i for i in range(1, 21)]
    assert calibrate(aa, floor=0.05).threshold == pytest.approx(np.quantile(aa, 0.99))  # type: ignore[union-attr]
    assert calibrate(aa, floor=0.5).threshold == 0.5  # type: ignore[union-attr]
    assert calibrate(aa[:5], floor=0.05) is None  # too little history to calibrate


# --- real data: Azure LLM inference 2023 ---------------------------------------------------------

WINDOW = 120.0


def token_windows(kind: str, column: str = "ContextTokens") -> list[np.ndarray]:
    pd = pytest.importorskip("pandas")
    path = DATA / f"AzureLLMInferenceTrace_{kind}.csv"
    if not path.exists():
        pytest.skip(f"the Azure LLM 2023 trace is not at {DATA} (see /work/shared/data)")
    frame = pd.read_csv(path)
    t = pd.to_datetime(frame["TIMESTAMP"]).astype("int64").to_numpy() / 1e9
    t -= t.min()
    values = frame[column].to_numpy()
    out = []
    for k in range(int(t.max() // WINDOW)):
        inside = (t >= k * WINDOW) & (t < (k + 1) * WINDOW)
        buckets = np.searchsorted(TOKEN_BOUNDS, values[inside], side="left")
        out.append(np.bincount(buckets, minlength=len(TOKEN_BOUNDS) + 1).astype(float))
    return out


def replay(reference: list[np.ndarray], current: list[np.ndarray], method: str) -> list[Verdict]:
    tracker = DriftTracker(
        method=method,
        floor=0.0,
        window_seconds=WINDOW,
        reference_seconds=1e9,
        same_phase=False,
        persistence=3,
    )
    for i, counts in enumerate(reference):
        tracker.add(i * WINDOW, counts, TOKEN_BOUNDS)
    verdicts = []
    for j, counts in enumerate(current):
        tracker.add((len(reference) + j) * WINDOW, counts, TOKEN_BOUNDS)
        verdicts.append(tracker.verdict)
    return verdicts


@pytest.mark.parametrize("method", METHODS)
def test_code_versus_conversation_prompts_is_found_within_the_persistence(method):
    code, conv = token_windows("code"), token_windows("conv")
    half = len(code) // 2
    verdicts = replay(code[:half], conv[half:], method)
    assert verdicts[2] is Verdict.FIRING, verdicts  # the third window: persistence 3


@pytest.mark.parametrize("method", METHODS)
def test_aa_on_the_code_trace_never_fires(method):
    code = token_windows("code")
    half = len(code) // 2
    verdicts = replay(code[:half], code[half:], method)
    assert Verdict.FIRING not in verdicts
    assert verdicts.count(Verdict.CLEAR) >= len(verdicts) - 2  # judged, not just unknown


def test_the_conversation_traces_own_mid_hour_shift_is_found():
    # minutes ~30-40 of the conversation trace: load surges and median prompts halve (1000 → 440)
    conv = token_windows("conv")
    verdicts = replay(conv[:12], conv[12:22], "jensen_shannon")
    assert Verdict.FIRING in verdicts


# --- seasonality ---------------------------------------------------------------------------------

HOUR = 3600.0
DAYS = 6


def seasonal_windows(shift_from_hour: int | None = None) -> list[np.ndarray]:
    """Hourly latency histograms whose median follows the hour of day (x0.2 .. x1.8)."""
    rng = np.random.default_rng(7)
    out = []
    for h in range(DAYS * 24):
        median = 0.2 * (1 + 0.8 * np.sin(2 * np.pi * h / 24))
        if shift_from_hour is not None and h >= shift_from_hour:
            median *= 1.3
        sample = rng.lognormal(np.log(median), 0.5, size=2000)
        buckets = np.searchsorted(LATENCY_BOUNDS, sample, side="left")
        out.append(np.bincount(buckets, minlength=len(LATENCY_BOUNDS) + 1).astype(float))
    return out


def seasonal_verdicts(windows: list[np.ndarray], *, same_phase: bool = True) -> list[Verdict]:
    tracker = DriftTracker(
        method="jensen_shannon",
        floor=0.1,
        window_seconds=HOUR,
        reference_seconds=5 * 86400,
        same_phase=same_phase,
        persistence=3,
    )
    verdicts = []
    for h, counts in enumerate(windows):
        tracker.add(h * HOUR, counts, LATENCY_BOUNDS)
        verdicts.append(tracker.verdict)
    return verdicts


def test_a_seasonal_series_without_change_is_not_flagged_with_same_phase():
    verdicts = seasonal_verdicts(seasonal_windows())
    assert Verdict.FIRING not in verdicts
    assert verdicts[-24:].count(Verdict.CLEAR) == 24  # the last day is judged, and clear


def test_a_30_percent_shift_in_the_seasonal_series_is_flagged_with_same_phase():
    onset = (DAYS - 1) * 24 + 6
    verdicts = seasonal_verdicts(seasonal_windows(shift_from_hour=onset))
    assert Verdict.FIRING not in verdicts[:onset]
    assert verdicts[onset + 2] is Verdict.FIRING


def test_without_same_phase_the_unchanged_seasonal_series_raises_false_alarms():
    # why same_phase matters: the peak hours are far from a pool of all hours, nothing changed
    windows = seasonal_windows()
    assert distance("jensen_shannon", windows[6], windows[0], LATENCY_BOUNDS) > 0.3
    assert Verdict.FIRING in seasonal_verdicts(windows, same_phase=False)


def test_a_missing_window_breaks_the_streak_and_is_unknown():
    code, conv = token_windows("code"), token_windows("conv")
    half = len(code) // 2
    tracker = DriftTracker(
        method="ks",
        floor=0.0,
        window_seconds=WINDOW,
        reference_seconds=1e9,
        same_phase=False,
        persistence=3,
    )
    for i, counts in enumerate(code[:half]):
        tracker.add(i * WINDOW, counts, TOKEN_BOUNDS)
    tracker.add(half * WINDOW, conv[half], TOKEN_BOUNDS)
    tracker.add((half + 1) * WINDOW, conv[half + 1], TOKEN_BOUNDS)
    assert tracker.streak == 2
    tracker.add((half + 2) * WINDOW, None, TOKEN_BOUNDS)
    verdicts = [tracker.verdict]
    tracker.add((half + 3) * WINDOW, conv[half + 3], TOKEN_BOUNDS)
    verdicts.append(tracker.verdict)
    assert tracker.streak == 1
    assert verdicts == [Verdict.UNKNOWN, Verdict.CLEAR]  # drifting again, not yet long enough


# --- through the store ---------------------------------------------------------------------------


def drift_rule(**params: ParamValue) -> Rule:
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    found = rules.get("latency-distribution-drift")
    assert found is not None
    return dataclasses.replace(found, parameters={**found.parameters, **params})


T0 = 1_767_225_600.0
STEP = 10


def feed_latency(svc, start: float, end: float, shift_at: float) -> None:
    rng = np.random.default_rng(3)
    counts = np.zeros(len(LATENCY_BOUNDS) + 1)
    total = 0.0
    for t in np.arange(start, end, STEP):
        median = 0.3 if t < shift_at else 0.45
        sample = rng.lognormal(np.log(median), 0.4, size=50)
        counts += np.bincount(
            np.searchsorted(LATENCY_BOUNDS, sample, side="left"), minlength=counts.size
        )
        total += float(sample.sum())
        svc.store.ingest_histogram(
            "gpuwarden.model.time_to_first_token",
            {"model": "llama", "host.name": "srv"},
            time_unix_nano=int(t * 1e9),
            bounds=LATENCY_BOUNDS,
            bucket_counts=counts.tolist(),
            sum_value=total,
            unit="s",
        )


def test_the_runner_reads_window_histograms_from_the_store(tmp_path):
    end = T0 + 5 * HOUR
    svc = make_service(tmp_path, end)
    feed_latency(svc, T0, end, shift_at=end - 20 * 60)
    rule = drift_rule(window_seconds=300.0, reference_seconds=3 * HOUR, same_phase=False)
    before = run_rule(svc, rule, end - 20 * 60)
    got = {f.subject: f for f in before}
    ttft = got["llama:gpuwarden.model.time_to_first_token"]
    assert ttft.verdict is Verdict.CLEAR, dict(ttft.evidence)
    samples = ttft.evidence["aa_samples"]
    assert isinstance(samples, int)
    assert samples >= 10
    after = {f.subject: f for f in run_rule(svc, rule, end)}
    ttft = after["llama:gpuwarden.model.time_to_first_token"]
    assert ttft.verdict is Verdict.FIRING, dict(ttft.evidence)
    assert ttft.evidence["drifted_windows_in_a_row"] == 4
    assert ttft.evidence["p50"] > ttft.evidence["reference_p50"]  # type: ignore[operator]
    assert ttft.evidence["distance"] > ttft.evidence["threshold"]  # type: ignore[operator]
