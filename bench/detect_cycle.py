"""What one detection cycle costs: every default rule through ``DetectionEngine`` on a fleet.

Run from the repository root: ``.venv/bin/python -m bench.detect_cycle --gpus 1000
[--long-hours 24] [--models 16] [--cycles 3] [--mode thread|fork|both] [--probe-ingest]
[--seed 0] [--profile] [--every-long] [--every-recent]``. Not a test: it prints figures. About
4 min at 1,000 GPUs on two busy cores, most of it building the fleet (the history's writes);
the fleet's size scales it.

The fleet. One real agent (``build_agent``, simulated source, scenario ``mixed``: 8 H100s, four
Slurm jobs on seven of them, the host's own metrics) is sampled twice; its request's points are
the template of every node: ``--gpus / 8`` nodes, each with its own host name, GPU UUIDs and job
ids (so the store holds exactly the agent's metric set per GPU, 43 series). Every node's first
request goes through ``CollectorService.accept`` (series, node facts); the history is then
written through the store's vectorised batch write (``SeriesTable.write``, what ``accept`` ends
in), one batch per timestamp for every series at once: one point a minute for ``--long-hours``
before the recent window (the long ring's 1-minute means), then every 10 s for the recent window
(6 h). Gauges keep the agent's values with 2 % noise (utilisation clipped to 0-1, whole numbers
kept whole), counters grow at a steady rate; the GPUs of job 2003 and 2004 idle, as the scenario
has them. Jobs are in the registry (Slurm, on their nodes, one team per node group, some serving a
model); ``--models`` model deployments have latency and time-to-first-token histograms (two
replicas each, the recent window: the histogram retention), request counters by outcome and a
queue gauge, a deploy event each. Storage is a real SQLite file.

The cycle. The default rules (``rules/default.yaml``) through ``DetectionEngine.run_cycle``,
incidents folded into the SQLite file, ``--cycles`` times one minute (6 slots of every series)
apart. The first cycle fits what the fit caches hold; the later ones reuse the fits. ``--mode
fork`` (the default) runs each cycle in a forked child (``detect.fork``) as the collector does,
``thread`` in this process, ``both`` one of each per cycle. ``--probe-ingest`` times
``CollectorService.accept`` of one node's request every 50 ms from another thread while a cycle
runs (the event loop's place): what a cycle does to ingest latency. Prints per cycle the
seconds of every rule and the total, then RSS (this process, ``VmRSS`` and ``VmHWM``) and bytes
per GPU of the recent and long windows: allocated, and at full retention (14 days of long ring),
the long ring for the metrics the default rules read long only (``--every-long``: for every
series, as before ``long_metrics``), and the recent window's bytes by metric: each metric's
tier (``R`` a recent ring, ``L`` a long ring too, ``-`` its latest value only: no rule,
accounting or page reads it over time; ``--every-recent``: a recent ring for every metric, as
before ``recent_metrics``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # tiny statsmodels fits: one thread each

import argparse
import cProfile
import gc
import logging
import pstats
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from gpuwarden.agent.build import build_agent
from gpuwarden.agent.config import AgentConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.config import CollectorConfig as AgentCollectorConfig
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.detect.fork import dumps
from gpuwarden.collector.ingest.otlp import NumberPoint, number_points
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import Event, EventKind, ModelDeployment
from gpuwarden.collector.store.types import AttrValue, IngestCounts

NS = 1_000_000_000
STEP = 10
T_END = 1_767_225_600  # 2026-01-01 00:00 UTC
GPUS_PER_NODE = 8
UNUSED_ENDPOINT = "http://127.0.0.1:9/v1/metrics"  # the template agent never sends
LATENCY_BOUNDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def say(text: str) -> None:
    print(text, flush=True)


def template_points() -> list[NumberPoint]:
    """One real simulated agent's second request (the first has no counter deltas)."""
    logging.getLogger("gpuwarden.agent").setLevel(logging.ERROR)
    now = [float(T_END)]
    with tempfile.TemporaryDirectory(prefix="detect-cycle-spool-") as spool:
        runtime = build_agent(
            AgentConfig(
                node_name="gpu-node-0000",
                source="simulated",
                scenario="mixed",
                collector=AgentCollectorConfig(endpoint=UNUSED_ENDPOINT),
                spool=SpoolConfig(directory=Path(spool), fsync=False),
                http=HttpConfig(enabled=False),
            ),
            clock=lambda: now[0],
            with_host=True,
        )
        payload = b""
        for _ in range(2):
            now[0] += STEP
            runtime.agent.sample_once()
            assert runtime.agent.spool is not None
            ((seq, payload),) = runtime.agent.spool.peek(1, 1 << 30)
            runtime.agent.spool.ack(seq)
        runtime.agent.telemetry.shutdown()
    points, _ = number_points(ExportMetricsServiceRequest.FromString(payload))
    return points


