"""The typed policies: five kinds, their selector, and the set a ``policies/`` folder loads to.

A policy is data about what may happen unasked: ``limit`` (GPUs per job, team or model),
``approval`` (actions that wait for a human), ``cost_cap`` (daily or monthly spend per team and
what a breach does), ``idle_reclaim`` (how long a team's job may idle before it is reclaimed) and
``quiet_hours`` (when automated actions are deferred or refused). The loader (``loader``) builds
these from YAML; the limit check (``limits``) and the action evaluation (``evaluate``) read them.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

POLICY_FILE_VERSION: Final = 1


class PolicyKind(StrEnum):
    """What a policy constrains."""

    LIMIT = "limit"
    APPROVAL = "approval"
    COST_CAP = "cost_cap"
    IDLE_RECLAIM = "idle_reclaim"
    QUIET_HOURS = "quiet_hours"


class OnBreach(StrEnum):
    """What a spend cap does once the team's spend reaches it."""

    NOTIFY = "notify"
    """Open a ``policy-breach`` incident; actions go on."""
    BLOCK_SCALE_UP = "block_scale_up"
    """Also refuse actions that add GPUs (``scale_up``; new jobs at admission)."""
    REQUIRE_APPROVAL = "require_approval"
    """Also make actions that spend (``scale_up``, ``requeue``) wait for a human."""


class CapPeriod(StrEnum):
    """The period a spend cap counts over (calendar day or month, UTC)."""

    DAY = "day"
    MONTH = "month"


class QuietEffect(StrEnum):
    """What quiet hours do to an automated action."""

    DEFER = "defer"
    """Hold it until the window ends (it stays proposed and is decided again later)."""
    REFUSE = "refuse"
    """Refuse it (audited); a human may still act."""


WEEKDAYS: Final = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
"""Day names in ``quiet_hours.days``, in ``datetime.weekday()`` order."""


def _globs(patterns: tuple[str, ...], value: str | None) -> bool:
    if not patterns:
        return True
    return value is not None and any(fnmatch.fnmatchcase(value, p) for p in patterns)


@dataclass(frozen=True, slots=True)
class PolicySelector:
    """Whom a policy applies to; empty fields match everything.

    Each field is a tuple of case-sensitive glob patterns (``ml-*``); a subject whose fact is
    unknown (``None``) does not match a field that is set.
    """

    teams: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()
    job_kinds: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()

    def matches(
        self,
        *,
        team: str | None = None,
        job: str | None = None,
        job_kind: str | None = None,
        model: str | None = None,
        cluster: str | None = None,
    ) -> bool:
        """Whether a subject with these facts is selected."""
        return (
            _globs(self.teams, team)
            and _globs(self.jobs, job)
            and _globs(self.job_kinds, job_kind)
            and _globs(self.models, model)
            and _globs(self.clusters, cluster)
        )


@dataclass(frozen=True, slots=True)
class PolicySource:
    """Where a policy was defined: file and position in its ``policies`` list."""

    file: str
    index: int

    def __str__(self) -> str:
        return f"{self.file} policies[{self.index}]"


_INLINE = PolicySource("<inline>", 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitPolicy:
    """At most this many GPUs per job, per team or per model (``None``: no limit of that kind).

    The team and model limits count each selected team (model) on its own: the GPUs it holds
    plus those requested.
    """

    name: str
    selector: PolicySelector = PolicySelector()
    max_gpus_per_job: int | None = None
    max_gpus_per_team: int | None = None
    max_gpus_per_model: int | None = None
    description: str = ""
    source: PolicySource = _INLINE
    kind: PolicyKind = PolicyKind.LIMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalPolicy:
    """Actions of these kinds on selected subjects wait for a human approval.

    ``price_tiers`` narrows it to actions whose ``price_tier`` parameter is one of them (the
    spot → on-demand fallback is a ``requeue`` with ``price_tier: on-demand``);
    ``min_cost_per_hour_dollars`` to actions that would cost at least that much per hour.
    """

    name: str
    actions: tuple[str, ...]
    selector: PolicySelector = PolicySelector()
    price_tiers: tuple[str, ...] = ()
    min_cost_per_hour_dollars: float | None = None
    description: str = ""
    source: PolicySource = _INLINE
    kind: PolicyKind = PolicyKind.APPROVAL


@dataclass(frozen=True, slots=True, kw_only=True)
class CostCapPolicy:
    """A selected team may spend at most ``cap_dollars`` per ``period`` (each team on its own)."""

    name: str
    cap_dollars: float
    period: CapPeriod = CapPeriod.MONTH
    on_breach: OnBreach = OnBreach.NOTIFY
    selector: PolicySelector = PolicySelector()
    description: str = ""
    source: PolicySource = _INLINE
    kind: PolicyKind = PolicyKind.COST_CAP


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleReclaimPolicy:
    """A selected job idle for ``idle_seconds`` is reclaimed by ``action``; not before."""

    name: str
    idle_seconds: float
    action: str = "requeue"
    selector: PolicySelector = PolicySelector()
    description: str = ""
    source: PolicySource = _INLINE
    kind: PolicyKind = PolicyKind.IDLE_RECLAIM


@dataclass(frozen=True, slots=True, kw_only=True)
class QuietHoursPolicy:
    """Automated actions (of ``actions``; empty: all) are deferred or refused inside the window.

    The window starts at ``start_minute`` (minutes after local midnight in ``timezone``) on each
    of ``days`` (0 = Monday) and ends at ``end_minute``; an end before the start crosses midnight
    into the next day.
    """

    name: str
    timezone: str
    days: tuple[int, ...]
    start_minute: int
    end_minute: int
    actions: tuple[str, ...] = ()
    effect: QuietEffect = QuietEffect.DEFER
    selector: PolicySelector = PolicySelector()
    description: str = ""
    source: PolicySource = _INLINE
    kind: PolicyKind = PolicyKind.QUIET_HOURS


Policy = LimitPolicy | ApprovalPolicy | CostCapPolicy | IdleReclaimPolicy | QuietHoursPolicy
"""Any policy."""


@dataclass(frozen=True, slots=True)
class PolicyProblem:
    """A file or policy that did not load. ``key`` is relative to the policy when ``index`` is
    set."""

    file: str
    key: str
    message: str
    index: int | None = None
    name: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.index is not None:
            where += f": policies[{self.index}] ({self.name or '?'})"
            return f"{where}.{self.key}: {self.message}" if self.key else f"{where}: {self.message}"
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class PolicyError(ValueError):
    """A policy file is broken; ``str()`` names the file, policy and key."""

    def __init__(self, problem: PolicyProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


@dataclass(frozen=True, slots=True)
class PolicySet:
    """The policies that loaded and, with ``skip_bad``, the problems of those that did not."""

    policies: tuple[Policy, ...] = ()
    problems: tuple[PolicyProblem, ...] = ()

    def of_kind(self, kind: PolicyKind) -> tuple[Policy, ...]:
        """The policies of one kind, in file order."""
        return tuple(p for p in self.policies if p.kind is kind)

    def get(self, name: str) -> Policy | None:
        """The policy with this name, or ``None``."""
        return next((p for p in self.policies if p.name == name), None)
