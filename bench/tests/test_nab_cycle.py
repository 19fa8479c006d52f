"""NAB at the production shape: the replay through the real collector and engine is checked
against a sliding-window computation written here from the rule's documented semantics.

The store round trip runs on synthetic data; the replay needs ../shared/data/nab and skips
without it (about 20 s on one core).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import nab, nab_cycle
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.metric_anomaly import fold_change
from gpuwarden.collector.detect.numerics import anomaly

NAB_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "nab"
needs_nab = pytest.mark.skipif(
    not (NAB_DIR / "data").is_dir(),
    reason=f"NAB data not found at {NAB_DIR} (../shared/data/nab next to the repository)",
)
HELD_OUT_FILE = "realTraffic/speed_7578.csv"  # split B; 1,126 rows, incidents in its first 900
ROWS = 900


@pytest.mark.parametrize("shift", [0.0, -50.0])
def test_the_counter_reads_back_as_the_values_at_one_minute(tmp_path, shift):
    rng = np.random.default_rng(7)
    values = rng.integers(0, 400, size=200).astype(np.float64) + shift
    now = [0.0]
    svc = build_service(
        CollectorConfig(database=tmp_path / "c.db"), clock=lambda: now[0], job_sources=[]
    )
    try:
        for point in nab_cycle.request_points("m", values):
            now[0] = point.time_unix_nano / nab_cycle.NS
            assert svc.accept([point], "test") == 0
        end = nab_cycle.T0 + 60 * len(values)
        now[0] = end
        matrix = svc.store.matrix(nab_cycle.METRIC, start=nab_cycle.T0, end=end, resolution="long")
    finally:
        svc.storage.close()
    assert matrix.values.shape == (1, len(values))
    # A counter cannot fall: negative series come back shifted by their minimum.
    np.testing.assert_allclose(matrix.values[0], values - min(0.0, values.min()), rtol=1e-6)


def sliding_reference(
    values: np.ndarray, threshold: float, min_fold: float
) -> tuple[list[int], list[int]]:
    """(incident rows, firing rows) of the shipped rule, from its semantics, without the store.

    Each minute: the newest 720 one-minute slots (12 h; NaN before the series began), UNKNOWN
    up to the scorer's warm-up of known minutes, FIRING when the top score in the newest 3
    slots reaches the threshold and its value is at least ``min_fold`` times above or below
    the median of the 60 slots before those 3 (not judged when that hour has no value); an
    incident opens on a firing cycle and resolves after 3 clear cycles in a row (UNKNOWN
    changes nothing).
    """
    opened, firing = [], []
    is_open, clears = False, 0
    warmup = anomaly.AnomalyParams().warmup_rows
    padded = np.concatenate((np.full(720, np.nan), values))
    for row in range(len(values)):
        window = padded[row + 1 : row + 721]
        if np.isfinite(window).sum() <= warmup:
            continue
        newest = anomaly.score_series(None, window)[-3:]
        scores = np.where(np.isfinite(newest), newest, -np.inf)
        top = int(np.argmax(scores))
        fires = bool(scores[top] >= threshold)
        hour = window[-63:-3][np.isfinite(window[-63:-3])]
        if fires and hour.size:
            fold = fold_change(float(window[-3:][top]), float(np.median(hour)))
            fires = not (np.isfinite(fold) and fold < min_fold)
        if fires:
            firing.append(row)
            if not is_open:
                opened.append(row)
            is_open, clears = True, 0
        elif is_open:
            clears += 1
            is_open = clears < 3
    return opened, firing


@needs_nab
def test_the_engine_replay_matches_the_sliding_window_semantics():
    _, values = nab.load_data_file(NAB_DIR / "data" / HELD_OUT_FILE)
    rule = nab_cycle.shipped_rule()
    run = nab_cycle.replay(HELD_OUT_FILE, values, rule=rule, rows=ROWS)
    fold = rule.parameters["min_fold_change"]
    assert isinstance(fold, float)
    assert fold > 1.0  # the shipped rule gates: the reference must apply it too
    opened, firing = sliding_reference(values[:ROWS], nab_cycle.threshold_of(rule), fold)
    assert run.cycles == ROWS
    assert opened  # the span holds incidents, so the comparison means something
    assert (list(run.opened), list(run.firing)) == (opened, firing)


def test_detections_become_nab_outputs(tmp_path):
    data = tmp_path / "data" / "c"
    data.mkdir(parents=True)
    (data / "f.csv").write_text(
        "timestamp,value\n" + "".join(f"2024-01-01 00:0{i}:00,{i}\n" for i in range(5))
    )
    run = nab_cycle.CycleRun("c/f.csv", 5, 5, opened=(1, 3), firing=(1, 2, 3), seconds=0.0)
    (opened,) = nab_cycle.as_outputs([run], tmp_path, "opened").values()
    (fired,) = nab_cycle.as_outputs([run], tmp_path, "firing").values()
    assert opened.scores.tolist() == [0, 1, 0, 1, 0]
    assert fired.scores.tolist() == [0, 1, 1, 1, 0]
    assert len(opened.timestamps) == 5