@dataclass
class Fleet:
    """The fleet's series as rows of the store, and how to make each row's next value."""

    service: CollectorService
    rows: np.ndarray
    base: np.ndarray
    noise: np.ndarray
    clip: np.ndarray
    whole: np.ndarray
    rate: np.ndarray
    counter: np.ndarray
    gpus: int
    nodes: int


def node_points(template: list[NumberPoint], node: int, t_ns: int) -> list[NumberPoint]:
    """The template's points as node ``node``'s: its host name, GPU UUIDs and job ids."""
    host = f"gpu-node-{node:05d}"
    uuids: dict[object, str] = {}
    for p in template:
        if p.metric == "gpuwarden.gpu.info":
            uuids[p.attributes["hw.id"]] = (
                f"GPU-{node:08x}-{int(p.attributes['gpuwarden.gpu.index']):04x}-4e2a-9c1d"
            )
    resource = dict(template[0].resource)
    resource.update(
        {"host.name": host, "host.id": f"id-{node}", "service.instance.id": f"inst-{node}"}
    )
    out = []
    for p in template:
        attrs = dict(p.attributes)
        if "hw.id" in attrs:
            attrs["hw.id"] = uuids.get(attrs["hw.id"], attrs["hw.id"])
        if "gpuwarden.job.id" in attrs:
            attrs["gpuwarden.job.id"] = job_id(node, int(str(attrs["gpuwarden.job.id"])))
        out.append(
            NumberPoint(resource, p.metric, p.unit, p.kind, p.monotonic, attrs, t_ns, p.value)
        )
    return out


def job_id(node: int, template_id: int) -> str:
    return str(node * 10 + template_id % 10)


def jobs_of(template: list[NumberPoint], nodes: int, models: int, start: float) -> list[Job]:
    """The template's Slurm jobs on every node, as the registry knows them."""
    index_of = {
        p.attributes["hw.id"]: int(str(p.attributes["gpuwarden.gpu.index"]))
        for p in template
        if p.metric == "gpuwarden.gpu.info"
    }
    held: dict[int, list[int]] = {}
    for p in template:
        if p.metric == "gpuwarden.gpu.process.memory.usage":
            held.setdefault(int(str(p.attributes["gpuwarden.job.id"])), []).append(
                index_of[p.attributes["hw.id"]]
            )
    jobs = []
    for node in range(nodes):
        for k, (tid, indices) in enumerate(sorted(held.items())):
            ident = job_id(node, tid)
            model = (
                f"model-{node % models:02d}" if models and k == 1 and node < 4 * models else None
            )
            jobs.append(
                Job(
                    key=f"slurm:bench:{ident}",
                    scheduler="slurm",
                    job_id=ident,
                    state=JobState.RUNNING,
                    name=f"train-{ident}",
                    owner=f"user{node % 50}",
                    team=f"team-{node % 12}",
                    gpus=len(indices),
                    allocations=(GpuAllocation(f"gpu-node-{node:05d}", tuple(sorted(indices))),),
                    submit_time=start - 600,
                    start_time=start,
                    price_tier="on-demand",
                    model=model,
                )
            )
    return jobs


