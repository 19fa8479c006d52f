"""Remote-write ingest: the collector's ``/api/v1/write`` against VictoriaMetrics', same batches.

Not a test: it prints figures. Run from the repository root:

    .venv/bin/python bench/remote_write_ingest.py                  # 16 nodes, 12 rounds
    .venv/bin/python bench/remote_write_ingest.py --nodes 125 --rounds 40   # the lead's size

1. Batches. A dcgm-exporter-like fleet: ``--nodes`` nodes x 8 GPUs x 40 DCGM fields, each series
   labelled as dcgm-exporter 3.x labels it (``gpu``, ``UUID``, ``device``, ``modelName``,
   ``Hostname``, ``DCGM_FI_DRIVER_VERSION``, ``pci_bus_id``, plus Prometheus' ``job`` and
   ``instance``; a quarter of the GPUs with ``namespace``/``pod``/``container``), scraped every
   15 s for ``--rounds`` rounds, cut into remote-write 1.0 requests of ``--batch`` samples (what
   Prometheus sends with ``max_samples_per_send``) and encoded (``remote_write.wire.encode``:
   protobuf + snappy) before anything is timed.
2. The collector: ``create_app`` with a ``CollectorService`` (pre-sized store, fixed clock) and
   :class:`BenchTranslator` below as its translator (it maps *every* series of the batch: the field
   name onto ``dcgm.<field>``, ``UUID`` onto ``hw.id``, ``Hostname`` onto ``host.name``, the pod
   labels onto attributes; each label set once, remembered), in a child process pinned to
   ``--core`` with ``taskset``.
3. VictoriaMetrics (Debian's ``victoria-metrics``), pinned to the same core, on its own
   ``/api/v1/write``, gets the same bodies.

Both get the first ``WARM`` rounds first (they create every series and fill each side's caches:
the collector reads a label set flat, and learns its mapping, from its second request; shown
apart), then the other rounds, timed,
``--concurrency`` requests in flight from this process, pinned to another core. Each server's
CPU (``/proc/<pid>/stat``, every thread) and the wall time give samples/s, CPU per sample and
the ratio collector / VictoriaMetrics (target >= 1.0x). Afterwards each says how many samples it
holds, so a receiver that drops them cannot win.

4. The collector's pipeline again in this process, stage by stage, before (series by series:
   decode, limits, translate, store) and after (read flat and stored through the columns,
   ``ingest.prom_columns``), so the server's CPU per sample can be split into those and the
   HTTP layer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiohttp import web

from bench.ingest_bench import (
    free_port,
    http_get,
    line,
    make_service,
    package_version,
    percentile,
    send_phase,
    serve_app,
    stop_process,
    wait_healthy,
)
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.prom_columns import (
    LabelSetCache,
    LabelSetColumns,
    SeriesMapping,
    store_columns,
)
from gpuwarden.collector.ingest.prom_write import LabelVerdicts, screen
from gpuwarden.collector.remote_write.wire import HEADERS, Decoder, Series, encode
from gpuwarden.collector.remote_write.wire_flat import FlatRequest
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import SERVICE, STATS, Admits, add_route
from gpuwarden.collector.web.remote_write_receiver import MAX_LABEL_SETS

SCRAPE_S = 15
WARM = 2
"""Rounds sent before the timing starts (new series; each side's caches filled)."""
GPUS = 8
TOKEN = "bench-token-0123456789abcdef"  # noqa: S105 - loopback only, throwaway
FIELDS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)
assert len(FIELDS) == 40


# --- the translator (maps every series of the batch) -------------------------------------------


@dataclass(frozen=True, slots=True)
class Translated:
    points: list[NumberPoint]
    skipped: int


POD_LABELS = ("namespace", "pod", "container")


