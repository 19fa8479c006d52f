"""The causal anomaly scorer: table-driven synthetic series with known anomalies (or none)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuwarden.collector.detect.anomaly import DEFAULT_THRESHOLD, AnomalyParams, score_series

N, AT = 2000, 1400
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
    quiet = np.nanmax(scores[200:AT])
    if anomalous:
        first = AT + int(np.argmax(np.nan_to_num(scores[AT:]) >= ALARM))
        assert np.nanmax(scores[AT:]) >= ALARM
        assert first < AT + 150  # found soon after it starts
        assert quiet < ALARM
    else:
        # No anomaly: at most one alarm in 1,800 scored points (the sine breaks its record once).
        assert int((scores[200:] >= ALARM).sum()) <= 1
        assert np.nanmean(scores[200:]) < 0.05


def test_one_alarm_per_anomaly_not_one_per_point():
    scores = score_series(None, level_shift())
    assert int((scores[AT:] >= ALARM).sum()) <= 3


def test_causal_prefix_scores_do_not_change():
    x = level_shift()
    full = score_series(None, x)
    for cut in (AT - 1, AT + 5, 1700):
        np.testing.assert_array_equal(score_series(None, x[:cut]), full[:cut])


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
        AnomalyParams(holdoff_rows=0)
    assert score_series(None, np.zeros(0)).shape == (0,)
