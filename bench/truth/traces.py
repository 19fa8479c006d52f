"""Real traces as busy fleets (no labels): incidents per GPU-day on real telemetry.

``/work/shared/data`` (``../shared/data`` next to the checkout; never copied into the repo):

- Alibaba GenTD26 ``pod_gpu_duty_cycle_anon`` (serving pods, 57 s grid, 22.8 h, duty cycle in
  %): the first ``PODS`` pods in sorted order, each a GPU on its own node held by one serving
  job (model ``gentd26``) from its first sample to its last. The store runs at 60 s slots.
  Serving pods follow their traffic: a ``gpu-utilization-drop``, ``training-straggler`` or
  ``input-bound-job`` incident there is false by the issue's own terms; ``idle-gpu``,
  ``forgotten-gpu`` and ``overprovisioned-inference`` may be true (some pods sit at 0 %), so
  their rate is shown, not judged.
- Alibaba PAI mini-batch times: not used. Three of its four jobs carry stragglers by the
  publisher's notes (so it is not a fleet without episodes), its labels are informal, and it
  has no GPU utilisation (the straggler rule's signal), only per-worker step time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.truth.canvas import Canvas
from bench.truth.model import Fleet, Gpu, PlannedJob
from gpuwarden.agent.traces import GENTD26_DUTY_CYCLE_FILE, gentd26_series

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
GENTD26 = DATA / "alibaba_gentd26"
PODS = 16
CADENCE = 57.0
FALSE_ON_SERVING = ("gpu-utilization-drop", "training-straggler", "input-bound-job")
"""Rules whose every incident on serving pods is false (their premise is training)."""


def gentd26_available(directory: Path = GENTD26) -> bool:
    return (directory / GENTD26_DUTY_CYCLE_FILE).exists()


def gentd26_fleet(directory: Path = GENTD26, pods: int = PODS) -> Fleet:
    """The first ``pods`` GenTD26 serving pods as a fleet (see the module docstring)."""
    series = gentd26_series(directory / GENTD26_DUTY_CYCLE_FILE, float)
    chosen = sorted(series)[:pods]
    start = min(series[p][0][0] for p in chosen)
    end = max(series[p][-1][0] for p in chosen)
    gpus = tuple(Gpu(f"pod{i:02d}", 0) for i in range(len(chosen)))
    canvas = Canvas(gpus, start, end, CADENCE)
    jobs = []
    for i, (pod, gpu) in enumerate(zip(chosen, gpus, strict=True)):
        samples = series[pod]
        canvas.util[gpu][:] = np.nan
        times = np.array([t for t, _ in samples])
        k = np.clip(np.round((times - start) / CADENCE).astype(int), 0, len(canvas.times) - 1)
        canvas.util[gpu][k] = np.array([v for _, v in samples]) / 100
        jobs.append(
            PlannedJob(
                f"slurm:gentd26:{i}",
                (gpu,),
                float(times[0]),
                model="gentd26",
                labels={"gpuwarden.io/workload": "serving"},  # serving pods, as the trace says
            )
        )
    return Fleet(
        name="trace/gentd26", family="trace-gentd26", seed=0, gpus=gpus, start=start, end=end,
        points=canvas.points, jobs=tuple(jobs), cadence_seconds=CADENCE, cycle_seconds=10 * 60,
        warmup_seconds=3600, step_seconds=60, recent_hours=24,
    )  # fmt: skip
