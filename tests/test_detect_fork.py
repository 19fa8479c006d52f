"""Detection cycles in a forked child: same incidents, caches sent back, stopped on demand."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gpuwarden.collector.detect.catalog import DETECTORS, load_rules
from gpuwarden.collector.detect.contract import DetectionContext, Detector
from gpuwarden.collector.detect.engine import CycleResult, DetectionEngine
from gpuwarden.collector.detect.findings import Finding, Verdict, new_finding
from gpuwarden.collector.detect.fork import Packed
from gpuwarden.collector.detect.incidents import MAX_PLOT_POINTS, incident_evidence, plot_points
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import Rule, RuleSet
from gpuwarden.collector.storage.records import IncidentState
from gpuwarden.collector.web.keys import SERVICE
from gpuwarden.collector.web.tasks import background
from tests.test_accounting_scenario import T0, service  # noqa: F401 - the fixture

NOW = T0 + 4200


def default_rules() -> RuleSet:
    return load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())


def test_a_forked_cycle_opens_what_a_cycle_in_process_opens(service):  # noqa: F811
    engine = DetectionEngine(
        service.detection_view, default_rules(), storage=service.storage, fork=True
    )
    result = engine.run_cycle(now=NOW)
    assert result.failed_rules == ()
    assert not result.stopped
    assert result.cpu_seconds > 0  # the child's, from its resource usage
    assert set(result.rule_seconds) >= {r.id for r in engine.rules}
    found = sorted(
        (i.rule_id, str(i.evidence["gpu"]))
        for i in service.storage.incidents(state=IncidentState.OPEN)
    )
    assert found == [("idle-gpu", "GPU-a-2"), ("idle-gpu", "GPU-b-5")]
    assert engine.run_cycle(now=NOW).opened == 0  # folded in this process, deduplicated
    assert len(service.storage.incidents()) == 2


class Visits:
    """A detector's cache: how many cycles ran with it."""

    def __init__(self) -> None:
        self.count = 0


def probe(log: Path) -> Any:
    """A run function that counts its cycles in its cache and logs its pid and count."""

    def run(ctx: DetectionContext, rule: Rule, params: Any, now: float) -> list[Finding]:
        visits = ctx.cache(Visits)
        visits.count += 1
        with log.open("a") as out:
            out.write(f"{os.getpid()} {visits.count}\n")
        return [new_finding(rule, subject="probe", verdict=Verdict.FIRING, window=(now - 60, now))]

    return run


def engine_with(run: Any, service, **options: Any) -> DetectionEngine:  # noqa: F811
    """An engine whose only runnable rule (node-silent) runs ``run``."""
    detector: Detector[Any] = dataclasses.replace(DETECTORS["node_silent"], run=run)
    return DetectionEngine(
        service.detection_view,
        default_rules(),
        storage=service.storage,
        detectors={"node_silent": detector},
        fork=True,
        **options,
    )


def test_each_cycle_runs_in_a_new_child_and_its_caches_come_back(service, tmp_path):  # noqa: F811
    log = tmp_path / "probe.log"
    engine = engine_with(probe(log), service)
    first = engine.run_cycle(now=NOW)
    second = engine.run_cycle(now=NOW + 60)
    assert (first.firing, second.firing) == (1, 1)
    assert first.opened == 1
    lines = [line.split() for line in log.read_text().splitlines()]
    pids = [int(pid) for pid, _ in lines]
    assert os.getpid() not in pids
    assert len(set(pids)) == 2  # a fork per cycle
    assert [int(count) for _, count in lines] == [1, 2]  # the first child's cache came back
    # kept pickled here until something here uses it: no objects of it in the parent's heap
    forked = engine._forked
    assert forked is not None
    (packed,) = forked.caches().values()
    assert isinstance(packed, Packed)
    assert not any(isinstance(o, Visits) for o in gc.get_objects())
    assert forked.cache(Visits).count == 2  # unpickled on first use here
    third = engine.run_cycle(now=NOW + 120)  # a cache the parent unpickled goes on as well
    assert third.firing == 1
    assert log.read_text().splitlines()[-1].split()[1] == "3"


