"""Agent overhead on the fake NVML: CPU per sample round, mCPU at 1 s and 10 s, RSS, pynvml share.

Not a test: it prints figures. Run from the repository root:

    .venv/bin/python bench/agent_overhead.py            # about two minutes
    .venv/bin/python bench/agent_overhead.py --quick    # about half a minute, noisier

This process is the agent (real pynvml against tests/fakenvml with 8 GPUs, every field on, two
processes per GPU attributed through the real /proc); the collector runs as a separate process,
so the CPU and RSS measured here are the agent's alone. Targets (issue 16): ≤ 10 ms CPU per full
8-GPU round, ≤ 1 mCPU at a 10 s interval, RSS ≤ 40 MiB.

Where the time goes: one table of CPU per round by stage (NVML sampling, host sampling,
attribution, the OTLP request, the spool's write and fsync, the push), each stage timed with
``time.process_time`` around the same calls ``Agent.sample_once`` makes, then the functions that
cost most in those rounds (cProfile, own time).
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import os
import pstats
import resource
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuwarden.agent.build import build_agent
from gpuwarden.agent.config import (
    AgentConfig,
    CollectorConfig,
    HttpConfig,
    SpoolConfig,
)
from gpuwarden.agent.daemon import Agent
from gpuwarden.agent.model import AgentStats, Snapshot
from gpuwarden.agent.sender import SendStatus
from gpuwarden.agent.sources.nvml import NvmlSource
from tests.fakenvml.control import FakeNvml, FakeProcess, build_fake_nvml

T = TypeVar("T")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load_fake(tmp: Path) -> FakeNvml:
    import pynvml

    path = build_fake_nvml(tmp)
    library = ctypes.CDLL(str(path))
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()
    fake = FakeNvml(library, path)
    fake.reset(8)
    pid = os.getpid()
    for gpu in range(8):
        fake.set_processes(gpu, [FakeProcess(pid, 4 << 30, 40, 20), FakeProcess(1, 1 << 30, 5, 1)])
    return fake


AGENT_DRIVER = """
import ctypes, os, sys
from pathlib import Path
from tests.fakenvml.control import FakeNvml, FakeProcess
fake = FakeNvml(ctypes.CDLL(sys.argv[1]), Path(sys.argv[1]))
fake.reset(8)
mine, init = FakeProcess(os.getpid(), 4 << 30, 40, 20), FakeProcess(1, 1 << 30, 5, 1)
for gpu in range(8):
    fake.set_processes(gpu, [mine, init])
