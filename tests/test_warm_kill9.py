"""kill -9 the collector while an agent pushes and a real VictoriaMetrics takes its remote-write.

Issue 16's "Done when": a real ``gpuwarden collector`` process writes to a real VictoriaMetrics,
with periodic snapshots; the real agent code (the simulated GPU source, its real spool and
sender) pushes rounds; the collector is killed with SIGKILL in the middle of the pushes and
started again on the same files. Then:

(a) every rule ``/readyz`` said was ready before the kill is ready as soon as the new process
    answers (before its first detection cycle);
(b) no accounting row holds less than before: per (period, job, GPU), busy + idle seconds never
    fall and unknown seconds never grow;
(c) the TSDB holds every point the agent sent exactly once: for every agent series, no
    timestamp twice, and the GPU utilisation of each GPU at every round the agent took.

The history before the agent's first round (2 h of its GPUs, written by remote-write as an
earlier collector would have) is in VictoriaMetrics only: the first collector starts with no
snapshot and reads it back (``remote_write.read_url``), which makes the 2 h rules ready.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.agent.catalog import rows_by_name
from gpuwarden.agent.model import GpuSample
from gpuwarden.agent.points import gpu_attributes, info_attributes
from gpuwarden.collector.remote_write.naming import labels, metric_name
from gpuwarden.collector.remote_write.wire import Series, encode
from gpuwarden.collector.storage.records import AccountingRow
from gpuwarden.collector.storage.sqlite import SqliteStorage
from tests.collector_server import free_port
from tests.loopback_process import wait_for
from tests.spooled_agent import make_agent
from tests.tsdb_servers import VictoriaMetrics, binary

TOKEN = "warm-kill9-token-0123456789abcdef"
NODE = "warm-node"
STEP = 10
HISTORY_SECONDS = 2 * 3600
UTIL = metric_name("hw.gpu.utilization", "1", counter=False)
INFO = metric_name("gpuwarden.gpu.info", "1", counter=False)
UTIL_ROW = rows_by_name()["hw.gpu.utilization"][0]


CLUSTER = "default"
"""The collector's cluster (its config's default): its writes, and its read-back, carry it."""


def http_get(url: str, *, token: bool = True) -> bytes | None:
    headers = {"Authorization": f"Bearer {TOKEN}"} if token else {}
    try:
        request = urllib.request.Request(url, headers=headers)  # noqa: S310 - loopback
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
            return bytes(resp.read())
    except OSError:
        return None


class Collector:
    """``gpuwarden collector`` as a real process, remote-writing to (and reading from) ``tsdb``."""

    def __init__(self, tmp: Path, tsdb: VictoriaMetrics) -> None:
        self.port = free_port()
        digest = hashlib.sha256(TOKEN.encode()).hexdigest()
        (tmp / "tokens").write_text(f"admin warm-tests sha256:{digest}\n")
        self.database = tmp / "collector.db"
        self.config = tmp / "collector.yaml"
        self.config.write_text(
            f"port: {self.port}\ntokens_file: {tmp / 'tokens'}\ndatabase: {self.database}\n"
            f"snapshot_file: {tmp / 'window.npz'}\nsnapshot_seconds: 2\n"
            "remote_write:\n"
            f"  url: {tsdb.write_url}\n"
            f"  read_url: {tsdb.url}\n"
            f"  queue_dir: {tmp / 'remote-write'}\n"
            "  flush_seconds: 0.2\n"
        )
        self.proc: subprocess.Popen[str] | None = None
        self.stderr = tmp / "collector.log"

    def start(self) -> None:
        with self.stderr.open("a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpuwarden", "collector", "--config", str(self.config)],
                stdout=subprocess.DEVNULL,
                stderr=log,
                text=True,
            )
        wait_for(lambda: self.get("/healthz") is not None, 90, "collector start")

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def get(self, path: str) -> bytes | None:
        return http_get(f"http://127.0.0.1:{self.port}{path}")

    def log(self) -> str:
        return self.stderr.read_text()

    def ready_rules(self) -> set[str]:
        body = http_get(f"http://127.0.0.1:{self.port}/readyz", token=False)
        assert body is not None
        return {r["rule"] for r in json.loads(body)["rules"] if r["state"] == "ready"}

    def queue_bytes(self) -> float:
        body = self.get("/metrics")
        assert body is not None
        for line in body.decode().splitlines():
            if line.startswith("gpuwarden_remote_write_queue_bytes "):
                return float(line.split()[1])
        raise AssertionError("no gpuwarden_remote_write_queue_bytes on /metrics")

    def accounting(self) -> dict[tuple[float, str | None, str], AccountingRow]:
        with SqliteStorage(self.database) as storage:
            rows = storage.accounting_rows(since=0, until=time.time() + 3600)
        return {(r.period_start, r.job_key, r.gpu_uuid): r for r in rows}


def write_history(tsdb: VictoriaMetrics, gpus: list[GpuSample], end: float) -> None:
    """2 h of the agent's GPUs up to ``end``, as a collector's remote-write would have left it."""
    times = [int(t * 1000) for t in range(int(end) - HISTORY_SECONDS, int(end), STEP)]
    series = []
    for gpu in gpus:
        host = [("host.name", NODE)]
        util_attrs = [*host, *gpu_attributes(gpu).items(), *UTIL_ROW.attributes.items()]
        util = labels(UTIL, util_attrs, cluster=CLUSTER)  # every write carries the cluster
        info = labels(INFO, [*host, *info_attributes(gpu).items()], cluster=CLUSTER)
        busy = [0.1 + 0.8 * ((t // 1000 // 600) % 2) for t in times]
        series.append(Series(util, tuple(times), tuple(busy)))
        series.append(Series(info, tuple(times), tuple(1.0 for _ in times)))
    request = urllib.request.Request(  # noqa: S310 - loopback
        tsdb.write_url,
        data=encode(series),
        headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - loopback
        assert resp.status in (200, 204)
    assert http_get(f"{tsdb.url}/internal/force_flush", token=False) is not None


def export(tsdb: VictoriaMetrics) -> list[dict[str, Any]]:
    """Every series of the agent's node, raw, as ``/api/v1/export`` gives it."""
    assert http_get(f"{tsdb.url}/internal/force_flush", token=False) is not None
    query = urllib.parse.urlencode({"match[]": f'{{host_name="{NODE}"}}'})
    body = http_get(f"{tsdb.url}/api/v1/export?{query}", token=False)
    assert body is not None
    return [json.loads(line) for line in body.decode().splitlines() if line.strip()]


