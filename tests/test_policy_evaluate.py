"""The policies' ruling on one action, pure: each kind forbidding what it forbids and allowing
what it permits, quiet-hour windows across midnight and DST, and the standing breaches."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Mapping

import pytest

from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.policy.breaches import standing_breaches
from gpuwarden.collector.policy.evaluate import (
    ActionFacts,
    Outcome,
    World,
    evaluate,
    period_start,
)
from gpuwarden.collector.policy.limits import Usage
from gpuwarden.collector.policy.model import (
    ApprovalPolicy,
    CapPeriod,
    CostCapPolicy,
    IdleReclaimPolicy,
    LimitPolicy,
    OnBreach,
    Policy,
    PolicySelector,
    QuietEffect,
    QuietHoursPolicy,
)
from gpuwarden.collector.policy.quiet import window_end

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def at(text: str, zone: dt.tzinfo = BERLIN) -> float:
    """Unix seconds of a local wall-clock time, e.g. ``2026-11-27 23:30`` (a Friday)."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


NOON = at("2026-11-25 12:00")  # a Wednesday
ML = PolicySelector(teams=("ml-*",))


def spend_of(table: Mapping[str, float]):
    def spend(period: CapPeriod, now: float) -> Mapping[str, float]:
        del period, now
        return table

    return spend