class BenchTranslator:
    """Every series onto ``dcgm.<field>`` (gauge, unit 1): ``UUID`` → ``hw.id``, ``Hostname`` →
    ``host.name`` (the resource), the pod labels kept as attributes; the rest dropped.

    Both contracts: ``map_series`` (a ``prom_columns.SeriesMapper``: the receiver then stores
    flat requests through its columns) and ``__call__`` (series → points, for the series path;
    each label set mapped once there too)."""

    def __init__(self) -> None:
        self.resources: dict[str, dict[str, str | int | float | bool]] = {}
        self.mapped: dict[tuple[tuple[str, str], ...], SeriesMapping | None] = {}

    def map_series(self, labels: tuple[tuple[str, str], ...], /) -> SeriesMapping | None:
        found = dict(labels)
        name, host, uuid = found.get("__name__"), found.get("Hostname"), found.get("UUID")
        if name is None or host is None or uuid is None:
            return None
        resource = self.resources.setdefault(host, {"host.name": host})
        attrs: dict[str, str | int | float | bool] = {"hw.id": uuid}
        attrs |= {key: found[key] for key in POD_LABELS if key in found}
        metric = "dcgm." + name.removeprefix("DCGM_FI_").lower()
        return SeriesMapping(resource, metric, "1", False, attrs)

    def __call__(self, series: Sequence[Series]) -> Translated:
        points: list[NumberPoint] = []
        skipped = 0
        mapped = self.mapped
        for one in series:
            labels = one.labels
            if labels in mapped:
                found = mapped[labels]
            else:
                found = mapped[labels] = self.map_series(labels)
            if found is None:
                skipped += 1
                continue
            resource, metric, attrs = found.resource, found.metric, found.attributes
            for t, v in zip(one.timestamps_ms, one.values, strict=True):
                t_ns = t * 1_000_000
                points.append(NumberPoint(resource, metric, "1", "gauge", False, attrs, t_ns, v))
        return Translated(points, skipped)


# --- the batches --------------------------------------------------------------------------------


def fleet_labels(nodes: int) -> list[tuple[tuple[str, str], ...]]:
    """Every series' labels, as dcgm-exporter and Prometheus' scrape give them (sorted)."""
    out = []
    for n in range(nodes):
        host = f"gpu-node-{n:04d}"
        for g in range(GPUS):
            gpu = {
                "gpu": str(g),
                "UUID": f"GPU-{n:04d}{g:02d}00-1111-2222-3333-444455556666",
                "device": f"nvidia{g}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": host,
                "DCGM_FI_DRIVER_VERSION": "550.90.07",
                "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0",
                "job": "dcgm-exporter",
                "instance": f"10.0.{n // 250}.{n % 250}:9400",
            }
            if g % 4 == 0:
                gpu |= {"namespace": "ml", "pod": f"train-{n}-{g}", "container": "trainer"}
            out += [tuple(sorted({**gpu, "__name__": f}.items())) for f in FIELDS]
    return out


def batches(nodes: int, rounds: int, batch: int, t0_ms: int) -> list[list[bytes]]:
    """Each round's remote-write bodies of at most ``batch`` samples."""
    labels = fleet_labels(nodes)
    out = []
    for r in range(rounds):
        t = t0_ms + r * SCRAPE_S * 1000
        series = [Series(ls, (t,), (float((i * 7 + r) % 100),)) for i, ls in enumerate(labels)]
        out.append([encode(series[i : i + batch]) for i in range(0, len(series), batch)])
    return out


# --- the collector process ------------------------------------------------------------------------


