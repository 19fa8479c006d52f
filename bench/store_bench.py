"""WindowStore benchmark: ingest rate, memory per series-hour, matrix() latency.

Run: ``.venv/bin/python bench/store_bench.py`` (about 45 s and 3 GB of RAM on a 2-core machine).

A fleet of 100 agents x 8 GPUs sends 40 series per GPU taken from the catalog (every GPU counter,
5 of them, then gauges and up-down sums; 3 are per-process series) every 10 s, one request of 320
points per agent, for 20 simulated minutes. Each round's points are built before the round, with
fresh attribute dicts (as the OTLP decoder makes them); only ``ingest()`` calls are timed. A few
more rounds use fresh strings too, which the store then has to hash. Building a ``NumberPoint``
(a frozen dataclass) costs about as much as ingesting it, which bounds the number of rounds.
"""

from __future__ import annotations

import gc
import mmap
import random
import time
import tracemalloc
from pathlib import Path

import numpy as np

from gpuwarden.agent.catalog import CATALOG, CLOCK_EVENT_REASONS, GPU_STATES, Scope, Shape
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.store.window import WindowStore

AGENTS, GPUS, ROUNDS, STEP_S = 100, 8, 120, 10
T0 = 1_750_000_000
NS = 1_000_000_000
KINDS = {"gauge": ("gauge", False), "counter": ("sum", True), "updowncounter": ("sum", False)}

# (metric, unit, OTLP kind, monotonic, fixed attributes, scope) for the 40 series of one GPU.
SeriesSpec = tuple[str, str, str, bool, tuple[tuple[str, str], ...], Scope]


def gpu_series() -> list[SeriesSpec]:
    specs: list[SeriesSpec] = []
    for row in CATALOG:
        if row.scope not in (Scope.GPU, Scope.PROCESS) or row.shape is Shape.MAPPING:
            continue
        kind, monotonic = KINDS[row.instrument.value]
        fixed = tuple(row.attributes.items())
        variants: list[tuple[tuple[str, str], ...]]
        if row.shape is Shape.BITMASK:
            variants = [((row.keys[0], reason),) for reason in CLOCK_EVENT_REASONS]
        elif row.shape is Shape.ONE_HOT:
            variants = [((row.keys[0], state),) for state in GPU_STATES]
        else:
            variants = [()]
        specs += [(row.name, row.unit, kind, monotonic, fixed + v, row.scope) for v in variants]
    return specs


def fleet_series(per_gpu: int = 40) -> list[SeriesSpec]:
    """``per_gpu`` series: every counter of the catalog's GPU rows, then gauges and sums."""
    specs = gpu_series()
    counters = [s for s in specs if s[3]]
    return [s for s in specs if not s[3]][: per_gpu - len(counters)] + counters


SPECS = fleet_series()
COUNTER_INDEXES = [gpu * len(SPECS) + i for gpu in range(GPUS) for i, s in enumerate(SPECS) if s[3]]


def agent_templates(agent: int) -> list[tuple[SeriesSpec, dict[str, str | int | float | bool]]]:
    """The attribute dicts of one agent's 320 series (copied into fresh dicts every round)."""
    out = []
    for gpu in range(GPUS):
        uuid = f"GPU-{agent:08x}-{gpu:04x}-4e2a-9c1d-00000000{gpu:04x}"
        for spec in SPECS:
            attrs: dict[str, str | int | float | bool] = {
                "hw.id": uuid,
                "hw.model": "NVIDIA H100 80GB HBM3",
                "gpuwarden.gpu.index": gpu,
            }
            attrs.update(spec[4])
            if spec[5] is Scope.PROCESS:
                attrs["process.pid"] = 4242 + gpu
                attrs["gpuwarden.job.scheduler"] = "slurm"
                attrs["gpuwarden.job.id"] = str(90_000 + agent)
            out.append((spec, attrs))
    return out


def agent_request(
    agent: int,
    templates: list[tuple[SeriesSpec, dict[str, str | int | float | bool]]],
    t_ns: int,
    rnd: random.Random,
    totals: list[float],
    fresh_strings: bool = False,
) -> list[NumberPoint]:
    """One agent's request: fresh attribute dicts, one resource dict shared by its points.

    With ``fresh_strings`` every key and value string is a new object, as the OTLP decoder makes
    them (so the store pays for hashing them); otherwise the strings are shared across rounds.
    """
    resource: dict[str, str | int | float | bool] = {
        "host.name": f"gpu-node-{agent:04d}",
        "service.name": "gpuwarden-agent",
    }
    base = agent * len(templates)
    values = [rnd.random() for _ in templates]
    for i in COUNTER_INDEXES:
        totals[base + i] += 7000.0 * values[i]
        values[i] = totals[base + i]
    if not fresh_strings:
        return [
            NumberPoint(resource, metric, unit, kind, monotonic, dict(template), t_ns, value)
            for ((metric, unit, kind, monotonic, _, _), template), value in zip(
                templates, values, strict=True
            )
        ]
    return [
        NumberPoint(
            resource,
            _fresh(metric),
            unit,
            kind,
            monotonic,
            {_fresh(k): _fresh(v) if isinstance(v, str) else v for k, v in template.items()},
            t_ns,
            value,
        )
        for ((metric, unit, kind, monotonic, _, _), template), value in zip(
            templates, values, strict=True
        )
    ]


