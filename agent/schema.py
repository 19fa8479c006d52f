"""Configuration schemas: YAML in, frozen typed objects out, errors naming the file and key.

Every configuration file (the agent's, the collector's and its ``alerting:``, ``remediation:``
and actuator sections) is described by ``msgspec.Struct`` types declared ``frozen=True,
forbid_unknown_fields=True``, with ``Annotated[..., msgspec.Meta(...)]`` constraints. This module
is the one place that turns loaded YAML into those types and a ``msgspec.ValidationError`` into
one line an operator can act on::

    /etc/gpuwarden/collector.yaml: alerting.resend_seconds: expected a number >= 1, got 0
    /etc/gpuwarden/agent.yaml: collector: unknown key 'endpiont'; did you mean 'endpoint'?

Why msgspec and not pydantic: the agent's base install must stay light, and msgspec is one small
wheel with no dependencies that imports fast (pydantic brings pydantic-core and
typing-inspection); it gives frozen typed structs directly; and it is strict by default (no
``"3"`` silently becoming ``3``). It lives in the agent so that the agent and the collector share
it without the agent ever importing the collector.

Checks a type cannot say (one setting needs another) live in each struct's ``__post_init__``,
which runs when code builds a struct and when msgspec converts one; msgspec reports its
``ValueError`` with the path of the struct, so those messages name the key too; a message that
starts with one of the struct's fields (``fallback: required with httproute``) is reported at
that field's key.
"""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Mapping
from enum import Enum
from os import PathLike
from pathlib import Path
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import msgspec
import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration problem, with the file and key it came from."""


class _OneOrMany:
    """Marker: a list field that also takes one item written alone (``routes: slack:#a``)."""

    def __repr__(self) -> str:
        return "ONE_OR_MANY"


#: Put in a list field's ``Annotated[...]``: a single item is read as a list of one.
ONE_OR_MANY: Any = _OneOrMany()


def read_yaml(path: Path, error: type[Exception] = ConfigError) -> dict[str, Any]:
    """The top-level mapping of the YAML file ``path`` (``{}`` for an empty file).

    Raises:
        error: the file cannot be read, is not YAML, or is not a mapping; naming the file.
    """
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise error(f"{path}: expected a mapping at the top level")
    return loaded


def convert(
    data: object,
    cls: type[T],
    where: str,
    error: type[Exception] = ConfigError,
    *,
    section: str = "",
) -> T:
    """``data`` (loaded YAML) as ``cls``, with mappings frozen.

    Args:
        data: what ``yaml.safe_load`` returned, with environment and CLI overrides merged in.
        cls: a ``msgspec.Struct`` type.
        where: the file name errors start with ("": none).
        error: the exception type to raise.
        section: the dotted key of ``data`` in its file ("": the whole file).

    Raises:
        error: one line, ``<where>: <section.dotted.key>: <what is wrong>``.
    """
    try:
        value = msgspec.convert(_as_lists(data, cls), cls, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise error(explain(str(exc), data, cls, where, section)) from None
    _freeze(value)
    return value


def check_value(
    value: object, cls: type, dotted: str, where: str, error: type[Exception] = ConfigError
) -> None:
    """Check one setting given outside the file (an environment variable, a CLI flag) against
    the type of the field ``dotted`` of ``cls``, so that its error names where it came from.

    Raises:
        error: one line, ``<where>: <dotted>: <what is wrong>``.
    """
    annotation: object = cls
    for name in dotted.split("."):
        annotation = _field_type(annotation, name)
    try:
        msgspec.convert(value, annotation, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise error(explain(str(exc), value, annotation, where, dotted)) from None


def _dec_hook(cls: type, obj: object) -> object:
    """Paths are written as strings (the CLI may pass ``Path`` objects)."""
    if cls is Path:
        if isinstance(obj, str | PathLike):
            return Path(obj)
        raise TypeError(f"expected a path, got {_shown(obj)}")
    raise NotImplementedError(cls)


def _as_lists(value: object, annotation: object) -> object:
    """A copy of ``value`` where every ``ONE_OR_MANY`` field written as one item is a list."""
    if ONE_OR_MANY in _metadata(annotation) and not isinstance(value, list):
        return [value]
    if isinstance(value, dict):
        structs = _structs(annotation)
        if structs:
            fields = {f.encode_name: f.type for s in structs for f in msgspec.structs.fields(s)}
            return {k: _as_lists(v, fields[k]) if k in fields else v for k, v in value.items()}
        _, value_type = _entry_types(annotation)
        return {k: _as_lists(v, value_type) for k, v in value.items()}
    if isinstance(value, list):
        item_type = _item_type(annotation)
        return [_as_lists(v, item_type) for v in value]
    return value


def _freeze(value: object) -> object:
    """Replace the dicts msgspec builds by read-only mappings, all the way down (structs are
    frozen in place; the frozen form of anything else is returned)."""
    if isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            current = getattr(value, name)
            frozen = _freeze(current)
            if frozen is not current:
                msgspec.structs.force_setattr(value, name, frozen)
        return value
    if isinstance(value, dict):
        return types.MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, tuple):
        return tuple(_freeze(v) for v in value)
    return value


def redacted_repr(struct: msgspec.Struct, *secrets: str) -> str:
    """``repr`` of ``struct`` with the values of the fields ``secrets`` left out."""
    shown = (
        f"{name}={'...' if name in secrets and value else repr(value)}"
        for name, value in zip(
            struct.__struct_fields__, msgspec.structs.astuple(struct), strict=True
        )
    )
    return f"{type(struct).__name__}({', '.join(shown)})"


# --- from msgspec's message to ours -----------------------------------------------------------

_AT = re.compile(r"(?P<message>.*?)(?: - at `(?P<key>key` in `)?\$(?P<path>[^`]*)`)?", re.DOTALL)
_SEGMENT = re.compile(r"\.(?P<field>[^.\[]+)|\[(?P<index>\d+)\]|\[\.\.\.\]")
_EXPECTED = re.compile(r"Expected `(?P<type>[^`]+)`(?P<rest>.*)", re.DOTALL)
_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "object": "a mapping",
    "array": "a list",
}
_SECRET = re.compile(r"token|secret|password", re.IGNORECASE)
_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.-]*://)?)[^/@\s]+@")
"""``user:password@`` at the start of a URL (with or without its scheme)."""


