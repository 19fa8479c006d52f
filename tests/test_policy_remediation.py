"""Policies in the remediation path, over a real SQLite store, job registry and remediator: each
kind refusing an action it forbids (the row refused, the audit naming the policy, also in
dry-run) and allowing one it permits; the spot -> on-demand fallback waiting for an approval and
running once approved; quiet hours deferring to the window's end; breaches opening and
resolving ``policy-breach`` incidents that name the policy."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import msgspec
import pytest

from gpuwarden.collector.build import build_policy_guard, build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.policy.breaches import RULE_ID, BreachBook
from gpuwarden.collector.policy.guard import PolicyGuard
from gpuwarden.collector.policy.model import (
    ApprovalPolicy,
    CapPeriod,
    CostCapPolicy,
    IdleReclaimPolicy,
    LimitPolicy,
    OnBreach,
    Policy,
    PolicyError,
    PolicySelector,
    QuietEffect,
    QuietHoursPolicy,
)
from gpuwarden.collector.remediate.actuators.base import ActionRequest, ActionResult, Outcome
from gpuwarden.collector.remediate.policy import PolicyConfig
from gpuwarden.collector.remediate.remediator import ActionState, Remediator
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import ActionMode, ActionSpec, Rule, Selector, Severity
from gpuwarden.collector.storage.records import AccountingRow, Incident, IncidentState
from gpuwarden.collector.storage.sqlite import SqliteStorage
from tests.storage_backends import Backend, SqlStorage

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
NOON = dt.datetime(2026, 11, 25, 12, 0, tzinfo=BERLIN).timestamp()  # a Wednesday
_BREACH_RULE = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir()).get(RULE_ID)
assert _BREACH_RULE is not None
BREACH_RULE: Rule = _BREACH_RULE


class Clock:
    def __init__(self) -> None:
        self.now = NOON

    def __call__(self) -> float:
        return self.now


@dataclass
class Actuator:
    """Records what it is asked to do (an in-memory fake of the protocol)."""

    kinds: frozenset[str] = frozenset({"requeue", "scale_up", "drain"})
    calls: list[ActionRequest] = field(default_factory=list)

    def execute(self, request: ActionRequest) -> ActionResult:
        self.calls.append(request)
        if request.dry_run:
            return ActionResult(Outcome.DRY_RUN, f"validated {request.kind} {request.target}")
        return ActionResult(Outcome.DONE, f"{request.kind} done")

    def rollback(self, request: ActionRequest, result: ActionResult) -> ActionResult:
        del result
        return ActionResult(Outcome.DONE, f"{request.kind} undone")


def rule(kind: str, parameters: Mapping[str, Any] | None = None) -> Rule:
    return Rule(
        id=f"r-{kind}",
        detector="idle_gpu",
        selector=Selector(),
        parameters=MappingProxyType({}),
        severity=Severity.WARNING,
        owner="ml-platform",
        runbook="idle-gpu.md",
        actions=(ActionSpec(kind, ActionMode.AUTO, MappingProxyType(dict(parameters or {}))),),
    )


@dataclass
class Fleet:
    storage: SqlStorage
    clock: Clock
    registry: JobRegistry
    actuator: Actuator = field(default_factory=Actuator)
    spent: dict[str, float] = field(default_factory=dict)

    def spend(self, period: CapPeriod, now: float) -> Mapping[str, float]:
        del period, now
        return self.spent

    def remediator(self, policies: list[Policy], rules: list[Rule], *, dry_run: bool) -> Remediator:
        guard = PolicyGuard(
            policies,
            jobs=self.registry,
            spend=self.spend,
            breaches=BreachBook(self.storage, BREACH_RULE),
            clock=self.clock,
        )
        return Remediator(
            self.storage,
            [*rules, BREACH_RULE],
            [self.actuator],
            config=PolicyConfig(dry_run=dry_run),
            clock=self.clock,
            guard=guard,
        )

    def incident(self, rule_id: str, evidence: Mapping[str, Any]) -> Incident:
        incident = Incident(
            fingerprint=f"fp-{rule_id}-{evidence.get('job') or evidence.get('model')}",
            rule_id=rule_id,
            severity="warning",
            first_seen=self.clock.now,
            last_seen=self.clock.now,
            evidence={"subject": "x", **evidence},
            consecutive_breaches=1,
        )
        incident_id = self.storage.open_incident(incident)
        assert incident_id is not None
        return replace(incident, incident_id=incident_id)

    def row(self, incident: Incident) -> Any:
        (row,) = self.storage.actions(incident_id=incident.incident_id)
        return row

    def breaches(self) -> list[tuple[str, str]]:
        return sorted(
            (str(i.evidence["policy"]), str(i.evidence["origin"]))
            for i in self.storage.incidents(state=IncidentState.OPEN)
            if i.rule_id == RULE_ID
        )


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    clock = Clock()
    storage = SqliteStorage(str(tmp_path / "state.db"), clock=clock)
    yield Fleet(storage, clock, JobRegistry(storage))
    storage.close()


@pytest.fixture
def either_fleet(backend: Backend) -> Iterator[Fleet]:
    """On SQLite and on PostgreSQL: the approval flow and the breach incidents are storage's."""
    clock = Clock()
    storage = backend.open(clock)
    yield Fleet(storage, clock, JobRegistry(storage))
    storage.close()


