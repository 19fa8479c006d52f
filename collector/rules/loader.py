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
``1h30m``, ``7d``, ``2w``. Files are read with a ``yaml.SafeLoader`` subclass that also refuses
duplicate keys (plain YAML keeps the last one silently), and are capped at ``MAX_FILE_BYTES``.
"""

from __future__ import annotations

import difflib
import importlib.resources
import math
import re
import reprlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any, cast

import yaml

from gpuwarden.collector.rules.durations import format_duration, format_number, parse_duration
from gpuwarden.collector.rules.model import (
    FILE_VERSION,
    MAX_FILE_BYTES,
    RULE_FILE_SUFFIXES,
    ActionMode,
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
    Severity,
)
from gpuwarden.collector.rules.vocabulary import ACTIONS, ROUTE_SCHEMES

# --- loading -------------------------------------------------------------------------------------

_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_ID_TEXT = "lowercase letters, digits, '-' and '_' (at most 63, starting with a letter or digit)"
_METRIC = re.compile(r"[A-Za-z_][A-Za-z0-9_.:]*")
_METRIC_TEXT = "a metric name: letters, digits, '_', '.' and ':'"
_ROUTE = re.compile(r"([a-z]+):(\S+)")
_FILE_KEYS = ("rules", "version")
_RULE_KEYS = (
    "id",
    "detector",
    "selector",
    "parameters",
    "severity",
    "owner",
    "runbook",
    "actions",
    "routes",
    "description",
    "enabled",
)
_SELECTOR_KEYS = ("metrics", "teams", "jobs", "models", "nodes", "labels")
_ACTION_KEYS = ("kind", "mode", "parameters")
_repr = reprlib.Repr()  # Python 3.11's Repr takes no arguments
_repr.maxstring = _repr.maxother = 60
_show = _repr.repr  # bounded: an aliased YAML structure cannot blow up an error message


class _InvalidError(Exception):
    """One thing wrong at ``key`` (a dotted path, relative to the rule or file)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key, self.message = key, message


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _unknown(what: str, value: object, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(value), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {_show(value)}{hint} (known: {', '.join(known)})"


def _mapping(value: object, key: str, known: Sequence[str] | None) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _InvalidError(key, f"expected a mapping, got {_show(value)}")
    for name in value:
        if not isinstance(name, str):
            raise _InvalidError(key, f"keys must be strings, got {_show(name)}")
        if known is not None and name not in known:
            raise _InvalidError(_join(key, name), _unknown("key", name, known))
    return value


def _string(value: object, key: str, pattern: tuple[re.Pattern[str], str] | None = None) -> str:
    """A non-empty string; ``pattern`` is a regex and what it means in words."""
    if not isinstance(value, str) or not value.strip():
        raise _InvalidError(key, f"expected a non-empty string, got {_show(value)}")
    if pattern is not None and not pattern[0].fullmatch(value):
        raise _InvalidError(key, f"{_show(value)}: expected {pattern[1]}")
    return value


def _strings(
    value: object, key: str, pattern: tuple[re.Pattern[str], str] | None = None
) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _InvalidError(key, f"expected a list of strings, got {_show(value)}")
    return tuple(_string(item, f"{key}[{i}]", pattern) for i, item in enumerate(value))


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
            raise _InvalidError(key, f"expected true or false, got {_show(value)}")
        return value
    if base == "str":
        text = _string(value, key)
        if spec.choices and text not in spec.choices:
            raise _InvalidError(key, _unknown("value", text, spec.choices))
        return text
    number: float
    if base == "duration":
        try:
            number = parse_duration(value)
        except ValueError as exc:
            raise _InvalidError(key, str(exc)) from None
    elif base == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise _InvalidError(key, f"expected an integer, got {_show(value)}")
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise _InvalidError(key, f"expected a number, got {_show(value)}")
    else:
        number = value
    if not math.isfinite(number):
        raise _InvalidError(key, f"expected a finite number, got {_show(value)}")
    low, high = spec.minimum, spec.maximum
    if (low is not None and number < low) or (high is not None and number > high):
        show = format_duration if base == "duration" else format_number
        raise _InvalidError(key, f"must be {_bounds(spec, show)} (got {_show(value)})")
    return float(number) if base in ("float", "duration") else number


def _params(
    raw: object, key: str, table: Mapping[str, ParamSpec], owner: str
) -> Mapping[str, ParamValue]:
    given = _mapping(raw if raw is not None else {}, key, None)
    out: dict[str, ParamValue] = {}
    for name, value in given.items():
        spec = table.get(name)
        if spec is None:
            known = tuple(table) or ("(none)",)
            raise _InvalidError(_join(key, name), _unknown(f"parameter of {owner}", name, known))
        if spec.type.startswith("list["):
            if not isinstance(value, list):
                raise _InvalidError(_join(key, name), f"expected a list, got {_show(value)}")
            items = [_scalar(spec, v, f"{_join(key, name)}[{i}]") for i, v in enumerate(value)]
            out[name] = cast("ParamValue", tuple(items))
        else:
            out[name] = _scalar(spec, value, _join(key, name))
    for name, spec in table.items():
        if name not in out:
            if spec.default is None:
                raise _InvalidError(_join(key, name), f"required by {owner}")
            out[name] = spec.default
    return MappingProxyType(out)


def _selector(raw: object, detector: DetectorSpec) -> Selector:
    data = _mapping(raw if raw is not None else {}, "selector", _SELECTOR_KEYS)
    fields: dict[str, Any] = {}
    for name in _SELECTOR_KEYS[:-1]:
        if name in data:
            pattern = (_METRIC, _METRIC_TEXT) if name == "metrics" else None
            fields[name] = _strings(data[name], f"selector.{name}", pattern)
    labels = _mapping(data.get("labels", {}), "selector.labels", None)
    fields["labels"] = MappingProxyType(
        {k: _string(v, f"selector.labels.{k}") for k, v in labels.items()}
    )
    for name in _SELECTOR_KEYS:
        if fields.get(name) and name not in detector.selector:
            honoured = ", ".join(k for k in _SELECTOR_KEYS if k in detector.selector) or "none"
            raise _InvalidError(
                f"selector.{name}",
                f"detector {detector.name} does not honour this field (it honours: {honoured})",
            )
    for name in detector.requires:
        if not fields.get(name):
            raise _InvalidError(
                f"selector.{name}", f"detector {detector.name} needs at least one entry"
            )
    return Selector(**fields)


def _runbook(raw: object, runbooks_dir: Path | None) -> str:
    name = _string(raw, "runbook")
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or path.suffix != ".md":
        raise _InvalidError(
            "runbook", f"{_show(name)}: expected a .md path inside the runbooks folder"
        )
    if runbooks_dir is not None and not (runbooks_dir / path).is_file():
        raise _InvalidError("runbook", f"no such runbook: {runbooks_dir / path}")
    return name


def _actions(raw: object, detector: DetectorSpec) -> tuple[ActionSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _InvalidError("actions", f"expected a list of actions, got {_show(raw)}")
    actions = []
    for i, item in enumerate(raw):
        key = f"actions[{i}]"
        data = _mapping(item, key, _ACTION_KEYS)
        if "kind" not in data:
            raise _InvalidError(f"{key}.kind", "required")
        spec = ACTIONS.get(data["kind"]) if isinstance(data["kind"], str) else None
        if spec is None:
            raise _InvalidError(
                f"{key}.kind", _unknown("action kind", data["kind"], tuple(ACTIONS))
            )
        if spec.target is not None and spec.target not in detector.subjects:
            finds = " or ".join(detector.subjects)
            message = f"{spec.kind} acts on a {spec.target}; {detector.name} finds {finds} problems"
            raise _InvalidError(f"{key}.kind", message)
        mode = data.get("mode", ActionMode.NOTIFY)
        if mode not in tuple(ActionMode):
            raise _InvalidError(f"{key}.mode", _unknown("mode", mode, tuple(ActionMode)))
        params = _params(data.get("parameters"), f"{key}.parameters", spec.parameters, spec.kind)
        actions.append(ActionSpec(spec.kind, ActionMode(mode), params))
    return tuple(actions)


def _routes(raw: object) -> tuple[str, ...]:
    routes = _strings(raw if raw is not None else [], "routes")
    for i, route in enumerate(routes):
        match = _ROUTE.fullmatch(route)
        if match is None:
            raise _InvalidError(f"routes[{i}]", f"{_show(route)}: expected <scheme>:<target>")
        if match.group(1) not in ROUTE_SCHEMES:
            message = _unknown("route scheme", match.group(1), tuple(ROUTE_SCHEMES))
            raise _InvalidError(f"routes[{i}]", message)
    return routes


def _rule(
    raw: object,
    source: RuleSource,
    runbooks_dir: Path | None,
    detectors: Mapping[str, DetectorSpec],
) -> Rule:
    data = _mapping(raw, "", _RULE_KEYS)
    for name in ("id", "detector", "severity", "owner", "runbook"):
        if name not in data:
            raise _InvalidError(name, "required")
    rule_id = _string(data["id"], "id", (_ID, _ID_TEXT))
    detector = detectors.get(data["detector"]) if isinstance(data["detector"], str) else None
    if detector is None:
        raise _InvalidError("detector", _unknown("detector", data["detector"], tuple(detectors)))
    severity = data["severity"]
    if severity not in tuple(Severity):
        raise _InvalidError("severity", _unknown("severity", severity, tuple(Severity)))
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _InvalidError("enabled", f"expected true or false, got {_show(enabled)}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _InvalidError("description", f"expected a string, got {_show(description)}")
    selector = _selector(data.get("selector"), detector)
    parameters = _params(data.get("parameters"), "parameters", detector.parameters, detector.name)
    if detector.check is not None and (wrong := detector.check(parameters)) is not None:
        raise _InvalidError(f"parameters.{wrong[0]}", wrong[1])
    return Rule(
        id=rule_id,
        detector=detector.name,
        selector=selector,
        parameters=parameters,
        severity=Severity(severity),
        owner=_string(data["owner"], "owner"),
        runbook=_runbook(data["runbook"], runbooks_dir),
        actions=_actions(data.get("actions"), detector),
        routes=_routes(data.get("routes")),
        description=description.strip(),
        enabled=enabled,
        source=source,
    )


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys, which YAML would silently overwrite."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


def _read(path: Path) -> list[object]:
    """The ``rules`` list of one file; ``_InvalidError`` keys are file-level."""
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _InvalidError("", f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise _InvalidError("", f"larger than {MAX_FILE_BYTES} bytes; split the rule set")
    try:
        loader = _Loader(data.decode("utf-8"))
        try:
            top = loader.get_single_data()
        finally:
            loader.dispose()
    except UnicodeDecodeError:
        raise _InvalidError("", "not UTF-8 text") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise _InvalidError("", f"not valid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise _InvalidError("", f"not valid YAML: {exc}") from None
    except RecursionError:
        raise _InvalidError("", "not valid YAML: nested too deeply") from None
    if isinstance(top, dict) and "groups" in top and "rules" not in top:
        raise _InvalidError(
            "groups",
            "this looks like a Prometheus rules file; keep those out of the detection rules "
            "folder (e.g. in a prometheus/ subfolder)",
        )
    data_map = _mapping(top, "", _FILE_KEYS) if top is not None else None
    if data_map is None:
        raise _InvalidError("", "empty file: expected a mapping with a 'rules' list")
    version = data_map.get("version", FILE_VERSION)
    if version != FILE_VERSION or isinstance(version, bool):
        raise _InvalidError("version", f"unsupported version {_show(version)} (supported: 1)")
    if "rules" not in data_map:
        raise _InvalidError("rules", "required")
    rules = data_map["rules"]
    if not isinstance(rules, list):
        raise _InvalidError("rules", f"expected a list of rules, got {_show(rules)}")
    return rules


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
            raws = _read(path)
        except _InvalidError as exc:
            bad(RuleProblem(name, exc.key, exc.message))
            continue
        for index, raw in enumerate(raws):
            raw_id = raw.get("id") if isinstance(raw, dict) else None
            rule_id = raw_id if isinstance(raw_id, str) else None
            try:
                rule = _rule(raw, RuleSource(name, index), runbooks_dir, detectors)
                if rule.id in seen:
                    raise _InvalidError(
                        "id", f"duplicate rule id, first defined in {seen[rule.id]}"
                    )
            except _InvalidError as exc:
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
