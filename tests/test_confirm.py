"""Confirm stage: statsmodels on candidates only; synthetic series with known truth."""

from __future__ import annotations

import numpy as np
import pytest

from gpuwarden.collector.detect.confirm import FitCache, confirm_shift

N, SPLIT, PERIOD = 400, 360, 48


def ar1(rng: np.random.Generator, phi: float) -> np.ndarray:
    eps = rng.normal(size=N)
    x = np.zeros(N)
    for t in range(1, N):
        x[t] = phi * x[t - 1] + eps[t]
    return x


def seasonal(rng: np.random.Generator, shift: float) -> np.ndarray:
    t = np.arange(N)
    x = 10 * np.sin(2 * np.pi * t / PERIOD) + 0.5 * rng.normal(size=N)
    x[SPLIT:] += shift
    return x


def step(rng: np.random.Generator, shift: float) -> np.ndarray:
    x = rng.normal(size=N)
    x[SPLIT:] += shift
    return x


@pytest.mark.parametrize(
    ("make", "period", "expected"),
    [
        pytest.param(lambda r: step(r, 3.0), None, True, id="step-confirmed"),
        pytest.param(lambda r: seasonal(r, 4.0), PERIOD, True, id="seasonal-step-confirmed"),
        pytest.param(lambda r: seasonal(r, 0.0), PERIOD, False, id="seasonal-only-not"),
        pytest.param(lambda r: ar1(r, 0.8), None, False, id="ar1-noise-not"),
        pytest.param(lambda r: step(r, 0.0), None, False, id="white-noise-not"),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_confirm_shift(make, period, expected, seed):
    x = make(np.random.default_rng(seed))
    result = confirm_shift(x[:SPLIT], x[SPLIT:], period)
    assert result.confirmed is expected
    assert 0.0 <= result.p_value <= 1.0


def test_gaps_are_dropped_and_short_history_is_not_confirmed():
    x = step(np.random.default_rng(4), 3.0)
    x[::9] = np.nan
    assert confirm_shift(x[:SPLIT], x[SPLIT:], None).confirmed
    short = confirm_shift(x[:5], x[SPLIT:], None)
    assert not short.confirmed
    assert np.isnan(short.p_value)


def test_fit_is_cached_and_reused_per_key():
    rng = np.random.default_rng(5)
    cache = FitCache(capacity=2)
    first = step(rng, 3.0)
    a = confirm_shift(first[:SPLIT], first[SPLIT:], None, key="gpu-0", cache=cache)
    # Same key, new data: the cached parameters are applied, not refitted.
    again = confirm_shift(first[:SPLIT], first[SPLIT:] + 1.0, None, key="gpu-0", cache=cache)
    assert len(cache) == 1
    assert again.detail["sigma"] == a.detail["sigma"]
    assert again.score > a.score
    for key in ("gpu-1", "gpu-2"):
        confirm_shift(first[:SPLIT], first[SPLIT:], None, key=key, cache=cache)
    assert len(cache) == 2
    assert cache.get("gpu-0") is None  # least recently used, evicted
    with pytest.raises(ValueError, match="capacity"):
        FitCache(0)


def long_seasonal(rng: np.random.Generator, length: int, shift_at: int | None) -> np.ndarray:
    t = np.arange(length)
    x = 10 * np.sin(2 * np.pi * t / PERIOD) + 0.5 * rng.normal(size=length)
    if shift_at is not None:
        x[shift_at:] += 4.0
    return x


@pytest.mark.parametrize(("shift_at", "expected"), [(380, True), (None, False)])
def test_reused_fit_keeps_the_seasonal_phase_as_the_window_moves(shift_at, expected):
    x = long_seasonal(np.random.default_rng(6), 480, shift_at)
    cache = FitCache()
    first = confirm_shift(x[:SPLIT], x[SPLIT:400], PERIOD, key="m", cache=cache)
    assert first.confirmed is expected
    assert first.detail["reused_fit"] == 0.0
    # 7 samples later (not a whole period): the kept profile is subtracted by phase.
    moved = confirm_shift(
        x[7 : SPLIT + 7], x[SPLIT + 7 : 407], PERIOD, key="m", cache=cache, start=7
    )
    assert moved.detail["reused_fit"] == 1.0
    assert moved.confirmed is expected
    fresh = confirm_shift(x[7 : SPLIT + 7], x[SPLIT + 7 : 407], PERIOD)
    assert moved.confirmed is fresh.confirmed
    assert moved.detail["sigma"] == pytest.approx(first.detail["sigma"])


def test_phase_alignment_is_what_keeps_the_interval_honest():
    """The reuse above can fail: with the wrong ``start``, the kept profile is subtracted out of
    phase and the clean window lands far outside its interval (the break test alone, which sees
    the misfit everywhere, keeps it from confirming)."""
    x = long_seasonal(np.random.default_rng(6), 480, None)
    aligned, wrong = FitCache(), FitCache()
    for cache in (aligned, wrong):
        confirm_shift(x[:SPLIT], x[SPLIT:400], PERIOD, key="m", cache=cache)
    history, window = x[12 : SPLIT + 12], x[SPLIT + 12 : 412]
    good = confirm_shift(history, window, PERIOD, key="m", cache=aligned, start=12)
    bad = confirm_shift(history, window, PERIOD, key="m", cache=wrong, start=0)
    assert good.detail["reused_fit"] == bad.detail["reused_fit"] == 1.0
    assert good.score < 2.0
    assert bad.score > 5.0


def test_fit_is_redone_after_refit_every_uses_and_on_another_period():
    x = step(np.random.default_rng(8), 3.0)
    cache = FitCache(refit_every=2)
    flags = [
        confirm_shift(x[:SPLIT], x[SPLIT:], None, key="k", cache=cache).detail["reused_fit"]
        for _ in range(4)
    ]
    assert flags == [0.0, 1.0, 1.0, 0.0]
    assert (cache.fitted, cache.reused) == (2, 2)
    # A kept fit without seasonality is not reused for a seasonal call.
    seasonal_call = confirm_shift(x[:SPLIT], x[SPLIT:], 48, key="k", cache=cache)
    assert seasonal_call.detail["reused_fit"] == 0.0
    with pytest.raises(ValueError, match="refit_every"):
        FitCache(refit_every=-1)