def job(key: str, team: str, gpus: int, **more: Any) -> Job:
    return Job(
        key=key, scheduler="slurm", job_id=key, state=JobState.RUNNING, team=team, gpus=gpus, **more
    )


NIGHT: dict[str, Any] = {
    "timezone": "Europe/Berlin",
    "days": (0, 1, 2, 3, 4),
    "start_minute": 22 * 60,
    "end_minute": 7 * 60,
}

# (name, policy, rule, incident evidence, jobs, spend, clock offset, forbidden?)
CASES: list[tuple[str, Policy, Rule, dict[str, Any], list[Job], dict[str, float], float, bool]] = []
for forbidden, held in ((True, 41), (False, 40)):
    CASES.append(
        (
            f"limit-{'refuses' if forbidden else 'allows'}",
            LimitPolicy(
                name="llama-ceiling",
                selector=PolicySelector(models=("llama-*",)),
                max_gpus_per_model=48,
            ),
            rule("scale_up", {"step_replicas": 1}),
            {"model": "llama-70b", "team": "serving", "gpus_per_replica": 8},
            [job("k8s:llama-0", "serving", held, model="llama-70b")],
            {},
            0.0,
            forbidden,
        )
    )
for forbidden, dollars in ((True, 250.0), (False, 150.0)):
    CASES.append(
        (
            f"cost_cap-{'refuses' if forbidden else 'allows'}",
            CostCapPolicy(
                name="interns-daily",
                selector=PolicySelector(teams=("interns",)),
                period=CapPeriod.DAY,
                cap_dollars=200,
                on_breach=OnBreach.BLOCK_SCALE_UP,
            ),
            rule("scale_up"),
            {"model": "tiny", "team": "interns"},
            [],
            {"interns": dollars},
            0.0,
            forbidden,
        )
    )
for forbidden, window in ((True, 10.0), (False, 30.0)):
    CASES.append(
        (
            f"idle_reclaim-{'refuses' if forbidden else 'allows'}",
            IdleReclaimPolicy(
                name="notebooks-idle",
                selector=PolicySelector(job_kinds=("notebook",)),
                idle_seconds=1800,
            ),
            rule("requeue"),
            {"job": "k8s:nb-1", "idle_gpus": 1, "job_gpus": 1, "window_minutes": window},
            [
                job(
                    "k8s:nb-1",
                    "ml-a",
                    1,
                    labels=MappingProxyType({"gpuwarden.io/workload": "notebook"}),
                )
            ],
            {},
            0.0,
            forbidden,
        )
    )
for forbidden, hour in ((True, 23.0), (False, 12.0)):
    CASES.append(
        (
            f"quiet_hours-{'refuses' if forbidden else 'allows'}",
            QuietHoursPolicy(name="nights", effect=QuietEffect.REFUSE, **NIGHT),
            rule("drain"),
            {"node": "gpu-01"},
            [],
            {},
            (hour - 12.0) * 3600,
            forbidden,
        )
    )
