"""Precision, recall and detection delay of the idle-GPU and forgotten-GPU detectors.

Run: ``.venv/bin/python bench/waste_eval.py [--cycle-seconds S] [--seed N] [--gentd26-dir DIR]``.

Everything goes through the whole path: OTLP points → ``CollectorService.accept`` → WindowStore →
``timelines`` / ownership → the shipped default rule through its detector (``idle_gpu``,
``forgotten_gpu``) on a simulated clock, one detection cycle every ``--cycle-seconds``. Truth is
computed separately, on the raw samples, never through the store:

- idle (window W, threshold θ): a job held the GPU for all of ``[t−W, t)``, the raw samples in it
  cover at least ``min_coverage`` of it and all are below θ. One sample at or above θ makes it
  busy; a held window with too few samples and none busy is *unknown* (the detector must not
  fire there: counted apart, as ``fired on unknown``).
- forgotten: the same, with the mean of the raw samples below θ instead of every sample.

Scores are over (GPU or job, cycle) pairs: TP = fired on truth idle, FP = fired on truth busy or
unknown, FN = truth idle and not fired. An *episode* is a run of consecutive cycles whose truth
is idle; its delay is the first firing cycle's time minus the onset of the waste: the end of
the last busy sample before the episode (or the job's start) for idle GPUs, the window's start
(or the job's start) for forgotten ones. The floor is the rule's window; the cycle period adds
up to one period.

Data: synthetic fleets whose truth is known by construction (seeded), and the Alibaba GenTD26
pods (``pod_gpu_duty_cycle_anon``: 143 serving pods, 57 s grid, 22.8 h). A pod is a GPU on its own
node held by one job from its first to its last sample; the store runs at 60 s slots (the
scrape cadence is 57 s, so ~5 % of slots hold two samples and keep the later). GenTD26 is in %
with a resolution of 1/30 %; "duty cycle 0" is detected with θ = 0.0002 (below the smallest
non-zero value, 0.033 % = 0.00033).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from gpuwarden.agent.traces import GENTD26_DUTY_CYCLE_FILE, gentd26_series
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import DETECTORS, load_rules
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.idle_gpu import BUSY_FRACTION_TOLERATED
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import Rule
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.store.types import AttrValue

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba_gentd26"
MODEL = "NVIDIA H100 80GB HBM3"
IDLE, BUSY, UNKNOWN = 1, 0, -1


# --- scoring ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Score:
    """Detection quality of one detector on one data set."""

    name: str
    tp: int
    fp: int
    fn: int
    negatives: int
    fired_on_unknown: int
    episodes: int
    episodes_found: int
    delays_seconds: tuple[float, ...] = field(default=())
    """Per episode found: first firing minus the onset of the waste."""
    held_delays_seconds: tuple[float, ...] = field(default=())
    """Per episode found: first firing minus the first cycle at which the truth was idle."""

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else math.nan

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else math.nan

    def delay_summary(self, *, held: bool = False) -> str:
        values = self.held_delays_seconds if held else self.delays_seconds
        if not values:
            return "no episodes found"
        d = np.array(values) / 60
        return (
            f"min {d.min():.1f}  median {np.median(d):.1f}  p95 {np.quantile(d, 0.95):.1f}  "
            f"max {d.max():.1f} min"
        )


def score(
    name: str,
    truth: np.ndarray,
    fired: np.ndarray,
    cycle_times: np.ndarray,
    onset: Callable[[int, float], float] | None = None,
) -> Score:
    """Score subjects × cycles: ``truth`` in {IDLE, BUSY, UNKNOWN}, ``fired`` boolean.

    ``onset(row, first_idle_cycle_time)`` gives when the episode's waste began; delays are then
    measured from it (else from the episode's first cycle).
    """
    tp = int((fired & (truth == IDLE)).sum())
    fp = int((fired & (truth != IDLE)).sum())
    fn = int((~fired & (truth == IDLE)).sum())
    delays = []
    held_delays = []
    episodes = found = 0
    for r, (row_truth, row_fired) in enumerate(zip(truth, fired, strict=True)):
        k = 0
        n = len(row_truth)
        while k < n:
            if row_truth[k] != IDLE:
                k += 1
                continue
            j = k
            while j < n and row_truth[j] == IDLE:
                j += 1
            episodes += 1
            hits = np.flatnonzero(row_fired[k:j])
            if hits.size:
                found += 1
                began = onset(r, float(cycle_times[k])) if onset else float(cycle_times[k])
                delays.append(float(cycle_times[k + hits[0]]) - began)
                held_delays.append(float(cycle_times[k + hits[0]] - cycle_times[k]))
            k = j
    return Score(
        name=name,
        tp=tp,
        fp=fp,
        fn=fn,
        negatives=int((truth == BUSY).sum()),
        fired_on_unknown=int((fired & (truth == UNKNOWN)).sum()),
        episodes=episodes,
        episodes_found=found,
        delays_seconds=tuple(delays),
        held_delays_seconds=tuple(held_delays),
    )


# --- raw-sample truth ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Raw:
    """One GPU's raw samples and the span its (only) job held it in each job segment."""

    key: str  # subject: "node/uuid"
    times: np.ndarray
    values: np.ndarray  # ratios
    jobs: tuple[tuple[str, float, float], ...]  # (job key, start, end)
    index: int = 0  # the GPU's index on its node


def raw_truth(
    raw: Raw,
    end: float,
    *,
    window_seconds: float,
    cadence_seconds: float,
    threshold: float,
    min_coverage: float,
    mean_rule: bool,
) -> tuple[int, str | None]:
    """Truth of the window ``[end − W, end)`` on raw samples, and the job holding it."""
    start = end - window_seconds
    holder = next((k for k, s, e in raw.jobs if s <= start and e >= end), None)
    if holder is None:
        return BUSY, None
    lo, hi = np.searchsorted(raw.times, [start, end], side="left")
    values = raw.values[lo:hi]
    coverage = len(values) * cadence_seconds / window_seconds
    if mean_rule:
        if coverage < min_coverage:
            return UNKNOWN, holder
        return (IDLE if float(values.mean()) < threshold else BUSY), holder
    # as the shipped rule: a few busy samples (heartbeats) in an idle window are tolerated
    tolerated = math.floor(BUSY_FRACTION_TOLERATED * window_seconds / cadence_seconds + 1e-9)
    if int((values >= threshold).sum()) > tolerated:
        return BUSY, holder
    return (IDLE if coverage >= min_coverage else UNKNOWN), holder


# --- feeding the service ---------------------------------------------------------------------


def points_for(
    node: str, uuid: str, index: int, t: float, value: float | None
) -> list[NumberPoint]:
    resource: dict[str, AttrValue] = {"host.name": node}
    ns = int(t * 1e9)
    info: dict[str, AttrValue] = {"hw.id": uuid, "hw.model": MODEL, "gpuwarden.gpu.index": index}
    out = [NumberPoint(resource, "gpuwarden.gpu.info", "1", "gauge", False, info, ns, 1.0)]
    if value is not None:
        attrs: dict[str, AttrValue] = {"hw.id": uuid}
        out.append(
            NumberPoint(resource, "hw.gpu.utilization", "1", "gauge", False, attrs, ns, value)
        )
    return out


def ingest(svc: CollectorService, raws: Sequence[Raw], index: dict[str, int]) -> None:
    """Every raw sample, in time order, one request per timestamp."""
    events: dict[float, list[NumberPoint]] = {}
    for raw in raws:
        node, uuid = raw.key.split("/")
        for t, v in zip(raw.times, raw.values, strict=True):
            events.setdefault(float(t), []).extend(
                points_for(node, uuid, raw.index, float(t), float(v))
            )
    for t in sorted(events):
        rejected = svc.accept(events[t], "agents")
        if rejected:
            raise RuntimeError(f"the store rejected {rejected} point(s) at {t}")
    jobs = []
    for raw in raws:
        node, uuid = raw.key.split("/")
        for key, start, end in raw.jobs:
            jobs.append(
                Job(
                    key=key,
                    scheduler="api",
                    job_id=key.split(":", 1)[1],
                    state=JobState.COMPLETED,
                    team="eval",
                    gpus=1,
                    start_time=start,
                    end_time=end,
                    allocations=(GpuAllocation(node, (raw.index,), (uuid,)),),
                    labels=MappingProxyType({"index": str(index[raw.key])}),
                )
            )
    svc.registry.put(jobs)


def evaluate(
    name: str,
    svc: CollectorService,
    raws: Sequence[Raw],
    cycles: np.ndarray,
    *,
    window_seconds: float,
    cadence_seconds: float,
    threshold: float,
    min_coverage: float,
    forgotten: bool,
) -> Score:
    """Run the detector at every cycle time and score it against the raw truth."""
    row = {raw.key: i for i, raw in enumerate(raws)}
    truth = np.full((len(raws), len(cycles)), BUSY, dtype=np.int8)
    fired = np.zeros(truth.shape, dtype=bool)
    holder_row: dict[str, int] = {}
    for i, raw in enumerate(raws):
        for c, t in enumerate(cycles):
            truth[i, c], holder = raw_truth(
                raw, float(t), window_seconds=window_seconds, cadence_seconds=cadence_seconds,
                threshold=threshold, min_coverage=min_coverage, mean_rule=forgotten,
            )  # fmt: skip
            if holder:
                holder_row[holder] = i
    detector = "forgotten_gpu" if forgotten else "idle_gpu"
    rule = _default_rule(detector, window_seconds, threshold, min_coverage)
    view = svc.detection_view
    for c, t in enumerate(cycles):
        for f in DETECTORS[detector].detect(view, rule, float(t)):
            if f.verdict is not Verdict.FIRING:
                continue
            if forgotten:
                fired[holder_row[f.subject], c] = True
            else:  # one idle finding per job: its evidence lists the idle GPUs
                for gpu in str(f.evidence["gpu_ids"]).split(","):
                    fired[row[gpu], c] = True

    def onset(r: int, first: float) -> float:
        raw = raws[r]
        holder = next((s for _, s, e in raw.jobs if s <= first - window_seconds and e >= first))
        before = raw.times < first - window_seconds
        if forgotten:
            return max(holder, first - window_seconds)
        busy = raw.times[before & (raw.values >= threshold) & (raw.times >= holder)]
        return float(busy[-1] + cadence_seconds) if busy.size else holder

    return score(name, truth, fired, cycles, onset)


def _default_rule(detector: str, window: float, threshold: float, coverage: float) -> Rule:
    """The shipped default rule of ``detector`` with the window, threshold and coverage set."""
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    rule = next(r for r in rules.rules if r.detector == detector)
    params = {
        **rule.parameters,
        "window_seconds": window,
        "utilization_below": threshold,
        "min_coverage": coverage,
    }
    return Rule(
        id=rule.id, detector=rule.detector, selector=rule.selector, parameters=params,
        severity=rule.severity, owner=rule.owner, runbook=rule.runbook,
    )  # fmt: skip


# --- data sets -------------------------------------------------------------------------------

T0 = 1_767_225_600.0


def _segments(
    rng: np.random.Generator, start: float, end: float, draw: Callable[[], tuple[str, float]]
) -> list[tuple[str, float, float]]:
    out = []
    t = start
    while t < end:
        kind, length = draw()
        out.append((kind, t, min(end, t + length)))
        t += length
    return out


def synthetic_fleet(
    seed: int, *, gpus: int, hours: float, cadence: float, forgotten: bool
) -> list[Raw]:
    """GPUs whose jobs, activity, blips and telemetry gaps are drawn from ``seed``.

    Idle fleets (``forgotten=False``): jobs of 40 min-3 h between free spells, activity
    alternating busy (30-100 %), idle (0-2 %, sometimes one 50 % blip) and low-but-working
    (6-20 %). Forgotten fleets: jobs of 2-8 h that are forgotten (zeros with rare bursts, mean
    ~2 %), light (3-15 %) or busy. Every GPU gets 0-3 telemetry gaps of 1-25 min, and samples
    jitter by ±4 s (so some slots get two samples, the later wins, and some none).
    """
    rng = np.random.default_rng(seed)
    end = T0 + hours * 3600
    raws = []
    for g in range(gpus):
        node, uuid = f"n{g // 8}", f"GPU-{g}"
        times = (
            T0
            + 5
            + np.arange(0, hours * 3600, cadence)
            + rng.uniform(-4, 4, int(hours * 3600 / cadence))
        )
        values = np.zeros(len(times))
        jobs = []
        t = T0 + rng.uniform(0, 600)
        j = 0
        while t < end:
            length = rng.uniform(2, 8) * 3600 if forgotten else rng.uniform(40, 180) * 60
            job_start, job_end = t + rng.uniform(0, 10), min(end, t + length)
            jobs.append((f"api:{g}-{j}", job_start, job_end))
            j += 1
            mask_job = (times >= job_start) & (times < job_end)
            if forgotten:
                kind = rng.choice(["forgotten", "light", "busy"])
                n = int(mask_job.sum())
                if kind == "forgotten":
                    v = np.where(rng.random(n) < 0.03, rng.uniform(0.5, 0.9, n), 0.0)
                elif kind == "light":
                    v = rng.uniform(0.03, 0.15, n)
                else:
                    v = rng.uniform(0.3, 1.0, n)
                values[mask_job] = v
            else:
                for kind, s, e in _segments(rng, job_start, job_end, lambda: _activity(rng)):
                    m = (times >= s) & (times < e)
                    n = int(m.sum())
                    if kind == "idle":
                        v = rng.uniform(0.0, 0.02, n)
                        if n and rng.random() < 0.3:
                            v[rng.integers(n)] = 0.5
                    elif kind == "low":
                        v = rng.uniform(0.06, 0.2, n)
                    else:
                        v = rng.uniform(0.3, 1.0, n)
                    values[m] = v
            t = job_end + rng.uniform(5, 40) * 60
        keep = np.ones(len(times), dtype=bool)
        for _ in range(rng.integers(0, 4)):
            s = rng.uniform(T0, end)
            keep &= ~((times >= s) & (times < s + rng.uniform(1, 25) * 60))
        raws.append(Raw(f"{node}/{uuid}", times[keep], values[keep], tuple(jobs), g % 8))
    return raws


def _activity(rng: np.random.Generator) -> tuple[str, float]:
    kind = str(rng.choice(["busy", "idle", "low"], p=[0.4, 0.4, 0.2]))
    length = {"busy": (5, 60), "idle": (5, 90), "low": (10, 40)}[kind]
    return kind, rng.uniform(*length) * 60


def gentd26_pods(directory: Path = DATA) -> list[Raw]:
    """One Raw per pod of ``pod_gpu_duty_cycle_anon`` (% → ratio), held by one job for its
    whole life (first sample to last sample + one 57 s tick)."""
    series = gentd26_series(directory / GENTD26_DUTY_CYCLE_FILE, float)
    cells = {ip: [(t, v / 100) for t, v in rows] for ip, rows in series.items()}
    raws = []
    for i, (ip, samples) in enumerate(sorted(cells.items())):
        samples.sort()
        times = np.array([s[0] for s in samples])
        values = np.array([s[1] for s in samples])
        span = (f"api:pod-{i}", float(times[0]), float(times[-1]) + 57.0)
        raws.append(Raw(f"pod-{ip[:10]}/GPU-{ip[:12]}", times, values, (span,)))
    return raws


def service_for(raws: Sequence[Raw], *, step: int, recent_hours: int) -> CollectorService:
    end = max(float(r.times[-1]) for r in raws if len(r.times)) + step
    config = CollectorConfig(
        database=Path(":memory:"), step_seconds=step, recent_hours=recent_hours
    )
    svc = build_service(config, clock=lambda: end)
    ingest(svc, raws, {raw.key: i for i, raw in enumerate(raws)})
    return svc


# --- the runs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """One evaluation: data set, detector, parameters."""

    name: str
    forgotten: bool
    window_seconds: float
    threshold: float
    cadence_seconds: float
    min_coverage: float = 0.8


def run_synthetic(*, cycle_seconds: float, seed: int, gpus: int = 32) -> list[Score]:
    """Idle and forgotten detection on seeded synthetic fleets (truth by construction)."""
    fleet = synthetic_fleet(seed, gpus=gpus, hours=6, cadence=10, forgotten=False)
    svc = service_for(fleet, step=10, recent_hours=6)
    idle = Run("synthetic idle (30 min, <5 %)", False, 1800, 0.05, 10)
    scores = [_evaluate(idle, svc, fleet, np.arange(T0 + 1800, T0 + 6 * 3600, cycle_seconds))]
    fleet = synthetic_fleet(seed, gpus=gpus, hours=12, cadence=60, forgotten=True)
    svc = service_for(fleet, step=10, recent_hours=1)  # a 3 h window reads the 1-min ring
    forgot = Run("synthetic forgotten (3 h mean <5 %)", True, 3 * 3600, 0.05, 60)
    cycles = np.arange(T0 + 3 * 3600, T0 + 12 * 3600, max(cycle_seconds, 600))
    scores.append(_evaluate(forgot, svc, fleet, cycles))
    return scores


def run_gentd26(directory: Path, *, cycle_seconds: float) -> list[Score]:
    """Idle (duty cycle 0, and below 5 %) and forgotten detection on the GenTD26 pods."""
    pods = gentd26_pods(directory)
    svc = service_for(pods, step=60, recent_hours=24)
    start = min(float(r.times[0]) for r in pods)
    end = max(float(r.times[-1]) for r in pods)
    runs = [
        Run("GenTD26 idle (30 min, duty cycle 0)", False, 1800, 0.0002, 57),
        Run("GenTD26 idle (30 min, <5 %)", False, 1800, 0.05, 57),
        Run("GenTD26 forgotten (6 h mean <5 %)", True, 6 * 3600, 0.05, 57),
    ]
    scores = []
    for run in runs:
        first = math.ceil((start + run.window_seconds) / 60) * 60
        period = max(cycle_seconds, 600) if run.forgotten else cycle_seconds
        scores.append(_evaluate(run, svc, pods, np.arange(first, end, period)))
    return scores


def _evaluate(run: Run, svc: CollectorService, raws: Sequence[Raw], cycles: np.ndarray) -> Score:
    return evaluate(
        run.name, svc, raws, cycles, window_seconds=run.window_seconds,
        cadence_seconds=run.cadence_seconds, threshold=run.threshold,
        min_coverage=run.min_coverage, forgotten=run.forgotten,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycle-seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gentd26-dir", type=Path, default=DATA)
    args = parser.parse_args()
    began = time.perf_counter()
    scores = run_synthetic(cycle_seconds=args.cycle_seconds, seed=args.seed)
    if (args.gentd26_dir / "pod_gpu_duty_cycle_anon.csv.gz").exists():
        scores += run_gentd26(args.gentd26_dir, cycle_seconds=args.cycle_seconds)
    else:
        print(f"GenTD26 not found in {args.gentd26_dir}: synthetic only", file=sys.stderr)
    header = (
        f"{'data set / detector':40} {'prec':>6} {'recall':>6} {'TP':>6} {'FP':>5} {'FN':>5} "
        f"{'neg':>7} {'unk!':>4} {'episodes':>9}"
    )
    print(header)
    for s in scores:
        print(
            f"{s.name:40} {s.precision:6.3f} {s.recall:6.3f} {s.tp:6d} {s.fp:5d} {s.fn:5d} "
            f"{s.negatives:7d} {s.fired_on_unknown:4d} {s.episodes_found:4d}/{s.episodes:<4d}"
        )
    print("\ndetection delay after the onset of the waste (per episode found):")
    for s in scores:
        print(f"  {s.name:40} {s.delay_summary()}")
    print("\ndetection delay after the first cycle at which the truth was idle:")
    for s in scores:
        print(f"  {s.name:40} {s.delay_summary(held=True)}")
    print(
        f"\ncycle every {args.cycle_seconds:g} s (forgotten: every max(cycle, 600) s); "
        f"seed {args.seed}; {time.perf_counter() - began:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
