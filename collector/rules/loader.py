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
with ``skip_bad``, loads the good rules and returns the bad ones as ``RuleProblem`` objects.

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


def _params(
    given: Mapping[str, object] | None, key: str, table: Mapping[str, ParamSpec], owner: str
) -> Mapping[str, ParamValue]:
    out: dict[str, ParamValue] = {}
    for name, value in (given or {}).items():
        spec = table.get(name)
        if spec is None:
            known = tuple(table) or ("(none)",)
            raise InvalidError(_join(key, name), _unknown(f"parameter of {owner}", name, known))
        if spec.type.startswith("list["):
            if not isinstance(value, list):
                raise InvalidError(_join(key, name), f"expected a list, got {_show(value)}")
            items = [_scalar(spec, v, f"{_join(key, name)}[{i}]") for i, v in enumerate(value)]
            out[name] = cast("ParamValue", tuple(items))
        else:
            out[name] = _scalar(spec, value, _join(key, name))
    for name, spec in table.items():
        if name not in out:
            if spec.default is None:
                raise InvalidError(_join(key, name), f"required by {owner}")
            out[name] = spec.default
    return MappingProxyType(out)


def _selector(keys: SelectorKeys, detector: DetectorSpec) -> Selector:
    fields = msgspec.structs.asdict(keys)
    for name, value in fields.items():
        if value and name not in detector.selector:
            honoured = ", ".join(k for k in fields if k in detector.selector) or "none"
            raise InvalidError(
                f"selector.{name}",
                f"detector {detector.name} does not honour this field (it honours: {honoured})",
            )
    for name in detector.requires:
        if not fields[name]:
            raise InvalidError(
                f"selector.{name}", f"detector {detector.name} needs at least one entry"
            )
    return Selector(**{**fields, "labels": MappingProxyType(keys.labels)})


def _runbook(name: str, runbooks_dir: Path | None) -> str:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or path.suffix != ".md":
        raise InvalidError(
            "runbook", f"{_show(name)}: expected a .md path inside the runbooks folder"
        )
    if runbooks_dir is not None and not (runbooks_dir / path).is_file():
        raise InvalidError("runbook", f"no such runbook: {runbooks_dir / path}")
    return name


def _actions(given: Sequence[ActionKeys], detector: DetectorSpec) -> tuple[ActionSpec, ...]:
    actions = []
    for i, action in enumerate(given):
        key = f"actions[{i}]"
        spec = ACTIONS.get(action.kind)
        if spec is None:
            raise InvalidError(f"{key}.kind", _unknown("action kind", action.kind, tuple(ACTIONS)))
        if spec.target is not None and spec.target not in detector.subjects:
            finds = " or ".join(detector.subjects)
            message = f"{spec.kind} acts on a {spec.target}; {detector.name} finds {finds} problems"
            raise InvalidError(f"{key}.kind", message)
        params = _params(action.parameters, f"{key}.parameters", spec.parameters, spec.kind)
        actions.append(ActionSpec(spec.kind, action.mode, params))
    return tuple(actions)


def _routes(routes: tuple[str, ...]) -> tuple[str, ...]:
    for i, route in enumerate(routes):
        match = _ROUTE.fullmatch(route)
        if match is None:
            raise InvalidError(f"routes[{i}]", f"{_show(route)}: expected <scheme>:<target>")
        if match.group(1) not in ROUTE_SCHEMES:
            message = _unknown("route scheme", match.group(1), tuple(ROUTE_SCHEMES))
            raise InvalidError(f"routes[{i}]", message)
    return routes


def _rule(
    raw: object,
    source: RuleSource,
    runbooks_dir: Path | None,
    detectors: Mapping[str, DetectorSpec],
) -> Rule:
    keys = structure(raw, RuleKeys)
    detector = detectors.get(keys.detector)
    if detector is None:
        raise InvalidError("detector", _unknown("detector", keys.detector, tuple(detectors)))
    selector = _selector(keys.selector or SelectorKeys(), detector)
    parameters = _params(keys.parameters, "parameters", detector.parameters, detector.name)
    if detector.check is not None and (wrong := detector.check(parameters)) is not None:
        raise InvalidError(f"parameters.{wrong[0]}", wrong[1])
    return Rule(
        id=keys.id,
        detector=detector.name,
        selector=selector,
        parameters=parameters,
        severity=keys.severity,
        owner=keys.owner,
        runbook=_runbook(keys.runbook, runbooks_dir),
        actions=_actions(keys.actions or (), detector),
        routes=_routes(keys.routes or ()),
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
                rule = _rule(raw, RuleSource(name, index), runbooks_dir, detectors)
                if rule.id in seen:
                    raise InvalidError("id", f"duplicate rule id, first defined in {seen[rule.id]}")
            except InvalidError as exc:
                bad(RuleProblem(name, exc.key, exc.message, index, rule_id))
                continue
            seen[rule.id] = rule.source
            rules.append(rule)
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
