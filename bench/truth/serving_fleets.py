"""Generated serving fleets: diurnal load with traffic bursts (busy), over-provisioned models.

Each model's load follows a daily curve (peak at 14:00 UTC, trough at 02:00) with noise; a
replica's utilisation is the load it serves over its capacity, and the model server counts the
requests it served (``gpuwarden.model.requests``, cumulative).

- ``busy-diurnal``: 8 GPUs (2 nodes × 4), models ``llm`` and ``chat`` with 4 one-GPU replicas
  each, peak 75-90 %, trough 10-20 %, from 13:00 to 01:00 (the afternoon peak and the whole
  evening decline), 2-3 traffic bursts per model of 15-40 min (+15-30 %, abrupt start and end).
  Every GPU at 10 s, detection every 5 min (the shipped demand-forecast rule refits a SARIMAX
  each cycle, ~0.25 s: a shorter period makes the run too slow). No episode.
- ``traffic``: 6 GPUs (3 one-node models × 2 replicas), 12 h from 13:00 at 60 s (the rule reads
  one-minute means), detection every 5 min. Each model follows its daily curve with 2-3
  ordinary bursts (+15-30 %, 15-40 min: not episodes). Roles per seed (shuffled): *outage*
  (peak 60-80 %; from an onset 6-11 h in, its traffic falls to 20-35 % of the curve for 20-30
  min: clients cut off), *surge* (peak 25-35 %; traffic rises to 2.5-3× for 20-40 min: a launch,
  a retry storm), both ``model-traffic-anomaly`` episodes of the model; and *plain*.
- ``overprovisioned``: 10 GPUs, 26 h at 60 s (the rule's window is a day), detection every
  10 min after 24 h: ``sd`` with 4 replicas peaking at 12-25 % (an
  ``overprovisioned-inference`` episode of the model over the whole run), ``llm`` with 4
  replicas peaking at 70-90 % and ``emb`` with 2 replicas (the rule's minimum) peaking at
  10-20 % (not episodes: one is busy, the other cannot shrink).

Constants here were set by construction while writing the generator, looking at the tune
split's seed 1 only (``bench.truth.splits``); none changed after a held-out run.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from bench.truth.canvas import Canvas
from bench.truth.model import T0, Episode, Fleet, Gpu, PlannedJob
from bench.truth.telemetry import requests_point
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.storage.records import ModelDeployment

HOUR = 3600.0
REPLICA_RPS = 50.0
"""Requests per second one replica serves at 100 % utilisation."""


def daily(times: npt.NDArray[np.float64], peak: float, trough: float) -> npt.NDArray[np.float64]:
    """Load ratio over the day: ``peak`` at 14:00 UTC, ``trough`` at 02:00."""
    phase = 2 * math.pi * ((times % 86400) / 3600 - 14) / 24
    return trough + (peak - trough) * (0.5 + 0.5 * np.cos(phase))


def _serve(
    canvas: Canvas, rng: np.random.Generator, model: str, replicas: tuple[Gpu, ...],
    load: npt.NDArray[np.float64], served: dict[str, npt.NDArray[np.float64]],
) -> None:  # fmt: skip
    """Paint the replicas' utilisation for ``load`` and record the model's request totals."""
    n = len(load)
    for g in replicas:
        canvas.util[g][:] = np.clip(load * (1 + 0.05 * rng.standard_normal(n)), 0, 1)
    served[model] = np.cumsum(load * len(replicas) * REPLICA_RPS * canvas.cadence)


def _counters(canvas: Canvas, served: dict[str, npt.NDArray[np.float64]], node: str) -> None:
    def requests(t: float) -> list[NumberPoint]:
        k = round((t - canvas.start) / canvas.cadence)
        return [requests_point(node, m, t, float(total[k])) for m, total in served.items()]

    canvas.extras.append(requests)


def diurnal_fleet(seed: int) -> Fleet:
    """Serving load that follows its traffic; no episode (see the module docstring)."""
    rng = np.random.default_rng(seed)
    gpus = tuple(Gpu(f"srv{n}", i) for n in range(2) for i in range(4))
    start, end = T0 + 13 * HOUR, T0 + 25 * HOUR
    canvas = Canvas(gpus, start, end, 10.0)
    times = canvas.times
    jobs: list[PlannedJob] = []
    served: dict[str, npt.NDArray[np.float64]] = {}
    deployments = []
    for m, model in enumerate(("llm", "chat")):
        replicas = gpus[4 * m : 4 * m + 4]
        load = daily(times, rng.uniform(0.75, 0.9), rng.uniform(0.1, 0.2))
        for _ in range(int(rng.integers(2, 4))):
            s = start + rng.uniform(1, 15) * HOUR
            load[canvas.span(s, s + rng.uniform(15, 40) * 60)] += rng.uniform(0.15, 0.3)
        load = np.clip(load * (1 + 0.03 * rng.standard_normal(len(load))), 0, 1)
        _serve(canvas, rng, model, replicas, load, served)
        jobs += [
            PlannedJob(f"slurm:serve:{seed}{m}{r}", (g,), start - HOUR, model=model)
            for r, g in enumerate(replicas)
        ]
        deployments.append(ModelDeployment(name=model, version="1", replicas=len(replicas)))
    _counters(canvas, served, "srv0")
    return Fleet(
        name=f"busy-diurnal/s{seed}", family="busy-diurnal", seed=seed, gpus=gpus, start=start,
        end=end, points=canvas.points, jobs=tuple(jobs), deployments=tuple(deployments),
        cycle_seconds=300, warmup_seconds=HOUR,
    )  # fmt: skip


def traffic_fleet(seed: int) -> Fleet:
    """Traffic collapses and surges among ordinary bursts (see the module docstring)."""
    rng = np.random.default_rng(seed)
    start, end = T0 + 13 * HOUR, T0 + 25 * HOUR
    gpus = tuple(Gpu(f"srv{n}", i) for n in range(3) for i in range(2))
    canvas = Canvas(gpus, start, end, 60.0)
    times = canvas.times
    jobs: list[PlannedJob] = []
    deployments, episodes = [], []
    for m, role in enumerate(rng.permutation(["outage", "surge", "plain"])):
        model, node = f"m{m}", f"srv{m}"
        replicas = tuple(g for g in gpus if g.node == node)
        peak = rng.uniform(0.25, 0.35) if role == "surge" else rng.uniform(0.6, 0.8)
        load = daily(times, peak, peak / 5)
        for _ in range(int(rng.integers(2, 4))):
            s = start + rng.uniform(1, 11) * HOUR
            load[canvas.span(s, s + rng.uniform(15, 40) * 60)] *= 1 + rng.uniform(0.15, 0.3)
        if role != "plain":
            onset = start + rng.uniform(6, 11) * HOUR
            minutes = rng.uniform(20, 30) if role == "outage" else rng.uniform(20, 40)
            factor = rng.uniform(0.2, 0.35) if role == "outage" else rng.uniform(2.5, 3.0)
            load[canvas.span(onset, onset + minutes * 60)] *= factor
            kind = f"traffic x{factor:.2f} for {minutes:.0f} min"
            episodes.append(
                Episode("model-traffic-anomaly", kind, onset, onset + minutes * 60, model=model)
            )
        load = np.clip(load * (1 + 0.03 * rng.standard_normal(len(load))), 0, 1)
        served: dict[str, npt.NDArray[np.float64]] = {}
        _serve(canvas, rng, model, replicas, load, served)
        _counters(canvas, served, node)
        jobs += [
            PlannedJob(f"slurm:serve:{seed}{m}{r}", (g,), start - HOUR, model=model)
            for r, g in enumerate(replicas)
        ]
        deployments.append(ModelDeployment(name=model, version="1", replicas=len(replicas)))
    return Fleet(
        name=f"traffic/s{seed}", family="traffic", seed=seed, gpus=gpus, start=start,
        end=end, points=canvas.points, jobs=tuple(jobs), deployments=tuple(deployments),
        episodes=tuple(episodes), cadence_seconds=60, cycle_seconds=300, warmup_seconds=HOUR,
    )  # fmt: skip


def overprovisioned_fleet(seed: int) -> Fleet:
    """One over-provisioned model among a busy one and a minimal one (see the docstring)."""
    rng = np.random.default_rng(seed)
    gpus = tuple(Gpu(f"srv{n}", i) for n in range(2) for i in range(5))
    start, end = T0, T0 + 26 * HOUR
    canvas = Canvas(gpus, start, end, 60.0)
    jobs: list[PlannedJob] = []
    served: dict[str, npt.NDArray[np.float64]] = {}
    deployments, episodes = [], []
    plan = (("sd", gpus[0:4], (0.12, 0.25)), ("llm", gpus[4:8], (0.7, 0.9)),
            ("emb", gpus[8:10], (0.1, 0.2)))  # fmt: skip
    for m, (model, replicas, peak) in enumerate(plan):
        top = rng.uniform(*peak)
        load = daily(canvas.times, top, top / 5)
        load = np.clip(load * (1 + 0.03 * rng.standard_normal(len(load))), 0, 1)
        _serve(canvas, rng, model, replicas, load, served)
        jobs += [
            PlannedJob(f"slurm:serve:{seed}{m}{r}", (g,), start - HOUR, model=model)
            for r, g in enumerate(replicas)
        ]
        deployments.append(ModelDeployment(name=model, version="1", replicas=len(replicas)))
        if model == "sd":
            episodes.append(
                Episode(
                    "overprovisioned-inference",
                    "peak under a third",
                    start,
                    end,
                    model=model,
                    gpus=tuple(g.uuid for g in replicas),
                )
            )
    _counters(canvas, served, "srv0")
    return Fleet(
        name=f"overprovisioned/s{seed}", family="overprovisioned", seed=seed, gpus=gpus,
        start=start, end=end, points=canvas.points, jobs=tuple(jobs),
        deployments=tuple(deployments), episodes=tuple(episodes), cadence_seconds=60,
        cycle_seconds=600, warmup_seconds=24 * HOUR,
    )  # fmt: skip
