"""Detection rules as data: ``rules/*.yaml`` parsed once into frozen, typed objects.

A rule names a detector from one vocabulary (the detect package's catalog: each detector's
parameters with type, default and range, and the selector fields it honours), the series it
watches (a ``Selector``: a field its detector does not honour is an error), what to do about a
finding (actions from a second vocabulary, ``ACTIONS``, each ``auto``, ``approve`` or ``notify``)
and whom to tell (routes such as ``slack:#gpu-alerts``). Everything is checked at load time, so
nothing downstream ever sees an unknown key or a value out of range; an error names the file, the
rule and the key::

    team.yaml: rules[2] (idle-gpu).parameters.window_seconds: must be between 1m and 1w (got 10)

``load_rule_files`` either raises on the first error (the collector's default: refuse to start) or,
with ``skip_bad``, loads the good rules and returns the problems of the bad ones as ``RuleProblem``
objects: every independent problem of a rule (each parameter, selector field, action, route and
the runbook), except that a rule whose keys or types are wrong stops at that one (the file
structure is read first, and without it nothing else can be judged).

File format::

    version: 1            # optional; the only version so far
    rules:
      - id: idle-gpu      # lowercase letters, digits, '-' and '_'; unique across all files
        detector: idle_gpu
        selector: {teams: ["ml-*"], labels: {cluster: a100}}
        parameters: {window_seconds: 30m, utilization_below: 0.05}
        severity: warning # info | warning | critical | page
        owner: ml-platform
        runbook: idle-gpu.md                    # relative to the runbooks folder
        actions: [{kind: requeue, mode: approve}]
        routes: ["slack:#gpu-waste"]

Durations (parameters ending in ``_seconds``) take a number of seconds or ``90s``, ``30m``,
``1h30m``, ``7d``, ``2w``. The file's keys and types are read by ``rulefile`` (safe YAML,
``msgspec`` structs); what depends on the detector or action is checked here, against the two
vocabularies.
"""

from __future__ import annotations

import difflib
import importlib.resources
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import cast

import msgspec

from gpuwarden.collector.rules.durations import format_duration, format_number, parse_duration
from gpuwarden.collector.rules.model import (
    RULE_FILE_SUFFIXES,
    ActionSpec,
    DetectorSpec,
    ParamSpec,
    ParamValue,
    Rule,
    RuleError,
    RuleProblem,
    RuleSet,
    RuleSource,
    Selector,
)
from gpuwarden.collector.rules.rulefile import (
    ActionKeys,
    InvalidError,
    RuleKeys,
    SelectorKeys,
    read_rules,
    structure,
)
from gpuwarden.collector.rules.rulefile import show as _show
from gpuwarden.collector.rules.vocabulary import ACTIONS, ROUTE_SCHEMES

