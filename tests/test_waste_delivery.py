"""Issue 17, for the waste detectors: a pod known only from dcgm-exporter's labels that held its
GPUs unused fires ``forgotten_gpu`` (and a starving one ``input_bound``) whatever the phase of
the sender's delivery against the detection cycle, as ``idle_gpu`` does
(tests/test_prom_idle_delivery.py).

A slot where the GPU sent nothing and no scheduler allocation speaks is unknown
(``gpu_time.holders``), not the pod letting its GPUs go: ``waste.held_by_job`` counted it as
"not held for the window", so a pod whose newest scrape had not arrived yet, or that missed one
scrape, was never judged. The scrapes go through the wire format, ``prom_write.screen``,
``prom_map.translate`` and a real ``CollectorService``; the detection runs at a chosen ``now``.
One slot is one minute (the rule's shortest window is an hour: 60 slots, as in the idle test).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.detect.waste import low_mean_verdicts
from gpuwarden.collector.remote_write.wire import Series
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.service import CollectorService
from tests.dcgm_exposition import DcgmFleet
from tests.detectors import make_rule, run_rule
from tests.test_prom_idle_delivery import KEY, STALE_NAN, T0, deliver, fleet
from tests.test_prom_idle_delivery import scrape as idle_scrape
from tests.test_prom_idle_delivery import service as idle_service
from tests.test_prom_map_service import scrape_series

STEP = 60
OFFSET = 59.0  # each minute's scrape, late in its slot
WINDOW = 60 * STEP
#: a GPU silent this long is stale; above the scrape interval, as a one-minute scrape needs
STALENESS = 1.5 * STEP
NOW = T0 + 70 * STEP + 12  # slots 10..69 of the scrapes are the window


def service(tmp_path: Path) -> CollectorService:
    config = CollectorConfig(
        database=tmp_path / "c.db", recent_hours=2, step_seconds=STEP, staleness_seconds=STALENESS
    )
    return build_service(config, clock=lambda: NOW)


def scrape(the_fleet: DcgmFleet, k: int) -> list[Series]:
    return scrape_series(the_fleet, T0 + k * STEP + OFFSET)


def forgotten_rule() -> Rule:
    return make_rule("forgotten_gpu", "forgotten-gpu", window_seconds=float(WINDOW))


def notebook(findings: list[Finding]) -> Finding:
    return next(f for f in findings if f.subject == KEY)


def test_the_newest_scrape_not_delivered_yet_still_fires(tmp_path: Path) -> None:
    """The cycle runs before the scrape of slot 69 has arrived: 59 of 60 slots have data."""
    svc = service(tmp_path)
    the_fleet = fleet()
    for k in range(69):
        deliver(svc, scrape(the_fleet, k))
    found = notebook(run_rule(svc, forgotten_rule(), NOW))
    assert found.verdict is Verdict.FIRING
    assert found.evidence["gpus"] == 2
    assert found.evidence["coverage_ratio"] == 59 / 60
    assert found.evidence["wasted_gpu_hours"] == 2.0


def test_a_failed_scrape_mid_window_does_not_clear_the_forgotten_pod(tmp_path: Path) -> None:
    """Stale markers for one failed scrape, then the series come back: one slot without data
    (presence bridges such a short gap, so this held before issue 17's fix too)."""
    svc = service(tmp_path)
    the_fleet = fleet()
    for k in range(70):
        if k == 40:
            deliver(svc, [s._replace(values=(STALE_NAN,)) for s in scrape(the_fleet, k)])
        else:
            deliver(svc, scrape(the_fleet, k))
    found = notebook(run_rule(svc, forgotten_rule(), NOW))
    assert found.verdict is Verdict.FIRING
    assert found.evidence["coverage_ratio"] == 59 / 60


def test_an_exporter_silent_beyond_the_presence_bridge_still_fires(tmp_path: Path) -> None:
    """Five scrapes lost in a row: longer than the gap that presence bridges (a job seen before
    and after a short gap holds the GPU through it, ``fleet._process_jobs``), within the 80 %
    coverage the rule asks for. Those slots tell nothing; the pod still held its GPUs."""
    svc = service(tmp_path)
    the_fleet = fleet()
    for k in range(70):
        if not 40 <= k < 45:
            deliver(svc, scrape(the_fleet, k))
    found = notebook(run_rule(svc, forgotten_rule(), NOW))
    assert found.verdict is Verdict.FIRING
    assert found.evidence["coverage_ratio"] == 55 / 60


def test_a_pod_that_left_its_gpus_was_not_forgotten(tmp_path: Path) -> None:
    """The exporter keeps reporting the GPUs but no longer names the pod: known, not held, so
    the pod did not hold them for the window (no finding: not this rule's case)."""
    svc = service(tmp_path)
    the_fleet = fleet()
    for k in range(70):
        if k == 60:
            for index in (2, 3):
                the_fleet.assign("node-a", index)
        deliver(svc, scrape(the_fleet, k))
    assert all(f.subject != KEY for f in run_rule(svc, forgotten_rule(), NOW))


def test_an_exporter_silent_for_a_fifth_of_the_window_is_unknown(tmp_path: Path) -> None:
    """Silence is never waste: 13 of 60 slots without data is below 80 % coverage."""
    svc = service(tmp_path)
    the_fleet = fleet()
    for k in range(70):
        if not 40 <= k < 53:
            deliver(svc, scrape(the_fleet, k))
    found = notebook(run_rule(svc, forgotten_rule(), NOW))
    assert found.verdict is Verdict.UNKNOWN
    assert found.evidence["wasted_gpu_hours"] == 0.0


def test_an_input_bound_pod_whose_newest_scrape_is_late_still_fires(tmp_path: Path) -> None:
    """``input_bound`` groups jobs by ``held_by_job`` too: a pod whose GPUs cycle between busy
    and stalled (a data loader that cannot keep up) fires when the scrape of the window's newest
    slot has not arrived yet. One-second slots and scrapes, a one-minute window, as in
    tests/test_prom_idle_delivery.py."""
    now = T0 + 70.2
    svc = idle_service(tmp_path, now)
    the_fleet = fleet()
    for k in range(69):  # the scrape of slot 69 (at T0 + 69.9) arrives after the cycle
        for index in (2, 3):
            busy = 95.0 if (k // 5) % 2 == 0 else 0.0  # 5 s busy, 5 s stalled
            the_fleet.set("node-a", index, {"DCGM_FI_DEV_GPU_UTIL": busy})
        deliver(svc, idle_scrape(the_fleet, k))
    rule = make_rule("input_bound", "input-bound", window_seconds=60.0)
    found = notebook(run_rule(svc, rule, now))
    assert found.verdict is Verdict.FIRING, found.evidence


NAN = np.nan


@pytest.mark.parametrize(
    ("row", "held", "unknown", "want"),
    [
        # a silent slot nobody can speak for counts against coverage only
        ([0.0, 0.0, 0.0, NAN], [1, 1, 1, 0], [0, 0, 0, 1], Verdict.FIRING),
        ([0.9, 0.9, 0.9, NAN], [1, 1, 1, 0], [0, 0, 0, 1], Verdict.CLEAR),
        ([0.0, NAN, NAN, NAN], [1, 0, 0, 0], [0, 1, 1, 1], Verdict.UNKNOWN),
        # a slot with a sample and no holder stays "not held", whatever unknown says
        ([0.0, 0.0, 0.0, 0.0], [1, 1, 1, 0], [0, 0, 0, 1], Verdict.CLEAR),
        # a silent slot the job is known not to hold (not unknown) stays "not held"
        ([0.0, 0.0, 0.0, NAN], [1, 1, 1, 0], [0, 0, 0, 0], Verdict.CLEAR),
    ],
)
def test_low_mean_verdicts_with_unknown_holder(row, held, unknown, want) -> None:
    got, _ = low_mean_verdicts(
        np.array([row], dtype=float), np.array([held], dtype=bool),
        threshold_ratio=0.05, min_coverage=0.7, unknown_holder=np.array([unknown], dtype=bool),
    )  # fmt: skip
    assert Verdict(int(got[0])) is want


def test_low_mean_verdicts_rejects_an_unknown_mask_of_another_shape() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        low_mean_verdicts(
            np.zeros((1, 3)), np.ones((1, 3), dtype=bool), threshold_ratio=0.05,
            min_coverage=0.5, unknown_holder=np.ones((1, 2), dtype=bool),
        )  # fmt: skip
