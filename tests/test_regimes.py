"""Busy/stalled regimes (statsmodels MarkovRegression): table-driven, with gaps and fit failures."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gpuwarden.collector.detect.numerics.regimes import MIN_SEPARATION, busy_stall_regimes

N = 180  # 30 min of 10 s samples


def stalls(share: float) -> Callable[[np.random.Generator], np.ndarray]:
    """Busy at 0.9, stalled near 0 for ``share`` of the samples at random."""

    def make(rng: np.random.Generator) -> np.ndarray:
        x = np.where(rng.random(N) < share, 0.02, 0.9) + rng.normal(0, 0.03, N)
        return np.clip(x, 0, 1)

    return make


def periodic(rng: np.random.Generator) -> np.ndarray:
    """Six busy samples, three stalled: a loader that falls behind every 90 s."""
    x = np.tile([0.9] * 6 + [0.05] * 3, N // 9) + rng.normal(0, 0.03, N)
    return np.clip(x, 0, 1)


def gaussian(sd: float) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: np.clip(rng.normal(0.3, sd, N), 0, 1)


def with_gaps(make: Callable[[np.random.Generator], np.ndarray]) -> Callable[..., np.ndarray]:
    def out(rng: np.random.Generator) -> np.ndarray:
        x = make(rng)
        x[::5] = np.nan
        return x

    return out


CASES = [
    ("random stalls, 30 %", stalls(0.3), True),
    ("random stalls, 30 %, every 5th sample missing", with_gaps(stalls(0.3)), True),
    ("periodic stalls", periodic, True),
    ("unimodal noise, clipped at 0", gaussian(0.25), False),
    ("wider unimodal noise, clipped at 0", gaussian(0.3), False),
    ("uniform spread", lambda rng: rng.uniform(0, 0.6, N), False),
]


@pytest.mark.parametrize(("name", "make", "distinct"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_distinct_regimes(name, make, distinct, seed):
    found = busy_stall_regimes(make(np.random.default_rng(seed)))
    assert found is not None, name
    assert found.distinct is distinct, (name, found)
    assert found.stall_level < found.busy_level
    if distinct:
        assert found.separation > 3 * MIN_SEPARATION  # far from the cut
    else:
        assert found.separation < MIN_SEPARATION


def test_periodic_stalls_report_their_share_and_duration():
    found = busy_stall_regimes(periodic(np.random.default_rng(3)))
    assert found is not None
    assert found.stall_share == pytest.approx(1 / 3, abs=0.03)
    assert found.stall_slots == pytest.approx(3, abs=0.5)
    assert found.stall_level == pytest.approx(0.05, abs=0.02)
    assert found.busy_level == pytest.approx(0.9, abs=0.02)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(np.tile([0.95, 0.0], N // 2), id="strict alternation: chain on its bound"),
        pytest.param(np.full(N, 0.3), id="constant"),
        pytest.param(stalls(0.3)(np.random.default_rng(4))[:20], id="too few samples"),
        pytest.param(np.full(N, np.nan), id="all missing"),
    ],
)
def test_no_fit_returns_none(values):
    assert busy_stall_regimes(values) is None