def test_the_services_view_reads_and_writes_the_forked_cycles_caches(service, tmp_path):  # noqa: F811
    # what the service read at start (level-shift's fits, read_fits) reaches the children,
    # and what the children made is what the service's view (write_fits, every snapshot) sees
    service.detection_view.cache(Visits).count = 10
    log = tmp_path / "probe.log"
    engine = engine_with(probe(log), service)
    engine.run_cycle(now=NOW)
    engine.run_cycle(now=NOW + 60)
    assert [line.split()[1] for line in log.read_text().splitlines()] == ["11", "12"]
    assert service.detection_view.cache(Visits).count == 12


def blocking(started_fd: int, never_fd: int) -> Any:
    """A run function that says it started, then waits for a byte that never comes."""

    def run(ctx: DetectionContext, rule: Rule, params: Any, now: float) -> list[Finding]:
        os.write(started_fd, b"1")
        os.read(never_fd, 1)
        return []

    return run


def test_stop_kills_a_running_cycle_and_every_later_one(service):  # noqa: F811
    started_r, started_w = os.pipe()
    never_r, never_w = os.pipe()
    engine = engine_with(blocking(started_w, never_r), service)
    results: list[CycleResult] = []
    cycle = threading.Thread(target=lambda: results.append(engine.run_cycle(now=NOW)))
    cycle.start()
    try:
        assert os.read(started_r, 1) == b"1"  # the child is inside the rule
        engine.stop()
        cycle.join(timeout=60)
        assert not cycle.is_alive()
        assert results[0].stopped
        assert engine.run_cycle(now=NOW).stopped  # no new child once stopped
        assert service.storage.incidents() == []
    finally:
        for fd in (started_r, started_w, never_r, never_w):
            os.close(fd)


def test_a_child_past_its_timeout_is_killed_and_the_cycle_fails(service):  # noqa: F811
    started_r, started_w = os.pipe()
    never_r, never_w = os.pipe()
    engine = engine_with(blocking(started_w, never_r), service, fork_timeout_seconds=0.5)
    try:
        with pytest.raises(RuntimeError, match="ran past"):
            engine.run_cycle(now=NOW)
        assert os.read(started_r, 1) == b"1"
    finally:
        for fd in (started_r, started_w, never_r, never_w):
            os.close(fd)


async def test_stopping_the_app_kills_the_cycle_its_child_runs(service, caplog):  # noqa: F811
    started_r, started_w = os.pipe()
    never_r, never_w = os.pipe()
    engine = engine_with(blocking(started_w, never_r), service)
    app = web.Application()
    app[SERVICE] = service
    hour = 3600.0
    app.cleanup_ctx.append(
        background(
            job_poll_seconds=hour,
            accounting_seconds=hour,
            evict_seconds=hour,
            detection=engine,
            detection_seconds=hour,
        )
    )
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, os.read, started_r, 1) == b"1"
    finally:
        await runner.cleanup()  # without the kill, it would wait STOP_TIMEOUT_SECONDS for it
        for fd in (started_r, started_w, never_r, never_w):
            os.close(fd)
    assert "still running" not in caplog.text
    assert "detection failed" not in caplog.text


@pytest.mark.parametrize("n", [0, 5, 120, 121, 1000, 8640])
def test_points_thinned_in_the_child_give_the_incident_the_same_evidence(n):
    rule = default_rules().rules[0]
    points = tuple((float(t), float(t % 7)) for t in range(n))
    finding = new_finding(
        rule, subject="s", verdict=Verdict.FIRING, window=(0.0, 1.0), points=points
    )
    thinned = dataclasses.replace(finding, points=plot_points(points))
    assert len(thinned.points) == min(n, MAX_PLOT_POINTS)
    assert incident_evidence(thinned) == incident_evidence(finding)