def _fresh(text: str) -> str:
    return text.encode().decode()


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def bench_ingest() -> None:
    now = [float(T0)]
    rss_before = rss_bytes()
    store = WindowStore(clock=lambda: now[0])
    rnd = random.Random(7)
    templates = [agent_templates(a) for a in range(AGENTS)]
    totals = [0.0] * (AGENTS * GPUS * len(SPECS))
    points = 0
    elapsed = first_round_s = 0.0
    for r in range(ROUNDS):
        t_ns = (T0 + r * STEP_S) * NS
        now[0] = T0 + r * STEP_S + 1.0
        batches = [agent_request(a, templates[a], t_ns, rnd, totals) for a in range(AGENTS)]
        start = time.perf_counter()
        for batch in batches:
            store.ingest(batch)
        took = time.perf_counter() - start
        elapsed += took
        first_round_s = first_round_s or took
        points += sum(len(b) for b in batches)
    series = store.series_count()
    per_round = points // ROUNDS
    print(
        f"fleet: {AGENTS} agents x {GPUS} GPUs x {len(SPECS)} series = {series} series; "
        f"{ROUNDS} rounds of {STEP_S} s ({ROUNDS * STEP_S // 60} simulated min), "
        f"{points:,} points in requests of {GPUS * len(SPECS)} points"
    )
    print(
        f"ingest: {points / elapsed:,.0f} points/s per core overall, including the first round "
        f"that creates the series and doubles the arrays to 32,768 rows ({first_round_s:.1f} s)"
    )
    print(
        f"ingest: {(points - per_round) / (elapsed - first_round_s):,.0f} points/s per core "
        f"steady state (rounds 2..{ROUNDS})"
    )

    # Decoder-like points: every string a new object whose hash the store has to compute.
    fresh_rounds, fresh_points, fresh_s = 10, 0, 0.0
    for r in range(ROUNDS, ROUNDS + fresh_rounds):
        t_ns = (T0 + r * STEP_S) * NS
        now[0] = T0 + r * STEP_S + 1.0
        batches = [
            agent_request(a, templates[a], t_ns, rnd, totals, fresh_strings=True)
            for a in range(AGENTS)
        ]
        start = time.perf_counter()
        for batch in batches:
            store.ingest(batch)
        fresh_s += time.perf_counter() - start
        fresh_points += sum(len(b) for b in batches)
    print(
        f"ingest: {fresh_points / fresh_s:,.0f} points/s per core steady state with fresh "
        f"strings in every point, as decoded from OTLP ({fresh_rounds} rounds)"
    )

    del batches
    gc.collect()
    table = store._table
    total = store.memory_bytes()
    rows = table.recent.rows
    rings = table.ring_bytes()
    recent_b = rings["recent"] / rows
    long_b = rings["long"] / rows
    counters_b = rings["counter_dt"] / series
    arrays = sum(rings.values())
    other_b = (total - arrays) / series
    per_series = total / series
    recent_h, long_h = 6.0, 14 * 24.0
    issue_rate = (recent_b + counters_b + other_b) / recent_h + long_b / long_h
    gauge_rate = (recent_b + other_b) / recent_h + long_b / long_h
    dt_row = table.dts.shape[1] * table.dts.itemsize
    counter_rate = gauge_rate + dt_row / recent_h
    print(
        f"memory_bytes(): {total / 2**20:,.0f} MiB for {series} series (capacity {rows} rows) "
        f"= {per_series / 1024:.1f} KiB/series"
    )
    print(
        f"memory per series: recent ring {recent_b:,.0f} B, long ring {long_b:,.0f} B, "
        f"counter covered-time ring {counters_b:,.0f} B (averaged; 5 of 40 series are counters "
        f"at {dt_row:,} B each, {table.dts.shape[0]:,} counter rows allocated), "
        f"per-row arrays + Python objects {other_b:,.0f} B"
    )
    print(
        f"memory per series-hour: {issue_rate:,.0f} B/series-hour for this mix "
        f"(gauge {gauge_rate:,.0f} B, counter {counter_rate:,.0f} B), counted as the issue does: "
        f"recent-window bytes / {recent_h:.0f} h + long ring / {long_h:.0f} h"
    )
    print(
        f"memory per series-hour: {per_series / long_h:,.0f} B/series-hour "
        f"(all bytes / {long_h:.0f} h, the longest retention)"
    )
    print(
        f"memory cross-check: RSS grew {(rss_bytes() - rss_before) / 2**20:,.0f} MiB "
        f"while memory_bytes() says {total / 2**20:,.0f} MiB (the rings' pages cost RSS once "
        "written: the long ring fills over 14 days; RSS also holds freed point objects)"
    )
    del store, table
    gc.collect()


