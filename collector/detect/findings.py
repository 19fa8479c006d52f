"""Findings: what a detector reports, with its evidence and a stable fingerprint."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

JsonScalar = str | int | float | bool | None


class Verdict(enum.IntEnum):
    """A detector's answer for one subject in one cycle."""

    UNKNOWN = -1  # not enough data: neither firing nor healthy
    CLEAR = 0
    FIRING = 1


def fingerprint(rule_id: str, subject: str) -> str:
    """Stable identity of "this rule about this subject", across cycles and restarts."""
    return hashlib.sha256(f"{rule_id}\0{subject}".encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class Finding:
    """One subject a rule looked at in one cycle, and what it concluded.

    ``evidence`` carries the numbers an operator needs (window, baseline, threshold, score, $),
    ``points`` the (time, value) pairs to plot.
    """

    rule_id: str
    detector: str
    subject: str
    verdict: Verdict
    severity: str
    window_start: float
    window_end: float
    summary: str = ""
    evidence: Mapping[str, JsonScalar] = field(default_factory=lambda: MappingProxyType({}))
    points: tuple[tuple[float, float], ...] = ()

    @property
    def fingerprint(self) -> str:
        """See :func:`fingerprint`."""
        return fingerprint(self.rule_id, self.subject)
