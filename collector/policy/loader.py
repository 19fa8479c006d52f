"""Policy files as data: ``policies/*.yaml`` parsed once into frozen, typed policies.

Validated the way rule files are (``gpuwarden.collector.rules.rulefile``: safe YAML without
duplicate keys, a size cap, ``msgspec`` structs that reject unknown keys), with one line per
mistake naming the file, the policy and the key::

    team.yaml: policies[1] (ml-cap).cap_dollars: expected a number > 0, got -5

File format (each ``kind`` has its own keys; ``docs/policies.md`` lists them)::

    version: 1
    policies:
      - name: ml-max-gpus           # lowercase letters, digits, '-' and '_'; unique
        kind: limit                 # limit | approval | cost_cap | idle_reclaim | quiet_hours
        selector: {teams: ["ml-*"], job_kinds: [training], models: [], clusters: []}
        max_gpus_per_job: 16

A policy whose keys or types are wrong stops at that one mistake (msgspec reads the structure
first); the checks that follow (a limit without any maximum, an unknown time zone, an unknown
action kind, a duplicate name) are each reported.
"""

from __future__ import annotations

import difflib
import re
import zoneinfo
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgspec

from gpuwarden.collector.policy.model import (
    POLICY_FILE_VERSION,
    WEEKDAYS,
    ApprovalPolicy,
    CapPeriod,
    CostCapPolicy,
    IdleReclaimPolicy,
    LimitPolicy,
    OnBreach,
    Policy,
    PolicyError,
    PolicyKind,
    PolicyProblem,
    PolicySelector,
    PolicySet,
    PolicySource,
    QuietEffect,
    QuietHoursPolicy,
)
from gpuwarden.collector.rules.durations import parse_duration
from gpuwarden.collector.rules.model import MAX_FILE_BYTES, RULE_FILE_SUFFIXES
from gpuwarden.collector.rules.rulefile import InvalidError, parse_yaml, show, structure
from gpuwarden.collector.rules.vocabulary import ACTIONS

_ID_TEXT = "lowercase letters, digits, '-' and '_' (at most 63, starting with a letter or digit)"
_Name = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$", description=_ID_TEXT)]
_Text = Annotated[str, msgspec.Meta(pattern=r"\S", description="a non-empty string")]
_Gpus = Annotated[int, msgspec.Meta(ge=1, description="a whole number of GPUs >= 1")]
_Dollars = Annotated[float, msgspec.Meta(gt=0, description="a number > 0 (dollars)")]
_HOURS = re.compile(r"(\d{1,2}):(\d{2})-(\d{1,2}):(\d{2})")
_KINDS = tuple(kind.value for kind in PolicyKind)


