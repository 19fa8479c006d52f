"""Screen primitives: table-driven, with gaps (NaN) that never count as normal nor anomalous."""

from __future__ import annotations

import numpy as np
import pytest

from gpuwarden.collector.detect.numerics import screen

N = np.nan


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        pytest.param([[3.0, 1.0, 2.0]], [2.0], id="odd"),
        pytest.param([[4.0, 1.0, 2.0, 3.0]], [2.5], id="even"),
        pytest.param([[N, 1.0, N, 3.0]], [2.0], id="gaps-ignored"),
        pytest.param([[N, N]], [N], id="all-missing-is-nan"),
        pytest.param([[1.0, 2.0, 9.0], [N, 5.0, N]], [2.0, 5.0], id="per-row"),
    ],
)
def test_nanmedian(rows, expected):
    got = screen.nanmedian(np.array(rows), axis=1)
    np.testing.assert_array_equal(got, np.array(expected))
    finite = [r for r in rows if not np.all(np.isnan(r))]
    if finite:
        np.testing.assert_allclose(
            screen.nanmedian(np.array(finite), axis=1), np.nanmedian(np.array(finite), axis=1)
        )


@pytest.mark.parametrize(
    ("row", "baseline", "expected"),
    [
        # median 3, |dev| = 2,1,0,1,2 -> MAD 1 -> scale 1.4826
        pytest.param(
            [1.0, 2.0, 3.0, 4.0, 5.0],
            None,
            [-2 / 1.4826, -1 / 1.4826, 0.0, 1 / 1.4826, 2 / 1.4826],
            id="mad",
        ),
        pytest.param([1.0, N, 3.0], None, [-1 / 1.4826, N, 1 / 1.4826], id="gap-stays-nan"),
        # Flat baseline but one value: MAD 0 -> mean |dev| (= 1/5) * 1.2533
        pytest.param(
            [5.0, 5.0, 5.0, 5.0, 6.0], None, [0, 0, 0, 0, 1 / (0.2 * 1.2533)], id="mad-zero"
        ),
        pytest.param([7.0, 7.0], [[7.0, 7.0, 7.0]], [0.0, 0.0], id="flat-floor-no-div0"),
        pytest.param([10.0], [[0.0, 1.0, 2.0]], [(10 - 1) / 1.4826], id="baseline-given"),
        pytest.param([1.0, 2.0], [[N, N]], [N, N], id="no-baseline-data"),
    ],
)
def test_robust_z(row, baseline, expected):
    got = screen.robust_z(np.array([row]), None if baseline is None else np.array(baseline))
    np.testing.assert_allclose(got[0], np.array(expected, dtype=float), rtol=1e-4, atol=1e-9)


def test_robust_z_flat_row_jump_is_huge_not_inf():
    z = screen.robust_z(np.array([[3.0, 4.0]]), np.array([[3.0] * 10]))
    assert z[0, 0] == 0.0
    assert np.isfinite(z[0, 1])
    assert z[0, 1] > 1e6


def test_ar1_prewhiten_recovers_phi_and_whitens():
    rng = np.random.default_rng(1)
    rows, cols = 4, 4000
    x = np.zeros((rows, cols))
    phis = np.array([0.0, 0.5, 0.9, -0.4])
    eps = rng.normal(size=(rows, cols))
    for t in range(1, cols):
        x[:, t] = phis * x[:, t - 1] + eps[:, t]
    resid, phi = screen.ar1_prewhiten(x)
    np.testing.assert_allclose(phi, phis, atol=0.05)
    assert np.isnan(resid[:, 0]).all()
    lag1 = screen.ar1_phi(resid[:, 1:])
    assert np.all(np.abs(lag1) < 0.05)


