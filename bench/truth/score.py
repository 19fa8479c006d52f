"""Scoring opened incidents against planted episodes: precision, recall, delay, false rate.

Matching (one rule, documented in docs/evaluation.md). An incident matches an episode when

1. its rule is the episode's rule (the shipped rule of the episode's detector);
2. it opened in ``[episode.start, episode.end + GRACE_SECONDS]``;
3. it names the episode's subject, comparing every name both sides know and requiring all of
   them to agree and at least one to be compared:

   - job: the finding's ``facts.job`` (else its evidence's ``job``) against ``episode.job``;
   - model: ``facts.model`` (else evidence ``model``) against ``episode.model``;
   - GPUs: the UUIDs the incident names (evidence ``gpu``, evidence ``gpus`` as a list or a
     comma-separated string, and any ``GPU-…`` token of its subject) must share one with
     ``episode.gpus``;
   - nodes, only when none of the above was compared: ``facts.nodes`` (else evidence ``node``,
     else a subject ``node/…``) must share one with ``episode.nodes``.

So a per-GPU incident (subject ``node/uuid``) and a per-job incident (``facts.job`` set, its GPUs
listed) both match an idle episode of that job; a straggler incident on the right job but the
wrong GPU does not. Precision is matched incidents / incidents of the rule (on every fleet);
recall is episodes with at least one match / episodes; delay is the first matching incident's
open time minus the episode's onset. False incidents per GPU-day count the rule's incidents on
busy fleets (no episode at all) over those fleets' GPU-days.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.truth.model import Episode
from gpuwarden.collector.detect.findings import Finding, JsonScalar

GRACE_SECONDS = 600.0
"""How long after an episode's end an incident still counts as its detection: two agent
spool flushes and a few cycles (chosen by construction, not tuned)."""

_UUID = re.compile(r"GPU-[A-Za-z0-9_.:-]+")


@dataclass(frozen=True, slots=True)
class OpenedIncident:
    """An incident the tracker opened, with the names its finding gave its subject."""

    rule: str
    time: float
    subject: str
    job: str | None = None
    model: str | None = None
    nodes: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    fleet: str = ""

    @classmethod
    def of(cls, finding: Finding, opened_at: float) -> OpenedIncident:
        """Names from the finding's facts first, its evidence and subject second."""
        ev = finding.evidence
        facts = finding.facts
        nodes = facts.nodes or tuple(_strings(ev.get("node")))
        if not nodes and "/" in finding.subject:
            nodes = (finding.subject.split("/", 1)[0],)
        gpus = set(_strings(ev.get("gpu"))) | set(_strings(ev.get("gpus")))
        gpus |= set(_UUID.findall(finding.subject))
        return cls(
            rule=finding.rule_id,
            time=opened_at,
            subject=finding.subject,
            job=facts.job or _string(ev.get("job")),
            model=facts.model or _string(ev.get("model")),
            nodes=tuple(sorted(nodes)),
            gpus=tuple(sorted(gpus)),
        )


def _string(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _strings(value: JsonScalar | Sequence[object] | None) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, str) and v]
    return []


def names_match(incident: OpenedIncident, episode: Episode) -> bool:
    """Rule 3 of the module docstring: every name both know agrees, and one was compared."""
    compared = False
    for mine, theirs in ((incident.job, episode.job), (incident.model, episode.model)):
        if mine and theirs:
            if mine != theirs:
                return False
            compared = True
    if incident.gpus and episode.gpus:
        if not set(incident.gpus) & set(episode.gpus):
            return False
        compared = True
    if not compared and incident.nodes and episode.nodes:
        return bool(set(incident.nodes) & set(episode.nodes))
    return compared


def matches(incident: OpenedIncident, episode: Episode, grace: float = GRACE_SECONDS) -> bool:
    """Whether ``incident`` is a detection of ``episode`` (rules 1-3)."""
    return (
        incident.rule == episode.rule
        and episode.start <= incident.time <= episode.end + grace
        and names_match(incident, episode)
    )


@dataclass(frozen=True, slots=True)
class FleetOutcome:
    """One fleet's truth and what opened on it (the scorer's input)."""

    name: str
    family: str
    episodes: tuple[Episode, ...]
    incidents: tuple[OpenedIncident, ...]
    gpu_days: float


@dataclass(frozen=True, slots=True)
class RuleScore:
    """One rule's quality over a set of fleets."""

    rule: str
    episodes: int
    found: int
    incidents: int
    matched: int
    delays: tuple[float, ...]
    busy_false: int
    busy_gpu_days: float
    by_family: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    """Busy family → (false incidents, GPU-days)."""

    @property
    def precision(self) -> float:
        return self.matched / self.incidents if self.incidents else math.nan

    @property
    def recall(self) -> float:
        return self.found / self.episodes if self.episodes else math.nan

    def delay(self, q: float) -> float:
        """Quantile ``q`` of the delays, in seconds (NaN when nothing was found)."""
        return float(np.quantile(self.delays, q)) if self.delays else math.nan

    @property
    def false_per_gpu_day(self) -> float:
        return self.busy_false / self.busy_gpu_days if self.busy_gpu_days else math.nan


def score_rule(rule: str, outcomes: Iterable[FleetOutcome]) -> RuleScore:
    """Score ``rule`` over ``outcomes`` (see the module docstring)."""
    episodes = found = incidents = matched = busy_false = 0
    busy_days = 0.0
    delays: list[float] = []
    family: dict[str, tuple[int, float]] = {}
    for fleet in outcomes:
        mine = [i for i in fleet.incidents if i.rule == rule]
        planted = [e for e in fleet.episodes if e.rule == rule]
        incidents += len(mine)
        matched += sum(1 for i in mine if any(matches(i, e) for e in planted))
        for episode in planted:
            episodes += 1
            hits = [i.time for i in mine if matches(i, episode)]
            if hits:
                found += 1
                delays.append(min(hits) - episode.start)
        if not fleet.episodes:
            busy_false += len(mine)
            busy_days += fleet.gpu_days
            n, d = family.get(fleet.family, (0, 0.0))
            family[fleet.family] = (n + len(mine), d + fleet.gpu_days)
    return RuleScore(
        rule=rule, episodes=episodes, found=found, incidents=incidents, matched=matched,
        delays=tuple(delays), busy_false=busy_false, busy_gpu_days=busy_days, by_family=family,
    )  # fmt: skip
