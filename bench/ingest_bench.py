"""OTLP ingest benchmark: the collector against VictoriaMetrics on the same points.

Not a test: it prints figures. Run from the repository root:

    .venv/bin/python bench/ingest_bench.py                 # about a minute on 2 cores
    .venv/bin/python bench/ingest_bench.py --rounds 10     # quicker, noisier
    .venv/bin/python bench/ingest_bench.py --profile       # adds a cProfile of the ingest pipeline

1. Requests. ``--agents`` simulated agents (scenario "mixed": 8 H100s with jobs, plus the host's
   own metrics) are built with ``build_agent`` and sampled ``--rounds`` times on a fake clock 10 s
   apart; each round's OTLP request is the agent's real encoding, taken from its spool. The OTel
   SDK stamps points with the wall clock, so every data point is restamped to its round's time
   (cumulative sums to the agent's start) before gzip. The same points are also written as
   Prometheus text for VictoriaMetrics. Everything is built (in 2 worker processes) before timing.
2. The collector. ``create_app`` with a ``CollectorService`` whose ``WindowStore`` is pre-sized and
   whose clock is fixed just after the last round runs in a child process of this script
   (``--serve-collector``), so its CPU time, read from ``/proc/<pid>/stat``, is the collector's
   alone. The load generator posts with a keep-alive aiohttp client, 8 requests in flight: round 1
   (which creates every series), then the rest but the last two (steady state); the last two
   rounds go one request at a time for the latency of an unloaded collector.
3. The same decode-and-store pipeline runs in this process, stage by stage, to split the
   collector's CPU into gzip and ``CollectorService.accept_payload`` (the handler's path: a
   request matching its sender's shape is read without parsing); what the server spent beyond
   that is HTTP and aiohttp. The same rounds also go through a collector that never keeps
   shapes (a sender's first requests, new layouts, JSON, histograms take that path), split into
   protobuf parsing, ``number_columns()`` and store ingest.
4. VictoriaMetrics (``apt-get install victoria-metrics``), started on loopback with a temporary
   data directory, gets the same points as gzip'd Prometheus text on /api/v1/import/prometheus
   with the same client concurrency; after /internal/force_flush its series and sample counts
   are checked against what was sent.

Targets (the collector issue): >= 250k points/s per core, <= 2 KB per series-hour.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import gzip
import io
import json
import logging
import math
import os
import pstats
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp
from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from gpuwarden.agent.build import build_agent
from gpuwarden.agent.config import AgentConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.config import CollectorConfig as AgentCollectorConfig
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.ingest.otlp import attributes
from gpuwarden.collector.ingest.otlp_columns import number_columns
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF, decompress, parse_request
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.sqlite import MEMORY, SqliteStorage
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import SERVICE, STATS, Admits, add_route

NS = 1_000_000_000
STEP_S = 10
CONCURRENCY = 8
LATENCY_ROUNDS = 2  # the last rounds, sent one request at a time
TOKEN = "bench-token-0123456789abcdef"  # noqa: S105 - loopback only, throwaway
GZIP_LEVEL = 6  # the agent's default (agent.config.CollectorConfig.gzip_level)
# The agents' spools need an endpoint to exist; their senders never start, nothing connects.
UNUSED_ENDPOINT = "http://127.0.0.1:9/v1/metrics"
RECENT_HOURS, LONG_HOURS = 6.0, 14 * 24.0  # WindowStore's default windows
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- requests -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Batch:
    """One agent's request of one round, encoded for both receivers."""

    round_index: int
    agent_index: int
    points: int
    otlp_bytes: int
    otlp_gzip: bytes
    prometheus_gzip: bytes


@dataclass(frozen=True, slots=True)
class Workload:
    """Every request of the run, by round, and what they hold."""

    rounds: list[list[Batch]]
    series: int
    t0_s: int

    @property
    def points(self) -> int:
        return sum(b.points for batches in self.rounds for b in batches)


def restamp(
    payload: bytes, time_unix_nano: int, start_unix_nano: int
) -> ExportMetricsServiceRequest:
    """The agent's request with every point at ``time_unix_nano`` (sums started at start)."""
    request = ExportMetricsServiceRequest.FromString(payload)
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                for dp in getattr(metric, kind).data_points:
                    dp.time_unix_nano = time_unix_nano
                    if dp.start_time_unix_nano:
                        dp.start_time_unix_nano = start_unix_nano
    return request


