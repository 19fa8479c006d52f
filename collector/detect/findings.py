"""Findings: what a detector reports, with its evidence, its subject's facts and a stable
fingerprint; :func:`new_finding` is the one way detectors make them."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpuwarden.collector.jobs.model import Job
from gpuwarden.collector.rules.model import Rule

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
class Facts:
    """Who and where a finding is about: the engine selects on these (teams, jobs, models,
    nodes). ``None`` or empty means not known, and a rule that selects on it does not match."""

    team: str | None = None
    job: str | None = None
    model: str | None = None
    nodes: tuple[str, ...] = ()

    @classmethod
    def of_job(cls, key: str | None, job: Job | None, nodes: Iterable[str]) -> Facts:
        """The facts of a finding about a job (its record may be gone: team and model unknown)."""
        return cls(
            team=job.team if job else None,
            job=key or None,
            model=job.model if job else None,
            nodes=tuple(sorted(set(nodes))),
        )


NO_FACTS = Facts()


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
    facts: Facts = NO_FACTS

    @property
    def fingerprint(self) -> str:
        """See :func:`fingerprint`."""
        return fingerprint(self.rule_id, self.subject)


def new_finding(
    rule: Rule,
    *,
    subject: str,
    verdict: Verdict,
    window: tuple[float, float],
    facts: Facts = NO_FACTS,
    summary: str = "",
    evidence: Mapping[str, JsonScalar] | None = None,
    points: Iterable[tuple[float, float]] = (),
) -> Finding:
    """A finding of ``rule`` about ``subject`` over ``window`` (start, end in Unix seconds)."""
    return Finding(
        rule_id=rule.id,
        detector=rule.detector,
        subject=subject,
        verdict=verdict,
        severity=str(rule.severity),
        window_start=window[0],
        window_end=window[1],
        summary=summary,
        evidence=MappingProxyType(dict(evidence or {})),
        points=tuple(points),
        facts=facts,
    )