def test_ar1_prewhiten_gaps_and_given_phi():
    x = np.array([[1.0, 2.0, N, 4.0, 5.0]])
    resid, phi = screen.ar1_prewhiten(x, phi=0.5)
    c = x - 3.0  # the mean of the known values
    expected = [N, c[0, 1] - 0.5 * c[0, 0], N, N, c[0, 4] - 0.5 * c[0, 3]]
    np.testing.assert_allclose(resid[0], expected)
    assert phi.tolist() == [0.5]
    _, flat_phi = screen.ar1_prewhiten(np.array([[2.0, 2.0, 2.0]]))
    assert flat_phi.tolist() == [0.0]


def ar1_rows(rng: np.random.Generator, phis: np.ndarray, cols: int) -> np.ndarray:
    x = np.zeros((phis.size, cols))
    eps = rng.normal(size=(phis.size, cols))
    for t in range(1, cols):
        x[:, t] = phis * x[:, t - 1] + eps[:, t]
    return x


@pytest.mark.parametrize(
    ("phi", "shift", "expected"),
    [
        pytest.param(0.0, 0.0, (-3.0, 3.0), id="white-no-shift"),
        pytest.param(0.8, 0.0, (-3.0, 3.0), id="ar1-no-shift-stays-calibrated"),
        pytest.param(0.0, 1.0, (8.0, 18.0), id="white-shift-up"),
        pytest.param(0.5, -2.0, (-20.0, -5.0), id="ar1-shift-down"),
    ],
)
def test_ar1_tests_shift_z(phi, shift, expected):
    rng = np.random.default_rng(11)
    x = ar1_rows(rng, np.full(200, phi), 720)
    x[:, 360:] += shift
    z = screen.ar1_tests(x[:, :360], x[:, 360:]).shift_z
    median = float(np.median(z))
    assert expected[0] <= median <= expected[1]
    if shift == 0.0:  # white under no change: |z| > 2.576 in about 1 % of rows
        assert np.mean(np.abs(z) > 2.576) < 0.05


def test_ar1_tests_gaps_and_shapes():
    rng = np.random.default_rng(12)
    x = ar1_rows(rng, np.array([0.3, 0.3]), 400)
    x[0, 200:] = np.nan  # no known window
    x[1, ::7] = np.nan  # scattered gaps: residuals next to them are skipped
    z = screen.ar1_tests(x[:, :200], x[:, 200:]).shift_z
    assert np.isnan(z[0])
    assert np.isfinite(z[1])
    with pytest.raises(ValueError, match="rows"):
        screen.ar1_tests(x[:1, :200], x[:, 200:])


@pytest.mark.parametrize("phi", [0.0, 0.6])
@pytest.mark.parametrize("shift", [0.0, 0.5])
def test_ar1_tests_break_sup_matches_statsmodels(phi, shift):
    """``break_sup`` is ``breaks_cusumolsresid``'s statistic on the same residuals."""
    from statsmodels.stats.diagnostic import breaks_cusumolsresid  # noqa: TID251 (the reference)

    rng = np.random.default_rng(13)
    x = ar1_rows(rng, np.full(5, phi), 600)
    x[:, 400:] += shift
    tests = screen.ar1_tests(x[:, :300], x[:, 300:])
    phis = screen.ar1_phi(x[:, :300])
    for row in range(5):
        c = x[row] - x[row, :300].mean()
        e = c[1:] - phis[row] * c[:-1]
        expected, p_value, _ = breaks_cusumolsresid(e - e.mean(), ddof=1)
        assert tests.break_sup[row] == pytest.approx(expected, rel=1e-9)
        assert (p_value < 0.01) == (tests.break_sup[row] > 1.63)


@pytest.mark.parametrize(
    ("row", "alpha", "expected"),
    [
        pytest.param([1.0, 3.0, 3.0], 0.5, [1.0, 2.0, 2.5], id="basic"),
        pytest.param([N, 4.0, 0.0], 0.5, [N, 4.0, 2.0], id="starts-at-first-known"),
        pytest.param([4.0, N, N, 0.0], 0.5, [4.0, N, N, 2.0], id="gap-holds-state"),
        pytest.param([1.0, 5.0], 1.0, [1.0, 5.0], id="alpha-one-is-identity"),
        pytest.param([N, N, N], 0.5, [N, N, N], id="all-missing-stays-nan"),
        pytest.param([N, 2.0, N, N], 0.5, [N, 2.0, N, N], id="trailing-gap-is-nan"),
    ],
)
def test_ewma(row, alpha, expected):
    np.testing.assert_allclose(screen.ewma(np.array([row]), alpha)[0], expected)