CASES: list[tuple[str, Policy, ActionFacts, World, Outcome]] = [
    # limit: GPUs an action adds, against the team's and model's holdings
    (
        "limit refuses a scale-up over the model's limit",
        LimitPolicy(
            name="llama", selector=PolicySelector(models=("llama-*",)), max_gpus_per_model=48
        ),
        ActionFacts(kind="scale_up", model="llama-70b", gpus_added=8),
        World(NOON, Usage({}, {"llama-70b": 41})),
        Outcome.REFUSE,
    ),
    (
        "limit allows a scale-up up to the limit",
        LimitPolicy(
            name="llama", selector=PolicySelector(models=("llama-*",)), max_gpus_per_model=48
        ),
        ActionFacts(kind="scale_up", model="llama-70b", gpus_added=8),
        World(NOON, Usage({}, {"llama-70b": 40})),
        Outcome.ALLOW,
    ),
    (
        "a human approval does not lift a limit",
        LimitPolicy(name="ml", selector=ML, max_gpus_per_team=16),
        ActionFacts(kind="scale_up", team="ml-a", gpus_added=8, human_approved=True),
        World(NOON, Usage({"ml-a": 9})),
        Outcome.REFUSE,
    ),
    # approval: spot -> on-demand fallback, and costly scale-ups
    (
        "approval holds the on-demand fallback",
        ApprovalPolicy(name="fallback", actions=("requeue",), price_tiers=("on-demand",)),
        ActionFacts(kind="requeue", job="slurm:c:1", price_tier="on-demand"),
        World(NOON),
        Outcome.REQUIRE_APPROVAL,
    ),
    (
        "approval lets a same-tier requeue run",
        ApprovalPolicy(name="fallback", actions=("requeue",), price_tiers=("on-demand",)),
        ActionFacts(kind="requeue", job="slurm:c:1"),
        World(NOON),
        Outcome.ALLOW,
    ),
    (
        "approval given: the fallback runs",
        ApprovalPolicy(name="fallback", actions=("requeue",), price_tiers=("on-demand",)),
        ActionFacts(kind="requeue", price_tier="on-demand", human_approved=True),
        World(NOON),
        Outcome.ALLOW,
    ),
    (
        "approval holds a scale-up of unknown cost",
        ApprovalPolicy(name="costly", actions=("scale_up",), min_cost_per_hour_dollars=50),
        ActionFacts(kind="scale_up"),
        World(NOON),
        Outcome.REQUIRE_APPROVAL,
    ),
    (
        "approval lets a cheap scale-up run",
        ApprovalPolicy(name="costly", actions=("scale_up",), min_cost_per_hour_dollars=50),
        ActionFacts(kind="scale_up", cost_per_hour_dollars=20.0),
        World(NOON),
        Outcome.ALLOW,
    ),
    # cost caps
    (
        "a cap at its limit blocks scale-ups",
        CostCapPolicy(name="cap", selector=ML, cap_dollars=200, on_breach=OnBreach.BLOCK_SCALE_UP),
        ActionFacts(kind="scale_up", team="ml-a"),
        World(NOON, spend=spend_of({"ml-a": 200.0})),
        Outcome.REFUSE,
    ),
    (
        "a cap under its limit lets scale-ups run",
        CostCapPolicy(name="cap", selector=ML, cap_dollars=200, on_breach=OnBreach.BLOCK_SCALE_UP),
        ActionFacts(kind="scale_up", team="ml-a"),
        World(NOON, spend=spend_of({"ml-a": 199.0})),
        Outcome.ALLOW,
    ),
    (
        "a blocking cap does not block a drain",
        CostCapPolicy(name="cap", selector=ML, cap_dollars=200, on_breach=OnBreach.BLOCK_SCALE_UP),
        ActionFacts(kind="drain", team="ml-a"),
        World(NOON, spend=spend_of({"ml-a": 500.0})),
        Outcome.ALLOW,
    ),
    (
        "a cap asks approval for requeues",
        CostCapPolicy(name="cap", cap_dollars=200, on_breach=OnBreach.REQUIRE_APPROVAL),
        ActionFacts(kind="requeue", team="ml-a"),
        World(NOON, spend=spend_of({"ml-a": 900.0})),
        Outcome.REQUIRE_APPROVAL,
    ),
    (
        "a cap of unknown spend says nothing",
        CostCapPolicy(name="cap", cap_dollars=200, on_breach=OnBreach.REQUIRE_APPROVAL),
        ActionFacts(kind="requeue", team="ml-b"),
        World(NOON, spend=spend_of({"ml-a": 900.0})),
        Outcome.ALLOW,
    ),
    # idle reclaim
    (
        "idle reclaim refuses before the team's timer",
        IdleReclaimPolicy(
            name="nb", selector=PolicySelector(job_kinds=("notebook",)), idle_seconds=1800
        ),
        ActionFacts(kind="requeue", job="k8s:nb", job_kind="notebook", idle_seconds=1200),
        World(NOON),
        Outcome.REFUSE,
    ),
    (
        "idle reclaim allows from the timer on",
        IdleReclaimPolicy(
            name="nb", selector=PolicySelector(job_kinds=("notebook",)), idle_seconds=1800
        ),
        ActionFacts(kind="requeue", job="k8s:nb", job_kind="notebook", idle_seconds=1800),
        World(NOON),
        Outcome.ALLOW,
    ),
    (
        "idle reclaim leaves other job kinds alone",
        IdleReclaimPolicy(
            name="nb", selector=PolicySelector(job_kinds=("notebook",)), idle_seconds=1800
        ),
        ActionFacts(kind="requeue", job="slurm:c:1", job_kind="training", idle_seconds=60),
        World(NOON),
        Outcome.ALLOW,
    ),
    # quiet hours
    (
        "quiet hours defer inside the window",
        QuietHoursPolicy(
            name="night",
            timezone="Europe/Berlin",
            days=(0, 1, 2, 3, 4),
            start_minute=22 * 60,
            end_minute=7 * 60,
        ),
        ActionFacts(kind="requeue"),
        World(at("2026-11-25 23:30")),
        Outcome.DEFER,
    ),
    (
        "quiet hours refuse inside the window",
        QuietHoursPolicy(
            name="night",
            timezone="Europe/Berlin",
            days=(2,),
            start_minute=22 * 60,
            end_minute=7 * 60,
            effect=QuietEffect.REFUSE,
        ),
        ActionFacts(kind="requeue"),
        World(at("2026-11-26 06:59")),  # Thursday morning: Wednesday's window
        Outcome.REFUSE,
    ),
    (
        "quiet hours allow outside the window",
        QuietHoursPolicy(
            name="night",
            timezone="Europe/Berlin",
            days=(0, 1, 2, 3, 4),
            start_minute=22 * 60,
            end_minute=7 * 60,
        ),
        ActionFacts(kind="requeue"),
        World(NOON),
        Outcome.ALLOW,
    ),
    (
        "quiet hours spare actions they do not name",
        QuietHoursPolicy(
            name="night",
            timezone="Europe/Berlin",
            days=(2,),
            start_minute=22 * 60,
            end_minute=7 * 60,
            actions=("drain",),
        ),
        ActionFacts(kind="requeue"),
        World(at("2026-11-25 23:30")),
        Outcome.ALLOW,
    ),
    (
        "an approved action runs in quiet hours",
        QuietHoursPolicy(
            name="night",
            timezone="Europe/Berlin",
            days=(2,),
            start_minute=22 * 60,
            end_minute=7 * 60,
        ),
        ActionFacts(kind="requeue", human_approved=True),
        World(at("2026-11-25 23:30")),
        Outcome.ALLOW,
    ),
]


