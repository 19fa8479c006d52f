"""level_shift's fits survive a restart: the first cycle after it judges every candidate.

Three shifted series, ``max_fits=1``: a fresh collector needs three cycles before none is
UNKNOWN. After the snapshot (window and fits) and a restart on it, the first cycle judges all
three, with the fits it had (``reused_fit``), and fits nothing new.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect import level_shift
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.fit_state import fits_path, read_fits, write_fits
from gpuwarden.collector.detect.numerics.confirm import FitCache
from gpuwarden.collector.service import CollectorService
from tests.detectors import run_rule
from tests.test_detect_level_shift import END, SLOTS, STEP, default_rule, series_points, shifted
from tests.test_detect_waste import feed


def service_on(tmp_path: Path, snapshot: Path) -> CollectorService:
    config = CollectorConfig(database=tmp_path / "c.db", snapshot_file=snapshot)
    return build_service(config, clock=lambda: END)


def test_a_restart_keeps_the_fits_and_judges_every_candidate_at_once(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    values = {f"g{i}": shifted(-0.5)(rng) for i in range(3)}
    snapshot = tmp_path / "window.npz"
    (tmp_path / "a").mkdir()
    first = service_on(tmp_path / "a", snapshot)
    feed(first, END - STEP * np.arange(SLOTS, 0, -1) + 1, series_points(values))
    rule = default_rule(max_fits=1)
    verdicts = [[f.verdict for f in run_rule(first, rule, END)] for _ in range(3)]
    assert verdicts[0].count(Verdict.UNKNOWN) == 2  # one fit per cycle
    assert verdicts[2] == [Verdict.FIRING] * 3
    first.save_snapshot()
    assert fits_path(snapshot).exists()

    (tmp_path / "b").mkdir()
    second = service_on(tmp_path / "b", snapshot)  # restores the window and the fits
    cache = second.detection_view.cache(level_shift.new_fit_cache)
    assert len(cache) == 3
    findings = run_rule(second, rule, END)
    assert [f.verdict for f in findings] == [Verdict.FIRING] * 3
    assert all(f.evidence["reused_fit"] is True for f in findings)
    assert cache.fitted == 0


def test_fits_that_do_not_read_are_made_again(tmp_path: Path) -> None:
    path = tmp_path / "window.npz.fits.npz"
    path.write_bytes(b"not an npz")
    cache = FitCache(16)
    assert read_fits(cache, path) == 0
    assert len(cache) == 0


def test_no_fits_is_a_file_of_none(tmp_path: Path) -> None:
    path = tmp_path / "window.npz.fits.npz"
    assert write_fits(FitCache(16), path) == 0
    assert read_fits(FitCache(16), path) == 0
