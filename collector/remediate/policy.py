"""The remediation policy: which action a rule's finding gets, and whether it may act now.

Pure decisions over a snapshot of state (:class:`PolicyState`): the remediator reads the snapshot
from storage, asks :meth:`Policy.check`, and records what it was told. Safety rules, in the order
they are checked:

1. a target that is empty or means "all" (``all``, ``*``, ``any``, a glob) is refused, never
   widened (Google's Diskerase wiped a CDN when an empty set meant "everything");
2. an open blast-radius breaker stops every automated action until a human resets it;
3. the per-target cooldown (never shorter than the action's settle time) defers an action;
4. attempts per incident are capped; the next step is a human (escalation);
5. the breaker trips when one more action would exceed ``breaker_max_actions`` in
   ``breaker_window_seconds`` or touch more than ``breaker_max_fleet_ratio`` of the fleet.

Dry-run is the global default: a dry run validates and records "would <action>", nothing changes.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any

import msgspec

from gpuwarden.agent.schema import convert
from gpuwarden.collector.rules.model import ActionMode, Rule
from gpuwarden.collector.rules.vocabulary import ACTIONS

#: Seconds until an action's effect can be judged. Slurm keeps a requeued job PENDING
#: (BeginTime) for ~121 s (measured, reference §5.1): 150 s leaves margin. HPA/KEDA settle
#: scale changes over minutes (scale-down stabilisation 300 s); traffic shifts need a few
#: burn-rate short windows (5 min).
SETTLE_SECONDS: Mapping[str, float] = MappingProxyType(
    {"requeue": 150.0, "scale_up": 300.0, "degrade": 300.0, "drain": 120.0, "webhook": 60.0}
)
DEFAULT_SETTLE_SECONDS = 300.0
#: Kinds whose effect is temporary: undone ("restored") once the incident is resolved.
TEMPORARY_KINDS = frozenset({"degrade"})
#: Kinds that take no action: recorded as proposals for the alert, never executed.
NOTIFY_ONLY_KINDS = frozenset({"notify"})
_ALL_WORDS = frozenset({"all", "any", "everything", "*", "%", "cluster", "fleet", "none", "null"})
_GLOB = re.compile(r"[*?\[\]]")


class PolicyError(ValueError):
    """The rules or the remediation configuration are wrong; the message names the rule."""


Positive = Annotated[float, msgspec.Meta(gt=0)]
Count = Annotated[int, msgspec.Meta(gt=0)]
SecondsByKind = Mapping[str, Annotated[float, msgspec.Meta(ge=0)]]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class PolicyConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Remediation settings (the ``remediation:`` section of the collector configuration).

    Attributes:
        dry_run: act for real only when false; the default is a dry run.
        max_attempts: failed executions per incident and action before escalating (a rule's
            own ``max_attempts`` parameter wins).
        breaker_max_actions: real actions allowed per ``breaker_window_seconds``.
        breaker_window_seconds: the breaker's sliding window.
        breaker_max_fleet_ratio: share of the fleet's targets that may be acted on per window.
        cooldown_seconds: per action kind; raised to the kind's settle time when shorter.
        settle_seconds: per action kind: wait this long before verifying.
        approval_ttl_seconds: how long an approval link stays valid.
        stale_execution_seconds: an action left "executing" this long (the collector died
            mid-call) is reconciled; longer than any actuator call may take.
    """

    dry_run: bool = True
    max_attempts: Count = 3
    breaker_max_actions: Count = 10
    breaker_window_seconds: Positive = 600.0
    breaker_max_fleet_ratio: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.1
    cooldown_seconds: SecondsByKind = msgspec.field(default_factory=lambda: MappingProxyType({}))
    settle_seconds: SecondsByKind = msgspec.field(default_factory=lambda: SETTLE_SECONDS)
    approval_ttl_seconds: Positive = 3600.0
    stale_execution_seconds: Positive = 300.0

    def __post_init__(self) -> None:
        for table in ("cooldown_seconds", "settle_seconds"):
            for kind in getattr(self, table):
                if kind not in ACTIONS:
                    raise PolicyError(
                        f"{table}.{kind}: unknown action kind (known: {', '.join(sorted(ACTIONS))})"
                    )

    def settle(self, kind: str) -> float:
        """Seconds to wait before judging ``kind``'s effect."""
        return float(self.settle_seconds.get(kind, DEFAULT_SETTLE_SECONDS))

    def cooldown(self, kind: str) -> float:
        """Per-target cooldown of ``kind``: never shorter than its settle time."""
        return max(float(self.cooldown_seconds.get(kind, 0.0)), self.settle(kind))


