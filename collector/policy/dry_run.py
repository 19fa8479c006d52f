"""``gpuwarden policies test``: the policies asked about a backtest's actions, dry.

Every incident a backtest opened (``collector.backtest``) proposes its rule's acting actions;
each is put to the policies as the remediator would at the moment the incident opened (in the
data's clock: a relative trace starts on 1970-01-01 UTC, which matters to quiet hours only),
with the trace's jobs as the fleet. Nothing is recorded and nothing acts: the verdicts say
which actions the policies would refuse, defer or hold for approval, and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuwarden.collector.backtest.replay import FoundIncident
from gpuwarden.collector.jobs.model import Job
from gpuwarden.collector.policy.evaluate import Outcome
from gpuwarden.collector.policy.guard import PolicyGuard
from gpuwarden.collector.policy.model import Policy
from gpuwarden.collector.rules.model import RuleSet

NOTIFY_ONLY = frozenset({"notify"})


@dataclass(frozen=True, slots=True)
class DryVerdict:
    """What the policies would say about one action of one backtest incident."""

    at_seconds: float
    rule_id: str
    subject: str
    action: str
    outcome: Outcome
    policy: str | None
    reason: str


class _Jobs:
    """The trace's jobs as the guard's job view."""

    def __init__(self, jobs: Iterable[Job]) -> None:
        self._by_key = {job.key: job for job in jobs}

    def jobs(self) -> list[Job]:
        return list(self._by_key.values())

    def get(self, key: str) -> Job | None:
        return self._by_key.get(key)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def dry_evaluate(
    policies: Sequence[Policy],
    rules: RuleSet,
    incidents: Iterable[FoundIncident],
    jobs: Iterable[Job],
    spend: Mapping[str, float] | None = None,
) -> list[DryVerdict]:
    """The verdict on every acting action of every incident, in incident order.

    ``spend`` (team -> dollars) stands for the spend so far in any cap's period (none given:
    unknown, so cost caps say nothing).
    """
    clock = _Clock()
    spent = dict(spend or {})
    guard = PolicyGuard(policies, jobs=_Jobs(jobs), spend=lambda _p, _n: spent, clock=clock)
    verdicts = []
    for incident in incidents:
        rule = rules.get(incident.rule_id)
        if rule is None:
            continue
        clock.now = incident.opened_seconds
        for spec in rule.actions:
            if spec.kind in NOTIFY_ONLY:
                continue
            evidence = incident.evidence
            target = evidence.get("job") or evidence.get("model") or evidence.get("node")
            facts = guard.facts(
                kind=spec.kind,
                target=str(target) if target is not None else None,
                parameters=spec.parameters,
                evidence=evidence,
                first_seen=incident.opened_seconds,
                human_approved=False,
            )
            ruling = guard.review(facts)
            verdicts.append(
                DryVerdict(
                    at_seconds=incident.opened_seconds,
                    rule_id=incident.rule_id,
                    subject=incident.subject,
                    action=spec.kind,
                    outcome=ruling.outcome,
                    policy=ruling.policy,
                    reason=ruling.reason,
                )
            )
    return verdicts