_ROUTE = re.compile(r"([a-z]+):(\S+)")


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _unknown(what: str, value: object, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(value), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {_show(value)}{hint} (known: {', '.join(known)})"


def _bounds(spec: ParamSpec, show: Callable[[float], str]) -> str:
    low, high = spec.minimum, spec.maximum
    if low is not None and high is not None:
        return f"between {show(low)} and {show(high)}"
    return f"at least {show(low)}" if low is not None else f"at most {show(high or 0.0)}"


def _scalar(spec: ParamSpec, value: object, key: str) -> bool | int | float | str:
    """One value (or list element) of ``spec``'s type, range and choices."""
    base = spec.type.removeprefix("list[").removesuffix("]")
    if base == "bool":
        if not isinstance(value, bool):
            raise InvalidError(key, f"expected true or false, got {_show(value)}")
        return value
    if base == "str":
        if not isinstance(value, str) or not value.strip():
            raise InvalidError(key, f"expected a non-empty string, got {_show(value)}")
        if spec.choices and value not in spec.choices:
            raise InvalidError(key, _unknown("value", value, spec.choices))
        return value
    number: float
    if base == "duration":
        try:
            number = parse_duration(value)
        except ValueError as exc:
            raise InvalidError(key, str(exc)) from None
    elif base == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidError(key, f"expected an integer, got {_show(value)}")
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidError(key, f"expected a number, got {_show(value)}")
    else:
        number = value
    if not math.isfinite(number):
        raise InvalidError(key, f"expected a finite number, got {_show(value)}")
    low, high = spec.minimum, spec.maximum
    if (low is not None and number < low) or (high is not None and number > high):
        show = format_duration if base == "duration" else format_number
        raise InvalidError(key, f"must be {_bounds(spec, show)} (got {_show(value)})")
    return float(number) if base in ("float", "duration") else number


class _Problems:
    """The independent problems of one rule, in the order the loader meets them."""

    def __init__(self) -> None:
        self.found: list[InvalidError] = []

    def add(self, key: str, message: str) -> None:
        self.found.append(InvalidError(key, message))

    def scalar(self, spec: ParamSpec, value: object, key: str) -> ParamValue | None:
        try:
            return _scalar(spec, value, key)
        except InvalidError as exc:
            self.found.append(exc)
            return None


def _params(
    given: Mapping[str, object] | None,
    key: str,
    table: Mapping[str, ParamSpec],
    owner: str,
    problems: _Problems,
) -> Mapping[str, ParamValue] | None:
    """The parameters with defaults filled in; ``None`` when any is wrong (each one reported)."""
    before = len(problems.found)
    out: dict[str, ParamValue] = {}
    for name, value in (given or {}).items():
        spec = table.get(name)
        if spec is None:
            known = tuple(table) or ("(none)",)
            problems.add(_join(key, name), _unknown(f"parameter of {owner}", name, known))
        elif spec.type.startswith("list["):
            if not isinstance(value, list):
                problems.add(_join(key, name), f"expected a list, got {_show(value)}")
                continue
            items = [
                problems.scalar(spec, v, f"{_join(key, name)}[{i}]") for i, v in enumerate(value)
            ]
            out[name] = cast("ParamValue", tuple(items))
        elif (one := problems.scalar(spec, value, _join(key, name))) is not None:
            out[name] = one
    for name, spec in table.items():
        if name not in out and name not in (given or {}):
            if spec.default is None:
                problems.add(_join(key, name), f"required by {owner}")
            else:
                out[name] = spec.default
    return MappingProxyType(out) if len(problems.found) == before else None


def _selector(keys: SelectorKeys, detector: DetectorSpec, problems: _Problems) -> Selector:
    fields = msgspec.structs.asdict(keys)
    for name, value in fields.items():
        if value and name not in detector.selector:
            honoured = ", ".join(k for k in fields if k in detector.selector) or "none"
            problems.add(
                f"selector.{name}",
                f"detector {detector.name} does not honour this field (it honours: {honoured})",
            )
    for name in detector.requires:
        if not fields[name]:
            problems.add(f"selector.{name}", f"detector {detector.name} needs at least one entry")
    return Selector(**{**fields, "labels": MappingProxyType(keys.labels)})


def _runbook(name: str, runbooks_dir: Path | None, problems: _Problems) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or path.suffix != ".md":
        problems.add("runbook", f"{_show(name)}: expected a .md path inside the runbooks folder")
    elif runbooks_dir is not None and not (runbooks_dir / path).is_file():
        problems.add("runbook", f"no such runbook: {runbooks_dir / path}")
    return name


def _actions(
    given: Sequence[ActionKeys], detector: DetectorSpec | None, problems: _Problems
) -> tuple[ActionSpec, ...]:
    """The rule's actions; each one is checked on its own (``detector`` ``None``: unknown, so
    whether an action fits its findings cannot be judged)."""
    actions = []
    for i, action in enumerate(given):
        key = f"actions[{i}]"
        spec = ACTIONS.get(action.kind)
        if spec is None:
            problems.add(f"{key}.kind", _unknown("action kind", action.kind, tuple(ACTIONS)))
            continue
        if (
            detector is not None
            and spec.target is not None
            and spec.target not in detector.subjects
        ):
            finds = " or ".join(detector.subjects)
            message = f"{spec.kind} acts on a {spec.target}; {detector.name} finds {finds} problems"
            problems.add(f"{key}.kind", message)
        params = _params(
            action.parameters, f"{key}.parameters", spec.parameters, spec.kind, problems
        )
        if params is not None:
            actions.append(ActionSpec(spec.kind, action.mode, params))
    return tuple(actions)


def _routes(routes: tuple[str, ...], problems: _Problems) -> tuple[str, ...]:
    for i, route in enumerate(routes):
        match = _ROUTE.fullmatch(route)
        if match is None:
            problems.add(f"routes[{i}]", f"{_show(route)}: expected <scheme>:<target>")
        elif match.group(1) not in ROUTE_SCHEMES:
            problems.add(
                f"routes[{i}]", _unknown("route scheme", match.group(1), tuple(ROUTE_SCHEMES))
            )
    return routes


def _rule(
    keys: RuleKeys,
    source: RuleSource,
    runbooks_dir: Path | None,
    detectors: Mapping[str, DetectorSpec],
) -> Rule | list[InvalidError]:
    """The rule, or every independent problem of it.

    What depends on the detector (selector fields, parameters and their cross-check) is checked
    only when the detector is known; the cross-check only when every parameter is valid. The
    runbook, the actions (each on its own) and the routes are checked whatever else is wrong.
    """
    problems = _Problems()
    detector = detectors.get(keys.detector)
    selector, parameters = Selector(), None
    if detector is None:
        problems.add("detector", _unknown("detector", keys.detector, tuple(detectors)))
    else:
        selector = _selector(keys.selector or SelectorKeys(), detector, problems)
        parameters = _params(
            keys.parameters, "parameters", detector.parameters, detector.name, problems
        )
        if (
            parameters is not None
            and detector.check is not None
            and (wrong := detector.check(parameters)) is not None
        ):
            problems.add(f"parameters.{wrong[0]}", wrong[1])
    runbook = _runbook(keys.runbook, runbooks_dir, problems)
    actions = _actions(keys.actions or (), detector, problems)
    routes = _routes(keys.routes or (), problems)
    if problems.found or detector is None or parameters is None:
        return problems.found
    return Rule(
        id=keys.id,
        detector=detector.name,
        selector=selector,
        parameters=parameters,
        severity=keys.severity,
        owner=keys.owner,
        runbook=runbook,
        actions=actions,
        routes=routes,
        description=keys.description.strip(),
        enabled=keys.enabled,
        source=source,
    )


def rule_files(paths: Sequence[Path]) -> tuple[list[Path], list[RuleProblem]]:
    """Expand folders to their ``*.yaml``/``*.yml`` files (not recursive), in name order."""
    files: list[Path] = []
    problems: list[RuleProblem] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in RULE_FILE_SUFFIXES)
            if not found:
                problems.append(RuleProblem(str(path), "", "no *.yaml or *.yml rule files"))
            files.extend(p for p in found if p.is_file())
        elif path.is_file():
            files.append(path)
        else:
            problems.append(RuleProblem(str(path), "", "no such file or folder"))
    return files, problems