class Verdict(enum.StrEnum):
    """The policy's answer for one action on one target, now."""

    EXECUTE = "execute"  # act for real
    DRY_RUN = "dry_run"  # validate and record "would ..."
    AWAIT_APPROVAL = "await_approval"  # mode approve, not approved yet
    PROPOSE = "propose"  # mode notify (or a notify-only kind): shown in the alert
    REFUSE_TARGET = "refuse_target"  # empty or "all" target
    BREAKER_OPEN = "breaker_open"  # automation halted until a human resets the breaker
    TRIP_BREAKER = "trip_breaker"  # this action would exceed the blast radius: trip now
    COOLDOWN = "cooldown"  # the target was acted on too recently
    MAX_ATTEMPTS = "max_attempts"  # escalate to a human
    POLICY_REFUSED = "policy_refused"  # a policy (policies/) forbids it: refused, audited
    POLICY_DEFERRED = "policy_deferred"  # a policy's quiet hours: decided again at their end


@dataclass(frozen=True, slots=True)
class PolicyState:
    """What the policy needs to know about the world, read by the remediator from storage.

    ``fleet_size`` is the number of targets of the fleet (``None``: unknown, the ratio check
    is skipped and the count cap alone applies).
    """

    now: float
    breaker_open: bool
    actions_in_window: int
    targets_in_window: frozenset[str]
    cooldown_until: float | None
    attempts: int
    fleet_size: int | None


@dataclass(frozen=True, slots=True)
class Decision:
    """A verdict and why, in words an operator reads in the audit log."""

    verdict: Verdict
    reason: str


def idempotency_key(fingerprint: str, action: str, target: str) -> str:
    """sha256 of (incident fingerprint, action, target): one action per target per incident."""
    return hashlib.sha256(f"{fingerprint}\0{action}\0{target}".encode()).hexdigest()


def target_problem(target: str | None) -> str | None:
    """Why ``target`` must be refused (empty, "all", a pattern), or ``None`` when it is one."""
    if target is None or not target.strip():
        return "no target: an empty target is refused, never widened to everything"
    text = target.strip()
    if text.lower() in _ALL_WORDS or _GLOB.search(text) or text != target or "," in text:
        return f"target {target!r} names many or all objects; only one object is acted on"
    if any(ch.isspace() or ord(ch) < 32 for ch in text):
        return f"target {target!r} contains whitespace or control characters"
    return None


class Policy:
    """Decisions for the rules' actions under one :class:`PolicyConfig`.

    Raises:
        PolicyError: at construction, when an enabled rule names an action kind outside the
            vocabulary, or an action kind's mode cannot be honoured.
    """

    def __init__(self, config: PolicyConfig, rules: Iterable[Rule]) -> None:
        self.config = config
        for rule in rules:
            for index, spec in enumerate(rule.actions):
                if spec.kind not in ACTIONS:
                    raise PolicyError(
                        f"{rule.source}: rule {rule.id}: actions[{index}].kind: unknown action "
                        f"kind {spec.kind!r} (known: {', '.join(sorted(ACTIONS))})"
                    )
                if spec.mode not in tuple(ActionMode):
                    raise PolicyError(
                        f"{rule.source}: rule {rule.id}: actions[{index}].mode: unknown mode "
                        f"{spec.mode!r} (known: auto, approve, notify)"
                    )

    def max_attempts(self, parameters: Mapping[str, Any]) -> int:
        """Attempts per incident for an action with these rule parameters."""
        given = parameters.get("max_attempts")
        return int(given) if isinstance(given, int) else self.config.max_attempts

    def decide(  # noqa: PLR0911 - one early return per rule of the ladder reads best
        self,
        *,
        kind: str,
        mode: ActionMode,
        target: str | None,
        approved: bool,
        parameters: Mapping[str, Any],
        state: PolicyState,
    ) -> Decision:
        """The verdict for one action on one target now (see the module docstring's order)."""
        if kind not in ACTIONS:  # rules are checked at construction; this is a programming error
            raise PolicyError(f"unknown action kind {kind!r}")
        if kind in NOTIFY_ONLY_KINDS:
            return Decision(Verdict.PROPOSE, f"{kind}: tells the rule's routes, acts on nothing")
        problem = target_problem(target)
        if problem is not None:
            return Decision(Verdict.REFUSE_TARGET, problem)
        if mode is ActionMode.NOTIFY:
            return Decision(Verdict.PROPOSE, f"mode {mode}: proposed, a human acts")
        if mode is ActionMode.APPROVE and not approved:
            return Decision(Verdict.AWAIT_APPROVAL, "mode approve: waiting for a human")
        dry_run = self.config.dry_run
        if state.breaker_open and not dry_run:
            return Decision(Verdict.BREAKER_OPEN, "breaker open: automation halted until reset")
        if state.cooldown_until is not None and state.now < state.cooldown_until:
            left = state.cooldown_until - state.now
            return Decision(Verdict.COOLDOWN, f"{target} in cooldown for {kind}: {left:.0f} s left")
        limit = self.max_attempts(parameters)
        if state.attempts >= limit:
            return Decision(Verdict.MAX_ATTEMPTS, f"{state.attempts} of {limit} attempts used")
        if dry_run:
            return Decision(Verdict.DRY_RUN, f"dry run: would {kind} {target}")
        trip = self._blast_radius(str(target), state)
        if trip is not None:
            return Decision(Verdict.TRIP_BREAKER, trip)
        return Decision(Verdict.EXECUTE, f"mode {mode}{' (approved)' * approved}: {kind} {target}")

    def _blast_radius(self, target: str, state: PolicyState) -> str | None:
        c = self.config
        window = f"{c.breaker_window_seconds:.0f} s"
        if state.actions_in_window + 1 > c.breaker_max_actions:
            return (
                f"blast radius: {state.actions_in_window} actions in the last {window}, "
                f"cap {c.breaker_max_actions}"
            )
        if state.fleet_size is not None and state.fleet_size > 0:
            touched = len(state.targets_in_window | {target})
            allowed = c.breaker_max_fleet_ratio * state.fleet_size
            if touched > max(1.0, allowed):
                return (
                    f"blast radius: {touched} of {state.fleet_size} targets in the last {window}"
                    f" (cap {c.breaker_max_fleet_ratio:.0%} of the fleet)"
                )
        return None


class RemediationSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The collector configuration's ``remediation:`` section, parsed once.

    Attributes:
        policy: the policy settings (dry-run by default).
        external_url: the collector's URL as people reach it (links in alerts).
        runbook_base_url: serve rule runbooks from elsewhere (a wiki) instead.
        dashboard_base_url: Grafana's URL for dashboard links.
        approval_secret_file: the HMAC secret of approval links (else
            ``$GPUWARDEN_APPROVAL_SECRET``; without either, links are off: CLI/API approval only).
        escalation_routes: where breaker trips and escalations page.
        interval_seconds: how often the remediation pass runs.
    """

    policy: PolicyConfig = msgspec.field(default_factory=PolicyConfig)
    external_url: NonEmpty = "http://127.0.0.1:4318"
    runbook_base_url: NonEmpty | None = None
    dashboard_base_url: NonEmpty | None = None
    approval_secret_file: NonEmpty | None = None
    escalation_routes: Annotated[
        tuple[Annotated[str, msgspec.Meta(pattern=":")], ...],
        msgspec.Meta(description="a list of routes such as pagerduty:oncall"),
    ] = ()
    interval_seconds: Positive = 30.0

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str) -> RemediationSettings:
        """Parse the section found at the dotted key ``where``; errors name ``where.key``.

        Raises:
            PolicyError: with the file and key in the message.
        """
        return convert(data, RemediationSection, "", PolicyError, section=where).settings()


class RemediationSection(PolicyConfig, frozen=True, forbid_unknown_fields=True):
    """The ``remediation:`` section as written: the policy's keys and the links' side by side."""

    external_url: NonEmpty = "http://127.0.0.1:4318"
    runbook_base_url: NonEmpty | None = None
    dashboard_base_url: NonEmpty | None = None
    approval_secret_file: NonEmpty | None = None
    escalation_routes: Annotated[
        tuple[Annotated[str, msgspec.Meta(pattern=":")], ...],
        msgspec.Meta(description="a list of routes such as pagerduty:oncall"),
    ] = ()
    interval_seconds: Positive = 30.0

    def settings(self) -> RemediationSettings:
        """The section as the remediator reads it; ``settle_seconds`` adds to the defaults."""
        values = msgspec.structs.asdict(self)
        own = {name: values.pop(name) for name in RemediationSettings.__struct_fields__[1:]}
        values["settle_seconds"] = MappingProxyType({**SETTLE_SECONDS, **values["settle_seconds"]})
        return RemediationSettings(policy=PolicyConfig(**values), **own)
