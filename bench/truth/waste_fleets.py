"""Generated fleets of training jobs: idle GPUs, and busy fleets with no episode.

Every draw comes from the fleet's seed; the episodes are what the generator planted. Shapes:

- ``idle``: 12 GPUs on 3 nodes, 4 h. Each node runs one 4-GPU job or two 2-GPU jobs; a job
  alternates busy spells (util 0.5-0.95) and, for about half of the jobs, one idle spell of
  40-90 min (util 0-1 %, with a heartbeat blip of 10-60 % on one sample every 8-20 min, as a
  monitoring probe or a ``nvidia-smi`` call makes). An idle spell is an ``idle-gpu`` episode of
  the job on all its GPUs. A 40-min spell of low-but-real work (10-20 %) is not idle: it is a
  ``gpu-utilization-drop`` episode.
- ``busy-checkpoint``: 16 GPUs, two 8-GPU training jobs, 4 h: util ~0.9 with a checkpoint
  every 20-40 min (1-4 min at 2-10 %) and an evaluation phase every 60-90 min (8-15 min at
  30-50 %). No episode.
- ``busy-boundaries``: 12 GPUs, 4 h of job churn: jobs of 20-90 min at different levels, one
  after another with 1-5 min unallocated between them. No episode.
"""

from __future__ import annotations

import numpy as np

from bench.truth.canvas import Canvas, noisy
from bench.truth.model import T0, Episode, Fleet, Gpu, PlannedJob

HOUR = 3600.0


def _gpus(nodes: int, per_node: int, prefix: str = "n") -> tuple[Gpu, ...]:
    return tuple(Gpu(f"{prefix}{n}", i) for n in range(nodes) for i in range(per_node))


def idle_fleet(seed: int) -> Fleet:
    """Idle GPUs with heartbeat blips (see the module docstring)."""
    rng = np.random.default_rng(seed)
    gpus = _gpus(3, 4)
    start, end = T0, T0 + 4 * HOUR
    canvas = Canvas(gpus, start, end, 10.0)
    jobs, episodes = [], []
    for n in range(3):
        node_gpus = [g for g in gpus if g.node == f"n{n}"]
        groups = [node_gpus] if rng.random() < 0.5 else [node_gpus[:2], node_gpus[2:]]
        for j, group in enumerate(groups):
            key = f"slurm:eval:{seed}{n}{j}"
            jobs.append(PlannedJob(key, tuple(group), start - 600))
            level = rng.uniform(0.5, 0.95)
            for g in group:
                canvas.paint(g, start, end, noisy(rng, canvas.span(start, end).stop, level))
            if rng.random() < 0.3:  # low but real work: a level drop, not idle
                s = start + rng.uniform(0.5, 3) * HOUR
                low = rng.uniform(0.1, 0.2)
                for g in group:
                    canvas.paint(g, s, s + 40 * 60, noisy(rng, 240, low, 0.02))
                episodes.append(
                    Episode(
                        "gpu-utilization-drop",
                        "drop to low but real work",
                        s,
                        min(s + 40 * 60, end),
                        job=key,
                        gpus=tuple(g.uuid for g in group),
                        nodes=(f"n{n}",),
                    )
                )
            elif rng.random() < 0.75:
                s = start + rng.uniform(0.4, 2.4) * HOUR
                e = s + rng.uniform(40, 90) * 60
                for g in group:
                    span = canvas.span(s, e)
                    values = rng.uniform(0.0, 0.01, span.stop - span.start)
                    k = int(rng.integers(30, 60))
                    while k < len(values):
                        values[k] = rng.uniform(0.1, 0.6)
                        k += int(rng.integers(48, 120))
                    canvas.paint(g, s, e, values)
                episodes.append(
                    Episode(
                        "idle-gpu",
                        "idle with heartbeat blips",
                        s,
                        min(e, end),
                        job=key,
                        gpus=tuple(g.uuid for g in group),
                        nodes=(f"n{n}",),
                    )
                )
    return Fleet(
        name=f"idle/s{seed}", family="idle", seed=seed, gpus=gpus, start=start, end=end,
        points=canvas.points, jobs=tuple(jobs), episodes=tuple(episodes), warmup_seconds=1800,
    )  # fmt: skip


def checkpoint_fleet(seed: int) -> Fleet:
    """Training with checkpoint dips and evaluation phases; no episode."""
    rng = np.random.default_rng(seed)
    gpus = _gpus(2, 8)
    start, end = T0, T0 + 4 * HOUR
    canvas = Canvas(gpus, start, end, 10.0)
    jobs = []
    for n in range(2):
        group = [g for g in gpus if g.node == f"n{n}"]
        jobs.append(PlannedJob(f"slurm:eval:{seed}{n}", tuple(group), start - 1800))
        level = rng.uniform(0.8, 0.97)
        common = noisy(rng, len(canvas.times), level, 0.02)
        for g in group:
            canvas.util[g][:] = np.clip(common + 0.01 * rng.standard_normal(len(common)), 0, 1)
        t = start + rng.uniform(10, 30) * 60
        while t < end:
            dip, low = rng.uniform(1, 4) * 60, rng.uniform(0.02, 0.1)
            span = canvas.span(t, t + dip)
            for g in group:
                canvas.paint(g, t, t + dip, noisy(rng, span.stop - span.start, low, 0.01))
            t += rng.uniform(20, 40) * 60
        t = start + rng.uniform(30, 60) * 60
        while t < end:
            length = rng.uniform(8, 15) * 60
            span = canvas.span(t, t + length)
            phase = noisy(rng, span.stop - span.start, rng.uniform(0.3, 0.5), 0.05)
            for g in group:
                own = np.clip(phase + 0.02 * rng.standard_normal(len(phase)), 0, 1)
                canvas.paint(g, t, t + length, own)
            t += rng.uniform(60, 90) * 60
    return Fleet(
        name=f"busy-checkpoint/s{seed}", family="busy-checkpoint", seed=seed, gpus=gpus,
        start=start, end=end, points=canvas.points, jobs=tuple(jobs), warmup_seconds=1800,
    )  # fmt: skip


def boundaries_fleet(seed: int) -> Fleet:
    """Jobs ending and starting back to back at different levels; no episode."""
    rng = np.random.default_rng(seed)
    gpus = _gpus(3, 4)
    start, end = T0, T0 + 4 * HOUR
    canvas = Canvas(gpus, start, end, 10.0)
    jobs = []
    for n in range(3):
        group = tuple(g for g in gpus if g.node == f"n{n}")
        t, j = start - rng.uniform(0, 30) * 60, 0
        while t < end:
            length = rng.uniform(20, 90) * 60
            key = f"slurm:eval:{seed}{n}{j:02d}"
            job_end = t + length
            jobs.append(PlannedJob(key, group, t, job_end if job_end < end else None))
            level = rng.uniform(0.3, 0.97)
            span = canvas.span(t, job_end)
            for g in group:
                canvas.paint(g, t, job_end, noisy(rng, span.stop - span.start, level))
            gap = rng.uniform(1, 5) * 60
            for g in group:
                canvas.paint(g, job_end, job_end + gap, 0.0)
            t, j = job_end + gap, j + 1
    return Fleet(
        name=f"busy-boundaries/s{seed}", family="busy-boundaries", seed=seed, gpus=gpus,
        start=start, end=end, points=canvas.points, jobs=tuple(jobs), warmup_seconds=1800,
    )  # fmt: skip
