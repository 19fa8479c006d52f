"""Policy breaches as incidents of the ``policy-breach`` rule: found, opened, resolved.

Two kinds of breach reach here. *Standing* ones are found by :func:`standing_breaches` from the
fleet as it is (a running job over its per-job limit, a team or model holding more GPUs than its
limit allows, a team at or over its spend cap); they resolve when the fleet no longer shows them.
*Refused* ones come from an action a ``limit`` or ``cost_cap`` refused (``evaluate``); the state
they describe never existed, so they resolve after ``hold_seconds`` without a new refusal.

Incidents are written straight to storage, as the Alertmanager receiver does: the
``policy_breach`` detector is a pushed one (nothing to compute in the detection cycle).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.policy.evaluate import PolicyBreach, cap_breach
from gpuwarden.collector.policy.model import (
    CapPeriod,
    CostCapPolicy,
    LimitPolicy,
    Policy,
    PolicyKind,
)
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.storage.base import Storage
from gpuwarden.collector.storage.records import Incident, IncidentState

log = logging.getLogger(__name__)

RULE_ID = "policy-breach"
"""The rule whose incidents name breached policies (rules/default.yaml)."""
DETECTOR = "policy_breach"
FINGERPRINT_PREFIX = "policy:"
WORKLOAD_LABEL = "gpuwarden.io/workload"
"""The job label naming a job's kind (``training``, ``serving``, ``notebook``...)."""


def job_kind(job: Job) -> str | None:
    """The job's kind as policies select it: its ``gpuwarden.io/workload`` label."""
    return job.labels.get(WORKLOAD_LABEL) or None


def _selected(policy: Policy, job: Job, cluster: str | None) -> bool:
    return policy.selector.matches(
        team=job.team, job=job.key, job_kind=job_kind(job), model=job.model, cluster=cluster
    )


def _over(policy: LimitPolicy, jobs: Sequence[Job], cluster: str | None) -> Iterable[PolicyBreach]:
    mine = [j for j in jobs if _selected(policy, j, cluster)]
    if policy.max_gpus_per_job is not None:
        for job in mine:
            if job.gpus > policy.max_gpus_per_job:
                yield PolicyBreach(
                    policy=policy.name,
                    kind=PolicyKind.LIMIT,
                    subject=job.key,
                    team=job.team,
                    reason=f"job {job.key} holds {job.gpus} GPUs; policy {policy.name} allows at "
                    f"most {policy.max_gpus_per_job} (max_gpus_per_job)",
                )
    for key, limit in (
        ("max_gpus_per_team", policy.max_gpus_per_team),
        ("max_gpus_per_model", policy.max_gpus_per_model),
    ):
        if limit is None:
            continue
        held: dict[str, int] = {}
        for job in mine:
            name = job.team if key == "max_gpus_per_team" else job.model
            if name is not None:
                held[name] = held.get(name, 0) + job.gpus
        for name, gpus in sorted(held.items()):
            if gpus > limit:
                what = "team" if key == "max_gpus_per_team" else "model"
                yield PolicyBreach(
                    policy=policy.name,
                    kind=PolicyKind.LIMIT,
                    subject=name,
                    team=name if what == "team" else None,
                    reason=f"{what} {name} holds {gpus} GPUs; policy {policy.name} allows at "
                    f"most {limit} ({key})",
                )


def standing_breaches(
    policies: Iterable[Policy],
    jobs: Iterable[Job],
    spend: Callable[[CapPeriod, float], Mapping[str, float]],
    now: float,
    cluster: str | None = None,
) -> list[PolicyBreach]:
    """Every limit the running jobs breach and every cost cap a team's spend reached."""
    running = [j for j in jobs if j.state is JobState.RUNNING]
    found: list[PolicyBreach] = []
    spent: dict[CapPeriod, Mapping[str, float]] = {}
    for policy in policies:
        if isinstance(policy, LimitPolicy):
            found.extend(_over(policy, running, cluster))
        elif isinstance(policy, CostCapPolicy):
            if policy.period not in spent:
                spent[policy.period] = spend(policy.period, now)
            for team, dollars in sorted(spent[policy.period].items()):
                if not policy.selector.matches(team=team, cluster=cluster):
                    continue
                if (breach := cap_breach(policy, team, dollars)) is not None:
                    found.append(breach)
    return found


def fingerprint(breach: PolicyBreach) -> str:
    """One incident per policy and subject."""
    return f"{FINGERPRINT_PREFIX}{breach.policy}:{breach.subject}"


class BreachBook:
    """Opens, updates and resolves the ``policy-breach`` rule's incidents.

    Args:
        storage: where incidents live.
        rule: the ``policy-breach`` rule (its severity); ``None``: the rule is not loaded, so
            breaches are only logged.
        hold_seconds: a refused action's breach resolves this long after it was last seen.
    """

    def __init__(
        self, storage: Storage, rule: Rule | None, *, hold_seconds: float = 3600.0
    ) -> None:
        self._storage = storage
        self._rule = rule
        self._hold = hold_seconds

    def record(self, breaches: Iterable[PolicyBreach], now: float, *, origin: str) -> int:
        """Open or update one incident per breach; ``origin`` is ``standing`` or ``refused``.
        Returns how many incidents were opened."""
        opened = 0
        for breach in breaches:
            log.warning("policy breach: %s", breach.reason)
            if self._rule is not None:
                opened += self._fold(self._rule, breach, now, origin)
        return opened

    def _fold(self, rule: Rule, breach: PolicyBreach, now: float, origin: str) -> int:
        evidence: dict[str, object] = {
            "subject": breach.subject,
            "summary": breach.reason,
            "policy": breach.policy,
            "policy_kind": str(breach.kind),
            "origin": origin,
        }
        if breach.team is not None:
            evidence["team"] = breach.team
        key = fingerprint(breach)
        current = self._storage.open_incident_for(key)
        if current is not None:
            if current.evidence.get("origin") == "standing":
                evidence["origin"] = "standing"  # a refusal does not shorten a standing breach
            self._storage.update_incident(
                replace(
                    current,
                    last_seen=now,
                    evidence=evidence,
                    consecutive_breaches=current.consecutive_breaches + 1,
                )
            )
            return 0
        incident = Incident(
            fingerprint=key,
            rule_id=rule.id,
            severity=str(rule.severity),
            first_seen=now,
            last_seen=now,
            evidence=evidence,
            consecutive_breaches=1,
        )
        return int(self._storage.open_incident(incident) is not None)

    def sync(self, standing: Sequence[PolicyBreach], now: float) -> tuple[int, int]:
        """Record the standing breaches and resolve the incidents no longer shown: standing
        ones not in ``standing``, refused ones not seen for ``hold_seconds``. Returns
        ``(opened, resolved)``."""
        opened = self.record(standing, now, origin="standing")
        if self._rule is None:
            return opened, 0
        current = {fingerprint(b) for b in standing}
        resolved = 0
        for incident in self._storage.incidents(state=IncidentState.OPEN):
            if incident.rule_id != self._rule.id or incident.fingerprint in current:
                continue
            refused = incident.evidence.get("origin") == "refused"
            if refused and now - incident.last_seen < self._hold:
                continue
            self._storage.update_incident(
                replace(
                    incident,
                    state=IncidentState.RESOLVED,
                    resolved_time=now,
                    last_seen=now,
                    consecutive_clears=incident.consecutive_clears + 1,
                    consecutive_breaches=0,
                )
            )
            resolved += 1
        return opened, resolved
