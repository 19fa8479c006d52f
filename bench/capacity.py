"""Capacity benchmark: one real collector, every default rule, agents in real time.

Not a test: it prints figures. Run from the repository root:

    .venv/bin/python bench/capacity.py --gpus 1000                  # ~4 min on 2 cores
    .venv/bin/python bench/capacity.py --gpus 1000 4000 10000 --cycles 5   # a quiet machine

Per size (``--gpus``, 8 GPUs a node, one virtual agent a node):

1. Requests. Every agent is the real agent (``build_agent``, simulated source, scenario "mixed":
   8 H100s with jobs, plus the host's own metrics), sampled ``--variants`` times on a fake
   clock; each round's OTLP request is taken from its spool and every point restamped to a
   sentinel time (``bench.ingest_bench.restamp``). Built in 2 worker processes before the
   collector starts.
2. The collector: ``gpuwarden collector`` in a child process with its normal configuration:
   the packaged default rules through ``DetectionEngine`` every ``detection_seconds`` (60),
   SQLite storage, snapshots, one agent token per node bound to its node (tokens file).
3. The agents, in real time: each posts one round every ``--interval`` seconds (10), at its
   own phase of the interval, its template cycled and the sentinel replaced by the send time
   (``bytes.replace``), gzip'd at the agent's level (6), with the agent's round headers and
   its 10 s timeout, over keep-alive connections from one asyncio process. A request that
   fails is counted, not retried (a real agent keeps it in its spool and resends it with the
   next round, or after its ``Retry-After``). Latencies are those of the requests answered
   200; when each agent's first request was stored is printed too (a new node waits while the
   collector creates series at ``max_new_series_per_second``: its 503s are counted apart).
   The run lasts ``--cycles`` detection cycles after the first (the first cycle
   starts with the collector, on an empty store).
4. After the run: the collector's ``/metrics`` (503s by reason, abandoned requests, event-loop
   lag), its peak RSS (``VmHWM``), then SIGTERM and the seconds to its exit; the cycle times
   come from its log (``detection took ... s``, ``web.tasks``); the bytes per GPU of the
   recent and long windows from the snapshot it wrote at shutdown, read back into a store.

The load generator's own CPU is printed: it must stay well under a core (2 cores here).
Targets (issue 16): 10,000 GPUs at a 10 s interval, every default rule, cycle <= 60 s, ingest
p99 <= 1 s, RSS <= 4 GiB, SIGTERM to exit <= 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import logging
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from bench.ingest_bench import UNUSED_ENDPOINT, free_port, restamp
from gpuwarden.agent.build import build_agent
from gpuwarden.agent.config import DEFAULT_TIMEOUT_SECONDS, AgentConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.config import CollectorConfig as AgentCollectorConfig
from gpuwarden.agent.rounds import INSTANCE_HEADER, ROUNDS_HEADER, Round, encode_rounds
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig

NS = 1_000_000_000
GPUS_PER_NODE = 8
SENTINEL_NS = 0x1A2B3C4D5E6F7081
"""A time no real point has: its 8 little-endian bytes are replaced by the send time."""
SENTINEL = SENTINEL_NS.to_bytes(8, "little")
GZIP_LEVEL = 6  # the agent's default (collector.gzip_level)
READER_TOKEN = "capacity-bench-reader-" + "0" * 16
CYCLE_LINE = re.compile(r"detection took ([0-9.]+) s")


# --- requests ----------------------------------------------------------------------------------


def node_name(index: int) -> str:
    return f"gpu-node-{index:05d}"


def count_points(request: ExportMetricsServiceRequest) -> int:
    """Data points of every kind in ``request``."""
    total = 0
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind is not None:
                    total += len(getattr(metric, kind).data_points)
    return total


def agent_templates(indexes: Sequence[int], variants: int, spool_root: str) -> list[list[bytes]]:
    """Each agent's ``variants`` rounds, every point at :data:`SENTINEL_NS`."""
    logging.getLogger("gpuwarden.agent").setLevel(logging.ERROR)  # the scenario's XID warnings
    now = [1_700_000_000.0]
    out = []
    for i in indexes:
        runtime = build_agent(
            AgentConfig(
                node_name=node_name(i),
                source="simulated",
                scenario="mixed",
                collector=AgentCollectorConfig(endpoint=UNUSED_ENDPOINT),
                spool=SpoolConfig(directory=Path(spool_root) / f"agent-{i}", fsync=False),
                http=HttpConfig(enabled=False),
            ),
            clock=lambda: now[0],
            with_host=True,
        )
        rounds = []
        for _ in range(variants):
            now[0] += 10.0
            runtime.agent.sample_once()
            spool = runtime.agent.spool
            assert spool is not None
            ((seq, payload),) = spool.peek(1, 1 << 30)
            spool.ack(seq)
            request = restamp(payload, SENTINEL_NS, int(now[0] - 3600) * NS)
            points = count_points(request)
            template = request.SerializeToString()
            assert template.count(SENTINEL) == points, "the sentinel is not unique"
            rounds.append(template)
        runtime.agent.telemetry.shutdown()
        out.append(rounds)
    return out


