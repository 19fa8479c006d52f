"""The waste quality bar: idle and forgotten GPUs at precision and recall ≥ 0.95, measured
through the whole collector path against truth computed on the raw samples (bench/waste_eval.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.waste_eval import BUSY, IDLE, UNKNOWN, Score, run_gentd26, run_synthetic, score

GENTD26 = Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba_gentd26"
BAR = 0.95


def test_the_scorer_counts_pairs_and_episodes():
    truth = np.array([[BUSY, IDLE, IDLE, BUSY, IDLE], [UNKNOWN, BUSY, IDLE, IDLE, IDLE]])
    fired = np.array([[False, False, True, False, False], [True, False, False, True, True]])
    got = score("t", truth, fired, np.arange(5) * 60.0)
    assert (got.tp, got.fp, got.fn, got.fired_on_unknown) == (3, 1, 3, 1)
    assert (got.episodes, got.episodes_found) == (3, 2)
    assert sorted(got.held_delays_seconds) == [60.0, 60.0]


def assert_bar(scores: list[Score]) -> None:
    for s in scores:
        assert s.episodes > 0, s.name  # a data set without waste proves nothing
        assert s.precision >= BAR, (s.name, s.precision, s.tp, s.fp)
        assert s.recall >= BAR, (s.name, s.recall, s.tp, s.fn)
        assert s.episodes_found >= BAR * s.episodes, s.name
        # found within one cycle of the first moment the condition held, at the median
        assert np.median(s.held_delays_seconds) <= 600, s.name


def test_synthetic_fleets_meet_the_bar():
    assert_bar(run_synthetic(cycle_seconds=300, seed=7, gpus=16))


def test_gentd26_pods_meet_the_bar():
    if not (GENTD26 / "pod_gpu_duty_cycle_anon.csv.gz").exists():
        pytest.skip(f"GenTD26 data not found at {GENTD26} (see shared/data README)")
    scores = run_gentd26(GENTD26, cycle_seconds=300)
    assert [s.name.split(" (")[0] for s in scores] == ["GenTD26 idle"] * 2 + ["GenTD26 forgotten"]
    assert_bar(scores)