def explain(message: str, data: object, cls: object, where: str, section: str = "") -> str:
    """One line from a ``msgspec.ValidationError`` message, naming ``where`` and the key."""
    match = _AT.fullmatch(message)
    text, path = (match["message"], match["path"] or "") if match else (message, "")
    if match and match["key"]:  # a mapping key that does not convert: name that entry
        path += "[...]"
    keys, value, annotation = _walk(path, data, cls)
    if missing := re.fullmatch(r"Object missing required field `(.*)`", text):
        keys, text = [*keys, missing[1]], "required"
    field, colon, rest = text.partition(": ")
    if colon and field in _field_names(annotation):  # a check naming one of its struct's fields
        keys, text, value = [*keys, field], rest, _MISSING
    key = ".".join([section, *keys] if section else keys).replace(".[", "[")
    said = _say(text, value, annotation, keys[-1] if keys else section)
    return ": ".join(part for part in (where, key, said) if part)


def _say(text: str, value: object, annotation: object, key: str) -> str:
    """The operator's wording of msgspec's ``text`` about ``value``."""
    if found := re.fullmatch(r"Object contains unknown field `(.*)`", text):
        return _unknown(found[1], annotation)
    got = "" if value is _MISSING else f", got {_shown(value, secret=bool(_SECRET.search(key)))}"
    if text.startswith("Invalid enum value"):
        return f"expected one of {', '.join(map(str, _literal_values(annotation)))}{got}"
    found = _EXPECTED.fullmatch(text)
    if found is None:  # a check of our own (``__post_init__``, a path): already in our words
        return text
    return f"expected {_description(annotation) or _expected(found['type'], found['rest'])}{got}"


def _expected(kinds: str, rest: str) -> str:
    """``Expected `int | null` >= 2`` → ``an integer >= 2``."""
    kind = " or ".join(_WORDS.get(part, part) for part in kinds.split(" | ") if part != "null")
    rest = "" if rest.startswith(", got") else re.sub(r"(\d)\.0\b", r"\1", rest.strip())
    if rest == "of length >= 1":
        return f"a non-empty {kind.removeprefix('a ')}"
    return f"{kind} {rest}".strip()


