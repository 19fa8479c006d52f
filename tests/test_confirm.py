"""Confirm stage: statsmodels on candidates only; synthetic series with known truth."""

from __future__ import annotations

import numpy as np
import pytest

from gpuwarden.collector.detect.numerics.confirm import FitCache, confirm_shift, confirm_shifts

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


def test_batch_reuse_equals_one_by_one_statsmodels():
    """``confirm_shifts`` judges rows with kept fits in numpy: the same verdicts and numbers as
    ``confirm_shift`` one by one, whose reused path runs statsmodels' filter and break test."""
    rng = np.random.default_rng(11)
    rows, hist, win, period = 24, 240, 240, 48
    t = np.arange(hist + win + 12)
    data = 3 * np.sin(2 * np.pi * t / period)[np.newaxis, :] * rng.random((rows, 1))
    data = data + rng.normal(0, 0.5, data.shape)
    data[::3, 400:] += 2.0
    data[rng.random(data.shape) < 0.03] = np.nan
    keys = list(range(rows))
    one, many = FitCache(rows), FitCache(rows)
    for r in range(rows):
        confirm_shift(data[r, :hist], data[r, hist : hist + win], period, key=r, cache=one)
    head, tail = data[:, :hist], data[:, hist : hist + win]
    first = confirm_shifts(head, tail, period, keys=keys, cache=many)
    assert [f.detail["reused_fit"] for f in first] == [0.0] * rows
    off = 12
    past, ahead = data[:, off : off + hist], data[:, off + hist : off + hist + win]
    expected = [
        confirm_shift(past[r], ahead[r], period, key=r, cache=one, start=off) for r in range(rows)
    ]
    got = confirm_shifts(past, ahead, period, keys=keys, cache=many, start=off)
    assert many.reused == rows
    assert sum(e.confirmed for e in expected) >= rows // 3  # the shifted rows, at least
    for e, g in zip(expected, got, strict=True):
        assert g.confirmed is e.confirmed
        assert g.p_value == pytest.approx(e.p_value, rel=1e-7, abs=1e-12)
        assert g.score == pytest.approx(e.score, rel=1e-7)
        assert g.baseline == pytest.approx(e.baseline, rel=1e-9)
        assert dict(g.detail) == pytest.approx(dict(e.detail), rel=1e-7)


def test_batch_checks_its_input():
    with pytest.raises(ValueError, match="rows"):
        confirm_shifts(np.zeros((2, 30)), np.zeros((3, 5)), None)
    with pytest.raises(ValueError, match="keys"):
        confirm_shifts(np.zeros((2, 30)), np.zeros((2, 5)), None, keys=["a"], cache=FitCache())


def test_a_due_refit_can_be_postponed_once_per_call():
    cache = FitCache(4, refit_every=2)
    rng = np.random.default_rng(12)
    x = step(rng, 0.0)
    confirm_shift(x[:SPLIT], x[SPLIT:], None, key="k", cache=cache)
    assert cache.peek("k")
    assert cache.kept("k")
    assert not cache.kept("k", period=48)
    assert cache.get("k") is not None
    assert cache.get("k") is not None
    assert not cache.peek("k")
    assert cache.kept("k")
    cache.postpone("k")
    assert cache.get("k") is not None  # one more use
    assert cache.get("k") is None
    cache.postpone("missing")  # nothing kept: nothing happens
    assert not cache.kept("missing")


@pytest.mark.parametrize(
    ("shift", "direction", "expected"),
    [
        (3.0, "increase", True),
        (3.0, "decrease", False),
        (-3.0, "decrease", True),
        (-3.0, "increase", False),
        (-3.0, "both", True),
    ],
)
def test_only_a_shift_in_the_direction_asked_is_confirmed(shift, direction, expected):
    """Fresh and kept fits alike: a rise is never a confirmed decrease."""
    x = step(np.random.default_rng(5), shift)
    fresh = confirm_shift(x[:SPLIT], x[SPLIT:], None, direction=direction)
    assert fresh.confirmed is expected
    cache = FitCache()
    confirm_shifts(x[np.newaxis, :SPLIT], x[np.newaxis, SPLIT:], None, keys=["s"], cache=cache)
    (kept,) = confirm_shifts(
        x[np.newaxis, :SPLIT], x[np.newaxis, SPLIT:], None, keys=["s"], cache=cache,
        direction=direction,
    )  # fmt: skip
    assert kept.detail["reused_fit"] == 1.0
    assert kept.confirmed is expected
