"""Idle-GPU screening, table-driven: gaps are never idle and never healthy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.detect.findings import Verdict, fingerprint
from gpuwarden.collector.detect.idle_gpu import idle_verdicts
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import JobState
from tests.detectors import run_rule
from tests.test_detect_waste import (
    GIB,
    T0,
    feed,
    gpu_points,
    job,
    make_service,
    proc,
    rule_for,
)

N = np.nan
F, C, U = Verdict.FIRING, Verdict.CLEAR, Verdict.UNKNOWN


@pytest.mark.parametrize(
    ("series", "held", "expected"),
    [
        ([0.0] * 10, True, F),  # idle the whole window
        ([0.01] * 10, True, F),  # below the 5 % threshold
        ([0.0] * 9 + [0.5], True, C),  # one busy sample clears
        ([0.9] * 10, True, C),  # busy
        ([0.0] * 10, False, C),  # not allocated: not an idle *allocated* GPU
        ([N] * 10, True, U),  # no data: never idle
        ([0.0] * 7 + [N] * 3, True, U),  # 70 % coverage < 80 %: unknown
        ([0.0] * 8 + [N] * 2, True, F),  # 80 % coverage: enough
        ([N] * 9 + [0.9], True, C),  # a busy sample is evidence enough of activity
        ([N] * 10, False, C),
    ],
)
def test_idle_verdicts(series, held, expected):
    util = np.array([series], dtype=np.float32)
    held_m = np.full(util.shape, held)
    assert idle_verdicts(util, held_m, threshold_ratio=0.05).tolist() == [expected]


def test_partially_held_window_is_clear():
    util = np.zeros((1, 10), dtype=np.float32)
    held = np.array([[False] * 3 + [True] * 7])
    assert idle_verdicts(util, held, threshold_ratio=0.05).tolist() == [C]


@pytest.mark.parametrize(
    ("series", "held", "unknown", "expected"),
    [
        # issue 17: the newest slot not delivered yet (no sample, no holder seen): still idle
        ([0.0] * 9 + [N], [True] * 9 + [False], [False] * 9 + [True], F),
        ([0.0] * 9 + [N], [True] * 9 + [False], None, C),  # as before: "not held" clears
        ([0.0] * 4 + [N] + [0.0] * 5, [True] * 4 + [False] + [True] * 5,
         [False] * 4 + [True] + [False] * 5, F),  # a failed scrape mid-window
        ([0.0] * 7 + [N] * 3, [True] * 7 + [False] * 3, [False] * 7 + [True] * 3, U),  # 70 %
        ([0.0] * 10, [True] * 9 + [False], [False] * 9 + [True], C),  # a sample speaks: not held
        ([N] * 10, [False] * 10, [True] * 10, U),  # nothing known at all
    ],
)  # fmt: skip
def test_a_slot_nobody_can_tell_is_held_counts_against_coverage_only(
    series, held, unknown, expected
):
    util = np.array([series], dtype=np.float32)
    got = idle_verdicts(
        util, np.array([held]), threshold_ratio=0.05,
        unknown_holder=None if unknown is None else np.array([unknown]),
    )  # fmt: skip
    assert got.tolist() == [expected]


def test_vectorised_over_many_gpus():
    rng = np.random.default_rng(1)
    util = rng.uniform(0.2, 1.0, size=(10_000, 360)).astype(np.float32)
    util[::7] = 0.0
    held = np.ones(util.shape, dtype=bool)
    verdicts = idle_verdicts(util, held, threshold_ratio=0.05)
    assert (verdicts == F).sum() == len(range(0, 10_000, 7))


def test_shapes_must_match():
    with pytest.raises(ValueError, match="shapes differ"):
        idle_verdicts(np.zeros((2, 3)), np.zeros((3, 2), dtype=bool), threshold_ratio=0.05)


def test_fingerprints_are_stable_and_distinct():
    assert fingerprint("idle", "n1/GPU-1") == fingerprint("idle", "n1/GPU-1")
    assert fingerprint("idle", "n1/GPU-1") != fingerprint("idle", "n1/GPU-2")
    assert len(fingerprint("idle", "x")) == 24


def _window(busy_slots: list[int], slots: int = 180, value: float = 0.05) -> np.ndarray:
    util = np.full((1, slots), 0.0, dtype=np.float32)
    util[0, busy_slots] = value
    return util


@pytest.mark.parametrize(
    ("busy_slots", "expected"),
    [
        ([90], F),  # issue 14: one heartbeat sample at the threshold no longer clears 30 min
        ([10, 100, 170], F),  # three blips in 180 slots: within the default 2 %
        (list(range(0, 180, 10)), C),  # an intermittent job: busy one slot in ten
        (list(range(60, 66)), C),  # a minute of real work in the half hour
    ],
)
def test_brief_blips_do_not_clear_an_idle_window(busy_slots, expected):
    util = _window(busy_slots)
    held = np.ones(util.shape, dtype=bool)
    assert idle_verdicts(util, held, threshold_ratio=0.05).tolist() == [expected]


def test_tolerated_busy_fraction_is_a_parameter():
    util = _window([10, 100, 170])
    held = np.ones(util.shape, dtype=bool)
    for tolerated, want in ((0.0, C), (0.02, F)):
        got = idle_verdicts(util, held, threshold_ratio=0.05, busy_fraction_tolerated=tolerated)
        assert got.tolist() == [want]


def test_an_ended_jobs_lingering_process_does_not_make_it_idle(tmp_path: Path):
    """Issue 14 (bench/truth orphaned fleets): job 1 completed 40 min ago and its process still
    holds GPU 0 at 0 %; the agent's attribution names job 1, but an ended job is not idle
    (orphaned-gpu-memory's case). Job 2 runs and leaves GPU 1 idle: it fires."""
    end = T0 + 5400
    svc = make_service(tmp_path, end)
    svc.registry.put(
        [
            job("slurm:c:1", "a", (0,), T0 - 60, end - 2400, state=JobState.COMPLETED),
            job("slurm:c:2", "a", (1,), T0 - 60),
        ]
    )

    def points(t: float) -> list[NumberPoint]:
        out = [p for g in (0, 1) for p in gpu_points("a", g, t, 0.0, memory=10 * GIB)]
        return [*out, proc("a", 0, t, 100, 10 * GIB, "1"), proc("a", 1, t, 101, 10 * GIB, "2")]

    feed(svc, np.arange(T0, end, 10.0), points)
    found = {f.subject: f.verdict for f in run_rule(svc, rule_for("idle_gpu"), end)}
    assert found == {"slurm:c:2": Verdict.FIRING}
