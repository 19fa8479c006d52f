"""Durations in rules and messages: ``90s``, ``30m``, ``1h30m``, ``7d``, ``2w``."""

from __future__ import annotations

import re
import reprlib

MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"w": 7 * DAY, "d": DAY, "h": HOUR, "m": MINUTE, "s": 1.0}
_repr = reprlib.Repr()  # Python 3.11's Repr takes no arguments
_repr.maxstring = _repr.maxother = 60


def format_number(value: float) -> str:
    """``5.0`` → ``5``, ``0.05`` → ``0.05`` (for messages and docs)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def format_duration(seconds: float) -> str:
    """``1800.0`` → ``30m``; the largest unit that divides the value exactly, else seconds."""
    for unit, size in _UNITS.items():
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like ``90s``, ``30m``, ``1h30m``, ``7d``, ``2w``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text and _DURATION_PART.sub("", text) == "":
            return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(text))
    raise ValueError(
        f"expected a duration such as 90s, 30m, 24h, 7d or seconds, got {_repr.repr(value)}"
    )