def build_templates(agents: int, variants: int, workers: int = 2) -> list[list[bytes]]:
    chunks = [list(range(agents))[k::workers] for k in range(workers)]
    by_agent: list[list[bytes]] = [[] for _ in range(agents)]
    with (
        tempfile.TemporaryDirectory(prefix="capacity-spool-") as spool_root,
        ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool,
    ):
        futures = [pool.submit(agent_templates, c, variants, spool_root) for c in chunks]
        for chunk, future in zip(chunks, futures, strict=True):
            for i, rounds in zip(chunk, future.result(), strict=True):
                by_agent[i] = rounds
    return by_agent


# --- the collector -----------------------------------------------------------------------------


def write_config(tmp: Path, agents: int, port: int) -> tuple[Path, list[str]]:
    """The collector's config file and the agents' tokens (one per node, bound to it)."""
    tokens = [secrets.token_hex(16) for _ in range(agents)]
    lines = [f"agent {node_name(i)} {t} nodes={node_name(i)}\n" for i, t in enumerate(tokens)]
    lines.append(f"reader bench {READER_TOKEN}\n")
    (tmp / "tokens").write_text("".join(lines))
    config = tmp / "collector.yaml"
    config.write_text(
        f"port: {port}\ntokens_file: {tmp / 'tokens'}\ndatabase: {tmp / 'collector.db'}\n"
    )
    return config, tokens


def proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the collector exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("the collector does not answer /healthz") from None
            time.sleep(0.2)


def scrape(port: int) -> dict[str, float]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {READER_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("gpuwarden_collector_") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


# --- the agents ---------------------------------------------------------------------------------


@dataclass
class LoadFigures:
    latencies_s: list[float] = field(default_factory=list)
    sent_s: list[float] = field(default_factory=list)
    """When each request of ``latencies_s`` was sent, seconds after the agents started."""
    statuses: dict[int, int] = field(default_factory=dict)
    timeouts: int = 0
    errors: int = 0
    first_stored_s: list[float] = field(default_factory=list)
    """When each agent's first request answered 200 was sent, seconds after the agents started
    (a new node waits while the collector creates series at ``max_new_series_per_second``)."""


async def run_agent(
    session: aiohttp.ClientSession,
    url: str,
    token: str,
    rounds: list[bytes],
    phase_s: float,
    interval_s: float,
    until: float,
    figures: LoadFigures,
    origin: float,
) -> None:
    instance = secrets.token_hex(16)
    timeout = aiohttp.ClientTimeout(total=DEFAULT_TIMEOUT_SECONDS)
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/x-protobuf",
        "Content-Encoding": "gzip",
        INSTANCE_HEADER: instance,
    }
    due = time.monotonic() + phase_s
    seq = 0
    stored = False
    while due < until:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        template = rounds[seq % len(rounds)]
        seq += 1
        payload = template.replace(SENTINEL, time.time_ns().to_bytes(8, "little"))
        body = gzip.compress(payload, GZIP_LEVEL, mtime=0)
        headers[ROUNDS_HEADER] = encode_rounds([Round(seq, len(payload))])
        started = time.monotonic()
        try:
            async with session.post(url, data=body, headers=headers, timeout=timeout) as answer:
                await answer.read()
                figures.statuses[answer.status] = figures.statuses.get(answer.status, 0) + 1
                if answer.status == 200:
                    figures.latencies_s.append(time.monotonic() - started)
                    figures.sent_s.append(started - origin)
                    if not stored:
                        stored = True
                        figures.first_stored_s.append(started - origin)
        except TimeoutError:
            figures.timeouts += 1
        except aiohttp.ClientError:
            figures.errors += 1
        due += interval_s