from gpuwarden.cli import main
sys.exit(main(["agent", "--config", sys.argv[2]]))
"""


def agent_process_rss(tmp: Path, library: Path, port: int, token: str) -> tuple[float, float]:
    """RSS and peak RSS (MiB) of a real ``gpuwarden agent`` process after 8 one-second rounds.

    The fake NVML's state lives in the process that loads it, so a short driver sets it up
    (8 GPUs, two processes each) and then runs the agent's own command line in that process.
    """
    config = tmp / "agent-rss.yaml"
    config.write_text(
        f"node_name: bench\nsource: nvml\nnvml_library_path: {library}\ninterval_seconds: 1\n"
        f"collector: {{endpoint: 'http://127.0.0.1:{port}/v1/metrics', token: {token}}}\n"
        f"spool: {{directory: {tmp / 'spool-rss'}}}\nhttp: {{port: 0}}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", AGENT_DRIVER, str(library), str(config)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(8.0)  # a benchmark, not a test: let it run eight rounds
        if proc.poll() is not None:
            raise SystemExit(f"agent exited: {proc.communicate()[1].decode()[-2000:]}")
        status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        kib = {line.split(":")[0]: int(line.split()[1]) for line in status if "kB" in line}
        return kib["VmRSS"] / 1024, kib["VmHWM"] / 1024
    finally:
        proc.terminate()
        proc.wait(15)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_collector(tmp: Path, token: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    (tmp / "tokens").write_text(f"agent bench {token} nodes=*\n")
    (tmp / "collector.yaml").write_text(f"port: {port}\ntokens_file: {tmp / 'tokens'}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "collector", "--config", str(tmp / "collector.yaml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("collector did not start")


def bench_source(rounds: int) -> tuple[float, float]:
    """CPU ms per NvmlSource.sample() round, and the share of it inside pynvml."""
    with NvmlSource() as source:
        source.sample()  # warm: handles, static facts, first event drain
        start = time.process_time()
        for _ in range(rounds):
            source.sample()
        per_round_ms = (time.process_time() - start) / rounds * 1000
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(rounds):
            source.sample()
        profile.disable()
    stats = pstats.Stats(profile)
    total = sum(row[2] for row in stats.stats.values())  # type: ignore[attr-defined]
    in_pynvml = sum(
        row[2]
        for (filename, _, _), row in stats.stats.items()  # type: ignore[attr-defined]
        if filename.endswith("pynvml.py") or filename == "~"
    )
    return per_round_ms, in_pynvml / total if total else float("nan")


STAGES = (
    ("NVML sampling", "source"),
    ("host sampling (/proc, /sys)", "host"),
    ("XID events", "events"),
    ("attribution (/proc/<pid>)", "attribution"),
    ("OTLP request (collect + encode)", "otlp"),
    ("spool write + fsync", "spool"),
    ("push (gzip + HTTP POST + answer)", "push"),
)


def stage_breakdown(agent: Agent, rounds: int) -> tuple[dict[str, float], pstats.Stats]:
    """CPU ms per round of each stage of ``Agent.sample_once`` plus the push, and a profile.

    The stages are the calls ``sample_once`` makes, in its order, each timed on its own; the
    push is the sender's ``send_once`` run inline (no sender thread), so it is timed here too.
    The profile comes from as many further rounds, so its overhead stays out of the table.
    """
    sender, spool = agent.sender, agent.spool
    assert sender is not None
    assert spool is not None
    spent: dict[str, float] = {key: 0.0 for _, key in STAGES}

    def timed(key: str, call: Callable[[], T]) -> T:
        start = time.process_time()
        try:
            return call()
        finally:
            spent[key] += time.process_time() - start

    host, events = agent._host, agent._events
    profile = cProfile.Profile(time.process_time)  # CPU time: an fsync's wait is not work
    for index in range(2 * rounds):
        if index == rounds:
            timings = {key: value / rounds * 1000 for key, value in spent.items()}
            profile.enable()
        gpus = timed("source", agent.source.sample)
        host_sample = timed("host", host) if host is not None else None
        round_events = tuple(timed("events", events)) if events is not None else ()
        attributed = timed("attribution", lambda: agent._attributed(gpus))  # noqa: B023
        agent.cache.put(
            Snapshot(time.time_ns(), attributed, host_sample, round_events, AgentStats())
        )
        payload = timed("otlp", agent.telemetry.collect_otlp)
        assert payload is not None
        timed("spool", lambda: spool.append(payload))  # noqa: B023
        result = timed("push", sender.send_once)
        assert result.status is SendStatus.SENT, result
    profile.disable()
    return timings, pstats.Stats(profile)


def print_breakdown(per_stage_ms: dict[str, float], stats: pstats.Stats, top: int) -> None:
    """The stage table, then the functions with the most own time."""
    total = sum(per_stage_ms.values())
    print(f"\n{'stage':<36} {'ms CPU/round':>12} {'share':>6}")
    for label, key in STAGES:
        share = per_stage_ms[key] / total if total else float("nan")
        print(f"{label:<36} {per_stage_ms[key]:>12.2f} {share:>6.0%}")
    print(f"{'total':<36} {total:>12.2f}")
    rows = sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda item: item[1][2],
        reverse=True,
    )
    own_total = sum(row[2] for _, row in rows) or float("nan")
    print(f"\ntop {top} functions by own CPU time in those rounds (cProfile):")
    for (filename, line, name), row in rows[:top]:
        where = f"{Path(filename).name}:{line}({name})" if filename != "~" else name
        print(f"  {row[2] / own_total:>5.1%}  {where}")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows (noisier figures)")
    parser.add_argument("--rounds", type=int, default=100, help="rounds in the stage breakdown")
    args = parser.parse_args()
    live_1s, live_10s = (10.0, 30.0) if args.quick else (30.0, 80.0)

    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmpdir:
        tmp = Path(tmpdir)
        fake = load_fake(tmp)
        token = secrets.token_hex(16)
        collector, port = start_collector(tmp, token)
        try:
            per_round_ms, pynvml_share = bench_source(300)
            print(f"NVML sample round, 8 GPUs, every field: {per_round_ms:.2f} ms CPU per round")
            print(
                f"share of the sample round inside pynvml/ctypes calls (cProfile): "
                f"{pynvml_share:.0%}"
            )
            print(f"fake NVML calls per round: {sum(fake.call_counts().values()) / 601:.0f}")

            for interval, window in ((1.0, live_1s), (10.0, live_10s)):
                config = AgentConfig(
                    node_name="bench",
                    source="nvml",
                    interval_seconds=interval,
                    collector=CollectorConfig(
                        endpoint=f"http://127.0.0.1:{port}/v1/metrics", token=token
                    ),
                    spool=SpoolConfig(directory=tmp / f"spool-{interval}", fsync=True),
                    http=HttpConfig(port=0),
                )
                runtime = build_agent(config)
                agent = runtime.agent
                assert runtime.http is not None
                runtime.http.start()
                # full rounds, sender included: sample, host, attribution, OTel, spool, push
                if interval == 1.0:
                    agent.sample_once()  # warm: handles, first attribution, series
                    assert agent.sender is not None
                    agent.sender.flush(5)
                    per_stage_ms, stats = stage_breakdown(agent, args.rounds)
                    print_breakdown(per_stage_ms, stats, top=15)
                agent.start_sender()
                start = cpu_seconds()
                for _ in range(50):
                    agent.sample_once()
                    assert agent.sender is not None
                    agent.sender.flush(5)
                full_ms = (cpu_seconds() - start) / 50 * 1000
                stop = threading.Event()
                thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
                thread.start()
                time.sleep(min(5.0, interval))  # let the loop settle before measuring
                c0, w0 = cpu_seconds(), time.monotonic()
                time.sleep(window)
                mcpu = (cpu_seconds() - c0) / (time.monotonic() - w0) * 1000
                stop.set()
                thread.join()
                agent.shutdown(flush_timeout_seconds=5)
                runtime.http.stop()
                if interval == 1.0:
                    print(
                        f"full round (sample + host + attribution + OTel + spool fsync + "
                        f"OTLP push): {full_ms:.2f} ms CPU"
                    )
                print(
                    f"agent CPU at a {interval:g} s interval: {mcpu:.2f} mCPU "
                    f"(measured over {window:g} s)"
                )
            print(
                f"bench RSS: {rss_mib():.1f} MiB (this whole process: agent, benchmark, profiler)"
            )
            rss, peak = agent_process_rss(tmp, fake.directory / "libnvidia-ml.so.1", port, token)
            print(
                f"agent RSS: {rss:.1f} MiB, peak {peak:.1f} MiB (a `gpuwarden agent` process, "
                "8 GPUs, Prometheus pull on)"
            )
        finally:
            collector.terminate()
            collector.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