_NAME_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def _label_value(value: object) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_samples(request: ExportMetricsServiceRequest) -> Iterator[tuple[str, float]]:
    """``(series, value)`` for every gauge and sum point, named as OTel→Prometheus does.

    Dots become underscores, monotonic sums get ``_total``, point attributes become labels (unit
    suffixes are left out), ``service.name`` becomes ``job``, and ``instance`` is ``host.name``,
    the series identity the collector's store uses too (the SDK's ``service.instance.id`` is one
    per process, shared by the simulated agents of a worker). Non-finite values are skipped, as
    the collector rejects them.
    """
    for rm in request.resource_metrics:
        resource = attributes(rm.resource.attributes)
        base = {
            "job": _label_value(resource.get("service.name", "")),
            "instance": _label_value(resource.get("host.name", "")),
        }
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind == "gauge":
                    dps, suffix = metric.gauge.data_points, ""
                elif kind == "sum":
                    dps = metric.sum.data_points
                    suffix = "_total" if metric.sum.is_monotonic else ""
                else:
                    continue
                name = _NAME_INVALID.sub("_", metric.name) + suffix
                for dp in dps:
                    value = dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int
                    if not math.isfinite(value):
                        continue
                    labels = dict(base)
                    for key, attr in attributes(dp.attributes).items():
                        labels[_LABEL_INVALID.sub("_", key)] = _label_value(attr)
                    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    yield f"{name}{{{text}}}", float(value)


def generate_agents(
    agent_indexes: Sequence[int], rounds: int, t0_s: int, spool_root: str
) -> tuple[list[Batch], int]:
    """Run simulated agents for ``rounds`` rounds; return their batches and distinct series."""
    # The scenario's XID faults are logged by every agent: a warning each, noise here.
    logging.getLogger("gpuwarden.agent").setLevel(logging.ERROR)
    now = [float(t0_s)]

    def clock() -> float:
        return now[0]

    runtimes = [
        build_agent(
            AgentConfig(
                node_name=f"gpu-node-{i:04d}",
                source="simulated",
                scenario="mixed",
                collector=AgentCollectorConfig(endpoint=UNUSED_ENDPOINT, gzip_level=GZIP_LEVEL),
                spool=SpoolConfig(directory=Path(spool_root) / f"agent-{i}", fsync=False),
                http=HttpConfig(enabled=False),
            ),
            clock=clock,
            with_host=True,
        )
        for i in agent_indexes
    ]
    seen: list[set[str]] = [set() for _ in agent_indexes]
    start_ns = (t0_s - STEP_S) * NS
    batches = []
    for r in range(rounds):
        now[0] = float(t0_s + r * STEP_S)
        t_ns = (t0_s + r * STEP_S) * NS
        for k, (agent, runtime) in enumerate(zip(agent_indexes, runtimes, strict=True)):
            runtime.agent.sample_once()
            spool = runtime.agent.spool
            assert spool is not None
            ((seq, payload),) = spool.peek(1, 1 << 30)
            spool.ack(seq)
            request = restamp(payload, t_ns, start_ns)
            encoded = request.SerializeToString()
            timestamp_ms = t_ns // 1_000_000
            lines = []
            for series, value in prometheus_samples(request):
                seen[k].add(series)
                lines.append(f"{series} {value!r} {timestamp_ms}\n")
            batches.append(
                Batch(
                    round_index=r,
                    agent_index=agent,
                    points=len(lines),
                    otlp_bytes=len(encoded),
                    otlp_gzip=gzip.compress(encoded, GZIP_LEVEL, mtime=0),
                    prometheus_gzip=gzip.compress("".join(lines).encode(), GZIP_LEVEL, mtime=0),
                )
            )
    for runtime in runtimes:
        runtime.agent.telemetry.shutdown()
    return batches, sum(len(s) for s in seen)


def build_workload(agents: int, rounds: int, t0_s: int, workers: int = 2) -> Workload:
    """Every batch of the run, built in ``workers`` processes (agents are independent)."""
    chunks = [list(range(agents))[k::workers] for k in range(workers)]
    by_round: list[list[Batch]] = [[] for _ in range(rounds)]
    series = 0
    with (
        tempfile.TemporaryDirectory(prefix="ingest-bench-spool-") as spool_root,
        ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool,
    ):
        futures = [
            pool.submit(generate_agents, chunk, rounds, t0_s, spool_root) for chunk in chunks
        ]
        for future in futures:
            batches, chunk_series = future.result()
            series += chunk_series
            for batch in batches:
                by_round[batch.round_index].append(batch)
    for batches in by_round:
        batches.sort(key=lambda b: b.agent_index)
    return Workload(rounds=by_round, series=series, t0_s=t0_s)


