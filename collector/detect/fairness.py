"""Fairness between teams: a team starved of GPUs, a team holding more than its share.

Both read the jobs the collector knows (``squeue``, Kubernetes pods, the API; each job's latest
attempt, :func:`~gpuwarden.collector.jobs.runs.run_from_job`), with Kueue's Workloads in place
of their pods (``ctx.kueue_workloads()``, :mod:`~gpuwarden.collector.fairness.kueue`: a job still
queued in Kueue is pending) over the rule's window and judge
each team's figures (:mod:`~gpuwarden.collector.fairness.figures`) against its entitled share
(``fairness.targets``; with no targets set, an equal share of the teams seen in the window):

- ``team_starved``: the team's queue wait p95 is at least ``min_wait_seconds`` and
  ``wait_ratio`` times its peers' (every other team's waits together), while its share used is
  under its target. The finding names the team most over its share, if any: the one it waits
  behind.
- ``team_hogging``: the team's share used is ``over_share_margin`` above its target while
  another team has jobs pending whose wait p95 is at least ``min_wait_seconds``. The finding
  names the team that waits longest.

A pending job counts with its wait so far, so a team whose jobs never start is seen before any
of them starts. The subject is ``team:<name>``; the finding's team is that team; its evidence's
``job`` is the team's longest-waiting job (starved) or the one using the most GPU time (hogging).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuwarden.collector.detect.contract import DetectionContext, Detector, spec_of
from gpuwarden.collector.detect.findings import Facts, Finding, Verdict, new_finding
from gpuwarden.collector.fairness.figures import (
    NONE_GROUP,
    FairnessFigures,
    GroupFigures,
    fairness_figures,
    percentile,
    used_seconds,
    wait_seconds,
)
from gpuwarden.collector.fairness.kueue import runs_with_workloads
from gpuwarden.collector.jobs.runs import QueueRun
from gpuwarden.collector.rules.durations import format_duration
from gpuwarden.collector.rules.model import Rule, Subject
from gpuwarden.collector.rules.params import duration, number


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _secs(value: float | None) -> str:
    return "-" if value is None else format_duration(value)


@dataclass(frozen=True, slots=True)
class _Window:
    """What both rules read: the figures, the attempts, the targets judged against."""

    figures: FairnessFigures
    runs: list[QueueRun]
    targets: dict[str, float]
    start: float
    end: float

    def over_share(self, exclude: str) -> GroupFigures | None:
        """The team most above its target (other than ``exclude``), if any is."""
        over = [
            t
            for t in self.figures.teams
            if t.group != exclude
            and t.group in self.targets
            and t.share_used_ratio is not None
            and t.share_used_ratio > self.targets[t.group]
        ]
        return max(
            over, key=lambda t: (t.share_used_ratio or 0) - self.targets[t.group], default=None
        )

    def longest_wait(self, team: str) -> str | None:
        """The key of the team's job that waited (or waits) longest in the window."""
        waits = [
            (w, r.key)
            for r in self.runs
            if (r.team or NONE_GROUP) == team
            and (w := wait_seconds(r, self.start, self.end)) is not None
        ]
        return max(waits)[1] if waits else None

    def largest_use(self, team: str) -> str | None:
        """The key of the team's job that used the most GPU-seconds in the window."""
        used = [
            (used_seconds(r, self.start, self.end), r.key)
            for r in self.runs
            if (r.team or NONE_GROUP) == team
        ]
        return max(used)[1] if used and max(used)[0] > 0 else None

    def peer_wait_p95(self, team: str) -> float | None:
        """The p95 of every other team's waits together."""
        waits = [
            w
            for r in self.runs
            if (r.team or NONE_GROUP) != team
            and (w := wait_seconds(r, self.start, self.end)) is not None
        ]
        return percentile(waits, 0.95)


def _window(ctx: DetectionContext, window_seconds: float, now: float) -> _Window:
    start = now - window_seconds
    runs = runs_with_workloads(ctx.jobs(), ctx.kueue_workloads(), since=start)
    figures = fairness_figures(runs, since=start, until=now, targets=ctx.fairness_targets)
    return _Window(figures, runs, dict(figures.targets), start, now)


def _evidence(team: GroupFigures, targets: Mapping[str, float]) -> dict[str, float | int | None]:
    return {
        "share_used_ratio": team.share_used_ratio,
        "share_target_ratio": targets.get(team.group),
        "wait_p50_seconds": team.wait_p50_seconds,
        "wait_p95_seconds": team.wait_p95_seconds,
        "pending": team.pending,
        "gpu_hours": team.gpu_hours,
    }