def _unknown(key: str, annotation: object) -> str:
    known = _field_names(annotation)
    close = difflib.get_close_matches(key, known, n=1)
    if close:
        return f"unknown key {key!r}; did you mean {close[0]!r}?"
    return f"unknown key {key!r} (known: {', '.join(sorted(known))})"


def _shown(value: object, *, secret: bool = False) -> str:
    if secret and isinstance(value, str | list | dict):
        return f"a {type(value).__name__} (not shown)"
    if isinstance(value, str):
        value = _USERINFO.sub(r"\1***@", value)  # a password in a URL is never echoed
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Missing:
    pass


_MISSING: Any = _Missing()


def _walk(path: str, data: object, cls: object) -> tuple[list[str], object, object]:
    """Follow msgspec's ``path`` through the data and the types: the keys as an operator writes
    them, the offending value and its annotation. ``[...]`` (a mapping entry) is resolved to the
    first entry that does not convert."""
    keys: list[str] = []
    value, annotation = data, cls
    for segment in _SEGMENT.finditer(path):
        if segment["field"] is not None:
            name = segment["field"]
            keys.append(name)
            annotation = _field_type(annotation, name)
            value = value.get(name, _MISSING) if isinstance(value, Mapping) else _MISSING
        elif segment["index"] is not None:
            index = int(segment["index"])
            keys.append(f"[{index}]")
            annotation = _item_type(annotation)
            ok = isinstance(value, list | tuple) and index < len(value)
            value = value[index] if isinstance(value, list | tuple) and ok else _MISSING
        else:
            name, value, annotation = _bad_entry(value, *_entry_types(annotation))
            keys.append(name)
    return keys, value, annotation


def _bad_entry(value: object, key_type: object, value_type: object) -> tuple[str, object, object]:
    """The first entry of the mapping ``value`` whose key or value does not convert: its name,
    the part that does not, and that part's annotation."""
    if not isinstance(value, Mapping):
        return "...", _MISSING, value_type
    for key, item in value.items():
        for part, kind in ((key, key_type), (item, value_type)):
            try:
                msgspec.convert(part, kind, dec_hook=_dec_hook)
            except msgspec.ValidationError:
                return str(key), part, kind
    return "...", _MISSING, value_type


def _strip(annotation: object) -> object:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _members(annotation: object) -> tuple[object, ...]:
    annotation = _strip(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(_strip(a) for a in get_args(annotation) if a is not type(None))
    return (annotation,)


def _structs(annotation: object) -> list[type[msgspec.Struct]]:
    return [
        m for m in _members(annotation) if isinstance(m, type) and issubclass(m, msgspec.Struct)
    ]


def _field_names(annotation: object) -> list[str]:
    return [f.encode_name for s in _structs(annotation) for f in msgspec.structs.fields(s)]


def _field_type(annotation: object, name: str) -> object:
    for struct in _structs(annotation):
        for info in msgspec.structs.fields(struct):
            if info.encode_name == name:
                return info.type
    return None


def _item_type(annotation: object) -> object:
    for member in _members(annotation):
        if get_origin(member) in (tuple, list, set, frozenset):
            return get_args(member)[0]
    return None


def _entry_types(annotation: object) -> tuple[object, object]:
    for member in _members(annotation):
        if get_origin(member) in (dict, Mapping):
            key_type, value_type = get_args(member)
            return key_type, value_type
    return object, object


def _metadata(annotation: object) -> list[object]:
    """The ``Annotated`` metadata of ``annotation`` (and of its members, for ``X | None``)."""
    found: list[object] = []
    while get_origin(annotation) is Annotated:
        found.extend(get_args(annotation)[1:])
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, types.UnionType):
        for member in get_args(annotation):
            found.extend(_metadata(member))
    return found


def _description(annotation: object) -> str | None:
    return next(
        (
            m.description
            for m in _metadata(annotation)
            if isinstance(m, msgspec.Meta) and m.description
        ),
        None,
    )


def _literal_values(annotation: object) -> tuple[object, ...]:
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, Enum):
            return tuple(m.value for m in member)
        if get_args(member) and str(get_origin(member)).endswith("Literal"):
            return get_args(member)
    return ()