# --- processes ------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User plus system CPU of a process (all its threads), from ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14 and 15


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def http_get(url: str, timeout_s: float = 60.0) -> bytes:
    """A GET on loopback; the body."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - http only
        return bytes(response.read())


def wait_healthy(url: str, proc: subprocess.Popen[Any], timeout_s: float) -> None:
    """Poll ``url`` until it answers ``OK`` (VictoriaMetrics' /health)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before it was ready")
        try:
            if http_get(url, 1.0).strip() == b"OK":
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} not healthy after {timeout_s:.0f} s")


# --- the collector process --------------------------------------------------------------------


def make_service(clock_s: float, capacity: int) -> CollectorService:
    """The collector's core as ``build_service`` builds it, but a pre-sized store, fixed clock."""
    config = CollectorConfig()

    def clock() -> float:
        return clock_s

    storage = SqliteStorage(MEMORY, clock=clock)
    return CollectorService(
        store=WindowStore(
            step_seconds=config.step_seconds,
            recent_seconds=config.recent_hours * 3600,
            max_series=config.max_series,
            initial_capacity=capacity,
            clock=clock,
        ),
        storage=storage,
        registry=JobRegistry(storage, []),
        period_seconds=config.accounting_period_seconds,
        clock=clock,
    )


def store_report(service: CollectorService) -> dict[str, float]:
    store = service.store
    table = store._table
    rings = table.ring_bytes()
    return {
        "series": store.series_count(),
        "memory_bytes": store.memory_bytes(),
        "capacity_rows": table.recent.rows,
        "recent_bytes": rings["recent"],
        "long_bytes": rings["long"],
        "counter_dt_bytes": rings["counter_dt"],
        "counter_rows": table.dts.shape[0],
        "counter_series": table.next_counter_row - len(table.free_counter_rows),
        "shape_hits": store.shape_hits,
        "accepted": service.totals.accepted,
        "rejected": service.totals.rejected,
    }


async def _report(request: web.Request) -> web.Response:
    report = store_report(request.app[SERVICE])
    stats = request.app[STATS]
    report["points_accepted"] = stats.points_accepted
    report["points_rejected"] = stats.points_rejected
    report["responses_ok"] = stats.responses[200]
    return web.json_response(report)


async def serve_collector(clock_s: float, capacity: int) -> None:
    """The collector app on an ephemeral loopback port; prints ``port N``; stops on SIGTERM."""
    service = make_service(clock_s, capacity)
    app = create_app(
        # an agent token bound to every node: the receiver reads each request's host names
        CollectorConfig(
            tokens=TokenTable((credential(TOKEN, Role.AGENT, "bench-agents", ("*",)),))
        ),
        service=service,
        background=False,
    )
    add_route(app, "GET", "/bench/report", _report, Admits(open_because="the bench's own"))
    await serve_app(app, service)


