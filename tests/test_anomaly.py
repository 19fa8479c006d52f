"""The causal anomaly scorer: table-driven synthetic series with known anomalies (or none)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuwarden.collector.detect.numerics import anomaly_streams
from gpuwarden.collector.detect.numerics.anomaly import (
    DEFAULT_THRESHOLD,
    AnomalyParams,
    score_series,
)

N, AT = 2000, 1400
START = 500  # warm-up (300 rows) and the novelty stream's start-up
ALARM = DEFAULT_THRESHOLD


def noise(seed: int = 0) -> np.ndarray:
    return 10.0 + np.random.default_rng(seed).normal(size=N)


def spike() -> np.ndarray:
    x = noise()
    x[AT] += 15.0
    return x


def level_shift() -> np.ndarray:
    x = noise()
    x[AT:] += 6.0
    return x


def ramp() -> np.ndarray:
    x = noise()
    x[AT:] += 0.2 * np.arange(N - AT)
    return x


def sine() -> np.ndarray:
    t = np.arange(N)
    return 50 + 20 * np.sin(2 * np.pi * t / 288) + np.random.default_rng(1).normal(size=N)


def flat() -> np.ndarray:
    return np.full(N, 3.0)


def gappy_shift() -> np.ndarray:
    x = level_shift()
    x[AT - 50 : AT - 10] = np.nan
    x[::13] = np.nan
    return x


@pytest.mark.parametrize(
    ("make", "anomalous"),
    [
        pytest.param(spike, True, id="spike"),
        pytest.param(level_shift, True, id="level-shift"),
        pytest.param(ramp, True, id="ramp"),
        pytest.param(gappy_shift, True, id="level-shift-with-gaps"),
        pytest.param(noise, False, id="white-noise"),
        pytest.param(sine, False, id="seasonal-sine"),
        pytest.param(flat, False, id="flat-line"),
    ],
)
def test_scores(make, anomalous):
    x = make()
    scores = score_series(None, x)
    assert scores.shape == x.shape
    known = ~np.isnan(x)
    assert np.isnan(scores[~known]).all()  # missing is neither normal nor anomalous
    assert ((scores[known] >= 0) & (scores[known] < 1)).all()
    # The novelty stream learns its first contexts for a while after the 300-row warm-up and
    # may alarm once or twice then (NAB's probation, 15 % of a file, covers this); after that,
    # at most one false alarm before the anomaly.
    assert int((scores[START:AT] >= ALARM).sum()) <= 1
    if anomalous:
        first = AT + int(np.argmax(np.nan_to_num(scores[AT:]) >= ALARM))
        assert np.nanmax(scores[AT:]) >= ALARM
        assert first < AT + 150  # found soon after it starts
    else:
        # No anomaly: at most one alarm in 1,500 points after the start-up.
        assert int((scores[START:] >= ALARM).sum()) <= 1
        assert np.nanmean(scores[START:]) < 0.05


def test_one_alarm_per_anomaly_not_one_per_point():
    alarms = score_series(None, level_shift())[AT:] >= ALARM
    episodes = int(alarms[0]) + int((alarms[1:] & ~alarms[:-1]).sum())  # rising edges
    assert episodes == 1  # one alarm episode for a shift that lasts 600 rows
    assert int(alarms.sum()) <= 10  # a few rows while the shift enters the shape window


@pytest.mark.parametrize("make", [level_shift, gappy_shift, spike, sine], ids=lambda f: f.__name__)
def test_causal_prefix_scores_do_not_change(make):
    x = make()
    full = score_series(None, x)
    for cut in (AT - 1, AT + 5, 1700):
        np.testing.assert_array_equal(score_series(None, x[:cut]), full[:cut])


def test_leading_gap_and_short_series():
    x = level_shift()
    x[:400] = np.nan
    scores = score_series(None, x)
    assert np.isnan(scores[:400]).all()
    assert np.nanmax(scores[AT:]) >= ALARM
    assert np.isnan(score_series(None, np.full(50, np.nan))).all()
    assert (score_series(None, np.arange(3.0)) == 0).all()  # too short to say anything


@pytest.mark.parametrize(
    ("z", "half_life", "floor", "expected"),
    [
        pytest.param([1.0, 1.0, 1.0], 1e9, 0.5, [2.0, 1.0, 1.0], id="repeat-is-no-record"),
        pytest.param([0.0, 4.0, 2.0], 1.0, 1.0, [0.0, 4.0, 1.0], id="record-halves-per-row"),
        pytest.param([3.0, np.nan, 3.0], 1e9, 1.0, [3.0, 0.0, 1.0], id="nan-counts-as-zero"),
    ],
)
def test_decaying_record_ratio(z, half_life, floor, expected):
    ratio = anomaly_streams.decaying_record_ratio(np.array(z), half_life, floor)
    np.testing.assert_allclose(ratio, expected)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        # levels=2, orders 1 and 2, bins sized on the first 2 known values (0 and 2)
        pytest.param([0.0, 2.0, 0.0, 2.0, 0.0], [np.nan, np.nan, 0.5, 0.0, 0.0], id="learns-cycle"),
        pytest.param([0.0, 2.0, 0.0, 2.0, 9.0], [np.nan, np.nan, 0.5, 0.0, 1.0], id="new-level"),
        pytest.param([0.0, 2.0, np.nan, 0.0, 2.0], [np.nan] * 3 + [0.5, 0.0], id="gap-skipped"),
        pytest.param([0.0, np.nan, 2.0], [np.nan] * 3, id="still-warming-up"),
    ],
)
def test_context_novelty(values, expected):
    novelty = anomaly_streams.context_novelty(np.array(values), 2, 2, 2)
    np.testing.assert_allclose(novelty, expected)


def test_knn_distance_of_a_repeated_pattern_is_zero_then_positive():
    x = np.tile([0.0, 1.0, 2.0, 1.0], 100)
    x[300] = 5.0
    alpha = anomaly_streams.knn_distance(x, 4, 200, 3, 20)
    assert np.isnan(alpha[:26]).all()  # fewer than 20 earlier shapes
    assert np.nanmax(alpha[:300]) == 0.0
    assert alpha[300] > 0.0


def test_flat_line_then_change_alarms():
    x = flat()
    x[AT:] = 4.0
    scores = score_series(None, x)
    assert scores[AT] >= ALARM
    assert np.nanmax(scores[:AT]) == 0.0


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="1-D"):
        score_series(None, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="timestamps"):
        score_series(np.arange(3), np.zeros(4))
    with pytest.raises(ValueError, match="window"):
        AnomalyParams(knn_reference_rows=0)
    with pytest.raises(ValueError, match="half_life"):
        AnomalyParams(half_life_rows=0)
    assert score_series(None, np.zeros(0)).shape == (0,)
