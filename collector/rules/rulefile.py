"""A rule file's structure: safe YAML in, ``msgspec`` structs out, errors naming the key.

Files are read with a ``yaml.SafeLoader`` subclass that also refuses duplicate keys (plain YAML
keeps the last one silently) and keys that are not strings; files are capped at
``MAX_FILE_BYTES``, and so is what their aliases expand to (YAML bombs). The keys and types of the
file, a rule, its selector and its actions are frozen structs that reject unknown keys; each rule
is converted on its own (so one bad rule leaves the others), with errors worded by
``gpuwarden.agent.schema``. What depends on the detector or action is the loader's business.
"""

from __future__ import annotations

import re
import reprlib
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import yaml

from gpuwarden.agent.schema import explain
from gpuwarden.collector.rules.model import FILE_VERSION, MAX_FILE_BYTES, ActionMode, Severity

T = TypeVar("T")
_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `(?P<name>[^`]*)`")
_repr = reprlib.Repr()  # Python 3.11's Repr takes no arguments
_repr.maxstring = _repr.maxother = 60
show = _repr.repr
"""A value for a message, bounded."""


class InvalidError(Exception):
    """One thing wrong at ``key`` (a dotted path, relative to the rule or file)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key, self.message = key, message


_ID_TEXT = "lowercase letters, digits, '-' and '_' (at most 63, starting with a letter or digit)"
_Id = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$", description=_ID_TEXT)]
_Text = Annotated[str, msgspec.Meta(pattern=r"\S", description="a non-empty string")]
_METRIC_TEXT = "a metric name: letters, digits, '_', '.' and ':'"
_Metric = Annotated[
    str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_.:]*$", description=_METRIC_TEXT)
]
_Params = dict[str, object]  # checked against the detector's or action's table in code


class SelectorKeys(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    metrics: tuple[_Metric, ...] = ()
    teams: tuple[_Text, ...] = ()
    jobs: tuple[_Text, ...] = ()
    models: tuple[_Text, ...] = ()
    nodes: tuple[_Text, ...] = ()
    labels: dict[str, _Text] = {}


class ActionKeys(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    kind: str
    mode: ActionMode = ActionMode.NOTIFY  # the least powerful one
    parameters: _Params | None = None


class RuleKeys(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One rule as written; ``null`` for a list or mapping means empty (all entries commented)."""

    id: _Id
    detector: str
    selector: SelectorKeys | None = None
    parameters: _Params | None = None
    severity: Severity
    owner: _Text
    runbook: _Text
    actions: tuple[ActionKeys, ...] | None = None
    routes: tuple[_Text, ...] | None = None
    description: str = ""
    enabled: bool = True


class FileKeys(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    rules: list[object]  # each rule is converted alone, so one bad rule leaves the others
    version: int = FILE_VERSION


def structure(raw: object, cls: type[T]) -> T:
    """``raw`` as ``cls``; a mismatch is an ``InvalidError`` worded by ``agent.schema``.

    ``explain`` writes ``<section>.<key>: <message>``; the section ``$`` marks where the key
    starts. An unknown key is named in the key (``selector.team``), as every other rule error is.
    (A label name holding ``": "`` would end the key early; the line reads the same.)
    """
    try:
        return msgspec.convert(raw, cls)
    except msgspec.ValidationError as exc:
        line = explain(str(exc), raw, cls, "", section="$").removeprefix("$")
        key, _, message = line.removeprefix(".").partition(": ")
        if unknown := _UNKNOWN_FIELD.match(str(exc)):
            key = f"{key}.{unknown['name']}" if key else unknown["name"]
        raise InvalidError(key, message) from None


_STR_TAG = "tag:yaml.org,2002:str"


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys, which YAML would silently overwrite, and
    keys that are not strings (``on:`` is a boolean in YAML 1.1)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key, _ in node.value:
            if key.tag == "tag:yaml.org,2002:merge":
                continue
            wrong = "keys must be strings (quote this one)" if key.tag != _STR_TAG else None
            if wrong or key.value in seen:
                message = wrong or f"duplicate key {key.value!r}"
                raise yaml.constructor.ConstructorError(None, None, message, key.start_mark)
            seen.add(key.value)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` stands for with its aliases expanded (``sizes``: memo by id)."""
    if id(node) not in sizes:
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(_expanded_size(item, sizes) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
        sizes[id(node)] = size
    return sizes[id(node)]


def _parse(data: bytes) -> object:
    """The YAML document in ``data``; ``InvalidError`` (file-level) when it is not one.

    Aliases may not expand it beyond one value per byte (no file without aliases can), so that
    what walks the values afterwards (msgspec, error messages) stays bounded.
    """
    try:
        loader = _Loader(data.decode("utf-8"))
        try:
            node = loader.get_single_node()
            if node is not None and _expanded_size(node, {}) > MAX_FILE_BYTES:
                raise InvalidError("", f"aliases expand it beyond {MAX_FILE_BYTES} values")
            return loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except UnicodeDecodeError:
        raise InvalidError("", "not UTF-8 text") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InvalidError("", f"not valid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise InvalidError("", f"not valid YAML: {exc}") from None
    except RecursionError:
        raise InvalidError("", "not valid YAML: nested too deeply") from None


def parse_yaml(data: bytes) -> object:
    """The YAML document in ``data``, read as rule files are (also for policy files)."""
    return _parse(data)


def read_rules(path: Path) -> list[object]:
    """The ``rules`` list of one file; ``InvalidError`` keys are file-level."""
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InvalidError("", f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise InvalidError("", f"larger than {MAX_FILE_BYTES} bytes; split the rule set")
    top = _parse(data)
    if top is None:
        raise InvalidError("", "empty file: expected a mapping with a 'rules' list")
    if isinstance(top, dict) and "groups" in top and "rules" not in top:
        raise InvalidError(
            "groups",
            "this looks like a Prometheus rules file; keep those out of the detection rules "
            "folder (e.g. in a prometheus/ subfolder)",
        )
    keys = structure(top, FileKeys)
    if keys.version != FILE_VERSION:
        raise InvalidError("version", f"unsupported version {keys.version} (supported: 1)")
    return keys.rules
