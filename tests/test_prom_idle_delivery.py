"""Issue 17, the vmagent flake: an idle pod's GPUs fire ``idle_gpu`` whatever the phase of the
sender's delivery against the detection cycle.

vmagent scrapes on exact 1,000 ms ticks and delivers each scrape a constant ~0.3 s later; the
detection loop runs on a fixed phase too. When the newest slot's scrape arrives just after each
cycle's ``now``, that slot had no sample and no pod seen, and a pod known only from
dcgm-exporter's labels counted as "not holding" its GPUs there: every cycle was CLEAR and the
end-to-end test saw no incident (about one run in six). The scrapes here go through the wire
format, ``prom_write.screen`` (stale markers apart, as the receiver does), ``prom_map.translate``
and a real ``CollectorService``; the detection runs at a chosen ``now``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.ingest.otlp_limits import IngestLimits
from gpuwarden.collector.ingest.prom_map import translate
from gpuwarden.collector.ingest.prom_write import STALE_NAN_BITS, screen
from gpuwarden.collector.remote_write.wire import Series, decode, encode
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.service import CollectorService
from tests.dcgm_exposition import DcgmFleet, Pod
from tests.detectors import make_rule, run_rule
from tests.test_prom_map_service import scrape_series

T0 = 1_767_225_600.0
OFFSET = 0.9  # vmagent's scrapes: exactly 1,000 ms apart, late in each second
WINDOW = 60
NOTEBOOK = Pod("notebook-7", "research")
KEY = "k8s:research/notebook-7"


STALE_NAN = float(struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0])
"""Prometheus' stale marker."""


def fleet() -> DcgmFleet:
    out = DcgmFleet(("node-a",), 4)
    for index in (0, 1):
        out.assign("node-a", index, Pod("trainer-0", "ml"))
        out.set("node-a", index, {"DCGM_FI_DEV_GPU_UTIL": 93.0})
    for index in (2, 3):
        out.assign("node-a", index, NOTEBOOK)  # idle
    return out


def service(tmp_path: Path, now: float) -> CollectorService:
    config = CollectorConfig(database=tmp_path / "c.db", recent_hours=1, step_seconds=1)
    return build_service(config, clock=lambda: now)


def deliver(svc: CollectorService, series: Iterable[Series]) -> None:
    """One remote-write request as the receiver stores it: values, then stale markers."""
    screened = screen(decode(encode(list(series))), IngestLimits())
    assert svc.accept(translate(screened.series).points, "vmagent") == 0
    if screened.stale:
        svc.end_series(translate(screened.stale).points)


def scrape(the_fleet: DcgmFleet, k: int) -> list[Series]:
    return scrape_series(the_fleet, T0 + k + OFFSET)


def notebook(findings: list[Finding]) -> Finding:
    return next(f for f in findings if f.subject == KEY)


def idle_rule() -> Rule:
    return make_rule("idle_gpu", "idle-gpu", window_seconds=float(WINDOW))


def test_the_newest_scrape_not_delivered_yet_still_fires(tmp_path: Path) -> None:
    """Scrapes at T0 + k + 0.9 for k < 69; the cycle runs at T0 + 70.2, before the scrape of
    slot 69 (taken at T0 + 69.9) has arrived: 59 of the window's 60 slots have data."""
    now = T0 + 70.2
    svc = service(tmp_path, now)
    the_fleet = fleet()
    for k in range(69):
        deliver(svc, scrape(the_fleet, k))
    found = notebook(run_rule(svc, idle_rule(), now))
    assert found.verdict is Verdict.FIRING
    assert found.evidence["idle_gpus"] == 2
    assert found.evidence["coverage_ratio"] == 59 / 60


def test_a_failed_scrape_mid_window_does_not_clear_the_idle_pod(tmp_path: Path) -> None:
    """vmagent writes stale markers for a target whose scrape failed, then the next scrape
    brings the series back: one slot without data is not the pod letting its GPUs go."""
    now = T0 + 71.2
    svc = service(tmp_path, now)
    the_fleet = fleet()
    for k in range(71):
        if k == 40:
            deliver(svc, [s._replace(values=(STALE_NAN,)) for s in scrape(the_fleet, k)])
        else:
            deliver(svc, scrape(the_fleet, k))
    found = notebook(run_rule(svc, idle_rule(), now))
    assert found.verdict is Verdict.FIRING
    assert found.evidence["coverage_ratio"] == 59 / 60


def test_a_pod_that_left_its_gpus_is_not_idle(tmp_path: Path) -> None:
    """The exporter keeps reporting the GPUs but no longer names the pod: known, not held."""
    now = T0 + 70.2
    svc = service(tmp_path, now)
    the_fleet = fleet()
    for k in range(70):
        if k == 60:
            for index in (2, 3):
                the_fleet.assign("node-a", index)
        deliver(svc, scrape(the_fleet, k))
    assert notebook(run_rule(svc, idle_rule(), now)).verdict is Verdict.CLEAR


def test_an_exporter_gone_for_a_fifth_of_the_window_is_unknown(tmp_path: Path) -> None:
    """Silence is never idleness: 13 of 60 slots without data is below 80 % coverage."""
    now = T0 + 70.2
    svc = service(tmp_path, now)
    the_fleet = fleet()
    for k in range(70):
        if not 40 <= k < 53:
            deliver(svc, scrape(the_fleet, k))
    assert notebook(run_rule(svc, idle_rule(), now)).verdict is Verdict.UNKNOWN