def detect_starved(
    ctx: DetectionContext, rule: Rule, p: StarvedParams, now: float
) -> list[Finding]:
    """One finding per team with a wait in the window; FIRING when it is starved."""
    w = _window(ctx, p.window_seconds, now)
    findings = []
    for team in w.figures.teams:
        if team.group == NONE_GROUP or team.wait_p95_seconds is None:
            continue
        target = w.targets.get(team.group)
        peers = w.peer_wait_p95(team.group)
        under = target is not None and (team.share_used_ratio or 0.0) < target
        waits_long = team.wait_p95_seconds >= p.min_wait_seconds and (
            peers is None or team.wait_p95_seconds >= p.wait_ratio * peers
        )
        firing = under and waits_long
        hog = w.over_share(team.group)
        summary = ""
        if firing:
            behind = (
                f"; team {hog.group} holds {_pct(hog.share_used_ratio)} "
                f"(target {_pct(w.targets.get(hog.group))})"
                if hog is not None
                else "; no team is over its share"
            )
            summary = (
                f"team {team.group} is starved: queue wait p95 {_secs(team.wait_p95_seconds)} "
                f"vs {_secs(peers)} for its peers, {team.pending} job(s) pending, "
                f"{_pct(team.share_used_ratio)} of the GPU time (target {_pct(target)}){behind}"
            )
        findings.append(
            new_finding(
                rule,
                subject=f"team:{team.group}",
                verdict=Verdict.FIRING if firing else Verdict.CLEAR,
                window=(w.start, w.end),
                summary=summary,
                evidence={
                    "team": team.group,
                    "job": w.longest_wait(team.group),
                    **_evidence(team, w.targets),
                    "peers_wait_p95_seconds": peers,
                    "over_share_team": hog.group if hog is not None else None,
                    "over_share_used_ratio": hog.share_used_ratio if hog is not None else None,
                    "over_share_target_ratio": w.targets.get(hog.group) if hog else None,
                },
                facts=Facts(team=team.group),
            )
        )
    return findings


def detect_hogging(
    ctx: DetectionContext, rule: Rule, p: HoggingParams, now: float
) -> list[Finding]:
    """One finding per team with a target and some use in the window; FIRING when it holds
    more than its share while another team waits."""
    w = _window(ctx, p.window_seconds, now)
    waiting = [
        t
        for t in w.figures.teams
        if t.pending and t.wait_p95_seconds is not None and t.wait_p95_seconds >= p.min_wait_seconds
    ]
    findings = []
    for team in w.figures.teams:
        target = w.targets.get(team.group)
        if target is None or team.share_used_ratio is None:
            continue
        others = [t for t in waiting if t.group != team.group]
        longest = max(others, key=lambda t: t.wait_p95_seconds or 0.0, default=None)
        firing = team.share_used_ratio >= target + p.over_share_margin and longest is not None
        summary = ""
        if firing and longest is not None:
            summary = (
                f"team {team.group} holds {_pct(team.share_used_ratio)} of the GPU time "
                f"(target {_pct(target)}) while team {longest.group} waits: "
                f"{longest.pending} job(s) pending, wait p95 {_secs(longest.wait_p95_seconds)}"
            )
        findings.append(
            new_finding(
                rule,
                subject=f"team:{team.group}",
                verdict=Verdict.FIRING if firing else Verdict.CLEAR,
                window=(w.start, w.end),
                summary=summary,
                evidence={
                    "team": team.group,
                    "job": w.largest_use(team.group),
                    **_evidence(team, w.targets),
                    "waiting_team": longest.group if longest is not None else None,
                    "waiting_team_pending": longest.pending if longest is not None else None,
                    "waiting_team_wait_p95_seconds": (
                        longest.wait_p95_seconds if longest is not None else None
                    ),
                    "waiting_teams": ",".join(t.group for t in others) or None,
                },
                facts=Facts(team=team.group),
            )
        )
    return findings


@dataclass(frozen=True, slots=True, kw_only=True)
class StarvedParams:
    """Parameters of ``team_starved``."""

    window_seconds: float = duration("6h", "1m", "30d", "Window of use and waits.")
    wait_ratio: float = number(3.0, 1.0, 1000.0, "Team's wait p95 over its peers' at least.")
    min_wait_seconds: float = duration("30m", "1s", "30d", "Team's wait p95 at least.")


@dataclass(frozen=True, slots=True, kw_only=True)
class HoggingParams:
    """Parameters of ``team_hogging``."""

    window_seconds: float = duration("6h", "1m", "30d", "Window of use and waits.")
    over_share_margin: float = number(0.1, 0.0, 1.0, "Share used above the target at least.")
    min_wait_seconds: float = duration("30m", "1s", "30d", "Waiting team's wait p95 at least.")


STARVED = Detector(
    spec=spec_of(
        "team_starved",
        "A team's jobs wait far longer than its peers' while it is under its GPU share.",
        subjects=(Subject.JOB,),
        signals=(),
        params=StarvedParams,
        selector=("teams",),
    ),
    params=StarvedParams,
    run=detect_starved,
)
HOGGING = Detector(
    spec=spec_of(
        "team_hogging",
        "A team holds more than its GPU share while another team's jobs wait.",
        subjects=(Subject.JOB,),
        signals=(),
        params=HoggingParams,
        selector=("teams",),
    ),
    params=HoggingParams,
    run=detect_hogging,
)