async def serve_app(
    app: web.Application, service: CollectorService, *, access_log: bool = True
) -> None:
    """Serve ``app`` on an ephemeral loopback port; print ``port N`` (what the parent reads);
    on SIGTERM stop and close ``service``'s storage. ``access_log=False``: no access-log
    record per request (its cost is not the collector's)."""
    runner = web.AppRunner(app) if access_log else web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(f"port {runner.addresses[0][1]}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        service.storage.close()


# --- the load generator -----------------------------------------------------------------------


@dataclass
class SendResult:
    latencies_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rejected_points: int = 0


async def send_all(
    url: str,
    bodies: Sequence[bytes],
    headers: dict[str, str],
    concurrency: int,
    *,
    otlp: bool,
) -> SendResult:
    """POST every body over keep-alive connections, ``concurrency`` in flight, in order."""
    result = SendResult()
    queue = iter(bodies)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            for body in queue:
                started = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    answer = await response.read()
                result.latencies_s.append(time.perf_counter() - started)
                if response.status not in (200, 204):
                    result.failures.append(f"{response.status}: {answer[:200]!r}")
                elif otlp:
                    parsed = ExportMetricsServiceResponse.FromString(answer)
                    result.rejected_points += parsed.partial_success.rejected_data_points

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return result


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def send_phase(
    url: str,
    bodies: Sequence[bytes],
    headers: dict[str, str],
    concurrency: int,
    pid: int,
    *,
    otlp: bool,
) -> tuple[SendResult, float, float]:
    """Send; return the result, the server's CPU seconds and the wall seconds it took."""
    cpu_before, wall_before = cpu_seconds(pid), time.perf_counter()
    result = asyncio.run(send_all(url, bodies, headers, concurrency, otlp=otlp))
    wall = time.perf_counter() - wall_before
    cpu = cpu_seconds(pid) - cpu_before
    if result.failures:
        raise RuntimeError(f"{len(result.failures)} requests failed, first: {result.failures[0]}")
    return result, cpu, wall


# --- figures --------------------------------------------------------------------------------------


def line(label: str, text: str) -> None:
    print(f"{label:<34} {text}")


@dataclass(frozen=True, slots=True)
class CollectorFigures:
    per_core: float
    steady_per_core: float
    p99_ms: float
    b_per_series_hour: float
    steady_cpu_per_point_s: float


def bench_collector(work: Workload, clock_s: float, log_dir: Path) -> CollectorFigures:
    headers = {
        "Content-Type": PROTOBUF,
        "Content-Encoding": "gzip",
        "Authorization": f"Bearer {TOKEN}",
    }
    # Pre-size for every series the run creates: the store's doubling would be timed otherwise.
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--serve-collector",
        "--clock",
        repr(clock_s),
        "--capacity",
        str(work.series),
    ]
    print()
    print(f"== collector (aiohttp app in its own process, {CONCURRENCY} requests in flight) ==")
    proc = None
    with (log_dir / "collector.log").open("wb") as log:
        try:
            started = time.perf_counter()
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, cwd=ROOT)
            assert proc.stdout is not None
            first = proc.stdout.readline().decode().split()
            if first[:1] != ["port"]:
                raise RuntimeError(f"collector did not start; see {log_dir / 'collector.log'}")
            base = f"http://127.0.0.1:{first[1]}"
            url = f"{base}/v1/metrics"
            line(
                "collector start-up",
                f"{time.perf_counter() - started:.1f} s (store pre-sized to {work.series:,} rows)",
            )
            rss_idle = rss_bytes(proc.pid)
            load_rounds = work.rounds[: len(work.rounds) - LATENCY_ROUNDS]
            first_round = [b.otlp_gzip for b in load_rounds[0]]
            steady = [b.otlp_gzip for batches in load_rounds[1:] for b in batches]
            first_points = sum(b.points for b in load_rounds[0])
            steady_points = sum(b.points for batches in load_rounds[1:] for b in batches)
            r1, cpu1, wall1 = send_phase(
                url, first_round, headers, CONCURRENCY, proc.pid, otlp=True
            )
            r2, cpu2, wall2 = send_phase(url, steady, headers, CONCURRENCY, proc.pid, otlp=True)
            quiet = [b.otlp_gzip for batches in work.rounds[-LATENCY_ROUNDS:] for b in batches]
            r3, cpu3, _ = send_phase(url, quiet, headers, 1, proc.pid, otlp=True)
            report = json.loads(http_get(f"{base}/bench/report"))
            rss = rss_bytes(proc.pid)
        finally:
            stop_process(proc)

    points = first_points + steady_points
    cpu = cpu1 + cpu2
    loaded = r1.latencies_s + r2.latencies_s
    rejected = r1.rejected_points + r2.rejected_points + r3.rejected_points
    line(
        "points accepted (server count)",
        f"{report['points_accepted']:,} of {work.points:,} sent, {rejected:,} rejected",
    )
    line(
        "ingest, all load rounds",
        f"{points / cpu:,.0f} points/s per core ({points:,} points, {cpu:.2f} s collector CPU)",
    )
    line(
        "ingest, round 1 (creates series)",
        f"{first_points / cpu1:,.0f} points/s per core "
        f"({cpu1:.2f} s CPU for {first_points:,} points)",
    )
    line(
        "ingest, steady state",
        f"{steady_points / cpu2:,.0f} points/s per core "
        f"(rounds 2..{len(load_rounds)}, {cpu2:.2f} s CPU)",
    )
    line(
        "wall throughput",
        f"{points / (wall1 + wall2):,.0f} points/s "
        f"({(len(first_round) + len(steady)) / (wall1 + wall2):,.0f} requests/s; "
        f"collector busy {cpu / (wall1 + wall2):.0%} of one core)",
    )
    line(
        f"latency, {CONCURRENCY} in flight",
        f"p50 {percentile(loaded, 0.5) * 1e3:.1f} ms, "
        f"p99 {percentile(loaded, 0.99) * 1e3:.1f} ms, max {max(loaded) * 1e3:.1f} ms "
        f"({len(loaded):,} requests)",
    )
    line(
        "latency, 1 in flight",
        f"p50 {percentile(r3.latencies_s, 0.5) * 1e3:.1f} ms, "
        f"p99 {percentile(r3.latencies_s, 0.99) * 1e3:.1f} ms "
        f"({len(r3.latencies_s)} requests, {cpu3 / len(quiet) * 1e3:.1f} ms collector CPU each)",
    )
    every = [b for batches in work.rounds for b in batches]
    line(
        "request size (mean)",
        f"{work.points / len(every):.0f} points, "
        f"{sum(b.otlp_bytes for b in every) / len(every) / 1024:.1f} KiB protobuf, "
        f"{sum(len(b.otlp_gzip) for b in every) / len(every) / 1024:.1f} KiB gzip",
    )

    series = int(report["series"])
    per_series = report["memory_bytes"] / series
    recent_b = report["recent_bytes"] / report["capacity_rows"]
    long_b = report["long_bytes"] / report["capacity_rows"]
    counters_b = report["counter_dt_bytes"] / series
    other_b = (
        report["memory_bytes"]
        - report["recent_bytes"]
        - report["long_bytes"]
        - report["counter_dt_bytes"]
    ) / series
    per_series_hour = (recent_b + counters_b + other_b) / RECENT_HOURS + long_b / LONG_HOURS
    requests = len(first_round) + len(steady) + len(quiet)
    line(
        "requests read through shapes",
        f"{int(report['shape_hits']):,} of {requests:,} (the rest were parsed: each sender's "
        "first two, and the first of a new layout)",
    )
    line("series", f"{series:,} held, {work.series:,} expected")
    line(
        "store memory_bytes()",
        f"{report['memory_bytes'] / 2**20:,.0f} MiB = "
        f"{per_series / 1024:.1f} KiB/series (capacity {int(report['capacity_rows']):,} rows, "
        f"{int(report['counter_rows']):,} counter rows for "
        f"{int(report['counter_series']):,} counter series)",
    )
    line(
        "memory per series-hour",
        f"{per_series_hour:,.0f} B (recent ring {recent_b:,.0f} B + "
        f"counter covered-time ring {counters_b:,.0f} B + per-series objects {other_b:,.0f} B "
        f"over {RECENT_HOURS:.0f} h, long ring {long_b:,.0f} B over {LONG_HOURS:.0f} h)",
    )
    used_counter_b = counters_b * report["counter_series"] / report["counter_rows"]
    line(
        "  ... counter ring without slack",
        f"{per_series_hour - (counters_b - used_counter_b) / RECENT_HOURS:,.0f} B (counter "
        f"covered-time ring {used_counter_b:,.0f} B: only the rows counters use; it grows by "
        "half from capacity/8 rows)",
    )
    line(
        "memory per series-hour, all/14 d",
        f"{per_series / LONG_HOURS:,.0f} B (every byte over the longest retention)",
    )
    line(
        "collector RSS",
        f"{rss / 2**20:,.0f} MiB at the end ({rss_idle / 2**20:,.0f} MiB "
        f"before the first request) = {rss / series / 1024:.1f} KiB/series",
    )
    if report["points_accepted"] != work.points - rejected or series != work.series:
        print("WARNING: the collector did not hold every point and series sent")
    return CollectorFigures(
        per_core=points / cpu,
        steady_per_core=steady_points / cpu2,
        p99_ms=percentile(loaded, 0.99) * 1e3,
        b_per_series_hour=per_series_hour,
        steady_cpu_per_point_s=cpu2 / steady_points,
    )


