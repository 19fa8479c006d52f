"""The policies as the remediation path asks them: facts of an action in, a ruling out.

:class:`PolicyGuard` is what ``remediate.decide`` holds: it turns an action (kind, target, rule
parameters, the incident's evidence) into :class:`~.evaluate.ActionFacts` with what the collector
knows (the job registry, the GPUs each team and model holds, spend so far), asks
:func:`~.evaluate.evaluate`, and records the breaches it reports. :meth:`sweep` finds the
standing breaches once per remediation pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.policy.breaches import BreachBook, job_kind, standing_breaches
from gpuwarden.collector.policy.evaluate import ActionFacts, Ruling, Spend, World, evaluate
from gpuwarden.collector.policy.limits import Usage
from gpuwarden.collector.policy.model import CapPeriod, Policy, PolicyKind


class JobView(Protocol):
    """The job registry as the guard reads it."""

    def jobs(self) -> list[Job]:
        """Current jobs."""
        ...

    def get(self, key: str) -> Job | None:
        """A job by key, current or remembered."""
        ...


def _no_spend(period: CapPeriod, now: float) -> Mapping[str, float]:
    del period, now
    return {}


def usage_of(jobs: Iterable[Job]) -> Usage:
    """GPUs held by running jobs, per team and per model."""
    teams: dict[str, int] = {}
    models: dict[str, int] = {}
    for job in jobs:
        if job.state is not JobState.RUNNING:
            continue
        if job.team is not None:
            teams[job.team] = teams.get(job.team, 0) + job.gpus
        if job.model is not None:
            models[job.model] = models.get(job.model, 0) + job.gpus
    return Usage(teams, models)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class PolicyGuard:
    """Policies asked before an action runs.

    Args:
        policies: the loaded policies.
        jobs: the job registry (facts about a job, GPUs held per team and model).
        spend: spend so far per team this day or month (accounting).
        breaches: where breaches become incidents (``None``: not recorded).
        cluster: this collector's cluster (policies may select clusters).
        clock: wall clock.
    """

    def __init__(
        self,
        policies: Iterable[Policy],
        *,
        jobs: JobView,
        spend: Spend = _no_spend,
        breaches: BreachBook | None = None,
        cluster: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policies = tuple(policies)
        self._jobs = jobs
        self._spend = spend
        self._breaches = breaches
        self._cluster = cluster
        self._clock = clock

    def facts(
        self,
        *,
        kind: str,
        target: str | None,
        parameters: Mapping[str, Any],
        evidence: Mapping[str, Any],
        first_seen: float,
        human_approved: bool,
    ) -> ActionFacts:
        """What the policies know about this action, from the incident and the registry."""
        key = _text(evidence.get("job"))
        job = self._jobs.get(key) if key is not None else None
        tier = _text(parameters.get("price_tier"))
        gpus_added = 0
        if kind == "scale_up":
            per_replica = _number(evidence.get("gpus_per_replica")) or 1.0
            gpus_added = int(per_replica * int(parameters.get("step_replicas", 1)))
        idle = None
        window = _number(evidence.get("window_minutes"))
        if evidence.get("idle_gpus") is not None and window is not None:
            idle = window * 60 + max(0.0, self._clock() - first_seen)
        return ActionFacts(
            kind=kind,
            target=target,
            team=_text(evidence.get("team")) or (job.team if job else None),
            job=key,
            job_kind=job_kind(job) if job else None,
            model=_text(evidence.get("model")) or (job.model if job else None),
            cluster=self._cluster,
            human_approved=human_approved,
            price_tier=None if tier == "same" else tier,
            gpus_added=gpus_added,
            cost_per_hour_dollars=_number(evidence.get("cost_per_hour_dollars")),
            idle_seconds=idle,
        )

    def review(self, facts: ActionFacts) -> Ruling:
        """The policies' ruling on ``facts`` now; a breach it reports opens an incident."""
        now = self._clock()
        world = World(now, usage_of(self._jobs.jobs()), self._spend)
        ruling = evaluate(self.policies, facts, world)
        if self._breaches is not None and ruling.breaches:
            # a limit breach is the refused action's (it never happened); spend is real
            for origin, kinds in (
                ("refused", {PolicyKind.LIMIT}),
                ("standing", {PolicyKind.COST_CAP}),
            ):
                found = [b for b in ruling.breaches if b.kind in kinds]
                self._breaches.record(found, now, origin=origin)
        return ruling

    def sweep(self) -> tuple[int, int]:
        """Open and resolve the standing breaches' incidents; ``(opened, resolved)``."""
        if self._breaches is None:
            return 0, 0
        now = self._clock()
        found = standing_breaches(self.policies, self._jobs.jobs(), self._spend, now, self._cluster)
        return self._breaches.sync(found, now)