def model_points(models: int, t_ns: int, rng: np.random.Generator) -> list[NumberPoint]:
    """Request counters (by outcome) and queue gauges of every model's two replicas."""
    out = []
    for m in range(models):
        for replica in range(2):
            resource: dict[str, AttrValue] = {
                "host.name": f"serve-{m:02d}-{replica}",
                "service.name": f"model-{m:02d}",
            }
            attrs_ok: dict[str, AttrValue] = {"model": f"model-{m:02d}", "outcome": "success"}
            attrs_bad: dict[str, AttrValue] = {"model": f"model-{m:02d}", "outcome": "failure"}
            queue: dict[str, AttrValue] = {"model": f"model-{m:02d}"}
            out += [
                NumberPoint(resource, "gpuwarden.model.requests", "{request}", "sum", True,
                            attrs_ok, t_ns, float(rng.integers(1000, 5000))),
                NumberPoint(resource, "gpuwarden.model.requests", "{request}", "sum", True,
                            attrs_bad, t_ns, 1.0),
                NumberPoint(resource, "gpuwarden.model.queue.size", "{request}", "gauge", False,
                            queue, t_ns, float(rng.integers(1, 20))),
            ]  # fmt: skip
    return out


def build_fleet(
    args: argparse.Namespace, clock: list[float], tmp: Path
) -> tuple[Fleet, list[NumberPoint]]:
    rng = np.random.default_rng(args.seed)
    nodes = args.gpus // GPUS_PER_NODE
    template = template_points()
    config = CollectorConfig(database=tmp / "bench.db", snapshot_seconds=0)
    service = build_service(config, clock=lambda: clock[0])
    store = service.store
    if args.every_long:  # the store as before long_metrics: a long row for every series
        store._table.long_metrics = None
    if args.every_recent:  # the store as before recent_metrics: a recent row for every series
        store._table.recent_metrics = None
    recent_start = T_END - store.recent_seconds
    long_start = recent_start - int(args.long_hours * 3600)
    first_ns = long_start * NS
    clock[0] = float(long_start + 1)
    began = time.perf_counter()
    all_points: list[NumberPoint] = []
    for node in range(nodes):
        points = node_points(template, node, first_ns)
        service.accept(points, f"agent-{node}")
        all_points += points
    extra = model_points(args.models, first_ns, rng)
    service.accept(extra, "models")
    all_points += extra
    table = store._table
    rows = np.array(
        [
            table.aliases[(p.metric, p.resource.get("host.name"), tuple(p.attributes.items()))]
            for p in all_points
        ],
        dtype=np.int64,
    )
    values = np.array([p.value for p in all_points])
    counter = np.array([p.kind == "sum" and p.monotonic for p in all_points])
    util = np.array([p.metric.endswith("utilization") for p in all_points])
    whole = values == np.round(values)
    noise = np.where(whole | counter, 0.0, 0.02)
    faults = np.array([p.metric == "hw.errors" or "reject" in p.metric for p in all_points])
    rate = np.where(counter & ~faults, np.maximum(1.0, np.abs(values) / 1e4), 0.0)
    say(f"{nodes} nodes, {args.gpus} GPUs, {len(all_points):,} series "
        f"({len(all_points) / max(args.gpus, 1):.1f} per GPU with the model series), "
        f"created in {time.perf_counter() - began:.1f} s")  # fmt: skip
    registry_jobs = jobs_of(template, nodes, args.models, float(long_start))
    service.registry.put(registry_jobs)
    for m in range(args.models):
        service.storage.upsert_model(
            ModelDeployment(f"model-{m:02d}", "v2", replicas=2, slo_latency_p99_seconds=2.5,
                            slo_error_ratio=0.001)
        )  # fmt: skip
        service.storage.record_event(
            Event(T_END - 1200.0 - 60 * m, EventKind.DEPLOY, f"model-{m:02d}",
                  {"from": "v1", "to": "v2"})
        )  # fmt: skip
    fleet = Fleet(service, rows, values, noise, util, whole, rate, counter, args.gpus, nodes)
    began = time.perf_counter()
    long_times = range(long_start + 60, recent_start, 60)
    for t in long_times:
        write(fleet, t, rng, clock)
    say(f"long window: {len(long_times)} minutes of every series in "
        f"{time.perf_counter() - began:.1f} s")  # fmt: skip
    began = time.perf_counter()
    hist = Histograms(args.models, rng)
    for t in range(recent_start, T_END, STEP):
        write(fleet, t, rng, clock)
        hist.observe(store, t)
    say(f"recent window: {store.recent_seconds // STEP} timestamps in "
        f"{time.perf_counter() - began:.1f} s")  # fmt: skip
    return fleet, template