# --- where the collector's CPU goes -------------------------------------------------------------


STAGES = ("gzip", "accept_payload(), shaped", "accept_payload(), parsed")
STAGE_NOTES = (
    "decompress()",
    "requests matching their sender's shape: extract + store writes + node facts",
    "the others (first of a layout): parse + columns + store + building the shape",
)
PARSED = ("protobuf parse", "number_columns()", "store + service")
PARSED_NOTES = (
    "parse_request(): upb, into C structs",
    "attribute tuples, times, values: no NumberPoint",
    "alias lookups, WindowStore writes, node facts",
)


@dataclass
class StageTimes:
    """Process-CPU seconds per pipeline stage over the steady-state rounds."""

    points: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STAGES, 0))
    parsed: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARSED, 0.0))
    gc_seconds: float = 0.0
    gc_runs: int = 0
    profile: str = ""


def pipeline_stages(
    work: Workload, clock_s: float, rounds: Sequence[int], profile: bool
) -> StageTimes:
    """Time the handler's pipeline stage by stage over ``rounds`` (the first creates series)."""
    service = make_service(clock_s, work.series)
    parsing = make_service(clock_s, work.series)  # never keeps a request shape
    parsing.store._shape_wanted = lambda _key: False  # type: ignore[method-assign,assignment]
    times = StageTimes()
    gc_started = [0.0]

    def on_gc(phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.process_time()
        else:
            times.gc_seconds += time.process_time() - gc_started[0]
            times.gc_runs += 1

    def run(r: int, *, timed: bool) -> None:
        clock = time.process_time
        for batch in work.rounds[r]:
            t0 = clock()
            payload = decompress(batch.otlp_gzip, "gzip", 64 << 20)
            hits = service.store.shape_hits
            t1 = clock()
            done = service.accept_payload(payload, PROTOBUF, "bench-agents")
            t2 = clock()
            if timed:
                times.points += done.points
                times.seconds["gzip"] += t1 - t0
                how = "shaped" if service.store.shape_hits > hits else "parsed"
                times.seconds[f"accept_payload(), {how}"] += t2 - t1
                times.requests[f"accept_payload(), {how}"] += 1

    def run_parsed(r: int) -> None:
        clock = time.process_time
        for batch in work.rounds[r]:
            payload = decompress(batch.otlp_gzip, "gzip", 64 << 20)
            t0 = clock()
            request = parse_request(payload, PROTOBUF)
            t1 = clock()
            number_columns(request)
            t2 = clock()
            parsing.accept_payload(payload, PROTOBUF, "bench-agents")  # parses again
            t3 = clock()
            times.parsed["protobuf parse"] += t1 - t0
            times.parsed["number_columns()"] += t2 - t1
            times.parsed["store + service"] += (t3 - t2) - (t2 - t0)

    run(rounds[0], timed=False)
    gc.callbacks.append(on_gc)
    try:
        for r in rounds[1:]:
            run(r, timed=True)
    finally:
        gc.callbacks.remove(on_gc)
    for r in rounds:
        if r == rounds[0]:
            for batch in work.rounds[r]:
                parsing.accept_payload(
                    decompress(batch.otlp_gzip, "gzip", 64 << 20), PROTOBUF, "bench-agents"
                )
        else:
            run_parsed(r)
    if profile:
        profile_rounds = [r for r in range(len(work.rounds)) if r not in rounds][:5]
        profiler = cProfile.Profile()
        profiler.enable()
        for r in profile_rounds:
            run(r, timed=False)
        profiler.disable()
        out = io.StringIO()
        print(
            f"== cProfile of the same pipeline, rounds {profile_rounds[0] + 1}.."
            f"{profile_rounds[-1] + 1}, top 15 by own time (perf_counter calls included) ==",
            file=out,
        )
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
        times.profile = out.getvalue()
    service.storage.close()
    parsing.storage.close()
    return times


def report_stages(
    work: Workload, clock_s: float, collector: CollectorFigures, profile: bool
) -> None:
    n = min(len(work.rounds) - LATENCY_ROUNDS, 8)
    times = pipeline_stages(work, clock_s, list(range(n)), profile)
    points = times.points
    pipeline = sum(times.seconds.values())
    server = collector.steady_cpu_per_point_s * points
    print()
    print(
        f"== where the collector's CPU goes (the handler's pipeline in this process, rounds "
        f"2..{n}, shares of the server's steady-state CPU per point) =="
    )
    for stage, note in zip(STAGES, STAGE_NOTES, strict=True):
        spent = times.seconds[stage]
        line(stage, f"{spent / points * 1e6:5.2f} µs/point {spent / server:6.1%}  {note}")
    shaped, parsed_requests = (
        times.requests["accept_payload(), shaped"],
        times.requests["accept_payload(), parsed"],
    )
    per_request = points / max(1, shaped + parsed_requests)
    line(
        "  ... per request of each kind",
        f"shaped {times.seconds['accept_payload(), shaped'] / max(1, shaped) * 1e6:,.0f} µs "
        f"({shaped} requests), parsed "
        f"{times.seconds['accept_payload(), parsed'] / max(1, parsed_requests) * 1e6:,.0f} µs "
        f"({parsed_requests}), {per_request:.0f} points each",
    )
    http = server - pipeline
    line(
        "HTTP + aiohttp (the rest)",
        f"{http / points * 1e6:5.2f} µs/point {http / server:6.1%}  "
        "server CPU minus the pipeline (noisy)",
    )
    line("pipeline alone", f"{points / pipeline:,.0f} points/s per core")
    line(
        "cyclic GC during the pipeline",
        f"{times.gc_runs} collections, {times.gc_seconds * 1e3:.1f} ms "
        f"({times.gc_seconds / pipeline:.1%} of it)",
    )
    parsed = sum(times.parsed.values())
    print()
    print(
        f"== the same rounds when every request is parsed (no request shapes; gzip "
        f"{times.seconds['gzip'] / points * 1e6:.2f} µs/point not included) =="
    )
    for stage, note in zip(PARSED, PARSED_NOTES, strict=True):
        spent = times.parsed[stage]
        line(stage, f"{spent / points * 1e6:5.2f} µs/point {spent / parsed:6.1%}  {note}")
    line("parsed path alone", f"{points / parsed:,.0f} points/s per core (gzip and HTTP apart)")
    if times.profile:
        print()
        print(times.profile.rstrip())


# --- VictoriaMetrics ------------------------------------------------------------------------------


def victoria_binary() -> str | None:
    found = shutil.which("victoria-metrics")
    if found is None and Path("/usr/bin/victoria-metrics").exists():
        found = "/usr/bin/victoria-metrics"
    return found


def package_version(package: str) -> str:
    """The Debian package's version (the Debian build's own version string is empty)."""
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        return "?"
    answer = subprocess.run(
        [dpkg, "-W", "-f=${Version}", package], capture_output=True, text=True, check=False
    )
    return answer.stdout.strip() or "?"


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_victoria(work: Workload, binary: str, tmp: Path) -> float:
    """VictoriaMetrics points/s per core on the same points as Prometheus text."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    data_dir = tmp / "vm-data"
    command = [
        binary,
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-storageDataPath={data_dir}",
        "-retentionPeriod=1d",
        "-loggerLevel=ERROR",
    ]
    proc = None
    with (tmp / "victoria-metrics.log").open("wb") as log:
        try:
            proc = subprocess.Popen(command, stdout=log, stderr=log)
            wait_healthy(f"{base}/health", proc, 30)
            headers = {"Content-Encoding": "gzip", "Content-Type": "text/plain"}
            url = f"{base}/api/v1/import/prometheus"
            bodies = [b.prometheus_gzip for batches in work.rounds for b in batches]
            cpu_idle = cpu_seconds(proc.pid)
            time.sleep(1.0)
            idle_per_s = cpu_seconds(proc.pid) - cpu_idle
            result, cpu, wall = send_phase(url, bodies, headers, CONCURRENCY, proc.pid, otlp=False)
            cpu_before_flush = cpu_seconds(proc.pid)
            http_get(f"{base}/internal/force_flush")
            flush_cpu = cpu_seconds(proc.pid) - cpu_before_flush
            series = int(json.loads(http_get(f"{base}/api/v1/series/count"))["data"][0])
            t_last = work.t0_s + (len(work.rounds) - 1) * STEP_S
            window_s = len(work.rounds) * STEP_S + STEP_S
            query = urllib.parse.quote(
                f'sum(count_over_time({{__name__=~".+"}}[{window_s}s]))', safe=""
            )
            answer = json.loads(http_get(f"{base}/api/v1/query?query={query}&time={t_last + 1}"))
            samples = int(float(answer["data"]["result"][0]["value"][1]))
            rss = rss_bytes(proc.pid)
            disk = directory_bytes(data_dir)
        finally:
            stop_process(proc)
    points = work.points
    raw = sum(len(b.prometheus_gzip) for batches in work.rounds for b in batches) / len(bodies)
    print()
    version = package_version("victoria-metrics")
    print(
        f"== VictoriaMetrics {version} (/api/v1/import/prometheus, gzip'd text, "
        f"{CONCURRENCY} in flight) =="
    )
    line(
        "stored (after force_flush)",
        f"{series:,} series, {samples:,} samples ({work.series:,} series, {points:,} points sent)",
    )
    line(
        "ingest",
        f"{points / cpu:,.0f} points/s per core ({cpu:.2f} s CPU over all threads; "
        f"idle {idle_per_s:.2f} CPU-s/s, force_flush {flush_cpu:.2f} s more)",
    )
    line("wall throughput", f"{points / wall:,.0f} points/s ({len(bodies) / wall:,.0f} requests/s)")
    line(
        f"latency, {CONCURRENCY} in flight",
        f"p50 {percentile(result.latencies_s, 0.5) * 1e3:.1f} ms, "
        f"p99 {percentile(result.latencies_s, 0.99) * 1e3:.1f} ms",
    )
    line("request size", f"{raw / 1024:.1f} KiB gzip'd text")
    line(
        "VictoriaMetrics RSS / disk",
        f"{rss / 2**20:,.0f} MiB / {disk / 2**20:,.1f} MiB "
        f"({disk / samples:.2f} B/sample on disk after flush)",
    )
    if series != work.series or samples != points:
        print("WARNING: VictoriaMetrics does not hold every series and point sent")
    return points / cpu


# --- main -----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=30, help="10-second rounds (default 30)")
    parser.add_argument("--agents", type=int, default=100, help="8-GPU agents (default 100)")
    parser.add_argument("--profile", action="store_true", help="cProfile the ingest pipeline")
    parser.add_argument("--skip-victoria", action="store_true", help="collector only")
    parser.add_argument("--serve-collector", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clock", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--capacity", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < LATENCY_ROUNDS + 2 or args.agents < 1:
        parser.error(f"need --rounds >= {LATENCY_ROUNDS + 2} and --agents >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_collector:
        asyncio.run(serve_collector(args.clock, args.capacity))
        return 0
    began = time.perf_counter()
    binary = victoria_binary()
    # Rounds end a minute in the past: VictoriaMetrics hides the last 30 s from queries.
    t0_s = int(time.time()) // STEP_S * STEP_S - args.rounds * STEP_S - 60
    clock_s = float(t0_s + args.rounds * STEP_S)
    print(
        f"building {args.agents} agents x {args.rounds} rounds of real OTLP requests "
        f"(simulated 8-GPU nodes, 2 worker processes)...",
        flush=True,
    )
    work = build_workload(args.agents, args.rounds, t0_s)
    line(
        "workload",
        f"{work.points:,} points in {args.agents * args.rounds:,} requests, "
        f"{work.series:,} series, built in {time.perf_counter() - began:.0f} s",
    )
    tmp = Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    try:
        collector = bench_collector(work, clock_s, tmp)
        report_stages(work, clock_s, collector, args.profile)
        gc.collect()
        vm_per_core: float | None = None
        if args.skip_victoria:
            print("\nVictoriaMetrics: skipped (--skip-victoria)")
        elif binary is None:
            print(
                "\nVictoriaMetrics: not installed, skipped; install it with "
                "`sudo apt-get install -y victoria-metrics` (Debian/Ubuntu) and run again"
            )
        else:
            vm_per_core = bench_victoria(work, binary, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print()
    print("== summary ==")
    target_rate, target_mem = 250_000, 2048
    line(
        "collector ingest",
        f"{collector.per_core:,.0f} points/s per core "
        f"(steady state {collector.steady_per_core:,.0f}); target >= {target_rate:,}: "
        f"{'met' if collector.per_core >= target_rate else 'NOT met'}",
    )
    if vm_per_core is not None:
        line(
            "collector / VictoriaMetrics",
            f"{collector.per_core / vm_per_core:.2f}x per core "
            f"(VictoriaMetrics {vm_per_core:,.0f} points/s per core, same run)",
        )
    line(
        "memory per series-hour",
        f"{collector.b_per_series_hour:,.0f} B; target <= "
        f"{target_mem:,} B: {'met' if collector.b_per_series_hour <= target_mem else 'NOT met'}",
    )
    line("p99 request latency", f"{collector.p99_ms:.1f} ms with {CONCURRENCY} in flight")
    fleet_rate = work.points / len(work.rounds) / STEP_S
    line(
        "this fleet's real load",
        f"{fleet_rate:,.0f} points/s = {fleet_rate / collector.per_core:.1%} of one core",
    )
    line("bench wall time", f"{time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
