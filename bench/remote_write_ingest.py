"""Remote-write ingest: the collector's ``/api/v1/write`` against VictoriaMetrics', same batches.

Not a test: it prints figures. Run from the repository root:

    .venv/bin/python bench/remote_write_ingest.py                  # 16 nodes, 12 rounds
    .venv/bin/python bench/remote_write_ingest.py --nodes 125 --rounds 40   # the lead's size
    .venv/bin/python bench/remote_write_ingest.py --nodes 32 --rounds 40 --repeat 3
    .venv/bin/python bench/remote_write_ingest.py --reader python   # without the compiled reader

1. Batches. dcgm-exporter's pages as the end-to-end test serves them (``tests/dcgm_exposition.py``:
   its default fields, help, labels and value formats), ``--nodes`` nodes x 8 GPUs (two GPUs a
   node held by a pod, one time-sliced between two pods), scraped as Prometheus scrapes them
   (``test_prom_map_service.scrape_series``: each sample a series with ``instance`` and
   ``job``) every 15 s for ``--rounds`` rounds, cut into remote-write 1.0 requests of
   ``--batch`` samples (what Prometheus sends with ``max_samples_per_send``) and encoded
   (``remote_write.wire.encode``: protobuf + snappy) before anything is timed.
2. The collector: ``create_app`` with a ``CollectorService`` (pre-sized store, fixed clock) and
   the production mapping as its translator (``prom_map_columns.PromTranslator``, what
   ``gpuwarden collector`` runs: dcgm-exporter's table, GPU info, memory limits, the pods'
   per-process points), in a child process pinned to ``--core`` with ``taskset``.
3. VictoriaMetrics (Debian's ``victoria-metrics``), pinned to the same core, on its own
   ``/api/v1/write``, gets the same bodies.

Both run at once, on that core. Each gets the first ``WARM`` rounds first (they create every
series and fill each side's caches: the collector reads a label set flat, and learns its
mapping, from its second request; shown apart), then the other rounds, timed, in turns:
``--chunk`` rounds to one server, the same rounds to the other, and the one that went second
goes first next time, so the shared machine's drift falls on both alike (``--one-after-the-other``
is the method before: every round to the collector, then every round to VictoriaMetrics).
``--concurrency`` requests are in flight from this process, pinned to another core. Each
server's CPU in its own turns (the scheduler's run time of every thread,
``/proc/<pid>/task/*/schedstat``) and wall time give samples/s, CPU per sample and the ratio
collector / VictoriaMetrics (target >= 1.0x; with ``--repeat N`` both run N times with new
processes, and the verdict is the median ratio). Afterwards each says what it holds:
VictoriaMetrics the samples, the collector the points its mapping made of them, checked against
what ``prom_map.translate`` makes of the same requests (step 4), so a receiver that drops them
cannot win.

4. The collector's pipeline again in this process, stage by stage, before (series by series:
   snappy, parse and label walk, limits, ``prom_map.translate``, store) and after (snappy, the
   flat read, limits and mapping as columns, store: ``ingest.prom_columns``), so the server's
   CPU per sample can be split into those and the HTTP layer.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import re
import shutil
import statistics
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

import aiohttp
import cramjam
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
    Attrs,
    LabelSetCache,
    LabelSetColumns,
    store_columns,
)
from gpuwarden.collector.ingest.prom_map import translate
from gpuwarden.collector.ingest.prom_map_columns import PromTranslator
from gpuwarden.collector.ingest.prom_write import LabelVerdicts, screen
from gpuwarden.collector.remote_write.wire import HEADERS, Decoder, _raw_write_request, encode
from gpuwarden.collector.remote_write.wire_flat import FlatRequest
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.store.window_rows import RowBatch, RowsIngested
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import SERVICE, STATS, Admits, add_route
from gpuwarden.collector.web.remote_write_receiver import MAX_LABEL_SETS, RW_STATE, Translator
from tests.dcgm_exposition import DcgmFleet, Pod
from tests.test_prom_map_service import scrape_series

SCRAPE_S = 15
WARM = 2
"""Rounds sent before the timing starts (new series; each side's caches filled)."""
GPUS = 8
TOKEN = "bench-token-0123456789abcdef"  # noqa: S105 - loopback only, throwaway


# --- the batches ------------------------------------------------------------------------------


def scripted_fleet(nodes: int) -> DcgmFleet:
    """``nodes`` x 8 GPUs as ``tests/dcgm_exposition.py`` prints them: a quarter of the GPUs held
    by a pod, one GPU a node time-sliced between two pods, the rest free; busy GPUs busy."""
    fleet = DcgmFleet([f"gpu-node-{n:04d}" for n in range(nodes)], GPUS, pod_uid=True)
    for n, node in enumerate(fleet.nodes):
        fleet.assign(node, 0, Pod(f"train-{n}", "ml", uid=f"uid-{n}-0"))
        fleet.assign(node, 4, Pod(f"train-{n}-b", "ml", uid=f"uid-{n}-4"))
        fleet.assign(node, 7, Pod(f"infer-{n}-0", "serve"), Pod(f"infer-{n}-1", "serve"))
        for gpu in (0, 4, 7):
            fleet.set(node, gpu, {"DCGM_FI_DEV_GPU_UTIL": 90.0, "DCGM_FI_DEV_FB_USED": 40e3})
    return fleet


def batches(nodes: int, rounds: int, batch: int, t0_ms: int) -> tuple[list[list[bytes]], int]:
    """Each round's remote-write bodies of at most ``batch`` samples (the pages as Prometheus
    scrapes and remote-writes them: ``test_prom_map_service.scrape_series``, the end-to-end
    test's shape), and the samples a round holds."""
    fleet = scripted_fleet(nodes)
    out = []
    per_round = 0
    for r in range(rounds):
        fleet.advance(SCRAPE_S)
        for node in fleet.nodes:
            fleet.set(node, 1, {"DCGM_FI_DEV_GPU_UTIL": float(r % 100)})
        series = scrape_series(fleet, (t0_ms + r * SCRAPE_S * 1000) / 1000)
        per_round = len(series)
        out.append([encode(series[i : i + batch]) for i in range(0, len(series), batch)])
    return out, per_round


# --- the collector process ------------------------------------------------------------------------


async def _report(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response(
        {
            "series": service.store.series_count(),
            "stored": service.totals.accepted,
            "made": service.totals.accepted + service.totals.rejected,
            "flat_reads": request.app[RW_STATE].decoder.flat_reads,
            "native": request.app[RW_STATE].decoder.native,
            "samples": request.app[STATS].remote_write_samples,
            "responses": {str(k): v for k, v in request.app[STATS].responses.items()},
        }
    )


async def serve_collector(clock_s: float, capacity: int, series_path: bool, reader: str) -> None:
    """The collector on an ephemeral loopback port; prints ``port N``; stops on SIGTERM."""
    service = make_service(clock_s, capacity)
    service.max_new_series_per_source_hour = 10**9  # the whole fleet through one token
    config = CollectorConfig(
        tokens=TokenTable((credential(TOKEN, Role.AGENT, "prometheus", ("*",)),))
    )
    mapping: Translator = translate if series_path else PromTranslator()
    app = create_app(config, service=service, background=False, prom_translate=mapping)
    if reader == "python":  # the receiver's decoder without the compiled reader
        decoder = Decoder(MAX_LABEL_SETS, native=False)
        app[RW_STATE] = dataclasses.replace(app[RW_STATE], decoder=decoder)
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
        if self.cpu_s <= 0:  # under one tick of /proc's CPU clock: too short to tell
            return math.nan
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


@dataclass(frozen=True, slots=True)
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    base: str

    @property
    def write_url(self) -> str:
        return f"{self.base}/api/v1/write"


def start_collector(args: argparse.Namespace, per_round: int, clock_s: float, log: Path) -> Server:
    command = [
        "taskset",
        "-c",
        str(args.core),
        sys.executable,
        __file__,
        "--serve-collector",
        *(["--series-path"] if args.series_path else []),
        f"--reader={args.reader}",
        f"--clock={clock_s}",
        f"--capacity={4 * per_round}",
    ]
    with log.open("wb") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    found = re.match(rb"port (\d+)", proc.stdout.readline())
    if found is None:
        stop_process(proc)
        raise RuntimeError(f"the collector did not start: {log.read_text()[-2000:]}")
    return Server("collector", proc, f"http://127.0.0.1:{int(found.group(1))}")


def collector_made(server: Server, work: list[list[bytes]]) -> int:
    """Print the collector's answers; the points its mapping made."""
    report: dict[str, Any] = json_get(f"{server.base}/bench/report")
    requests = sum(map(len, work))
    reader = "compiled (native/rwflat.c)" if report["native"] else "Python (wire_flat)"
    line(
        "collector answers",
        f"{report['responses']}; {report['flat_reads']} of {requests} requests read flat, "
        f"by the {reader} reader",
    )
    return int(report["made"])


def json_get(url: str) -> Any:
    import json

    return json.loads(http_get(url))


def start_victoria(args: argparse.Namespace, tmp: Path) -> Server:
    port = free_port()
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
    server = Server("VictoriaMetrics", proc, f"http://127.0.0.1:{port}")
    try:
        wait_healthy(f"{server.base}/health", proc, 30)
    except Exception:
        stop_process(proc)
        raise
    return server


def victoria_held(server: Server, work: list[list[bytes]], t_last_s: int) -> int:
    """The samples VictoriaMetrics holds of those sent."""
    http_get(f"{server.base}/internal/force_flush")
    window_s = len(work) * SCRAPE_S + SCRAPE_S
    query = urllib.parse.quote(
        f'sum(count_over_time({{__name__=~"DCGM_.+"}}[{window_s}s]))', safe=""
    )
    url = f"{server.base}/api/v1/query?query={query}&time={t_last_s + 1}"
    for _ in range(100):  # a flushed part can take a moment to be searchable
        found = json_get(url)["data"]["result"]
        if found:
            return int(float(found[0]["value"][1]))
        time.sleep(0.1)
    return 0


def run_one_after_the_other(
    work: list[list[bytes]], per_round: int, args: argparse.Namespace, tmp: Path, t_last_s: int
) -> tuple[Figures, Figures]:
    """``--one-after-the-other``: the collector gets every round, then VictoriaMetrics."""
    samples = per_round * (len(work) - WARM)
    out = []
    for start in ("collector", "VictoriaMetrics"):
        if start == "collector":
            server = start_collector(args, per_round, float(t_last_s + SCRAPE_S), tmp / "c.log")
        else:
            server = start_victoria(args, tmp)
        try:
            first, cpu, wall, p99 = timed(
                server.name, server.write_url, server.proc.pid, work, per_round, args.concurrency
            )
            if start == "collector":
                held = collector_made(server, work)
            else:
                held = victoria_held(server, work, t_last_s)
        finally:
            stop_process(server.proc)
        out.append(Figures(server.name, samples, cpu, wall, first, p99, held))
    return out[0], out[1]


def task_cpu_s(pid: int) -> float:
    """CPU seconds of every live thread of a process, to the nanosecond (the scheduler's
    ``/proc/<pid>/task/*/schedstat``; ``/proc/<pid>/stat`` counts 10 ms ticks, too coarse for
    a phase of a few tens of milliseconds)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return total / 1e9


async def _post_all(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[bytes],
    concurrency: int,
    latencies: list[float],
) -> None:
    """POST every body, ``concurrency`` in flight, in order; raise on an answer but 204/200."""
    headers = {**HEADERS, "Authorization": f"Bearer {TOKEN}"}
    queue = iter(bodies)

    async def worker() -> None:
        for body in queue:
            began = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as response:
                answer = await response.read()
            latencies.append(time.perf_counter() - began)
            if response.status not in (200, 204):
                raise RuntimeError(f"{url}: {response.status}: {answer[:200]!r}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _take_turns(
    servers: Sequence[Server], work: list[list[bytes]], concurrency: int, chunk: int
) -> list[tuple[float, float, float, float]]:
    """The warm-up rounds to each server, then ``chunk`` rounds at a time to each in turn (who
    goes first alternates); per server (warm-up CPU, CPU, wall, p99 ms) of its timed turns."""
    sessions = [
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) for _ in servers
    ]
    cpu = [0.0] * len(servers)
    wall = [0.0] * len(servers)
    first = [0.0] * len(servers)
    latencies: list[list[float]] = [[] for _ in servers]
    try:
        warm = [body for bodies in work[:WARM] for body in bodies]
        for k, server in enumerate(servers):
            began = task_cpu_s(server.proc.pid)
            await _post_all(sessions[k], server.write_url, warm, concurrency, [])
            first[k] = task_cpu_s(server.proc.pid) - began
        rest = work[WARM:]
        for turn, at in enumerate(range(0, len(rest), chunk)):
            bodies = [body for round_ in rest[at : at + chunk] for body in round_]
            order = range(len(servers)) if turn % 2 == 0 else reversed(range(len(servers)))
            for k in order:
                pid = servers[k].proc.pid
                cpu_0, wall_0 = task_cpu_s(pid), time.perf_counter()
                await _post_all(
                    sessions[k], servers[k].write_url, bodies, concurrency, latencies[k]
                )
                wall[k] += time.perf_counter() - wall_0
                cpu[k] += task_cpu_s(pid) - cpu_0
    finally:
        for session in sessions:
            await session.close()
    return [
        (first[k], cpu[k], wall[k], percentile(latencies[k], 0.99) * 1e3)
        for k in range(len(servers))
    ]


def run_in_turns(
    work: list[list[bytes]], per_round: int, args: argparse.Namespace, tmp: Path, t_last_s: int
) -> tuple[Figures, Figures]:
    """Both servers up at once, on the same core; ``--chunk`` rounds to one, then the same to
    the other, whoever went second going first next time: the machine's drift falls on both."""
    samples = per_round * (len(work) - WARM)
    ours = start_collector(args, per_round, float(t_last_s + SCRAPE_S), tmp / "c.log")
    try:
        vm = start_victoria(args, tmp)
        try:
            taken = asyncio.run(_take_turns((ours, vm), work, args.concurrency, args.chunk))
            held = (collector_made(ours, work), victoria_held(vm, work, t_last_s))
        finally:
            stop_process(vm.proc)
    finally:
        stop_process(ours.proc)
    out = []
    for server, (first, cpu, wall, p99), kept in zip((ours, vm), taken, held, strict=True):
        line(
            server.name,
            f"{samples / wall:,.0f} samples/s, {cpu / samples * 1e6:.2f} us CPU per sample, "
            f"p99 {p99:.1f} ms (first {WARM} rounds, new series: {first:.2f} s CPU)",
        )
        out.append(Figures(server.name, samples, cpu, wall, first, p99, kept))
    return out[0], out[1]


class TimedSink:
    """``CollectorService`` as the column path's sink, timing the store (CPU)."""

    def __init__(self, service: CollectorService) -> None:
        self.service = service
        self.cpu_s = 0.0

    def accept_rows(self, batch: RowBatch, resources: Sequence[Attrs], source: str) -> RowsIngested:
        began = time.process_time()
        try:
            return self.service.accept_rows(batch, resources, source)
        finally:
            self.cpu_s += time.process_time() - began

    def end_series(self, points: Sequence[NumberPoint]) -> int:
        return self.service.end_series(points)


def parse_raw(raw: bytes) -> None:
    """Parse an inflated request as ``Decoder`` parses it series by series (upb)."""
    _raw_write_request()().ParseFromString(raw)


def stages(
    work: list[list[bytes]], per_round: int, clock_s: float, native: bool
) -> tuple[int, int]:
    """The collector's per-request pipeline in this process, stage by stage (CPU per sample),
    before (series by series: snappy, protobuf parse and label walk into ``Series``, screen,
    ``prom_map.translate`` into ``NumberPoint``s, ``accept``) and after (snappy, the flat read,
    the label checks and mapping as columns, ``ingest_rows``): what the server spent beyond it
    is HTTP, aiohttp and the worker-thread hand-off. Returns the points each path stored."""
    limits = CollectorConfig().ingest_limits
    samples = per_round * (len(work) - WARM)
    before = dict.fromkeys(
        ("snappy", "protobuf parse", "label walk", "limits", "translate", "store"), 0.0
    )
    service = make_service(clock_s, 4 * per_round)
    service.max_new_series_per_source_hour = 10**9
    decoder = Decoder(MAX_LABEL_SETS, flat=False)
    verdicts = LabelVerdicts(limits, MAX_LABEL_SETS)
    for r, bodies in enumerate(work):
        for body in bodies:
            t0 = time.process_time()
            raw = bytes(cramjam.snappy.decompress_raw(body))
            t1 = time.process_time()
            parse_raw(raw)  # what the decoder's parse costs alone (upb, no Python per series)
            t2 = time.process_time()
            series = decoder.decode(body)  # snappy and parse again: counted in their stages
            t3 = time.process_time()
            screened = screen(series, limits, verdicts)
            t4 = time.process_time()
            points = translate(screened.series).points
            t5 = time.process_time()
            service.accept(points, "bench", history=False)
            t6 = time.process_time()
            if r >= WARM:  # the warm-up rounds are left out, as above
                walk = (t3 - t2) - (t2 - t1) - (t1 - t0)
                took = (t1 - t0, t2 - t1, walk, t4 - t3, t5 - t4, t6 - t5)
                for stage, cpu in zip(before, took, strict=True):
                    before[stage] += cpu
    made_before = service.totals.accepted + service.totals.rejected
    service.storage.close()
    after = dict.fromkeys(("snappy", "flat read", "limits + mapping (columns)", "store"), 0.0)
    service = make_service(clock_s, 4 * per_round)
    service.max_new_series_per_source_hour = 10**9
    sink = TimedSink(service)
    decoder = Decoder(MAX_LABEL_SETS, native=native)
    translator = PromTranslator()
    cache = LabelSetCache(LabelVerdicts(limits, MAX_LABEL_SETS), translator)
    for r, bodies in enumerate(work):
        for body in bodies:
            stored_s = sink.cpu_s
            t0 = time.process_time()
            cramjam.snappy.decompress_raw(body)
            t1 = time.process_time()
            got = decoder.decode_flat(body)
            t2 = time.process_time()
            if isinstance(got, FlatRequest):
                request = LabelSetColumns(
                    got.ids, got.timestamps_ms, got.values, got.label_sets, got.generation
                )
                store_columns(request, cache, sink, _anyone, limits.max_points_per_request, "b")
            else:  # the first round (new label sets): the series path
                points = translator(screen(got, limits, verdicts).series).points
                service.accept(points, "bench", history=False)
            t3 = time.process_time()
            store = sink.cpu_s - stored_s
            if r >= WARM:
                took_after = (t1 - t0, t2 - t1 - (t1 - t0), t3 - t2 - store, store)
                for stage, cpu in zip(after, took_after, strict=True):
                    after[stage] += cpu
    print()
    print("collector pipeline in-process, steady rounds (CPU per sample sent):")
    print("  before (series by series, prom_map.translate):")
    for stage, cpu in before.items():
        line(f"    {stage}", f"{cpu / samples * 1e6:.2f} us")
    line("    total", f"{sum(before.values()) / samples * 1e6:.2f} us")
    reads = sum(map(len, work))
    reader = "compiled reader" if decoder.native else "Python reader"
    print(
        f"  after (read flat by the {reader}, PromTranslator columns; "
        f"{decoder.flat_reads} of {reads} flat):"
    )
    for stage, cpu in after.items():
        line(f"    {stage}", f"{cpu / samples * 1e6:.2f} us")
    line("    total", f"{sum(after.values()) / samples * 1e6:.2f} us")
    made_after = service.totals.accepted + service.totals.rejected
    line("  points made (before, after)", f"{made_before:,}, {made_after:,}")
    service.storage.close()
    return made_before, made_after


def _anyone(host: str) -> bool:
    return True


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=12, help=f"scrapes (> {WARM})")
    parser.add_argument("--batch", type=int, default=2000, help="samples per request")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument("--core", type=int, default=0, help="the core both servers run on")
    parser.add_argument(
        "--series-path",
        action="store_true",
        help="give the collector prom_map.translate alone (every request series by series: "
        "the receiver before the column path served the production mapping)",
    )
    parser.add_argument(
        "--reader",
        choices=("native", "python"),
        default="native",
        help="the collector's flat reader: the compiled one (native/rwflat.c, where the install "
        "built it) or the Python one (remote_write.wire_flat)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of both servers, each with new processes; the verdict is the median of the "
        "runs' ratios (the machine's noise moves each server's figures)",
    )
    parser.add_argument(
        "--chunk",
        type=int,
        default=4,
        help="rounds sent to one server before the other takes its turn with the same rounds",
    )
    parser.add_argument(
        "--one-after-the-other",
        action="store_true",
        help="the method before the turns: every round to the collector, then every round to "
        "VictoriaMetrics (drift between the two falls on the ratio)",
    )
    parser.add_argument("--serve-collector", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clock", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--capacity", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_collector:
        asyncio.run(serve_collector(args.clock, args.capacity, args.series_path, args.reader))
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
    began = time.perf_counter()
    work, per_round = batches(args.nodes, args.rounds, args.batch, t0_s * 1000)
    size = sum(len(b) for bodies in work for b in bodies) / sum(len(bodies) for bodies in work)
    line(
        "workload",
        f"{args.nodes} nodes x {GPUS} GPUs, dcgm-exporter's default fields "
        f"(tests/dcgm_exposition.py) = {per_round:,} series, {args.rounds} rounds {SCRAPE_S} s "
        f"apart, {args.batch:,}-sample requests ({size / 1024:.1f} KiB snappy), "
        f"{args.concurrency} in flight; built in {time.perf_counter() - began:.1f} s",
    )
    line(
        "translator",
        "prom_map.translate alone: every request series by series (--series-path)"
        if args.series_path
        else "the production mapping (prom_map_columns.PromTranslator, as `gpuwarden collector` "
        "runs it): requests read flat go through the receiver's columns",
    )
    line("servers pinned to", f"core {args.core} (taskset); load generator on {client_cores}")
    pairs: list[tuple[Figures, Figures]] = []
    for run in range(args.repeat):
        if args.repeat > 1:
            print(f"run {run + 1} of {args.repeat}")
        tmp = Path(tempfile.mkdtemp(prefix="rw-ingest-bench-"))
        try:
            both = run_one_after_the_other if args.one_after_the_other else run_in_turns
            ours, vm = both(work, per_round, args, tmp, t_last_s)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        pairs.append((ours, vm))
    sent = per_round * args.rounds
    print()
    for ours, vm in pairs:
        for f in (ours, vm):
            line(
                f.name,
                f"{f.per_s:,.0f} samples/s wall, {f.per_core_s:,.0f} samples/s per core, "
                f"{f.cpu_s / f.samples * 1e6:.2f} us CPU/sample",
            )
        line("VictoriaMetrics holds", f"{vm.held:,} samples of {sent:,} sent")
    clock_s = float(t_last_s + SCRAPE_S)
    by_series, _ = stages(work, per_round, clock_s, args.reader == "native")
    for ours, _vm in pairs:
        same = "the same" if ours.held == by_series else "not the same"
        line(
            "collector made",
            f"{ours.held:,} points (stored or refused by the store) of {sent:,} samples sent; "
            f"prom_map.translate on the series path makes {by_series:,} of the same requests "
            f"sent in order: {same} (with several requests in flight a round can overtake the "
            f"one before, and a counter's sample older than its newest is neither; "
            f"--concurrency 1 sends in order)",
        )
    print()
    version = package_version("victoria-metrics")
    walls = [ours.per_s / vm.per_s for ours, vm in pairs]
    per_core = [ours.per_core_s / vm.per_core_s for ours, vm in pairs]
    if len(pairs) > 1:
        for n, (wall, core) in enumerate(zip(walls, per_core, strict=True), start=1):
            line(f"run {n}", f"{wall:.2f}x samples/s, {core:.2f}x per core")
    if any(math.isnan(core) for core in per_core):
        line("note", "a server's CPU was under one clock tick (10 ms): use more --rounds")
    wall, core = statistics.median(walls), statistics.median(per_core)
    line(
        "collector / VictoriaMetrics" + (" (median)" if len(pairs) > 1 else ""),
        f"{wall:.2f}x samples/s, {core:.2f}x per core (VictoriaMetrics {version}); target "
        f">= 1.0x: {'met' if wall >= 1.0 else 'NOT met'}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
