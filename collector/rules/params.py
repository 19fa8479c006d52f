"""Typed parameters: a detector declares a frozen dataclass whose fields carry their spec.

The dataclass is the parameter table: each field is made by one of the helpers below
(``duration``, ``number``, ``integer``, ``flag``, ``text`` and their list forms), which records
the field's :class:`ParamSpec` (type, default, range, description) in the field's metadata.
:func:`param_table` reads the table back for the rule loader, the CLI and the docs;
:func:`build_params` turns a validated rule's parameters into the typed object a detector runs
with. One source, so the table and the types cannot drift apart::

    @dataclass(frozen=True, slots=True, kw_only=True)
    class IdleGpuParams:
        window_seconds: float = duration("30m", "1m", "1w", "How long the GPU must stay idle.")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final, TypeVar

from gpuwarden.collector.rules.durations import parse_duration
from gpuwarden.collector.rules.model import ParamSpec, ParamType, ParamValue

SPEC_KEY: Final = "gpuwarden.param"
P = TypeVar("P")
T = TypeVar("T")


def _field(spec: ParamSpec, default: T) -> T:
    return dataclasses.field(default=default, metadata={SPEC_KEY: spec})


def _bound(value: float | str | None) -> float | None:
    return None if value is None else parse_duration(value)


def duration(
    default: float | str, minimum: float | str | None, maximum: float | str | None, text_: str
) -> float:
    """A duration in seconds; ``default`` and bounds take ``90s``, ``30m``, ``7d`` or seconds."""
    seconds = parse_duration(default)
    return _field(
        ParamSpec(ParamType.DURATION, seconds, _bound(minimum), _bound(maximum), text_), seconds
    )


def number(default: float, minimum: float | None, maximum: float | None, text_: str) -> float:
    """A float in ``[minimum, maximum]``."""
    return _field(
        ParamSpec(ParamType.FLOAT, float(default), minimum, maximum, text_), float(default)
    )


def integer(default: int, minimum: float | None, maximum: float | None, text_: str) -> int:
    """An integer in ``[minimum, maximum]``."""
    return _field(ParamSpec(ParamType.INT, default, minimum, maximum, text_), default)


def flag(default: bool, text_: str) -> bool:
    """A boolean."""
    return _field(ParamSpec(ParamType.BOOL, default, None, None, text_), default)


def text(default: str, text_: str, *, choices: tuple[str, ...] = ()) -> str:
    """A string, one of ``choices`` when given."""
    return _field(ParamSpec(ParamType.STR, default, None, None, text_, choices), default)


def durations(
    default: tuple[float | str, ...],
    minimum: float | str | None,
    maximum: float | str | None,
    text_: str,
) -> tuple[float, ...]:
    """A list of durations (each element in range)."""
    values = tuple(parse_duration(v) for v in default)
    spec = ParamSpec(ParamType.DURATION_LIST, values, _bound(minimum), _bound(maximum), text_)
    return _field(spec, values)


def numbers(
    default: tuple[float, ...], minimum: float | None, maximum: float | None, text_: str
) -> tuple[float, ...]:
    """A list of floats (each element in range)."""
    values = tuple(float(v) for v in default)
    return _field(ParamSpec(ParamType.FLOAT_LIST, values, minimum, maximum, text_), values)


def integers(
    default: tuple[int, ...], minimum: float | None, maximum: float | None, text_: str
) -> tuple[int, ...]:
    """A list of integers (each element in range)."""
    return _field(ParamSpec(ParamType.INT_LIST, default, minimum, maximum, text_), default)


def texts(
    default: tuple[str, ...], text_: str, *, choices: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """A list of strings, each one of ``choices`` when given."""
    return _field(ParamSpec(ParamType.STR_LIST, default, None, None, text_, choices), default)


def coverage() -> float:
    """``min_coverage``: the share of a window that must have samples before it is judged. Above
    0: a window with no sample at all is unknown, never idle and never fine."""
    return number(
        0.8,
        0.01,
        1.0,
        "Share of the window that must have samples (missing data never counts as fine).",
    )


def param_table(params: type[object]) -> Mapping[str, ParamSpec]:
    """The parameter table of a parameters dataclass, in field order.

    Raises:
        TypeError: ``params`` is not a dataclass, or a field was not made by a helper here.
    """
    if not dataclasses.is_dataclass(params):
        raise TypeError(f"{params.__name__} is not a dataclass")
    table: dict[str, ParamSpec] = {}
    for item in dataclasses.fields(params):
        spec = item.metadata.get(SPEC_KEY)
        if not isinstance(spec, ParamSpec):
            raise TypeError(f"{params.__name__}.{item.name} has no parameter spec")
        table[item.name] = spec
    return MappingProxyType(table)


def build_params(params: type[P], values: Mapping[str, ParamValue]) -> P:
    """The typed parameters from a validated rule's ``parameters`` (defaults filled in).

    Raises:
        TypeError: a value is missing or unknown (the rule was not validated against this table).
    """
    table = param_table(params)
    missing = sorted(set(table) - set(values))
    unknown = sorted(set(values) - set(table))
    if missing or unknown:
        raise TypeError(f"{params.__name__}: missing {missing}, unknown {unknown}")
    kwargs: dict[str, Any] = {name: values[name] for name in table}
    return params(**kwargs)
