"""Policies asked about one action: allow, refuse, wait for approval, or defer. Pure.

The remediation path (``remediate.decide``) asks :func:`evaluate` before an action runs (or is
dry-run); ``policies test`` asks it about a backtest's actions. What a policy says:

- ``limit``: an action that adds GPUs (``ActionFacts.gpus_added``) beyond a limit is refused;
- ``cost_cap``: once a team's spend this day or month reaches the cap, the breach is reported
  (an incident) and, by ``on_breach``, a ``scale_up`` is refused (``block_scale_up``) or a
  ``scale_up``/``requeue`` waits for approval (``require_approval``);
- ``approval``: a matching action waits for a human approval;
- ``idle_reclaim``: the reclaim action on a selected job idle for less than the policy's timer is
  refused; from the timer on it is allowed;
- ``quiet_hours``: an automated action inside the window is deferred to its end, or refused.

A human approval lifts ``approval``, ``require_approval``, ``idle_reclaim`` and ``quiet_hours``
(they govern what happens unasked); it does not lift a ``limit`` or a ``block_scale_up`` cap.
The strongest answer wins: refuse, then defer, then approval; within one, the first policy in
file order names the ruling.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuwarden.collector.policy.limits import LimitRequest, Usage, check_limits
from gpuwarden.collector.policy.model import (
    ApprovalPolicy,
    CapPeriod,
    CostCapPolicy,
    IdleReclaimPolicy,
    OnBreach,
    Policy,
    PolicyKind,
    QuietEffect,
    QuietHoursPolicy,
)
from gpuwarden.collector.policy.quiet import window_end
from gpuwarden.collector.rules.durations import format_duration

SPENDING_ACTIONS = frozenset({"scale_up", "requeue"})
"""Actions that start spending again: a cost cap's ``require_approval`` holds these."""
SCALE_UP_ACTIONS = frozenset({"scale_up"})
"""Actions that add GPUs: a cost cap's ``block_scale_up`` refuses these."""


class Outcome(enum.StrEnum):
    """The policies' answer about one action, strongest last."""

    ALLOW = "allow"
    REQUIRE_APPROVAL = "require_approval"
    DEFER = "defer"
    REFUSE = "refuse"