async def _report(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response(
        {
            "series": service.store.series_count(),
            "stored": service.totals.accepted,
            "samples": request.app[STATS].remote_write_samples,
            "responses": {str(k): v for k, v in request.app[STATS].responses.items()},
        }
    )


async def serve_collector(clock_s: float, capacity: int) -> None:
    """The collector on an ephemeral loopback port; prints ``port N``; stops on SIGTERM."""
    service = make_service(clock_s, capacity)
    service.max_new_series_per_source_hour = 10**9  # the whole fleet through one token
    config = CollectorConfig(
        tokens=TokenTable((credential(TOKEN, Role.AGENT, "prometheus", ("*",)),))
    )
    app = create_app(config, service=service, background=False, prom_translate=BenchTranslator())
    add_route(app, "GET", "/bench/report", _report, Admits(open_because="the bench's own"))
    await serve_app(app, service, access_log=False)


# --- running both ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figures:
    name: str
    samples: int
    cpu_s: float
    wall_s: float
    first_cpu_s: float
    p99_ms: float
    held: int

    @property
    def per_s(self) -> float:
        return self.samples / self.wall_s

    @property
    def per_core_s(self) -> float:
        return self.samples / self.cpu_s


def timed(
    name: str, url: str, pid: int, work: list[list[bytes]], per_round: int, concurrency: int
) -> tuple[float, float, float, float]:
    """Send the warm-up rounds, then the rest; (warm-up CPU, CPU, wall, p99 ms) of the rest."""
    headers = {**HEADERS, "Authorization": f"Bearer {TOKEN}"}
    warm = [body for bodies in work[:WARM] for body in bodies]
    _, first_cpu, _ = send_phase(url, warm, headers, concurrency, pid, otlp=False)
    rest = [body for bodies in work[WARM:] for body in bodies]
    result, cpu, wall = send_phase(url, rest, headers, concurrency, pid, otlp=False)
    p99 = percentile(result.latencies_s, 0.99) * 1e3
    samples = per_round * (len(work) - WARM)
    line(
        name,
        f"{samples / wall:,.0f} samples/s, {cpu / samples * 1e6:.2f} us CPU per sample, "
        f"p99 {p99:.1f} ms (first {WARM} rounds, new series: {first_cpu:.2f} s CPU)",
    )
    return first_cpu, cpu, wall, p99


def run_collector(
    work: list[list[bytes]], per_round: int, args: argparse.Namespace, clock_s: float, log: Path
) -> Figures:
    command = [
        "taskset",
        "-c",
        str(args.core),
        sys.executable,
        __file__,
        "--serve-collector",
        f"--clock={clock_s}",
        f"--capacity={per_round}",
    ]
    with log.open("wb") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout is not None
        found = re.match(rb"port (\d+)", proc.stdout.readline())
        if found is None:
            raise RuntimeError(f"the collector did not start: {log.read_text()[-2000:]}")
        base = f"http://127.0.0.1:{int(found.group(1))}"
        first, cpu, wall, p99 = timed(
            "collector", f"{base}/api/v1/write", proc.pid, work, per_round, args.concurrency
        )
        report: dict[str, Any] = json_get(f"{base}/bench/report")
    finally:
        stop_process(proc)
    return Figures(
        "collector", per_round * (len(work) - WARM), cpu, wall, first, p99, report["stored"]
    )


def json_get(url: str) -> Any:
    import json

    return json.loads(http_get(url))


def run_victoria(
    work: list[list[bytes]], per_round: int, args: argparse.Namespace, tmp: Path, t_last_s: int
) -> Figures:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [
        "taskset",
        "-c",
        str(args.core),
        "victoria-metrics",
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-storageDataPath={tmp / 'vm-data'}",
        "-retentionPeriod=100y",
        "-loggerLevel=ERROR",
    ]
    with (tmp / "victoria-metrics.log").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=log)
    try:
        wait_healthy(f"{base}/health", proc, 30)
        first, cpu, wall, p99 = timed(
            "VictoriaMetrics", f"{base}/api/v1/write", proc.pid, work, per_round, args.concurrency
        )
        http_get(f"{base}/internal/force_flush")
        window_s = len(work) * SCRAPE_S + SCRAPE_S
        query = urllib.parse.quote(
            f'sum(count_over_time({{__name__=~"DCGM_.+"}}[{window_s}s]))', safe=""
        )
        answer = json_get(f"{base}/api/v1/query?query={query}&time={t_last_s + 1}")
        held = int(float(answer["data"]["result"][0]["value"][1]))
    finally:
        stop_process(proc)
    samples = per_round * (len(work) - WARM)
    return Figures("VictoriaMetrics", samples, cpu, wall, first, p99, held)


