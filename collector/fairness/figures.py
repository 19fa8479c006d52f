"""Fairness figures over a window ``[since, until)``, per team and per queue (pure functions).

From the scheduling attempts (:class:`~gpuwarden.collector.jobs.runs.QueueRun`):

- **GPU-seconds used**: each attempt's GPUs × the part of ``[start, end]`` inside the window (an
  attempt still running counts up to ``until``). **Share used** is a group's GPU-seconds over
  every group's: the share of the GPU time that was used, not of the fleet's capacity.
- **Share target**: the team's entitled share (``fairness.targets``); with no targets set at
  all, every team seen in the window is entitled to an equal share. Queues have none.
- **Queue wait** of an attempt: ``start − eligible`` (``− submit`` when the scheduler gives no
  eligible time), for attempts that started in the window; an attempt still pending at
  ``until`` counts with its wait so far, ``until − eligible``. p50 and p95 are linear-interpolated
  percentiles (numpy's default); no waits: ``None``.
- **Preemptions**: attempts that ended preempted in the window. The **preemption ratio** is
  preemptions over the attempts that ran in the window; **GPU-hours lost** are the preempted
  attempts' GPUs × their whole run time (the scheduler does not know the last checkpoint).

A job without a team or queue is in the group ``(none)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from gpuwarden.collector.jobs.runs import QueueRun

NONE_GROUP = "(none)"
WAIT_QUANTILES = (0.5, 0.95)


@dataclass(frozen=True, slots=True)
class GroupFigures:
    """One team's or queue's figures over the window."""

    group: str
    gpu_seconds: float
    share_used_ratio: float | None
    share_target_ratio: float | None
    runs: int
    """Attempts that ran (some of the time) in the window."""
    pending: int
    """Attempts still waiting at the window's end."""
    waits: int
    """Attempts with a wait in the window (started in it, or pending at its end)."""
    wait_p50_seconds: float | None
    wait_p95_seconds: float | None
    preemptions: int
    preemption_ratio: float | None
    preempted_gpu_hours: float

    @property
    def gpu_hours(self) -> float:
        """GPU-seconds used, in hours."""
        return self.gpu_seconds / 3600


@dataclass(frozen=True, slots=True)
class FairnessFigures:
    """Every team's and queue's figures over ``[since, until)``."""

    since: float
    until: float
    teams: tuple[GroupFigures, ...]
    queues: tuple[GroupFigures, ...]
    gpu_seconds: float
    targets: Mapping[str, float]
    """The targets judged against: the configured ones, or equal shares when none are."""

    def team(self, name: str) -> GroupFigures | None:
        """One team's figures, ``None`` when it had nothing in the window."""
        return next((t for t in self.teams if t.group == name), None)


def used_seconds(run: QueueRun, since: float, until: float) -> float:
    """GPU-seconds of ``run`` inside ``[since, until)``."""
    if run.start_time is None or run.start_time >= until:
        return 0.0
    end = min(run.end_time if run.end_time is not None else until, until)
    return run.gpus * max(0.0, end - max(run.start_time, since))


def wait_seconds(run: QueueRun, since: float, until: float) -> float | None:
    """The wait ``run`` had in the window: to its start if it started in ``[since, until)``,
    so far at ``until`` if it is still pending then; ``None`` otherwise."""
    queued = run.queued_time
    if queued is None:
        return None
    if run.start_time is not None and run.start_time < until:
        return max(0.0, run.start_time - queued) if run.start_time >= since else None
    if run.end_time is not None and run.end_time < until:
        return None  # cancelled before it started
    return max(0.0, until - queued) if queued < until else None


def ran_in(run: QueueRun, since: float, until: float) -> bool:
    """The attempt ran some time in ``[since, until)``."""
    if run.start_time is None or run.start_time >= until:
        return False
    return run.end_time is None or run.end_time >= since


def pending_at(run: QueueRun, until: float) -> bool:
    """The attempt was queued and not started nor ended at ``until``."""
    queued = run.queued_time
    started = run.start_time is not None and run.start_time < until
    ended = run.end_time is not None and run.end_time < until
    return queued is not None and queued < until and not started and not ended


def percentile(values: Sequence[float], q: float) -> float | None:
    """The linear-interpolated ``q`` quantile, ``None`` for no values."""
    return float(np.quantile(np.asarray(values, dtype=float), q)) if values else None


def _group_figures(
    name: str,
    runs: Sequence[QueueRun],
    *,
    since: float,
    until: float,
    total_seconds: float,
    target: float | None,
) -> GroupFigures:
    used = sum(used_seconds(r, since, until) for r in runs)
    waits = [w for r in runs if (w := wait_seconds(r, since, until)) is not None]
    ran = [r for r in runs if ran_in(r, since, until)]
    preempted = [
        r for r in runs if r.preempted and r.end_time is not None and since <= r.end_time < until
    ]
    lost = sum(
        r.gpus * (r.end_time - r.start_time)
        for r in preempted
        if r.end_time is not None and r.start_time is not None
    )
    return GroupFigures(
        group=name,
        gpu_seconds=used,
        share_used_ratio=used / total_seconds if total_seconds > 0 else None,
        share_target_ratio=target,
        runs=len(ran),
        pending=sum(pending_at(r, until) for r in runs),
        waits=len(waits),
        wait_p50_seconds=percentile(waits, WAIT_QUANTILES[0]),
        wait_p95_seconds=percentile(waits, WAIT_QUANTILES[1]),
        preemptions=len(preempted),
        preemption_ratio=len(preempted) / len(ran) if ran else None,
        preempted_gpu_hours=lost / 3600,
    )


def _by(
    runs: Iterable[QueueRun], name: Callable[[QueueRun], str | None]
) -> dict[str, list[QueueRun]]:
    groups: dict[str, list[QueueRun]] = {}
    for run in runs:
        groups.setdefault(name(run) or NONE_GROUP, []).append(run)
    return groups


def fairness_figures(
    runs: Iterable[QueueRun],
    *,
    since: float,
    until: float,
    targets: Mapping[str, float],
) -> FairnessFigures:
    """Figures per team and per queue over ``[since, until)`` (see the module docstring).

    Attempts with nothing in the window (ended before it, queued after it) are left out; a
    team with a target but nothing in the window is listed with zero use.
    """
    if until <= since:
        raise ValueError("the window is empty: until must be after since")
    relevant = [
        r
        for r in runs
        if ran_in(r, since, until)
        or wait_seconds(r, since, until) is not None
        or (r.preempted and r.end_time is not None and since <= r.end_time < until)
    ]
    total = sum(used_seconds(r, since, until) for r in relevant)
    teams = _by(relevant, lambda r: r.team)
    for team in targets:
        teams.setdefault(team, [])
    named = [team for team in teams if team != NONE_GROUP]
    if not targets and named:
        targets = {team: 1 / len(named) for team in named}
    queues = _by(relevant, lambda r: r.queue)
    common = {"since": since, "until": until, "total_seconds": total}
    return FairnessFigures(
        since=since,
        until=until,
        teams=tuple(
            _group_figures(n, teams[n], target=targets.get(n), **common) for n in sorted(teams)
        ),
        queues=tuple(_group_figures(n, queues[n], target=None, **common) for n in sorted(queues)),
        gpu_seconds=total,
        targets=MappingProxyType(dict(targets)),
    )