_STRENGTH = {o: i for i, o in enumerate(Outcome)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionFacts:
    """One action as the policies see it; unknown facts are ``None``."""

    kind: str
    target: str | None = None
    team: str | None = None
    job: str | None = None
    job_kind: str | None = None
    model: str | None = None
    cluster: str | None = None
    human_approved: bool = False
    """A person approved this very action (not merely an ``auto`` mode)."""
    price_tier: str | None = None
    """The tier the action would run at (``requeue``'s ``price_tier`` parameter)."""
    gpus_added: int = 0
    cost_per_hour_dollars: float | None = None
    idle_seconds: float | None = None


Spend = Callable[[CapPeriod, float], Mapping[str, float]]
"""``(period, now) -> {team: dollars}`` spent so far this UTC day or month (a team absent:
unknown, never taken for zero)."""


def _no_spend(period: CapPeriod, now: float) -> Mapping[str, float]:
    del period, now
    return {}


def period_start(period: CapPeriod, now: float) -> float:
    """Unix seconds at which the UTC day or month holding ``now`` began."""
    day = dt.datetime.fromtimestamp(now, dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return (day if period is CapPeriod.DAY else day.replace(day=1)).timestamp()


@dataclass(frozen=True, slots=True)
class World:
    """What the policies read besides the action: the time, GPUs held, spend so far."""

    now: float
    usage: Usage = field(default_factory=Usage)
    spend: Spend = _no_spend


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyBreach:
    """A ``limit`` or ``cost_cap`` found breached; it opens a ``policy-breach`` incident."""

    policy: str
    kind: PolicyKind
    subject: str
    """Whom it is about: the team (cost cap, team limit), model or job."""
    reason: str
    team: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Ruling:
    """The answer: the outcome, the policy that gave it (``None``: allowed by all) and why."""

    outcome: Outcome
    policy: str | None = None
    reason: str = "no policy objects"
    until: float | None = None
    """For ``DEFER``: when to decide again (the quiet window's end)."""
    breaches: tuple[PolicyBreach, ...] = ()


def _matches(policy: Policy, facts: ActionFacts) -> bool:
    return policy.selector.matches(
        team=facts.team,
        job=facts.job,
        job_kind=facts.job_kind,
        model=facts.model,
        cluster=facts.cluster,
    )


def _limits(policies: tuple[Policy, ...], facts: ActionFacts, world: World) -> list[Ruling]:
    if facts.gpus_added <= 0:
        return []
    request = LimitRequest(
        gpus=facts.gpus_added,
        team=facts.team,
        job=facts.job,
        job_kind=facts.job_kind,
        model=facts.model,
        cluster=facts.cluster,
    )
    rulings = []
    for breach in check_limits(policies, request, world.usage):
        subject = {
            "max_gpus_per_team": facts.team,
            "max_gpus_per_model": facts.model,
        }.get(breach.key, facts.job or facts.target)
        found = PolicyBreach(
            policy=breach.policy,
            kind=PolicyKind.LIMIT,
            subject=subject or "?",
            reason=breach.reason,
            team=facts.team,
        )
        reason = f"{facts.kind} refused: {breach.reason}"
        rulings.append(
            Ruling(outcome=Outcome.REFUSE, policy=breach.policy, reason=reason, breaches=(found,))
        )
    return rulings


def _cost_cap(policy: CostCapPolicy, facts: ActionFacts, world: World) -> Ruling | None:
    if facts.team is None:
        return None
    breach = cap_breach(policy, facts.team, world.spend(policy.period, world.now).get(facts.team))
    if breach is None:
        return None
    said = breach.reason
    outcome = Outcome.ALLOW
    if policy.on_breach is OnBreach.BLOCK_SCALE_UP and facts.kind in SCALE_UP_ACTIONS:
        outcome = Outcome.REFUSE
    elif (
        policy.on_breach is OnBreach.REQUIRE_APPROVAL
        and facts.kind in SPENDING_ACTIONS
        and not facts.human_approved
    ):
        outcome = Outcome.REQUIRE_APPROVAL
    return Ruling(
        outcome=outcome, policy=policy.name, reason=f"{facts.kind}: {said}", breaches=(breach,)
    )


def cap_breach(policy: CostCapPolicy, team: str, spent: float | None) -> PolicyBreach | None:
    """The breach when ``team`` spent ``spent`` dollars this period, at or over the cap."""
    if spent is None or spent < policy.cap_dollars:
        return None
    said = (
        f"team {team} spent ${spent:,.2f} this {policy.period}, at or over the "
        f"${policy.cap_dollars:,.2f} cap of policy {policy.name}"
    )
    return PolicyBreach(
        policy=policy.name, kind=PolicyKind.COST_CAP, subject=team, reason=said, team=team
    )


def _approval(policy: ApprovalPolicy, facts: ActionFacts) -> Ruling | None:
    if facts.human_approved or facts.kind not in policy.actions:
        return None
    if policy.price_tiers and facts.price_tier not in policy.price_tiers:
        return None
    why = f"{facts.kind} needs an approval under policy {policy.name}"
    if policy.min_cost_per_hour_dollars is not None:
        cost = facts.cost_per_hour_dollars
        if cost is not None and cost < policy.min_cost_per_hour_dollars:
            return None
        shown = "an unknown cost" if cost is None else f"${cost:,.2f}/h"
        why += f" ({shown}; approval from ${policy.min_cost_per_hour_dollars:,.2f}/h)"
    if policy.price_tiers:
        why += f" (price tier {facts.price_tier})"
    return Ruling(outcome=Outcome.REQUIRE_APPROVAL, policy=policy.name, reason=why)


def _idle(policy: IdleReclaimPolicy, facts: ActionFacts) -> Ruling | None:
    if facts.human_approved or facts.kind != policy.action or facts.idle_seconds is None:
        return None
    if facts.idle_seconds >= policy.idle_seconds:
        return None
    reason = (
        f"{facts.kind} refused: {facts.job or facts.target} idle for "
        f"{format_duration(round(facts.idle_seconds))}, policy {policy.name} reclaims after "
        f"{format_duration(policy.idle_seconds)}"
    )
    return Ruling(outcome=Outcome.REFUSE, policy=policy.name, reason=reason)


def _quiet(policy: QuietHoursPolicy, facts: ActionFacts, world: World) -> Ruling | None:
    if facts.human_approved or (policy.actions and facts.kind not in policy.actions):
        return None
    end = window_end(policy, world.now)
    if end is None:
        return None
    if policy.effect is QuietEffect.REFUSE:
        reason = f"{facts.kind} refused: quiet hours of policy {policy.name}"
        return Ruling(outcome=Outcome.REFUSE, policy=policy.name, reason=reason)
    left = format_duration(round(end - world.now))
    reason = f"{facts.kind} deferred: quiet hours of policy {policy.name}, for {left}"
    return Ruling(outcome=Outcome.DEFER, policy=policy.name, reason=reason, until=end)


def evaluate(policies: Iterable[Policy], facts: ActionFacts, world: World) -> Ruling:
    """What the policies say about ``facts`` now; every breach found rides along."""
    selected = tuple(p for p in policies if _matches(p, facts))
    rulings = _limits(selected, facts, world)
    for policy in selected:
        found: Ruling | None = None
        if isinstance(policy, CostCapPolicy):
            found = _cost_cap(policy, facts, world)
        elif isinstance(policy, ApprovalPolicy):
            found = _approval(policy, facts)
        elif isinstance(policy, IdleReclaimPolicy):
            found = _idle(policy, facts)
        elif isinstance(policy, QuietHoursPolicy):
            found = _quiet(policy, facts, world)
        if found is not None:
            rulings.append(found)
    breaches = tuple(b for r in rulings for b in r.breaches)
    strongest = max(rulings, key=lambda r: _STRENGTH[r.outcome], default=None)
    if strongest is None or strongest.outcome is Outcome.ALLOW:
        return Ruling(outcome=Outcome.ALLOW, breaches=breaches)
    return Ruling(
        outcome=strongest.outcome,
        policy=strongest.policy,
        reason=strongest.reason,
        until=strongest.until,
        breaches=breaches,
    )