def bench_tracemalloc() -> None:
    agents = 8  # 2,560 series in 4,096 rows
    now = [float(T0)]
    rnd = random.Random(3)
    templates = [agent_templates(a) for a in range(agents)]
    totals = [0.0] * (agents * GPUS * len(SPECS))
    gc.collect()
    tracemalloc.start()
    store = WindowStore(clock=lambda: now[0] + 100)
    for r in range(3):
        t_ns = (T0 + r * STEP_S) * NS
        for a in range(agents):
            store.ingest(agent_request(a, templates[a], t_ns, rnd, totals, fresh_strings=True))
    gc.collect()
    traced, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    table = store._table
    rings = (table.recent.bits, table.long.bits, table.dts)
    big = sum(table.ring_bytes().values())
    # Large rings are anonymous mappings, which tracemalloc does not see: count them apart.
    mapped = sum(int(a.nbytes) for a in rings if _mapped(a))
    estimate = store.memory_bytes()
    series = store.series_count()
    print(
        f"memory cross-check: tracemalloc {traced / 2**20:,.1f} MiB + mapped rings "
        f"{mapped / 2**20:,.1f} MiB vs memory_bytes() {estimate / 2**20:,.1f} MiB for {series} "
        f"series ({(traced + mapped) / estimate:.3f}x); beyond the three rings: tracemalloc "
        f"{(traced + mapped - big) / series:,.0f} B/series, "
        f"memory_bytes() {(estimate - big) / series:,.0f} B/series"
    )


def _mapped(array: np.ndarray) -> bool:
    """Whether an array's memory is an mmap (``store_ring.zeros``) rather than numpy's."""
    base: object = array.base
    while isinstance(base, np.ndarray | memoryview):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return isinstance(base, mmap.mmap)


def bench_matrix() -> None:
    n_series, rounds = 10_000, 360  # 1 h of 10 s rounds
    now = [float(T0)]
    store = WindowStore(clock=lambda: now[0] + rounds * STEP_S, initial_capacity=16_384)
    rnd = np.random.default_rng(1)
    attrs: list[dict[str, str | int | float | bool]] = [
        {"hw.id": f"GPU-{i:08x}", "gpuwarden.gpu.index": i % 8} for i in range(n_series)
    ]
    resources: list[dict[str, str | int | float | bool]] = [
        {"host.name": f"gpu-node-{i // 8:05d}"} for i in range(n_series)
    ]
    for r in range(rounds):
        t_ns = (T0 + r * STEP_S) * NS
        values = rnd.random(n_series).tolist()
        store.ingest(
            NumberPoint(resources[i], "hw.gpu.utilization", "1", "gauge", False, attrs[i], t_ns, v)
            for i, v in enumerate(values)
        )
    end = T0 + rounds * STEP_S
    for label, start, resolution in (
        ("1 h at 10 s", end - 3600, "recent"),
        ("6 h at 10 s", end - 6 * 3600, "recent"),
        ("24 h at 1 min", end - 86400, "long"),
    ):
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            m = store.matrix("hw.gpu.utilization", start=start, end=end, resolution=resolution)  # type: ignore[arg-type]
            best = min(best, time.perf_counter() - t)
        shape = m.values.shape
        print(
            f"matrix(): {best * 1e3:.1f} ms for {shape[0]:,} series x {shape[1]} slots "
            f"({label}, best of 5)"
        )
    sel = {"host.name": "gpu-node-00042"}
    t = time.perf_counter()
    m = store.matrix("hw.gpu.utilization", selector=sel, start=end - 3600, end=end)
    print(
        f"matrix(selector): {(time.perf_counter() - t) * 1e3:.1f} ms for "
        f"{m.values.shape[0]} of {n_series:,} series x {m.values.shape[1]} slots"
    )


def bench_startup() -> None:
    """An empty default store, and one pre-sized for 34,600 series as ingest_bench makes it."""
    for capacity in (1024, 34_600):
        gc.collect()
        rss_before = rss_bytes()
        start = time.perf_counter()
        store = WindowStore(initial_capacity=capacity)
        took = time.perf_counter() - start
        print(
            f"start-up: WindowStore(initial_capacity={capacity:,}) in {took * 1e3:,.1f} ms, "
            f"memory_bytes() {store.memory_bytes() / 2**20:,.0f} MiB allocated, "
            f"RSS grew {(rss_bytes() - rss_before) / 2**20:,.0f} MiB (untouched pages are free)"
        )
        del store


def main() -> None:
    began = time.perf_counter()
    for section in (bench_startup, bench_ingest, bench_tracemalloc, bench_matrix):
        start = time.perf_counter()
        section()
        print(f"({section.__name__}: {time.perf_counter() - start:.0f} s wall)")
    print(f"bench wall time: {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