for forbidden, tier in ((True, "on-demand"), (False, "same")):
    CASES.append(
        (
            f"approval-{'holds' if forbidden else 'allows'}",
            ApprovalPolicy(
                name="spot-to-on-demand", actions=("requeue",), price_tiers=("on-demand",)
            ),
            rule("requeue", {"price_tier": tier}),
            {"job": "slurm:c:7", "team": "ml-a"},
            [job("slurm:c:7", "ml-a", 8, price_tier="spot")],
            {},
            0.0,
            forbidden,
        )
    )


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "real"])
@pytest.mark.parametrize(
    ("policy", "the_rule", "evidence", "jobs", "spent", "offset", "forbidden"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_a_policy_refuses_what_it_forbids_audited_by_name(
    fleet: Fleet,
    policy: Policy,
    the_rule: Rule,
    evidence: dict[str, Any],
    jobs: list[Job],
    spent: dict[str, float],
    offset: float,
    forbidden: bool,
    dry_run: bool,
) -> None:
    fleet.registry.put(jobs)
    fleet.spent.update(spent)
    fleet.clock.now += offset
    remediator = fleet.remediator([policy], [the_rule], dry_run=dry_run)
    incident = fleet.incident(the_rule.id, evidence)
    remediator.tick()
    row = fleet.row(incident)
    entries = [e for e in fleet.storage.audit() if e.idempotency_key == row.idempotency_key]
    if not forbidden:
        assert row.state == (ActionState.DRY_RUN if dry_run else ActionState.VERIFYING)
        assert [c.dry_run for c in fleet.actuator.calls] == [dry_run]
        assert all(policy.name not in e.reason for e in entries)
        return
    assert fleet.actuator.calls == []  # nothing executed, not even a dry run
    (entry,) = entries
    assert entry.dry_run is dry_run
    assert entry.reason.startswith(f"policy {policy.name}: ")
    if isinstance(policy, ApprovalPolicy):
        assert (row.state, entry.verdict) == (ActionState.AWAITING_APPROVAL, "await_approval")
    else:
        assert (row.state, entry.verdict) == (ActionState.REFUSED, "policy_refused")


def test_the_spot_to_on_demand_fallback_waits_for_approval_then_runs(either_fleet: Fleet) -> None:
    fleet = either_fleet
    fleet.registry.put([job("slurm:c:7", "ml-a", 8, price_tier="spot")])
    fallback = rule("requeue", {"price_tier": "on-demand"})
    remediator = fleet.remediator(
        [
            ApprovalPolicy(
                name="spot-to-on-demand", actions=("requeue",), price_tiers=("on-demand",)
            )
        ],
        [fallback],
        dry_run=False,
    )
    incident = fleet.incident(fallback.id, {"job": "slurm:c:7", "team": "ml-a"})
    remediator.tick()
    row = fleet.row(incident)
    assert row.state == ActionState.AWAITING_APPROVAL
    remediator.tick()  # waiting is waiting: nothing runs by itself
    assert fleet.actuator.calls == []
    remediator.approve(row.action_id, actor="ada")
    (call,) = fleet.actuator.calls
    assert (call.kind, call.target, call.dry_run) == ("requeue", "slurm:c:7", False)
    assert call.parameters["price_tier"] == "on-demand"
    assert fleet.row(incident).state == ActionState.VERIFYING


def test_quiet_hours_defer_to_the_window_end_then_act(fleet: Fleet) -> None:
    fleet.clock.now = dt.datetime(2026, 11, 25, 23, 0, tzinfo=BERLIN).timestamp()
    drain = rule("drain")
    remediator = fleet.remediator(
        [QuietHoursPolicy(name="nights", **NIGHT)], [drain], dry_run=False
    )
    incident = fleet.incident(drain.id, {"node": "gpu-01"})
    remediator.tick()
    row = fleet.row(incident)
    end = dt.datetime(2026, 11, 26, 7, 0, tzinfo=BERLIN).timestamp()
    assert (row.state, row.next_attempt_at) == (ActionState.DEFERRED, end)
    fleet.clock.now = end - 60
    remediator.tick()
    assert fleet.actuator.calls == []
    fleet.clock.now = end
    remediator.tick()
    assert [c.kind for c in fleet.actuator.calls] == ["drain"]


def test_breaches_open_and_resolve_incidents_naming_the_policy(either_fleet: Fleet) -> None:
    fleet = either_fleet
    policies: list[Policy] = [
        LimitPolicy(
            name="ml-share", selector=PolicySelector(teams=("ml-*",)), max_gpus_per_team=16
        ),
        LimitPolicy(name="llama-ceiling", max_gpus_per_model=8),
        CostCapPolicy(name="ml-monthly", cap_dollars=1000),
    ]
    fleet.registry.put([job("slurm:c:1", "ml-a", 12), job("slurm:c:2", "ml-a", 8)])
    scale = rule("scale_up")
    remediator = fleet.remediator(policies, [scale], dry_run=True)
    remediator.tick()
    assert fleet.breaches() == [("ml-share", "standing")]
    (opened,) = [i for i in fleet.storage.incidents() if i.rule_id == RULE_ID]
    assert opened.evidence["summary"] == (
        "team ml-a holds 20 GPUs; policy ml-share allows at most 16 (max_gpus_per_team)"
    )
    # the breach incident's own action (notify) is proposed like any rule's
    (notify,) = fleet.storage.actions(incident_id=opened.incident_id)
    assert (notify.action, notify.state) == ("notify", ActionState.PROPOSED)

    # a refused scale-up opens its own breach; spend over the cap opens another
    fleet.spent["ml-a"] = 1200.0
    fleet.incident(scale.id, {"model": "llama-70b", "team": "ml-a", "gpus_per_replica": 16})
    remediator.tick()
    assert fleet.breaches() == [
        ("llama-ceiling", "refused"),
        ("ml-monthly", "standing"),
        ("ml-share", "standing"),
    ]

    # the team gives GPUs back and the month's spend is forgotten (a new month)
    fleet.registry.put([replace(job("slurm:c:1", "ml-a", 12), state=JobState.COMPLETED)])
    fleet.spent.clear()
    fleet.clock.now += 60
    remediator.tick()
    assert fleet.breaches() == [("llama-ceiling", "refused")]
    fleet.clock.now += 3600  # a refusal's breach is held an hour after it was last seen
    remediator.tick()
    assert fleet.breaches() == []


def test_the_collector_builds_its_guard_from_policies_dir(tmp_path: Path) -> None:
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    examples = Path(__file__).resolve().parent.parent / "policies"
    config = CollectorConfig(database=tmp_path / "c.db", policies_dir=examples)
    service = build_service(config, job_sources=[])
    try:
        assert build_policy_guard(replace_dir(config, None), service, rules) is None
        guard = build_policy_guard(config, service, rules)
        assert guard is not None
        assert len(guard.policies) == 9
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "p.yaml").write_text("policies: [{name: x, kind: nope}]\n")
        with pytest.raises(PolicyError, match=r"p\.yaml: policies\[0\] \(x\)\.kind: unknown"):
            build_policy_guard(replace_dir(config, tmp_path / "bad"), service, rules)
    finally:
        service.storage.close()


def replace_dir(config: CollectorConfig, path: Path | None) -> CollectorConfig:
    return msgspec.structs.replace(config, policies_dir=path)


def test_cost_caps_read_the_days_and_the_months_spend_from_accounting(tmp_path: Path) -> None:
    now = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC).timestamp()
    examples = tmp_path / "policies"
    examples.mkdir()
    (examples / "caps.yaml").write_text(
        "policies:\n"
        "  - {name: day-50, kind: cost_cap, period: day, cap_dollars: 50}\n"
        "  - {name: month-150, kind: cost_cap, period: month, cap_dollars: 150}\n"
        "  - {name: month-200, kind: cost_cap, period: month, cap_dollars: 200}\n"
    )
    config = CollectorConfig(database=tmp_path / "c.db", policies_dir=examples)
    service = build_service(config, job_sources=[])
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())

    def row(start: dt.datetime, dollars: float) -> AccountingRow:
        return AccountingRow(
            period_start=start.timestamp(),
            period_seconds=60.0,
            job_key="slurm:c:1",
            team="ml-a",
            model=None,
            node="n1",
            gpu_uuid="GPU-1",
            price_tier="on-demand",
            gpu_seconds_allocated=60.0,
            gpu_seconds_busy=60.0,
            gpu_seconds_idle=0.0,
            cost=dollars,
            currency="USD",
        )

    try:
        service.storage.write_rollups(
            [
                row(dt.datetime(2026, 11, 25, 11, 0, tzinfo=dt.UTC), 60.0),  # today
                row(dt.datetime(2026, 11, 3, 9, 0, tzinfo=dt.UTC), 100.0),  # this month
                row(dt.datetime(2026, 10, 31, 23, 0, tzinfo=dt.UTC), 1000.0),  # last month
            ]
        )
        clock = Clock()
        clock.now = now
        guard = build_policy_guard(config, service, rules, clock=clock)
        assert guard is not None
        assert guard.sweep() == (2, 0)
        # spend is read again once per accounting period, not on every pass
        service.storage.write_rollups([row(dt.datetime(2026, 11, 25, 11, 1, tzinfo=dt.UTC), 50.0)])
        assert guard.sweep() == (0, 0)
        clock.now += config.accounting_period_seconds
        assert guard.sweep() == (1, 0)  # month-200: $210 now
        opened = sorted(
            (str(i.evidence["policy"]), str(i.evidence["summary"]))
            for i in service.storage.incidents(state=IncidentState.OPEN)
        )
        assert opened == [
            (
                "day-50",
                "team ml-a spent $110.00 this day, at or over the $50.00 cap of policy day-50",
            ),
            (
                "month-150",
                "team ml-a spent $210.00 this month, at or over the $150.00 cap of policy "
                "month-150",
            ),
            (
                "month-200",
                "team ml-a spent $210.00 this month, at or over the $200.00 cap of policy "
                "month-200",
            ),
        ]
    finally:
        service.storage.close()