async def run_agents(
    port: int, tokens: list[str], templates: list[list[bytes]], interval_s: float, seconds: float
) -> LoadFigures:
    figures = LoadFigures()
    url = f"http://127.0.0.1:{port}/v1/metrics"
    origin = time.monotonic()
    until = origin + seconds
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(
            *(
                run_agent(
                    session,
                    url,
                    token,
                    rounds,
                    interval_s * i / len(tokens),
                    interval_s,
                    until,
                    figures,
                    origin,
                )
                for i, (token, rounds) in enumerate(zip(tokens, templates, strict=True))
            )
        )
    return figures


# --- one size ------------------------------------------------------------------------------------


@dataclass
class SizeFigures:
    gpus: int
    agents: int
    series: int
    cycles_s: list[float]
    load: LoadFigures
    load_cpu_cores: float
    shed: dict[str, float]
    abandoned: float
    rss_peak_bytes: int
    recent_bytes: int
    long_bytes: int
    sigterm_exit_s: float
    exit_code: int


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def run_size(gpus: int, args: argparse.Namespace) -> SizeFigures:
    agents = math.ceil(gpus / GPUS_PER_NODE)
    print(f"\n== {gpus} GPUs: building {agents} agents x {args.variants} rounds ...", flush=True)
    started = time.monotonic()
    templates = build_templates(agents, args.variants)
    size = sum(len(t[0]) for t in templates) / agents
    print(f"   built in {time.monotonic() - started:.0f} s; a round is {size / 1024:.1f} KiB")
    with tempfile.TemporaryDirectory(prefix="capacity-") as tmp_name:
        tmp = Path(tmp_name)
        port = free_port()
        config, tokens = write_config(tmp, agents, port)
        log_path = tmp / "collector.log"
        argv = [sys.executable, "-m", "gpuwarden", "--log-level", args.log_level, "collector"]
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [*argv, "--config", str(config)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        try:
            wait_healthy(port, proc)
            detection_s = CollectorConfig().detection_seconds
            seconds = (args.cycles + 1) * detection_s + args.interval
            print(f"   {agents} agents posting for {seconds:.0f} s ...", flush=True)
            cpu0, wall0 = time.process_time(), time.monotonic()
            load = asyncio.run(run_agents(port, tokens, templates, args.interval, seconds))
            load_cpu = (time.process_time() - cpu0) / (time.monotonic() - wall0)
            latency_timeline(load, args.interval, agents)
            metrics = scrape(port)
            rss_peak = proc_status(proc.pid, "VmHWM")
            print(f"   SIGTERM at {time.strftime('%H:%M:%S')}", flush=True)
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(120)
            exit_s = time.monotonic() - signalled
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log_text = log_path.read_text(errors="replace")
        if args.keep_log:
            kept = Path(args.keep_log) / f"collector-{gpus}.log"
            kept.write_text(log_text)
        cycles = [float(m.group(1)) for m in CYCLE_LINE.finditer(log_text)][1:]  # 1st: empty
        series, recent, long = window_bytes(tmp / "collector.db")
    shed = {
        key.split('"')[1]: value
        for key, value in metrics.items()
        if key.startswith("gpuwarden_collector_requests_shed_total{")
    }
    return SizeFigures(
        gpus=gpus,
        agents=agents,
        series=series,
        cycles_s=cycles,
        load=load,
        load_cpu_cores=load_cpu,
        shed=shed,
        abandoned=metrics.get("gpuwarden_collector_requests_abandoned_total", 0.0),
        rss_peak_bytes=rss_peak,
        recent_bytes=recent,
        long_bytes=long,
        sigterm_exit_s=exit_s,
        exit_code=code,
    )


def window_bytes(database: Path) -> tuple[int, int, int]:
    """Series, and the bytes their recent and long rings take when full, of the snapshot the
    collector wrote at shutdown: a ring row's bytes times the series that have a row in that
    ring (the store reserves rows ahead and touches their pages lazily, so its allocation is not
    the figure to plan with)."""
    service = build_service(CollectorConfig(database=database))
    try:
        table = service.store._table
        rings = table.ring_bytes()
        series = service.store.series_count()
        # only the series of the metrics read over time have a recent row (``recent_metrics``;
        # the others keep their latest value), and of those read long a long row
        recent = rings["recent"] * table.next_recent_row // table.recent.rows
        long = rings["long"] * table.next_long_row // table.long.rows
        return series, recent, long
    finally:
        service.storage.close()


def latency_timeline(load: LoadFigures, bucket_s: float, agents: int) -> None:
    """Ingest latency per ``bucket_s`` of the run (by send time): where the tail comes from, the
    first interval (every agent's series created) or a detection cycle's moment."""
    buckets: dict[int, list[float]] = {}
    for sent, latency in zip(load.sent_s, load.latencies_s, strict=True):
        buckets.setdefault(int(sent // bucket_s), []).append(latency)
    print(f"   ingest latency by send time ({bucket_s:.0f} s buckets), ms: p50 / p99 / max (n)")
    for key in sorted(buckets):
        values = buckets[key]
        print(
            f"     {key * bucket_s:5.0f} s: {percentile(values, 0.5) * 1000:6.0f} / "
            f"{percentile(values, 0.99) * 1000:6.0f} / {max(values) * 1000:6.0f} ({len(values)})"
        )
    later = [v for t, v in zip(load.sent_s, load.latencies_s, strict=True) if t >= bucket_s]
    print(f"   after the first {bucket_s:.0f} s: p99 {percentile(later, 0.99) * 1000:.0f} ms")
    first = load.first_stored_s
    print(
        f"   each agent's first request stored (sent at, s after the start): p50 "
        f"{percentile(first, 0.5):.1f}, p90 {percentile(first, 0.9):.1f}, max "
        f"{max(first, default=math.nan):.1f}; {agents - len(first)} of {agents} agents never"
    )


def report(rows: list[SizeFigures]) -> None:
    def ms(values: Sequence[float], q: float) -> str:
        return f"{percentile(values, q) * 1000:.0f}"

    print(
        "\n| GPUs | agents | series | cycle p50 / max s | ingest p50 / p99 ms | 200 | 503 "
        "(wait/slots/caller/new_series) | timeouts | errors | abandoned | RSS peak MiB "
        "| recent / long B per GPU | SIGTERM to exit s | load gen CPU |"
    )
    print("|" + "---:|" * 14)
    for r in rows:
        cycles = (
            f"{percentile(r.cycles_s, 0.5):.1f} / {max(r.cycles_s):.1f}" if r.cycles_s else "none"
        )
        shed = "/".join(
            f"{r.shed.get(k, 0):.0f}" for k in ("wait", "slots", "caller", "new_series")
        )
        print(
            f"| {r.gpus:,} | {r.agents:,} | {r.series:,} | {cycles} "
            f"| {ms(r.load.latencies_s, 0.5)} / {ms(r.load.latencies_s, 0.99)} "
            f"| {r.load.statuses.get(200, 0):,} | {r.load.statuses.get(503, 0):,} ({shed}) "
            f"| {r.load.timeouts:,} | {r.load.errors:,} | {r.abandoned:.0f} "
            f"| {r.rss_peak_bytes / 2**20:,.0f} "
            f"| {r.recent_bytes / r.gpus:,.0f} / {r.long_bytes / r.gpus:,.0f} "
            f"| {r.sigterm_exit_s:.1f} (exit {r.exit_code}) | {r.load_cpu_cores:.3f} |"
        )
    print(
        f"\n(cycles measured per size: {[len(r.cycles_s) for r in rows]}; "
        f"{os.cpu_count()} cores; the first cycle, on an empty store, left out)"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1000])
    parser.add_argument("--cycles", type=int, default=2, help="detection cycles measured a size")
    parser.add_argument("--interval", type=float, default=10.0, help="the agents' interval, s")
    parser.add_argument("--variants", type=int, default=3, help="distinct rounds per agent")
    parser.add_argument("--keep-log", default=None, help="a folder to keep the collector logs in")
    parser.add_argument(
        "--log-level", default="INFO",
        help="the collector's (DEBUG: every background step's duration, 'accounting took ... s')",
    )  # fmt: skip
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows = [run_size(gpus, args) for gpus in args.gpus]
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