class Histograms:
    """Cumulative latency and time-to-first-token histograms of every model replica."""

    def __init__(self, models: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.keys = [
            (metric, {"host.name": f"serve-{m:02d}-{r}", "model": f"model-{m:02d}"})
            for m in range(models)
            for r in range(2)
            for metric in ("gpuwarden.model.request.latency", "gpuwarden.model.time_to_first_token")
        ]
        self.counts = np.zeros((len(self.keys), len(LATENCY_BOUNDS) + 1))
        self.sums = np.zeros(len(self.keys))
        self.shape = np.array([1, 3, 10, 30, 40, 12, 3, 1, 0.5, 0.2, 0.1])

    def observe(self, store: object, t: int) -> None:
        adds = self.rng.poisson(self.shape * 3, size=self.counts.shape)
        self.counts += adds
        self.sums += adds.sum(axis=1) * 0.2
        for i, (metric, attrs) in enumerate(self.keys):
            store.ingest_histogram(  # type: ignore[attr-defined]
                metric, attrs, time_unix_nano=t * NS, bounds=LATENCY_BOUNDS,
                bucket_counts=self.counts[i].tolist(), sum_value=float(self.sums[i]), unit="s",
            )  # fmt: skip


def write(fleet: Fleet, t: int, rng: np.random.Generator, clock: list[float]) -> None:
    """Every series' point at ``t`` in one vectorised batch."""
    clock[0] = t + 1.0
    values = fleet.base * (1.0 + fleet.noise * rng.standard_normal(fleet.base.size))
    values = np.where(fleet.clip, np.clip(values, 0.0, 1.0), values)
    values = np.where(fleet.counter, fleet.base + fleet.rate * (t - T_END), values)
    store = fleet.service.store
    table = store._table
    with store._lock:
        table.write(
            fleet.rows,
            np.full(fleet.rows.size, t * NS, dtype=np.int64),
            values,
            store._step_ns,
            store._ratio,
            IngestCounts(),
            unique_rows=True,
        )


PSS_EVERY_SECONDS = 1.0


class IngestProbe:
    """Another thread that stores one node's request every 50 ms and times each ``accept``;
    it also samples, once a second, the memory of this process and of a forked cycle's child
    (PSS: a page shared by both counts half in each, so the sum is what they hold together)."""

    def __init__(
        self, engine: DetectionEngine, service: CollectorService, points: list[NumberPoint]
    ) -> None:
        self.points = points
        self.service = service
        self.engine = engine
        self.latencies: list[float] = []
        self.spans: list[tuple[float, float]] = []
        self.peak_pss = pss(os.getpid())
        self._pss_due = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        due = time.perf_counter() + 0.05
        while not self.done.wait(max(0.0, due - time.perf_counter())):
            began = time.perf_counter()
            self.service.accept(self.points, "agent-0")
            ended = time.perf_counter()
            self.latencies.append(ended - began)
            # from when it was due: a request arriving then also waits for the GIL first
            self.spans.append((due, ended))
            if began >= self._pss_due:
                # Once a second: reading smaps_rollup walks every page table of a process of
                # GiBs (tens of ms of kernel time, holding its mmap lock); every 50 ms it took
                # most of a core from the cycle it measures.
                self._pss_due = began + PSS_EVERY_SECONDS
                cycles = self.engine._cycles
                child = None if cycles is None else cycles._pid
                total = pss(os.getpid()) + (pss(child) if child is not None else 0)
                self.peak_pss = max(self.peak_pss, total)
            due = max(due + 0.05, time.perf_counter())  # the PSS reads are not a request's wait

    def finish(self) -> None:
        self.done.set()
        self.thread.join()

    def report(self) -> str:
        lat = np.array(self.latencies) * 1000
        if not lat.size:
            return "    ingest probe: no request finished during the cycle"
        seen = np.array([e - b for b, e in self.spans]) * 1000
        return (f"    ingest probe: {lat.size} requests of {len(self.points)} points during the "
                f"cycle, p50 {np.percentile(lat, 50):.1f} ms, p99 {np.percentile(lat, 99):.1f} ms, "
                f"max {lat.max():.1f} ms; from when due (GIL waits included): p99 "
                f"{np.percentile(seen, 99):.1f} ms, max {seen.max():.1f} ms; peak PSS (this "
                f"process + a cycle's child) {self.peak_pss / 2**30:.2f} GiB")  # fmt: skip


class GcTimer:
    """The spans of this process's garbage collections while it is installed (``gc.callbacks``):
    a collection holds the GIL, so ingest waits for it."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, float, float]] = []
        self._began = 0.0

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.spans.append((info["generation"], self._began, time.perf_counter()))


def stall_report(
    probe: IngestProbe, phases: dict[str, tuple[float, float]], gcs: GcTimer, faults: str
) -> str:
    """Where the probe's slowest requests fell: the cycle's phases and collections they overlap."""
    spans = dict(phases)
    full = [(b, e) for gen, b, e in gcs.spans if gen == 2]
    young = [(b, e) for gen, b, e in gcs.spans if gen < 2]
    lines = [
        f"    gc here: {len(full)} full collections, {sum(e - b for b, e in full) * 1000:.0f} ms "
        f"(max {max((e - b for b, e in full), default=0.0) * 1000:.0f} ms); {len(young)} young, "
        f"{sum(e - b for b, e in young) * 1000:.0f} ms; phases, ms: "
        + ", ".join(f"{k} {(e - b) * 1000:.0f}" for k, (b, e) in spans.items())
        + f"; {faults}"
    ]
    for gen, b, e in gcs.spans:
        if gen == 2:
            where = [k for k, (pb, pe) in spans.items() if k != "cycle" and pb <= b < pe]
            phase = ", ".join(where) or "-"
            lines.append(f"    full collection {(e - b) * 1000:.0f} ms in {phase}")
    worst = sorted(probe.spans, key=lambda s: s[0] - s[1])[:3]
    for began, ended in worst:
        over = [
            f"{k} {(min(e, ended) - max(b, began)) * 1000:.0f}"
            for k, (b, e) in spans.items()
            if min(e, ended) > max(b, began)
        ]
        in_gc = sum(max(0.0, min(e, ended) - max(b, began)) for _, b, e in gcs.spans)
        lines.append(
            f"    slow request {(ended - began) * 1000:.0f} ms overlaps (ms): "
            f"{', '.join(over) or 'no phase'}; gc {in_gc * 1000:.0f}"
        )
    return "\n".join(lines)


def pss(pid: int) -> int:
    """Proportional set size of a process in bytes (0 when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in bytes."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(rest.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def memory_report(fleet: Fleet) -> None:
    table = fleet.service.store._table
    used = table.next_row
    gpus = max(fleet.gpus, 1)
    live = table.metric_of_row[:used] >= 0
    ring_rows = int((table.recent_row[:used][live] >= 0).sum())
    ring_counters = int((table.counter_row[:used][live] >= 0).sum())
    recent = table.recent.n_slots * (
        ring_rows * table.recent.bits.itemsize + ring_counters * table.dts.itemsize
    )
    latest_only = int(live.sum()) - ring_rows
    long_row = table.long.n_slots * table.long.bits.itemsize
    long_rows = table.next_long_row
    long_full = long_rows * long_row
    every_long = used * long_row  # what keeping every series long (before long_metrics) takes
    now, peak = rss()
    say(
        f"RSS {now / 2**30:.2f} GiB (peak {peak / 2**30:.2f} GiB); {used:,} series rows, "
        f"{ring_rows:,} with a recent row, {latest_only:,} latest value only, "
        f"{long_rows:,} with a long row"
    )
    say(f"recent window ({table.recent.n_slots} slots): {recent / gpus / 2**10:,.1f} KiB per GPU "
        f"({recent / 2**30:,.2f} GiB for this fleet); latest values: "
        f"{latest_only * table.latest_bits.itemsize / gpus:,.0f} B per GPU; "
        f"long window at full retention ({table.long.n_slots} slots): "
        f"{long_full / gpus / 2**10:,.1f} KiB per GPU "
        f"({long_full / 2**30:,.2f} GiB for this fleet; every series long: "
        f"{every_long / gpus / 2**20:,.2f} MiB per GPU, "
        f"{every_long / 2**30:,.1f} GiB)")  # fmt: skip
    say(f"long metrics: {', '.join(sorted(fleet.service.store.long_metrics or ['every metric']))}")
    kept = fleet.service.store.recent_metrics
    say(f"recent metrics: {', '.join(sorted(kept)) if kept is not None else 'every metric'}")
    names = {mid: name for name, mid in table.metric_ids.items()}
    ids, counts = np.unique(table.metric_of_row[:used], return_counts=True)
    say("recent window by metric (tier: R recent ring, L long too, - latest only; series per "
        "GPU; KiB per GPU of recent ring, what it takes with a ring):")  # fmt: skip
    for mid, n in sorted(zip(ids.tolist(), counts.tolist(), strict=True), key=lambda x: -x[1]):
        if mid < 0:
            continue
        rows = np.flatnonzero(table.metric_of_row[:used] == mid)
        ring = table.recent_row[rows] >= 0
        tier = "L" if (table.long_row[rows] >= 0).any() else "R" if ring.any() else "-"
        counters = int((table.counter_row[rows] != -1).sum())
        slot_bytes = n * table.recent.bits.itemsize + counters * table.dts.itemsize
        kib = slot_bytes * table.recent.n_slots / gpus / 2**10
        held = kib if ring.any() else 0.0
        say(f"  {tier} {names[mid]:<44} {n / gpus:6.2f} {held:8.1f} {kib:8.1f}")


def run_one(
    engine: DetectionEngine,
    label: str,
    profile: bool,
    fleet: Fleet,
    t: int,
    template: list[NumberPoint] | None,
) -> None:
    """One cycle, its figures printed (and the ingest probe's, with a ``template``)."""
    profiler = cProfile.Profile() if profile else None
    began, cpu_began = time.perf_counter(), time.process_time()
    if profiler is not None:
        profiler.enable()
    probe = None
    if template is not None:
        probe = IngestProbe(engine, fleet.service, node_points(template, 0, t * NS))
    with GcTimer() as gcs:
        try:
            result = engine.run_cycle()
        finally:
            ended = time.perf_counter()
            if probe is not None:
                probe.finish()
    if profiler is not None:
        profiler.disable()
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    failed = list(result.failed_rules) or "none"
    say(f"{label}: {wall:.2f} s wall, {result.cpu_seconds:.2f} s CPU of the rules, "
        f"{cpu:.2f} s CPU in this process, "
        f"{result.findings} findings ({result.firing} firing), "
        f"{result.opened} opened, failed: {failed}; RSS {rss()[0] / 2**30:.2f} GiB")  # fmt: skip
    if probe is not None:
        say(probe.report())
        cycles = engine._cycles
        phases, faults = {"cycle": (began, ended)}, ""
        if cycles is not None:
            phases.update(cycles.phases)
            phases["fold"] = (cycles.phases["loads"][1], ended)
            minor, major = cycles.parent_faults
            faults = f"page faults here while the child lived: {minor:,} minor, {major:,} major"
        say(stall_report(probe, phases, gcs, faults))
    if engine._cycles is not None and engine._forked is not None:
        caches = ", ".join(
            f"{getattr(kind, '__qualname__', kind)} {len(dumps(cache)) / 2**20:.1f}"
            for kind, cache in engine._forked.caches().items()
        )
        say(f"    fork: {engine._cycles.fork_seconds * 1000:.1f} ms with the locks held; "
            f"result {engine._cycles.result_bytes / 2**20:.1f} MiB pickled; "
            f"caches, MiB: {caches}")  # fmt: skip
    for rule, seconds in sorted(result.rule_seconds.items(), key=lambda kv: -kv[1]):
        say(f"    {rule:32s} {seconds:7.2f} s")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)


def run_accounting(
    engine: DetectionEngine, fleet: Fleet, t: int, template: list[NumberPoint], where: str
) -> None:
    """One run of the collector's accounting step (every ``accounting_period_seconds``), with
    the ingest probe: what it costs ingest, computed ``where`` (this thread, or the forked child
    the collector uses: ``CollectorService.fork_accounting``)."""
    say(f"accounting ({where}):")
    probe = IngestProbe(engine, fleet.service, node_points(template, 0, t * NS))
    began, cpu = time.perf_counter(), time.thread_time()
    try:
        written = fleet.service.run_accounting(float(t))
    finally:
        wall, cpu = time.perf_counter() - began, time.thread_time() - cpu
        probe.finish()
    say(f"accounting ({where}): {wall:.2f} s wall, {cpu:.2f} s CPU in this thread (GIL held), "
        f"{written} rows written")  # fmt: skip
    say(probe.report())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--long-hours", type=float, default=24.0)
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument(
        "--mode", choices=("thread", "fork", "both"), default="fork",
        help="cycles in this process, in a forked child (detect.fork), or both in turn",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--every-long", action="store_true",
        help="keep a long ring for every series (as before long_metrics), to compare",
    )  # fmt: skip
    parser.add_argument(
        "--every-recent", action="store_true",
        help="keep a recent ring for every series (as before recent_metrics), to compare",
    )  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="cProfile the last cycle")
    parser.add_argument(
        "--probe-ingest", action="store_true",
        help="while each cycle runs, time CollectorService.accept of one node's request "
             "every 50 ms from another thread (as the event loop would)",
    )  # fmt: skip
    parser.add_argument(
        "--accounting", action="store_true",
        help="after the cycles, time one accounting step with the ingest probe: in a thread of "
             "this process, then in a forked child (as the collector runs it every minute)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("gpuwarden.collector.detect.incidents").setLevel(logging.ERROR)
    clock = [float(T_END)]
    with tempfile.TemporaryDirectory(prefix="detect-cycle-") as tmp:
        fleet, template = build_fleet(args, clock, Path(tmp))
        service = fleet.service
        rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
        modes = ("thread", "fork") if args.mode == "both" else (args.mode,)
        engines = {
            mode: DetectionEngine(
                service.detection_view,
                rules,
                storage=service.storage,
                clock=lambda: clock[0],
                fork=mode == "fork",
            )
            for mode in modes
        }
        memory_report(fleet)
        rng = np.random.default_rng(args.seed + 1)
        t = T_END
        for cycle in range(args.cycles):
            if cycle:
                for _ in range(6):
                    write(fleet, t, rng, clock)
                    t += STEP
            clock[0] = float(t)
            for mode, engine in engines.items():
                last = cycle == args.cycles - 1
                run_one(engine, f"cycle {cycle} ({mode})", args.profile and last, fleet, t,
                        template if args.probe_ingest else None)  # fmt: skip
        if args.accounting:  # as it ran before, then as the collector runs it now
            run_accounting(engines[modes[-1]], fleet, t, template, "in a thread")
            service.fork_accounting()
            run_accounting(engines[modes[-1]], fleet, t, template, "in a forked child")
        memory_report(fleet)
        service.storage.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
