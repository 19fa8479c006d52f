"""Generated model-serving fleets: deploys, SLO burns, demand growth, latency drift, and busy
serving with none of them.

One model (``chat``) on two GPUs of node ``srv0``, deployed with 2 replicas of 20 requests/s
each (label ``capacity_rps_per_replica``, the number an operator's load test gives), sends its
request counters and latency histogram every 10 s (:mod:`bench.truth.model_telemetry`). Every
draw comes from the seed; the episodes are what the generator planted, defined by what was
changed, never by a detector's rule:

- ``deploy-rollback`` (3.5 h): a deploy (``v2``) at 60-80 min makes latency 1.3-1.8x slower;
  it is rolled back (a deploy of ``v1``) 45-70 min later. Episode ``deploy-regression`` from
  the deploy to the rollback. After the rollback the incident must resolve: the runner records
  resolutions and :func:`rollback_resolutions` reports them.
- ``busy-deploy`` (3.5 h): the same deploys, but nothing gets slower. No episode.
- ``slo-burn`` (7 h): a steady 0.01-0.04 % of requests fail, with benign blips (20-60 s at
  2-10 % every 60-180 min; with the base, about 0.6x the budget of a 99.9 % SLO over a day);
  at 3-5 h, 3-6 % fail for 40-60 min: episode ``slo-burn-fast`` (a
  99.9 % SLO burnt 30-60x, 2.8-8 % of a 30-day budget in under an hour: page-worthy by the SRE
  workbook's 2 %-in-1-h line). The blips alone stay far under a 14.4x hour (by
  construction: at most 1 min x 10 % per hour). The first version had blips of 1-2 min every
  40-120 min, which averaged about 1-1.5x the budget: a real slow burn, which ``slo-burn-slow``
  rightly reported on held-out seed 101; they were made smaller after that run.
- ``busy-slo-blips`` (7 h): the base errors and the blips only. No episode.
- ``slo-burn-slow`` (44 h, detection every 5 min): the base errors and blips, then from 6-10 h
  on a steady 0.35-0.45 % of requests fail until the end (a flaky dependency): 3.5-4.5x the
  budget of a 99.9 % SLO, 12-15 % of a 30-day budget a day. Episode ``slo-burn-slow`` from the
  onset to the end. It stays under ``slo-burn-fast``'s 6x (by construction: 4.5x plus a blip
  of at most 1 min x 10 % per 30 min is under 6x). Written after the issue-14 run that left this
  rule with no episode; constants set by construction, not from the rule's output.
- ``demand-growth`` (2.5 days; detection runs in the last 12 h, once two days of history
  exist): a daily curve peaking at 40-55 % of capacity, then from 2-6 h into day 3 demand grows
  by 12-20 % of capacity per hour until the end. Episode ``demand-forecast`` from the growth's
  onset to the time demand reaches 80 % of capacity (the rule's line), which it always does
  at least an hour before the end.
- ``latency-drift`` (2.5 days, last 12 h judged): the daily curve, latency rising with load
  (median 0.3 s x (1 + 0.6 x load)); at 2-9 h into day 3 latency becomes 1.5-2x slower and
  stays so, with no deploy: episodes ``model-latency-drift`` and ``latency-distribution-drift``
  from then to the end.
- ``latency-drift-week`` and ``busy-model-diurnal-week`` (9 days, detection every hour from
  the first hour): as ``latency-drift`` (the slowdown at 2-9 h into day 9) and
  ``busy-model-diurnal`` (its deploy in day 9), for ``latency-distribution-drift``, whose 7-day
  same-phase reference is built from the windows its cycles saw (the store keeps histograms 6 h),
  so it needs a week of cycles before it judges; an hourly cycle sees every 1 h window. Written
  after the issue-14 run that left the rule unevaluated; constants copied from the 2.5-day
  fleets, not chosen from the rule's output.
- ``busy-model-diurnal`` (2.5 days, last 12 h judged): the daily curve of demand and latency,
  benign error blips and a harmless deploy. No episode: every model rule's false incidents.

Constants here were set by construction (what the episode must look like), looking only at tune
seeds while writing; none was chosen from a detector's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from bench.truth.model import T0, Episode, Fleet, Gpu, PlannedJob
from bench.truth.model_telemetry import Floats, ModelTraffic, diurnal
from gpuwarden.collector.storage.records import Event, EventKind, ModelDeployment

MODEL = "chat"
NODE = "srv0"
GPUS = (Gpu(NODE, 0), Gpu(NODE, 1))
REPLICAS = 2
PER_REPLICA_RPS = 20.0
CAPACITY = REPLICAS * PER_REPLICA_RPS
CADENCE = 10.0
HOUR = 3600.0
DAY = 86400.0
BASE_MEDIAN = 0.3


@dataclass(frozen=True, slots=True)
class Shape:
    """Demand, error ratio and median latency on the grid, before drawing counts."""

    times: Floats
    rps: Floats
    errors: Floats
    median: Floats


def _grid(hours: float) -> Floats:
    return np.asarray(T0 + CADENCE * np.arange(round(hours * HOUR / CADENCE) + 1), np.float64)


def _deployment() -> ModelDeployment:
    return ModelDeployment(
        name=MODEL, version="v1", replicas=REPLICAS,
        labels=MappingProxyType({"capacity_rps_per_replica": str(PER_REPLICA_RPS)}),
    )  # fmt: skip


def _blips(rng: np.random.Generator, shape: Shape) -> None:
    """Benign error blips: 20-60 s at 2-10 % errors, every 60-180 min."""
    t = shape.times[0] + rng.uniform(20, 60) * 60
    while t < shape.times[-1]:
        span = (shape.times >= t) & (shape.times < t + rng.uniform(20, 60))
        shape.errors[span] = rng.uniform(0.02, 0.10)
        t += rng.uniform(60, 180) * 60


def _flat(rng: np.random.Generator, hours: float) -> Shape:
    times = _grid(hours)
    n = len(times)
    rps = np.full(n, rng.uniform(15, 30))
    errors = np.full(n, rng.uniform(0.0001, 0.0004))
    return Shape(times, rps, errors, np.full(n, BASE_MEDIAN))


def _daily(rng: np.random.Generator, hours: float) -> Shape:
    times = _grid(hours)
    load = diurnal(times, rng.uniform(0.1, 0.15), rng.uniform(0.4, 0.55))
    errors = np.full(len(times), rng.uniform(0.0001, 0.0004))
    return Shape(times, load * CAPACITY, errors, BASE_MEDIAN * (1 + 0.6 * load))


def _fleet(
    name: str, family: str, seed: int, shape: Shape, *, warmup: float,
    episodes: Sequence[Episode] = (), events: Sequence[Event] = (), cycle_seconds: float = 60.0,
) -> Fleet:  # fmt: skip
    traffic = ModelTraffic(
        model=MODEL, node=NODE, gpus=GPUS, start=float(shape.times[0]), cadence=CADENCE,
        rps=shape.rps, error_ratio=shape.errors, median_seconds=shape.median,
        capacity_rps=CAPACITY, seed=seed,
    )  # fmt: skip
    start, end = float(shape.times[0]), float(shape.times[-1])
    job = PlannedJob(f"slurm:serve:{seed}", GPUS, start - HOUR, model=MODEL)
    return Fleet(
        name=f"{family}/s{seed}", family=family, seed=seed, gpus=GPUS, start=start, end=end,
        points=traffic.points, histograms=traffic.histograms, jobs=(job,),
        events=tuple(events), deployments=(_deployment(),), episodes=tuple(episodes),
        cadence_seconds=CADENCE, warmup_seconds=warmup, cycle_seconds=cycle_seconds,
    )  # fmt: skip


def _deploys(rng: np.random.Generator, slower: bool, seed: int, family: str) -> Fleet:
    shape = _flat(rng, 3.5)
    deploy = T0 + rng.uniform(60, 80) * 60
    rollback = deploy + rng.uniform(45, 70) * 60
    if slower:
        span = (shape.times >= deploy) & (shape.times < rollback)
        shape.median[span] *= rng.uniform(1.3, 1.8)
    events = (
        Event(time=deploy, kind=EventKind.DEPLOY, subject=MODEL, attributes={"version": "v2"}),
        Event(time=rollback, kind=EventKind.DEPLOY, subject=MODEL, attributes={"version": "v1"}),
    )
    episodes = (
        [Episode("deploy-regression", "slower deploy, rolled back", deploy, rollback, model=MODEL)]
        if slower
        else []
    )
    return _fleet(f"{family}", family, seed, shape, warmup=1800, episodes=episodes, events=events)


def deploy_rollback_fleet(seed: int) -> Fleet:
    """A slower deploy, then its rollback (see the module docstring)."""
    return _deploys(np.random.default_rng(seed), True, seed, "deploy-rollback")


def busy_deploy_fleet(seed: int) -> Fleet:
    """The same deploy and rollback, nothing slower; no episode."""
    return _deploys(np.random.default_rng(seed), False, seed, "busy-deploy")


def slo_burn_fleet(seed: int) -> Fleet:
    """Benign blips and one real burn of the error budget."""
    rng = np.random.default_rng(seed)
    shape = _flat(rng, 7)
    _blips(rng, shape)
    start = T0 + rng.uniform(3, 5) * HOUR
    end = start + rng.uniform(40, 60) * 60
    shape.errors[(shape.times >= start) & (shape.times < end)] = rng.uniform(0.03, 0.06)
    episode = Episode("slo-burn-fast", "3-6 % errors for 40-60 min", start, end, model=MODEL)
    return _fleet("slo-burn", "slo-burn", seed, shape, warmup=HOUR, episodes=[episode])


def slo_burn_slow_fleet(seed: int) -> Fleet:
    """Benign blips, then a steady slow burn of the error budget to the end."""
    rng = np.random.default_rng(seed)
    shape = _flat(rng, 44)
    _blips(rng, shape)
    start = T0 + rng.uniform(6, 10) * HOUR
    burning = shape.times >= start
    shape.errors[burning] = np.maximum(shape.errors[burning], rng.uniform(0.0035, 0.0045))
    end = float(shape.times[-1])
    episode = Episode("slo-burn-slow", "0.35-0.45 % errors from then on", start, end, model=MODEL)
    return _fleet("slo-burn-slow", "slo-burn-slow", seed, shape, warmup=HOUR, episodes=[episode],
                  cycle_seconds=300)  # fmt: skip


def busy_slo_blips_fleet(seed: int) -> Fleet:
    """Benign error blips only; no episode."""
    rng = np.random.default_rng(seed)
    shape = _flat(rng, 7)
    _blips(rng, shape)
    return _fleet("busy-slo-blips", "busy-slo-blips", seed, shape, warmup=HOUR)


def demand_growth_fleet(seed: int) -> Fleet:
    """A daily curve, then growth through 80 % of capacity."""
    rng = np.random.default_rng(seed)
    shape = _daily(rng, 60)
    onset = T0 + 2 * DAY + rng.uniform(2, 6) * HOUR
    slope = rng.uniform(0.12, 0.20) * CAPACITY / HOUR
    grows = shape.times >= onset
    shape.rps[grows] += slope * (shape.times[grows] - onset)
    load = shape.rps / CAPACITY
    shape.median[:] = BASE_MEDIAN * (1 + 0.6 * np.minimum(load, 1.0))
    crossed = np.flatnonzero(grows & (shape.rps >= 0.8 * CAPACITY))
    if not crossed.size or shape.times[crossed[0]] > shape.times[-1] - HOUR:
        raise AssertionError(f"seed {seed}: demand does not reach 80 % an hour before the end")
    reach = float(shape.times[crossed[0]])
    episode = Episode("demand-forecast", "demand grows past 80 %", onset, reach, model=MODEL)
    return _fleet("demand-growth", "demand-growth", seed, shape, warmup=2 * DAY,
                  episodes=[episode])  # fmt: skip


def latency_drift_fleet(seed: int) -> Fleet:
    """The daily curve, then latency 1.5-2x slower with no deploy."""
    rng = np.random.default_rng(seed)
    shape = _daily(rng, 60)
    start = T0 + 2 * DAY + rng.uniform(2, 9) * HOUR
    shape.median[shape.times >= start] *= rng.uniform(1.5, 2.0)
    end = float(shape.times[-1])
    episodes = [
        Episode("model-latency-drift", "latency 1.5-2x, no deploy", start, end, model=MODEL),
        Episode("latency-distribution-drift", "latency 1.5-2x, no deploy", start, end,
                model=MODEL),
    ]  # fmt: skip
    return _fleet("latency-drift", "latency-drift", seed, shape, warmup=2 * DAY,
                  episodes=episodes)  # fmt: skip


def busy_model_diurnal_fleet(seed: int) -> Fleet:
    """Daily demand and latency, benign blips, a harmless deploy; no episode."""
    rng = np.random.default_rng(seed)
    shape = _daily(rng, 60)
    _blips(rng, shape)
    deploy = T0 + 2 * DAY + rng.uniform(1, 8) * HOUR
    event = Event(time=deploy, kind=EventKind.DEPLOY, subject=MODEL, attributes={"version": "v2"})
    return _fleet("busy-model-diurnal", "busy-model-diurnal", seed, shape, warmup=2 * DAY,
                  events=[event])  # fmt: skip


def latency_drift_week_fleet(seed: int) -> Fleet:
    """Eight days of the daily curve, then latency 1.5-2x slower with no deploy."""
    rng = np.random.default_rng(seed)
    shape = _daily(rng, 9 * 24)
    start = T0 + 8 * DAY + rng.uniform(2, 9) * HOUR
    shape.median[shape.times >= start] *= rng.uniform(1.5, 2.0)
    end = float(shape.times[-1])
    episodes = [
        Episode("latency-distribution-drift", "latency 1.5-2x, no deploy", start, end,
                model=MODEL),
    ]  # fmt: skip
    return _fleet("latency-drift-week", "latency-drift-week", seed, shape, warmup=HOUR,
                  episodes=episodes, cycle_seconds=HOUR)  # fmt: skip


def busy_model_diurnal_week_fleet(seed: int) -> Fleet:
    """Nine days of daily demand and latency, benign blips, a harmless deploy; no episode."""
    rng = np.random.default_rng(seed)
    shape = _daily(rng, 9 * 24)
    _blips(rng, shape)
    deploy = T0 + 8 * DAY + rng.uniform(1, 8) * HOUR
    event = Event(time=deploy, kind=EventKind.DEPLOY, subject=MODEL, attributes={"version": "v2"})
    return _fleet("busy-model-diurnal-week", "busy-model-diurnal-week", seed, shape,
                  warmup=HOUR, events=[event], cycle_seconds=HOUR)  # fmt: skip


def rollback_resolutions(
    runs: Sequence[tuple[Sequence[Episode], Sequence[tuple[str, str, float]]]],
    after_seconds: float = 2 * HOUR,
) -> tuple[int, int, list[float]]:
    """(rolled-back episodes, those whose deploy-regression incident resolved after the
    rollback within ``after_seconds``, the minutes it took each).

    ``runs`` pairs each fleet's episodes with its resolutions (rule, subject, time).
    """
    episodes = resolved = 0
    minutes: list[float] = []
    for planted, resolutions in runs:
        for episode in planted:
            if episode.rule != "deploy-regression":
                continue
            episodes += 1
            times = [
                t for rule, subject, t in resolutions
                if rule == episode.rule and subject.startswith(f"{MODEL}/")
                and episode.end <= t <= episode.end + after_seconds
            ]  # fmt: skip
            if times:
                resolved += 1
                minutes.append((min(times) - episode.end) / 60)
    return episodes, resolved, minutes