@pytest.mark.parametrize(
    ("policy", "facts", "world", "outcome"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_each_kind_forbids_what_it_forbids_and_permits_the_rest(
    policy: Policy, facts: ActionFacts, world: World, outcome: Outcome
) -> None:
    ruling = evaluate([policy], facts, world)
    assert ruling.outcome is outcome
    if outcome is Outcome.ALLOW:
        assert ruling.policy is None
    else:
        assert ruling.policy == policy.name
        assert policy.name in ruling.reason


def test_every_policy_kind_is_in_the_table() -> None:
    assert {type(case[1]) for case in CASES} == {
        LimitPolicy,
        ApprovalPolicy,
        CostCapPolicy,
        IdleReclaimPolicy,
        QuietHoursPolicy,
    }


def test_the_strongest_ruling_wins_and_every_breach_rides_along() -> None:
    policies: list[Policy] = [
        ApprovalPolicy(name="ask", actions=("scale_up",)),
        CostCapPolicy(name="cap", cap_dollars=10, on_breach=OnBreach.NOTIFY),
        LimitPolicy(name="team", max_gpus_per_team=4),
    ]
    facts = ActionFacts(kind="scale_up", team="ml-a", gpus_added=8)
    ruling = evaluate(policies, facts, World(NOON, spend=spend_of({"ml-a": 11.0})))
    assert (ruling.outcome, ruling.policy) == (Outcome.REFUSE, "team")
    assert [(b.policy, b.subject) for b in ruling.breaches] == [("team", "ml-a"), ("cap", "ml-a")]
    assert ruling.breaches[1].reason == (
        "team ml-a spent $11.00 this month, at or over the $10.00 cap of policy cap"
    )


def test_a_deferral_lasts_until_the_window_ends() -> None:
    night = QuietHoursPolicy(
        name="night", timezone="Europe/Berlin", days=(4,), start_minute=22 * 60, end_minute=6 * 60
    )
    ruling = evaluate([night], ActionFacts(kind="requeue"), World(at("2026-11-27 23:00")))
    assert ruling.until == at("2026-11-28 06:00")
    assert ruling.reason == "requeue deferred: quiet hours of policy night, for 7h"


@pytest.mark.parametrize(
    ("start", "end", "local", "until"),
    [
        (22 * 60, 6 * 60, "2026-11-27 21:59", None),  # Friday, before the window
        (22 * 60, 6 * 60, "2026-11-27 22:00", "2026-11-28 06:00"),
        (22 * 60, 6 * 60, "2026-11-28 05:59", "2026-11-28 06:00"),  # Saturday: Friday's window
        (22 * 60, 6 * 60, "2026-11-28 22:30", None),  # Saturday's own night: not a day of it
        (9 * 60, 17 * 60, "2026-11-27 12:00", "2026-11-27 17:00"),
        (9 * 60, 17 * 60, "2026-11-27 17:00", None),  # the end is outside
        (0, 24 * 60, "2026-11-27 23:59", "2026-11-28 00:00"),  # the whole Friday
        # DST ends on Sunday 2026-10-25 in Berlin: the window's end is wall-clock 06:00
        (22 * 60, 6 * 60, "2026-10-25 05:00", "2026-10-25 06:00"),
    ],
)
def test_quiet_windows(start: int, end: int, local: str, until: str | None) -> None:
    days = (4, 5, 6) if local.startswith("2026-10-25") else (4,)  # Friday (and the weekend)
    policy = QuietHoursPolicy(
        name="q", timezone="Europe/Berlin", days=days, start_minute=start, end_minute=end
    )
    assert window_end(policy, at(local)) == (at(until) if until else None)


def test_periods_start_at_utc_midnight_and_the_first_of_the_month() -> None:
    now = at("2026-11-25 12:34", dt.UTC)
    assert period_start(CapPeriod.DAY, now) == at("2026-11-25 00:00", dt.UTC)
    assert period_start(CapPeriod.MONTH, now) == at("2026-11-01 00:00", dt.UTC)


def job(key: str, team: str, gpus: int, *, model: str | None = None, running: bool = True) -> Job:
    state = JobState.RUNNING if running else JobState.COMPLETED
    return Job(
        key=key, scheduler="slurm", job_id=key, state=state, team=team, gpus=gpus, model=model
    )


def test_standing_breaches_count_running_jobs_and_spend() -> None:
    policies: list[Policy] = [
        LimitPolicy(name="per-job", max_gpus_per_job=8),
        LimitPolicy(name="ml", selector=ML, max_gpus_per_team=12),
        LimitPolicy(name="llama", max_gpus_per_model=4),
        CostCapPolicy(name="daily", selector=ML, period=CapPeriod.DAY, cap_dollars=100),
    ]
    jobs = [
        job("a", "ml-a", 8, model="llama-8b"),
        job("b", "ml-a", 6),
        job("c", "vision", 16),
        job("d", "ml-b", 32, running=False),  # finished: holds nothing
    ]
    spent = {CapPeriod.DAY: {"ml-a": 50.0, "ml-b": 100.0, "vision": 1e6}}

    def spend(period: CapPeriod, now: float) -> Mapping[str, float]:
        assert now == NOON
        return spent.get(period, {})

    found = standing_breaches(policies, jobs, spend, NOON)
    assert [(b.policy, b.subject) for b in found] == [
        ("per-job", "c"),
        ("ml", "ml-a"),
        ("llama", "llama-8b"),
        ("daily", "ml-b"),
    ]
    assert (
        found[1].reason
        == "team ml-a holds 14 GPUs; policy ml allows at most 12 (max_gpus_per_team)"
    )