def stages(work: list[list[bytes]], per_round: int, clock_s: float) -> None:
    """The collector's per-request pipeline in this process, stage by stage (CPU per sample),
    before (series by series: ``Series``, screen, translate to ``NumberPoint``s, ``accept``) and
    after (read flat, then the columns: ``prom_columns.store_columns``): what the server spent
    beyond it is HTTP, aiohttp and the worker-thread hand-off."""
    limits = CollectorConfig().ingest_limits
    samples = per_round * (len(work) - WARM)
    before = dict.fromkeys(("decode", "limits", "translate", "store"), 0.0)
    service = make_service(clock_s, per_round)
    service.max_new_series_per_source_hour = 10**9
    decoder = Decoder(MAX_LABEL_SETS, flat=False)
    verdicts = LabelVerdicts(limits, MAX_LABEL_SETS)
    translate = BenchTranslator()
    for r, bodies in enumerate(work):
        for body in bodies:
            t0 = time.process_time()
            series = decoder.decode(body)
            t1 = time.process_time()
            screened = screen(series, limits, verdicts)
            t2 = time.process_time()
            points = translate(screened.series).points
            t3 = time.process_time()
            service.accept(points, "bench", history=False)
            t4 = time.process_time()
            if r >= WARM:  # the warm-up rounds are left out, as above
                for stage, took in zip(before, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                    before[stage] += took
    held_before = service.totals.accepted
    service.storage.close()
    after = dict.fromkeys(("decode", "limits + map + store (columns)"), 0.0)
    service = make_service(clock_s, per_round)
    service.max_new_series_per_source_hour = 10**9
    decoder = Decoder(MAX_LABEL_SETS)
    cache = LabelSetCache(LabelVerdicts(limits, MAX_LABEL_SETS), BenchTranslator())
    for r, bodies in enumerate(work):
        for body in bodies:
            t0 = time.process_time()
            got = decoder.decode_flat(body)
            t1 = time.process_time()
            if isinstance(got, FlatRequest):
                request = LabelSetColumns(
                    got.ids, got.timestamps_ms, got.values, got.label_sets, got.generation
                )
                store_columns(request, cache, service, _anyone, limits.max_points_per_request, "b")
            else:  # the first round (new label sets): the series path
                points = translate(screen(got, limits, verdicts).series).points
                service.accept(points, "bench", history=False)
            t2 = time.process_time()
            if r >= WARM:
                for stage, took in zip(after, (t1 - t0, t2 - t1), strict=True):
                    after[stage] += took
    print()
    print("collector pipeline in-process, steady rounds (CPU per sample):")
    print("  before (series by series):")
    for stage, took in before.items():
        line(f"    {stage}", f"{took / samples * 1e6:.2f} us")
    line("    total", f"{sum(before.values()) / samples * 1e6:.2f} us")
    print(f"  after (read flat, columns; {decoder.flat_reads} of {sum(map(len, work))} read flat):")
    for stage, took in after.items():
        line(f"    {stage}", f"{took / samples * 1e6:.2f} us")
    line("    total", f"{sum(after.values()) / samples * 1e6:.2f} us")
    line("  stored (before, after)", f"{held_before:,}, {service.totals.accepted:,}")
    service.storage.close()


def _anyone(host: str) -> bool:
    return True


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=12, help=f"scrapes (> {WARM})")
    parser.add_argument("--batch", type=int, default=2000, help="samples per request")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--core", type=int, default=0, help="the core both servers run on")
    parser.add_argument("--serve-collector", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clock", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--capacity", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_collector:
        asyncio.run(serve_collector(args.clock, args.capacity))
        return 0
    if shutil.which("victoria-metrics") is None or shutil.which("taskset") is None:
        print("needs victoria-metrics and taskset (apt-get install victoria-metrics util-linux)")
        return 1
    cores = sorted(os.sched_getaffinity(0))
    client_cores = {c for c in cores if c != args.core} or set(cores)
    os.sched_setaffinity(0, client_cores)  # the load generator off the servers' core
    # Rounds end a minute in the past: VictoriaMetrics hides the last 30 s from queries.
    t0_s = int(time.time()) - args.rounds * SCRAPE_S - 60
    t_last_s = t0_s + (args.rounds - 1) * SCRAPE_S
    per_round = args.nodes * GPUS * len(FIELDS)
    began = time.perf_counter()
    work = batches(args.nodes, args.rounds, args.batch, t0_s * 1000)
    size = sum(len(b) for bodies in work for b in bodies) / sum(len(bodies) for bodies in work)
    line(
        "workload",
        f"{args.nodes} nodes x {GPUS} GPUs x {len(FIELDS)} fields = {per_round:,} series, "
        f"{args.rounds} rounds {SCRAPE_S} s apart, {args.batch:,}-sample requests "
        f"({size / 1024:.1f} KiB snappy), {args.concurrency} in flight; built in "
        f"{time.perf_counter() - began:.1f} s",
    )
    line(
        "translator",
        "bench.remote_write_ingest.BenchTranslator: every series onto dcgm.<field>, each label "
        "set mapped once (a SeriesMapper: flat requests go through the receiver's columns)",
    )
    line("servers pinned to", f"core {args.core} (taskset); load generator on {client_cores}")
    tmp = Path(tempfile.mkdtemp(prefix="rw-ingest-bench-"))
    try:
        ours = run_collector(work, per_round, args, float(t_last_s + SCRAPE_S), tmp / "c.log")
        vm = run_victoria(work, per_round, args, tmp, t_last_s)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sent = per_round * args.rounds
    print()
    for f in (ours, vm):
        line(
            f.name,
            f"{f.per_s:,.0f} samples/s wall, {f.per_core_s:,.0f} samples/s per core, "
            f"{f.cpu_s / f.samples * 1e6:.2f} us CPU/sample; holds {f.held:,} of {sent:,} sent",
        )
    stages(work, per_round, float(t_last_s + SCRAPE_S))
    print()
    version = package_version("victoria-metrics")
    line(
        "collector / VictoriaMetrics",
        f"{ours.per_s / vm.per_s:.2f}x samples/s, {ours.per_core_s / vm.per_core_s:.2f}x per "
        f"core (VictoriaMetrics {version}); target >= 1.0x: "
        f"{'met' if ours.per_s >= vm.per_s else 'NOT met'}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