@pytest.fixture
def tsdb() -> Iterator[VictoriaMetrics]:
    if binary("victoria-metrics") is None:
        pytest.skip("victoria-metrics is not installed (scripts/system-packages.sh installs it)")
    server = VictoriaMetrics()
    with server:
        yield server


def test_kill_9_mid_push_comes_back_ready_with_its_accounting_and_every_point_once(
    tsdb: VictoriaMetrics, tmp_path: Path
) -> None:
    collector = Collector(tmp_path, tsdb)
    runtime = make_agent(tmp_path, collector.port, node=NODE, token=TOKEN)
    agent, sender = runtime.agent, runtime.agent.sender
    assert sender is not None
    write_history(tsdb, list(agent.source.sample()), time.time() - 5)
    rounds: list[int] = []  # each round's time as the agent stamped it (ms)
    try:
        collector.start()
        ready_before = collector.ready_rules()
        assert {"idle-gpu", "gpu-utilization-drop"} <= ready_before  # 2 h back from the TSDB
        wait_for(lambda: bool(collector.accounting()), 60, "accounting rows")

        stop = threading.Event()

        def push() -> None:
            while not stop.is_set():
                agent.sample_once()
                snapshot = agent.cache.get()
                assert snapshot is not None
                rounds.append(snapshot.time_unix_nano // 1_000_000)
                sender.send_once()
                stop.wait(0.1)

        pushing = threading.Thread(target=push)
        pushing.start()
        try:
            wait_for(lambda: sender.sent_records >= 30, 60, "pushes under way")
            accounting_before = collector.accounting()
            collector.kill9()
            spooled = len(agent.spool or [])
            wait_for(lambda: len(agent.spool or []) >= spooled + 5, 30, "the spool to fill")
        finally:
            stop.set()
            pushing.join(10)

        collector.start()  # same files: database, snapshot, remote-write queue
        # (a) ready again before any detection cycle ran in the new process
        assert ready_before <= collector.ready_rules()
        # the snapshot was older than the kill: the TSDB gave back what came after it
        starts = re.findall(
            r"warm start from the TSDB: \d+ series, (\d+) samples read", collector.log()
        )
        assert len(starts) == 2
        assert int(starts[1]) > 0
        assert sender.flush(timeout_seconds=60)
        gpus = len(list(agent.source.sample()))

        def all_sent() -> bool:
            got = [s for s in export(tsdb) if s["metric"]["__name__"] == UTIL]
            return len(got) == gpus and all(rounds[-1] in s["timestamps"] for s in got)

        wait_for(all_sent, 60, "the agent's last round in the TSDB")
        wait_for(lambda: collector.queue_bytes() == 0, 60, "the remote-write queue to drain")
        # (b) no accounting row lost information
        after = collector.accounting()
        for key, row in accounting_before.items():
            now = after.get(key)
            assert now is not None, key
            known_before = row.gpu_seconds_busy + row.gpu_seconds_idle
            assert now.gpu_seconds_busy + now.gpu_seconds_idle >= known_before - 1e-6, key
            assert now.gpu_seconds_unknown <= row.gpu_seconds_unknown + 1e-6, key
    finally:
        collector.stop()
        agent.shutdown(flush_timeout_seconds=2)
    # (c) every point once, none missing
    series = export(tsdb)
    assert series
    first_round = rounds[0]
    utilization = 0
    for one in series:
        stamps = one["timestamps"]
        assert len(stamps) == len(set(stamps)), one["metric"]  # no (series, timestamp) twice
        if one["metric"]["__name__"] == UTIL:
            utilization += 1
            sent = sorted(t for t in stamps if t >= first_round)
            assert sent == rounds, one["metric"]  # every round the agent took, once
    assert utilization == gpus
