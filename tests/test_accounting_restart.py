"""Accounting across collector restarts: a recomputed period never replaces one that knew more.

A ``kill -9``-like restart here is a new ``CollectorService`` on the same database with an
empty window. The agent then resends what it had in flight (the last 90 s, as its spool
replays a request whose answer it never got) and goes on pushing; the service's accounting
runs every minute as the background loop would. Issue 16 measured, without the rule, busy
hours falling and unknown hours growing at every restart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.collector.accounting.recompute import known_seconds, not_less_informed
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import AccountingRow
from gpuwarden.collector.store.types import AttrValue

T0 = 1_767_225_600.0  # aligned to the minute
STEP = 10
GPUS = 2
RESENT_SECONDS = 90  # the agent's in-flight request, resent after the restart
RUN_MINUTES = 12  # each life of the collector


class Clock:
    """The fake wall clock every service shares (the test moves it)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def points(t: float) -> list[NumberPoint]:
    """One agent round at ``t``: each GPU busy (util 0.9), described, drawing 500 W."""
    resource: dict[str, AttrValue] = {"host.name": "n1"}
    ns = int(t * 1e9)
    out = []
    for gpu in range(GPUS):
        attrs: dict[str, AttrValue] = {"hw.id": f"GPU-{gpu}"}
        out += [
            NumberPoint(resource, "hw.gpu.utilization", "1", "gauge", False, attrs, ns, 0.9),
            NumberPoint(
                resource,
                "gpuwarden.gpu.info",
                "1",
                "gauge",
                False,
                {**attrs, "hw.model": "H100", "gpuwarden.gpu.index": gpu},
                ns,
                1.0,
            ),
            NumberPoint(
                resource,
                "hw.energy",
                "J",
                "sum",
                True,
                {**attrs, "hw.type": "gpu"},
                ns,
                500.0 * (t - T0),
            ),
        ]
    return out


def start(db: Path, clock: Clock) -> CollectorService:
    """A collector process: the same database, an empty window."""
    return build_service(CollectorConfig(database=db, recent_hours=6), clock=clock)


def live(service: CollectorService, clock: Clock, since: float, until: float) -> None:
    """The agent pushes every 10 s over ``[since, until)``; accounting runs every minute."""
    t = since
    while t < until:
        clock.now = t
        assert service.accept(points(t), "agent") == 0
        if (t - T0) % 60 == 0:
            service.run_accounting()
        t += STEP
    clock.now = until
    service.run_accounting()


def by_scope(rows: list[AccountingRow]) -> dict[tuple[float, str], tuple[float, float, float]]:
    """(period, GPU) → (busy, idle, unknown) seconds, summed over its rows."""
    out: dict[tuple[float, str], tuple[float, float, float]] = {}
    for row in rows:
        key = (row.period_start, row.gpu_uuid)
        busy, idle, unknown = out.get(key, (0.0, 0.0, 0.0))
        out[key] = (
            busy + row.gpu_seconds_busy,
            idle + row.gpu_seconds_idle,
            unknown + row.gpu_seconds_unknown,
        )
    return out


@pytest.fixture
def job() -> Job:
    return Job(
        key="slurm:c:1",
        scheduler="slurm",
        job_id="1",
        state=JobState.RUNNING,
        team="ml",
        gpus=GPUS,
        start_time=T0 - 3600,
        allocations=(GpuAllocation("n1", tuple(range(GPUS))),),
    )


def test_five_kill_restarts_lose_no_busy_hour_and_add_no_unknown_one(tmp_path, job):
    db, clock = tmp_path / "c.db", Clock(T0)
    service = start(db, clock)
    service.registry.put([job])
    live(service, clock, T0, T0 + RUN_MINUTES * 60)
    end = T0 + RUN_MINUTES * 60
    before = by_scope(service.storage.accounting_rows(since=T0, until=end))
    service.storage.close()  # kill -9: no snapshot, no goodbye; the database is all that stays
    assert before, "the first life wrote no rows"
    assert all(unknown == 0 for _, _, unknown in before.values())
    totals = []
    for _ in range(5):
        service = start(db, clock)
        # the agent resends its in-flight request, then pushes on
        live(service, clock, end - RESENT_SECONDS, end + RUN_MINUTES * 60)
        end += RUN_MINUTES * 60
        after = by_scope(service.storage.accounting_rows(since=T0, until=end))
        for scope, (busy, idle, unknown) in before.items():
            assert after[scope][0] >= busy, scope
            assert after[scope][0] + after[scope][1] >= busy + idle, scope
            assert after[scope][2] <= unknown, scope
        totals.append(
            service.storage.rollups(since=T0, until=T0 + RUN_MINUTES * 60, by=("job_key",))
        )
        before = after
        service.storage.close()
    assert all(t == totals[0] for t in totals)
    busy_hours = sum(t.gpu_seconds_busy for t in totals[0]) / 3600
    # the first life's twelve periods: every GPU busy all the time
    assert busy_hours == pytest.approx(GPUS * RUN_MINUTES / 60)


def row(period: float, gpu: str, busy: float, idle: float, unknown: float) -> AccountingRow:
    return AccountingRow(
        period_start=period,
        period_seconds=60,
        job_key=None,
        team=None,
        model=None,
        node="n1",
        gpu_uuid=gpu,
        price_tier="on-demand",
        gpu_seconds_allocated=busy + idle,
        gpu_seconds_busy=busy,
        gpu_seconds_idle=idle,
        gpu_seconds_unknown=unknown,
        energy_joules=None,
        cost=0.0,
        currency="USD",
        carbon_grams=None,
    )


@pytest.mark.parametrize(
    ("stored", "recomputed", "kept"),
    [
        ((60, 0, 0), (30, 0, 30), False),  # less known: the stored row stays
        ((30, 0, 30), (60, 0, 0), True),  # more known (late samples): replaced
        ((60, 0, 0), (0, 60, 0), True),  # as much known, judged otherwise: replaced
        (None, (10, 0, 50), True),  # nothing stored: written
    ],
)
def test_a_scope_is_replaced_only_by_one_that_knows_as_much(stored, recomputed, kept):
    old = [] if stored is None else [row(T0, "GPU-0", *stored)]
    new = [row(T0, "GPU-0", *recomputed), row(T0, "GPU-1", 60, 0, 0)]
    chosen = not_less_informed(new, old)
    assert (new[0] in chosen) is kept
    assert new[1] in chosen  # another GPU's period is judged on its own
    assert known_seconds(chosen).get((T0, "GPU-1")) == 60