def test_ewma_rejects_bad_alpha():
    with pytest.raises(ValueError, match="alpha"):
        screen.ewma(np.zeros((1, 3)), 0.0)


@pytest.mark.parametrize(
    ("row", "drift", "threshold", "upper", "lower", "alarms"),
    [
        pytest.param(
            [1.0, 1.0, 1.0, 1.0],
            0.5,
            1.2,
            [0.5, 1.0, 1.5, 0.5],
            [0, 0, 0, 0],
            [2],
            id="up-alarm-then-restart",
        ),
        pytest.param([-2.0, -2.0, 0.0], 0.5, 2.0, [0, 0, 0], [1.5, 3.0, 0.0], [1], id="down-alarm"),
        pytest.param(
            [1.0, N, 1.0, N, 1.0], 0.5, 1.2, [0.5, N, 1.0, N, 1.5], [0, N, 0, N, 0], [4], id="gaps"
        ),
        pytest.param([0.4, -0.4, 0.4], 0.5, 1.0, [0, 0, 0], [0, 0, 0], [], id="within-drift"),
        pytest.param([N, N], 0.5, 1.0, [N, N], [N, N], [], id="all-missing-never-alarms"),
        pytest.param(
            [2.0, N, 2.0, 2.0],
            0.5,
            2.5,
            [1.5, N, 3.0, 1.5],
            [0, N, 0, 0],
            [2],
            id="restart-after-gap",
        ),
    ],
)
def test_cusum(row, drift, threshold, upper, lower, alarms):
    result = screen.cusum(np.array([row]), drift, threshold)
    np.testing.assert_allclose(result.upper[0], upper)
    np.testing.assert_allclose(result.lower[0], lower)
    assert np.flatnonzero(result.alarm[0]).tolist() == alarms


@pytest.mark.parametrize(
    ("mask", "known", "slots", "expected"),
    [
        pytest.param([1, 1, 1, 0, 1], None, 2, [0, 1, 1, 0, 0], id="basic"),
        pytest.param(
            [1, 1, 1, 1], [1, 0, 0, 1], 2, [0, 0, 0, 1], id="gap-neither-counts-nor-resets"
        ),
        pytest.param(
            [1, 0, 1, 1], [1, 0, 1, 1], 3, [0, 0, 0, 1], id="missing-false-is-not-a-reset"
        ),
        pytest.param([1, 1, 0, 1], [1, 1, 1, 1], 1, [1, 1, 0, 1], id="one-slot"),
        pytest.param([1, 1], [0, 0], 1, [0, 0], id="missing-never-held"),
        pytest.param([0, 0, 0], None, 1, [0, 0, 0], id="never-on"),
        pytest.param(
            [1, 1, 1, 0, 1, 1, 1],
            [1, 1, 0, 1, 1, 1, 1],
            3,
            [0, 0, 0, 0, 0, 0, 1],
            id="reset-after-gap",
        ),
    ],
)
def test_held_for(mask, known, slots, expected):
    got = screen.held_for(np.array([mask], bool), slots, known=None if known is None else [known])
    assert got[0].astype(int).tolist() == expected


def _ewma_reference(row: np.ndarray, alpha: float) -> list[float]:
    out: list[float] = []
    state: float | None = None
    for v in row.tolist():
        if np.isnan(v):
            out.append(N)
            continue
        state = v if state is None else alpha * v + (1 - alpha) * state
        out.append(state)
    return out


