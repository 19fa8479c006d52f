"""Operators' silences: which incident a silence matches, and a new silence from a request.

Shared by the alert dispatcher (a matched incident's notifications are held) and the
remediator (with ``actions: true`` its actions are held too), which must not import each other.

A silence's ``matchers`` map facts of an incident to shell-style globs (``gpu-rack3-*``):

* ``rule``: the incident's rule id;
* ``job``, ``node``, ``model``: from the incident's evidence (``nodes`` too, for findings about
  several nodes);
* ``team``: the evidence's team, else the rule's owner.

An incident matches when every matcher matches one of its values; a fact the incident does not
know matches nothing. Empty matchers would hold every incident: refused unless ``all: true``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

from gpuwarden.collector.rules.durations import parse_duration
from gpuwarden.collector.storage.base import SilenceRecord
from gpuwarden.collector.storage.records import Incident

MATCHER_KEYS = ("rule", "job", "node", "model", "team")
MAX_SECONDS = 30 * 86400.0
"""The longest silence: one that outlives everyone's memory of it is an outage in waiting."""
MAX_COMMENT_CHARS = 500
MAX_PATTERN_CHARS = 256
_FIELDS = frozenset({"matchers", "ends_at", "duration", "comment", "actions", "all"})


class SilenceError(ValueError):
    """A silence request that is refused: one line saying why."""


def incident_facts(incident: Incident, owner: str | None) -> dict[str, tuple[str, ...]]:
    """The values each matcher key sees for ``incident`` (``owner``: its rule's owner)."""
    ev = incident.evidence

    def text(key: str) -> tuple[str, ...]:
        value = ev.get(key)
        return (str(value),) if value not in (None, "") else ()

    nodes = text("node")
    listed = ev.get("nodes")
    if isinstance(listed, list | tuple):
        nodes += tuple(str(n) for n in listed if n not in (None, ""))
    team = text("team") or ((owner,) if owner else ())
    return {
        "rule": (incident.rule_id,),
        "job": text("job"),
        "node": nodes,
        "model": text("model"),
        "team": team,
    }


def matches(silence: SilenceRecord, facts: Mapping[str, tuple[str, ...]]) -> bool:
    """Whether every matcher of ``silence`` matches one of the incident's values."""
    return all(
        any(fnmatchcase(value, pattern) for value in facts.get(key, ()))
        for key, pattern in silence.matchers.items()
    )


def holding(
    silences: Iterable[SilenceRecord],
    incident: Incident,
    owner: str | None,
    now: float,
    *,
    actions: bool = False,
) -> SilenceRecord | None:
    """The first active silence that matches ``incident`` (with ``actions``: one that holds
    actions too), else None."""
    facts = incident_facts(incident, owner)
    for silence in silences:
        if silence.active(now) and (silence.actions or not actions) and matches(silence, facts):
            return silence
    return None


def new_silence(body: object, *, creator: str, now: float) -> SilenceRecord:
    """The silence a ``POST /v1/silences`` body asks for, created by ``creator`` at ``now``.

    The body: ``matchers`` (object of globs by key), ``ends_at`` (Unix seconds) or
    ``duration`` (``4h``, seconds), ``comment`` (required), ``actions`` (default false) and
    ``all`` (true to allow empty matchers). The creator is the authenticated caller, never a
    field.

    Raises:
        SilenceError: one line naming what is wrong.
    """
    if not isinstance(body, dict):
        raise SilenceError("expected a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise SilenceError(f"unknown field {unknown[0]!r} (known: {', '.join(sorted(_FIELDS))})")
    matchers = _matchers(body.get("matchers", {}), everything=body.get("all") is True)
    ends_at = _ends_at(body, now)
    comment = body.get("comment")
    if not isinstance(comment, str) or not comment.strip():
        raise SilenceError("comment: say why (a non-empty string)")
    if len(comment) > MAX_COMMENT_CHARS:
        raise SilenceError(f"comment: at most {MAX_COMMENT_CHARS} characters")
    actions = body.get("actions", False)
    if not isinstance(actions, bool):
        raise SilenceError("actions: expected true or false")
    return SilenceRecord(
        matchers=matchers,
        starts_at=now,
        ends_at=ends_at,
        created_by=creator,
        comment=comment.strip(),
        actions=actions,
    )


def _matchers(given: object, *, everything: bool) -> dict[str, str]:
    if not isinstance(given, dict):
        raise SilenceError('matchers: expected an object such as {"node": "gpu-07"}')
    out: dict[str, str] = {}
    for key, pattern in given.items():
        if key not in MATCHER_KEYS:
            raise SilenceError(
                f"matchers: unknown key {str(key)[:40]!r} (known: {', '.join(MATCHER_KEYS)})"
            )
        if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN_CHARS:
            raise SilenceError(
                f"matchers.{key}: expected a non-empty glob of at most {MAX_PATTERN_CHARS} "
                "characters"
            )
        out[key] = pattern
    if not out and not everything:
        raise SilenceError(
            "matchers: empty matchers would silence every incident; name what to silence, "
            "or set all: true"
        )
    return out


def _ends_at(body: dict[str, Any], now: float) -> float:
    has_end, has_duration = "ends_at" in body, "duration" in body
    if has_end == has_duration:
        raise SilenceError("give either ends_at (Unix seconds) or duration (such as 4h)")
    if has_duration:
        try:
            seconds = parse_duration(body["duration"])
        except ValueError as exc:
            raise SilenceError(f"duration: {exc}") from None
        ends_at = now + seconds
    else:
        value = body["ends_at"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SilenceError("ends_at: expected Unix seconds")
        ends_at = float(value)
    if not math.isfinite(ends_at) or ends_at <= now:
        raise SilenceError("the silence would end in the past")
    if ends_at - now > MAX_SECONDS:
        raise SilenceError(f"a silence lasts at most {MAX_SECONDS / 86400:.0f} days")
    return ends_at
