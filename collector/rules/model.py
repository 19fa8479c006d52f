"""The typed rule: severities, action modes, parameter specs, selectors, rules and rule sets."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Final

MAX_FILE_BYTES: Final = 1024 * 1024
"""Rule files larger than this are refused (a rule set is kilobytes; this bounds YAML bombs)."""
RULE_FILE_SUFFIXES: Final = (".yaml", ".yml")
FILE_VERSION: Final = 1


class Severity(StrEnum):
    """How loud a finding is: ``page`` wakes someone up."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"
    PAGE = "page"


class ActionMode(StrEnum):
    """Who decides: ``auto`` acts, ``approve`` waits for a human, ``notify`` only proposes."""

    AUTO = "auto"
    APPROVE = "approve"
    NOTIFY = "notify"


class Subject(StrEnum):
    """What a detector's finding is about, and what an action acts on."""

    JOB = "job"
    NODE = "node"
    DEPLOYMENT = "deployment"
    BUDGET = "budget"  # a team's or project's monthly budget (``team:nlp``)


class ParamType(StrEnum):
    """Value types of detector and action parameters."""

    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    STR = "str"
    DURATION = "duration"
    INT_LIST = "list[int]"
    FLOAT_LIST = "list[float]"
    STR_LIST = "list[str]"
    DURATION_LIST = "list[duration]"


ParamValue = bool | int | float | str | tuple[int, ...] | tuple[float, ...] | tuple[str, ...]
"""A parameter after loading: durations are float seconds, lists are tuples."""


SELECTOR_FIELDS: Final = ("metrics", "teams", "jobs", "models", "nodes", "labels")
"""Every selector field, in the order errors and docs list them."""


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter: type, default (``None``: required), inclusive range, description.

    For lists, ``minimum``/``maximum``/``choices`` apply to each element.
    """

    type: ParamType
    default: ParamValue | None
    minimum: float | None
    maximum: float | None
    description: str
    choices: tuple[str, ...] = ()


CrossCheck = Callable[[Mapping[str, ParamValue]], tuple[str, str] | None]
"""Checks parameters against each other; returns ``(parameter, what is wrong)`` or ``None``."""


@dataclass(frozen=True, slots=True)
class DetectorSpec:
    """A detector in the vocabulary: what it finds, about what, from which signals, with what."""

    name: str
    description: str
    subjects: tuple[Subject, ...]
    signals: tuple[str, ...]
    """Metrics it reads when the selector names none (empty: scheduler events, not metrics)."""
    parameters: Mapping[str, ParamSpec]
    requires: tuple[str, ...] = ()
    """Selector fields that must not be empty (the detector cannot guess which series)."""
    check: CrossCheck | None = None
    selector: frozenset[str] = frozenset()
    """Selector fields the detector honours; a rule that sets any other one does not load."""


@dataclass(frozen=True, slots=True)
class ActionKindSpec:
    """An action in the vocabulary; ``target`` ``None`` means it fits any finding."""

    kind: str
    description: str
    target: Subject | None
    parameters: Mapping[str, ParamSpec]


@dataclass(frozen=True, slots=True)
class Selector:
    """Which series a rule watches. Empty fields match everything.

    ``metrics`` are exact metric names; ``teams``, ``jobs``, ``models`` and ``nodes`` are
    case-sensitive glob patterns (``ml-*``); ``labels`` must all match exactly.
    """

    metrics: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()
    jobs: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def matches(
        self,
        *,
        team: str | None = None,
        job: str | None = None,
        model: str | None = None,
        node: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> bool:
        """Whether a subject with these facts is selected (a missing fact fails a pattern)."""
        for patterns, value in (
            (self.teams, team),
            (self.jobs, job),
            (self.models, model),
            (self.nodes, node),
        ):
            if patterns and (
                value is None or not any(fnmatch.fnmatchcase(value, p) for p in patterns)
            ):
                return False
        given = labels or {}
        return all(given.get(key) == value for key, value in self.labels.items())


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One action of a rule: kind (``ACTIONS``), mode, parameters with defaults filled in."""

    kind: str
    mode: ActionMode
    parameters: Mapping[str, ParamValue] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class RuleSource:
    """Where a rule was defined: file and position in its ``rules`` list."""

    file: str
    index: int

    def __str__(self) -> str:
        return f"{self.file} rules[{self.index}]"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """A validated rule; ``parameters`` holds every parameter of its detector (defaults filled)."""

    id: str
    detector: str
    selector: Selector
    parameters: Mapping[str, ParamValue]
    severity: Severity
    owner: str
    runbook: str
    actions: tuple[ActionSpec, ...] = ()
    routes: tuple[str, ...] = ()
    description: str = ""
    enabled: bool = True
    source: RuleSource = RuleSource("<inline>", 0)


@dataclass(frozen=True, slots=True)
class RuleProblem:
    """A file or rule that did not load. ``key`` is relative to the rule when ``index`` is set."""

    file: str
    key: str
    message: str
    index: int | None = None
    rule_id: str | None = None

    def __str__(self) -> str:
        where = self.file
        if self.index is not None:
            where += f": rules[{self.index}] ({self.rule_id or '?'})"
            return f"{where}.{self.key}: {self.message}" if self.key else f"{where}: {self.message}"
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class RuleError(ValueError):
    """A rules file is broken; ``str()`` names the file, rule and key."""

    def __init__(self, problem: RuleProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The rules that loaded and, with ``skip_bad``, the problems of those that did not."""

    rules: tuple[Rule, ...]
    problems: tuple[RuleProblem, ...] = ()

    def get(self, rule_id: str) -> Rule | None:
        """The rule with this id, or ``None``."""
        return next((rule for rule in self.rules if rule.id == rule_id), None)

    def enabled(self) -> tuple[Rule, ...]:
        """The rules to run."""
        return tuple(rule for rule in self.rules if rule.enabled)