def load_rule_files(
    paths: Sequence[Path],
    *,
    detectors: Mapping[str, DetectorSpec],
    runbooks_dir: Path | None,
    skip_bad: bool = False,
) -> RuleSet:
    """Load and validate rule files (folders stand for the rule files directly in them).

    Args:
        paths: rule files or folders.
        detectors: the detector vocabulary, by name (the detect package's catalog).
        runbooks_dir: where ``runbook`` paths must exist; ``None`` checks only their form.
        skip_bad: load what is valid and return the rest as ``problems`` instead of raising.

    Raises:
        RuleError: without ``skip_bad``, at the first problem.
    """
    files, problems = rule_files(paths)
    if problems and not skip_bad:
        raise RuleError(problems[0])
    rules: list[Rule] = []
    seen: dict[str, RuleSource] = {}

    def bad(problem: RuleProblem) -> None:
        if not skip_bad:
            raise RuleError(problem)
        problems.append(problem)

    for path in files:
        name = str(path)
        try:
            raws = read_rules(path)
        except InvalidError as exc:
            bad(RuleProblem(name, exc.key, exc.message))
            continue
        for index, raw in enumerate(raws):
            raw_id = raw.get("id") if isinstance(raw, dict) else None
            rule_id = raw_id if isinstance(raw_id, str) else None
            try:
                # msgspec stops at the first key of the wrong type or name: one problem then.
                keys = structure(raw, RuleKeys)
            except InvalidError as exc:
                bad(RuleProblem(name, exc.key, exc.message, index, rule_id))
                continue
            source = RuleSource(name, index)
            found = _rule(keys, source, runbooks_dir, detectors)
            errors = found if isinstance(found, list) else []
            if keys.id in seen:
                first = seen[keys.id]
                errors = [
                    InvalidError("id", f"duplicate rule id, first defined in {first}"),
                    *errors,
                ]
            else:
                seen[keys.id] = source
            for error in errors:
                bad(RuleProblem(name, error.key, error.message, index, rule_id))
            if not errors and isinstance(found, Rule):
                rules.append(found)
    return RuleSet(tuple(rules), tuple(problems))


def _package_dir(package: str) -> Path:
    root = importlib.resources.files(package)
    if not isinstance(root, Path):  # a zip import: rules must be real files to be edited
        raise RuntimeError(f"{package} is not installed as a folder: {root}")
    return root


def default_rules_dir() -> Path:
    """The packaged default rules (``rules/`` in the source tree)."""
    return _package_dir("gpuwarden.rules")


def default_runbooks_dir() -> Path:
    """The packaged runbooks (``runbooks/`` in the source tree)."""
    return _package_dir("gpuwarden.runbooks")