def _cusum_reference(row: np.ndarray, drift: float, threshold: float) -> list[int]:
    upper = lower = 0.0
    alarms: list[int] = []
    for t, v in enumerate(row.tolist()):
        if np.isnan(v):
            continue
        upper, lower = max(0.0, upper + v - drift), max(0.0, lower - v - drift)
        if upper > threshold or lower > threshold:
            alarms.append(t)
            upper = lower = 0.0
    return alarms


def _held_reference(mask: np.ndarray, known: np.ndarray, slots: int) -> list[bool]:
    run = 0
    out: list[bool] = []
    for on, present in zip(mask, known, strict=True):
        if present:
            run = run + 1 if on else 0
        out.append(bool(present and run >= slots))
    return out


def test_loops_match_a_scalar_reference_on_gappy_rows():
    """The vectorised forms equal the one-row, one-slot definitions, gaps included."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(40, 50)) * 2.0
    x[rng.random(x.shape) < 0.3] = N
    x[7] = N  # a row with no data at all
    x[8, :30] = N  # a row that starts late
    mask = rng.random(x.shape) < 0.7
    smooth = screen.ewma(x, 0.3)
    alarm = screen.cusum(x, 0.5, 3.0).alarm
    held = screen.held_for(mask, 3, known=~np.isnan(x))
    for i, row in enumerate(x):
        np.testing.assert_allclose(smooth[i], _ewma_reference(row, 0.3), rtol=1e-12)
        assert np.flatnonzero(alarm[i]).tolist() == _cusum_reference(row, 0.5, 3.0)
        assert held[i].tolist() == _held_reference(mask[i], ~np.isnan(row), 3)


def test_robust_scale_long_rows_match_float64():
    """Long rows take the MAD in float32: equal to float64 within float32 precision."""
    rng = np.random.default_rng(5)
    x = 1e6 + rng.normal(size=(50, 360))  # a level far above the spread
    x[rng.random(x.shape) < 0.1] = N
    center = np.nanmedian(x, axis=1)
    expected = 1.4826 * np.nanmedian(np.abs(x - center[:, np.newaxis]), axis=1)
    got = screen.robust_scale(x, screen.nanmedian(x, axis=1), axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    huge = np.array([np.linspace(0.0, 1e300, 100)])  # beyond float32: stays float64
    assert np.isfinite(screen.robust_scale(huge, np.array([5e299]), axis=1)).all()


def test_shapes_rejected():
    with pytest.raises(ValueError, match="2-D"):
        screen.robust_z(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="rows"):
        screen.robust_z(np.zeros((2, 3)), np.zeros((3, 3)))
    with pytest.raises(ValueError, match="slots"):
        screen.held_for(np.zeros((1, 3), bool), 0)


def test_row_mean_skips_gaps_and_is_nan_without_a_known_value():
    got = screen.row_mean([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan], [0.5, 0.5, 0.5]])
    np.testing.assert_array_equal(got, [2.0, np.nan, 0.5])


N_ = np.nan
EXCURSION_CASES = [
    # row, enter, leave, (current, longest before)
    ([1, 1, 0, 0, 1, 1, 0, 0, 0], 0.5, 0.75, (3, 2)),  # a phase, back, then a longer one now
    ([1, 0, 0, 0, 1, 0], 0.5, 0.75, (1, 3)),  # the one now is shorter than the one before
    ([1, 0, 0.6, 0, 0, 1], 0.5, 0.75, (0, 4)),  # 0.6: noise between enter and leave, not back
    ([1, 0, N_, N_, 0, 0], 0.5, 0.75, (3, 0)),  # a gap neither counts nor ends it
    ([1, 1, 1], 0.5, 0.75, (0, 0)),  # never below
    ([0, 0, 0], 0.5, 0.75, (3, 0)),  # below from the start
]


@pytest.mark.parametrize(("row", "enter", "leave", "want"), EXCURSION_CASES)
def test_excursions(row, enter, leave, want):
    found = screen.excursions(np.array([row], dtype=float), enter, leave)
    assert (int(found.current[0]), int(found.longest_before[0])) == want