class SelectorKeys(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    teams: tuple[_Text, ...] = ()
    jobs: tuple[_Text, ...] = ()
    job_kinds: tuple[_Text, ...] = ()
    models: tuple[_Text, ...] = ()
    clusters: tuple[_Text, ...] = ()


class _Common(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    name: _Name
    kind: str
    selector: SelectorKeys | None = None
    description: str = ""


class LimitKeys(_Common, frozen=True, forbid_unknown_fields=True, kw_only=True):
    max_gpus_per_job: _Gpus | None = None
    max_gpus_per_team: _Gpus | None = None
    max_gpus_per_model: _Gpus | None = None


class ApprovalKeys(_Common, frozen=True, forbid_unknown_fields=True, kw_only=True):
    actions: tuple[str, ...]
    price_tiers: tuple[_Text, ...] = ()
    min_cost_per_hour_dollars: _Dollars | None = None


class CostCapKeys(_Common, frozen=True, forbid_unknown_fields=True, kw_only=True):
    cap_dollars: _Dollars
    period: CapPeriod = CapPeriod.MONTH
    on_breach: OnBreach = OnBreach.NOTIFY


class IdleReclaimKeys(_Common, frozen=True, forbid_unknown_fields=True, kw_only=True):
    idle: int | float | str  # a duration: 30m, 2h, or seconds
    action: str = "requeue"


class QuietHoursKeys(_Common, frozen=True, forbid_unknown_fields=True, kw_only=True):
    timezone: _Text
    days: tuple[str, ...] = WEEKDAYS
    hours: _Text  # "22:00-06:00"
    actions: tuple[str, ...] = ()
    effect: QuietEffect = QuietEffect.DEFER


class FileKeys(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    policies: list[object]  # each policy is converted alone, so one bad policy leaves the others
    version: int = POLICY_FILE_VERSION


_KEYS: dict[PolicyKind, type[_Common]] = {
    PolicyKind.LIMIT: LimitKeys,
    PolicyKind.APPROVAL: ApprovalKeys,
    PolicyKind.COST_CAP: CostCapKeys,
    PolicyKind.IDLE_RECLAIM: IdleReclaimKeys,
    PolicyKind.QUIET_HOURS: QuietHoursKeys,
}
RECLAIM_ACTIONS = ("requeue", "notify")
"""What an idle reclaim may do: requeue the job (frees its GPUs) or only tell its team."""


def _unknown(what: str, value: object, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(value), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {show(value)}{hint} (known: {', '.join(known)})"


def _action_kinds(kinds: tuple[str, ...], key: str, found: list[InvalidError]) -> None:
    for i, kind in enumerate(kinds):
        if kind not in ACTIONS:
            found.append(InvalidError(f"{key}[{i}]", _unknown("action kind", kind, tuple(ACTIONS))))


class _Head(TypedDict):
    name: str
    selector: PolicySelector
    description: str
    source: PolicySource


def _head(keys: _Common, source: PolicySource) -> _Head:
    """The keys every kind has, as the policy holds them."""
    selector = PolicySelector(**msgspec.structs.asdict(keys.selector or SelectorKeys()))
    return _Head(
        name=keys.name, selector=selector, description=keys.description.strip(), source=source
    )


def _minute(hours: str, minutes: str) -> int | None:
    h, m = int(hours), int(minutes)
    return h * 60 + m if (h < 24 and m < 60) or (h == 24 and m == 0) else None


def _limit(keys: LimitKeys, found: list[InvalidError], source: PolicySource) -> Policy:
    if (keys.max_gpus_per_job, keys.max_gpus_per_team, keys.max_gpus_per_model) == (None,) * 3:
        found.append(
            InvalidError(
                "", "a limit needs max_gpus_per_job, max_gpus_per_team or max_gpus_per_model"
            )
        )
    return LimitPolicy(
        max_gpus_per_job=keys.max_gpus_per_job,
        max_gpus_per_team=keys.max_gpus_per_team,
        max_gpus_per_model=keys.max_gpus_per_model,
        **_head(keys, source),
    )


def _approval(keys: ApprovalKeys, found: list[InvalidError], source: PolicySource) -> Policy:
    if not keys.actions:
        found.append(InvalidError("actions", "name at least one action kind"))
    _action_kinds(keys.actions, "actions", found)
    return ApprovalPolicy(
        actions=keys.actions,
        price_tiers=keys.price_tiers,
        min_cost_per_hour_dollars=keys.min_cost_per_hour_dollars,
        **_head(keys, source),
    )


def _cost_cap(keys: CostCapKeys, found: list[InvalidError], source: PolicySource) -> Policy:
    del found  # every key of a cost cap is checked by its type
    return CostCapPolicy(
        cap_dollars=keys.cap_dollars,
        period=keys.period,
        on_breach=keys.on_breach,
        **_head(keys, source),
    )


def _idle_reclaim(keys: IdleReclaimKeys, found: list[InvalidError], source: PolicySource) -> Policy:
    seconds = 0.0
    try:
        seconds = parse_duration(keys.idle)
    except ValueError as exc:
        found.append(InvalidError("idle", str(exc)))
    else:
        if seconds <= 0:
            found.append(InvalidError("idle", f"must be longer than 0 (got {show(keys.idle)})"))
    if keys.action not in RECLAIM_ACTIONS:
        found.append(
            InvalidError("action", _unknown("reclaim action", keys.action, RECLAIM_ACTIONS))
        )
    return IdleReclaimPolicy(idle_seconds=seconds, action=keys.action, **_head(keys, source))


def _quiet_hours(keys: QuietHoursKeys, found: list[InvalidError], source: PolicySource) -> Policy:
    try:
        zoneinfo.ZoneInfo(keys.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        found.append(InvalidError("timezone", f"unknown time zone {show(keys.timezone)}"))
    days = []
    for i, day in enumerate(keys.days):
        if day.lower() in WEEKDAYS:
            days.append(WEEKDAYS.index(day.lower()))
        else:
            found.append(InvalidError(f"days[{i}]", _unknown("day", day, WEEKDAYS)))
    start = end = None
    if match := _HOURS.fullmatch(keys.hours.strip()):
        start, end = _minute(match[1], match[2]), _minute(match[3], match[4])
    if start is None or end is None or start == end:
        message = f"expected a window HH:MM-HH:MM such as 22:00-06:00, got {show(keys.hours)}"
        found.append(InvalidError("hours", message))
    _action_kinds(keys.actions, "actions", found)
    return QuietHoursPolicy(
        timezone=keys.timezone,
        days=tuple(sorted(set(days))),
        start_minute=start or 0,
        end_minute=end or 0,
        actions=keys.actions,
        effect=keys.effect,
        **_head(keys, source),
    )


_Build = Callable[[Any, list[InvalidError], PolicySource], Policy]
"""Builds one kind's policy from its keys (a struct of that kind), adding what is wrong."""
_BUILD: dict[PolicyKind, _Build] = {
    PolicyKind.LIMIT: _limit,
    PolicyKind.APPROVAL: _approval,
    PolicyKind.COST_CAP: _cost_cap,
    PolicyKind.IDLE_RECLAIM: _idle_reclaim,
    PolicyKind.QUIET_HOURS: _quiet_hours,
}


def _policy(raw: object, source: PolicySource) -> Policy | list[InvalidError]:
    """The policy, or every independent problem of it (one when its keys or types are wrong)."""
    if not isinstance(raw, dict):
        return [InvalidError("", f"expected a mapping, got {show(raw)}")]
    kind_text = raw.get("kind")
    if kind_text is None:
        return [InvalidError("kind", f"required ({', '.join(_KINDS)})")]
    if kind_text not in _KINDS:
        return [InvalidError("kind", _unknown("policy kind", kind_text, _KINDS))]
    kind = PolicyKind(kind_text)
    try:
        keys = structure(raw, _KEYS[kind])
    except InvalidError as exc:
        return [exc]
    found: list[InvalidError] = []
    policy = _BUILD[kind](keys, found, source)
    return found or policy


def _read(path: Path) -> list[object]:
    """The ``policies`` list of one file; ``InvalidError`` keys are file-level."""
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InvalidError("", f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise InvalidError("", f"larger than {MAX_FILE_BYTES} bytes; split the policy set")
    top = parse_yaml(data)
    if top is None:
        raise InvalidError("", "empty file: expected a mapping with a 'policies' list")
    keys = structure(top, FileKeys)
    if keys.version != POLICY_FILE_VERSION:
        raise InvalidError("version", f"unsupported version {keys.version} (supported: 1)")
    return keys.policies


def policy_files(paths: Sequence[Path]) -> tuple[list[Path], list[PolicyProblem]]:
    """Expand folders to their ``*.yaml``/``*.yml`` files (not recursive), in name order."""
    files: list[Path] = []
    problems: list[PolicyProblem] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in RULE_FILE_SUFFIXES)
            if not found:
                problems.append(PolicyProblem(str(path), "", "no *.yaml or *.yml policy files"))
            files.extend(p for p in found if p.is_file())
        elif path.is_file():
            files.append(path)
        else:
            problems.append(PolicyProblem(str(path), "", "no such file or folder"))
    return files, problems


def load_policies(paths: Sequence[Path], *, skip_bad: bool = False) -> PolicySet:
    """Load and validate policy files (folders stand for the policy files directly in them).

    Args:
        paths: policy files or folders.
        skip_bad: load what is valid and return the rest as ``problems`` instead of raising.

    Raises:
        PolicyError: without ``skip_bad``, at the first problem.
    """
    files, problems = policy_files(paths)
    if problems and not skip_bad:
        raise PolicyError(problems[0])
    policies: list[Policy] = []
    seen: dict[str, PolicySource] = {}

    def bad(problem: PolicyProblem) -> None:
        if not skip_bad:
            raise PolicyError(problem)
        problems.append(problem)

    for path in files:
        name = str(path)
        try:
            raws = _read(path)
        except InvalidError as exc:
            bad(PolicyProblem(name, exc.key, exc.message))
            continue
        for index, raw in enumerate(raws):
            raw_name = raw.get("name") if isinstance(raw, dict) else None
            shown = raw_name if isinstance(raw_name, str) else None
            source = PolicySource(name, index)
            found = _policy(raw, source)
            errors = found if isinstance(found, list) else []
            if shown is not None and shown in seen:
                first = seen[shown]
                errors = [
                    InvalidError("name", f"duplicate policy name, first defined in {first}"),
                    *errors,
                ]
            elif shown is not None:
                seen[shown] = source
            for error in errors:
                bad(PolicyProblem(name, error.key, error.message, index, shown))
            if not errors and not isinstance(found, list):
                policies.append(found)
    return PolicySet(tuple(policies), tuple(problems))
