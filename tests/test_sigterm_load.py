"""SIGTERM under load: a real collector process, agents posting without pause and a detection
cycle that would outlast any stop budget, exits 0 soon after the signal, and what it
acknowledged is kept.

Run as ``python -m tests.test_sigterm_load collector ...`` the module is the real CLI whose
detection cycles never end by themselves (they hold until the process exits, as a cycle over a
fleet far too large would): so the stop path must abandon it rather than wait. Load threads post
OTLP requests (one node each, 8 GPUs x 16 metrics, each request a distinct 10 s slot) over
keep-alive connections until the collector goes away; the signal is sent once every thread has
had answers. After the exit: code 0, the abandoned cycle and the stop's duration in the log, no
traceback, a database that passes ``integrity_check``, and a snapshot in which every request
answered 200 is, slot for slot, and nothing else. The time from the signal to the exit is
printed (``-s``), not asserted.
"""

from __future__ import annotations

import http.client
import sqlite3
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.engine import CycleResult, DetectionEngine
from tests.collector_server import free_port
from tests.test_shutdown import started

TOKEN = "sigterm-load-token-0123456789abcdef"
NODES = 4
GPUS = 8
METRICS = 16
STEP_SECONDS = 10
MAX_ROUNDS = 1500
"""Slots a load thread may fill, going back from now: 4 h 10 min, inside the 6 h window."""
ANSWERS_BEFORE_SIGNAL = 20

pytestmark = pytest.mark.slow  # a collector process, about 15 s


def held_cycle(_engine: DetectionEngine, _now: float | None = None) -> CycleResult:
    """A detection cycle that never ends by itself."""
    print("detection cycle started", flush=True)
    threading.Event().wait()
    raise AssertionError("unreachable")


def payload(node: str, t_s: int) -> bytes:
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    rm.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value=node)))
    scope = rm.scope_metrics.add()
    for m in range(METRICS):
        metric = scope.metrics.add()
        metric.name, metric.unit = f"load.metric.{m}", "1"
        for gpu in range(GPUS):
            dp = metric.gauge.data_points.add()
            dp.as_double, dp.time_unix_nano = float(gpu + m), t_s * 1_000_000_000
            dp.attributes.append(KeyValue(key="hw.id", value=AnyValue(string_value=f"GPU-{gpu}")))
    return request.SerializeToString()


class Load(threading.Thread):
    """Posts one node's rounds, newest first, without pause, until the collector goes away."""

    def __init__(self, port: int, node: str, newest_s: int) -> None:
        super().__init__(daemon=True)
        self.port, self.node, self.newest_s = port, node, newest_s
        self.acknowledged: list[int] = []
        self.statuses: dict[int, int] = {}
        self.failures = 0

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            self._post_rounds(conn)
        finally:
            conn.close()

    def _post_rounds(self, conn: http.client.HTTPConnection) -> None:
        headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}
        for k in range(MAX_ROUNDS):
            t_s = self.newest_s - k * STEP_SECONDS
            try:
                conn.request("POST", "/v1/metrics", payload(self.node, t_s), headers)
                response = conn.getresponse()
                response.read()
            except OSError:  # the collector stopped: closed, reset or refused
                self.failures += 1
                return
            self.statuses[response.status] = self.statuses.get(response.status, 0) + 1
            if response.status == 200:
                self.acknowledged.append(t_s)


def wait_listening(port: int) -> None:
    """Wait until the collector answers ``/healthz`` (its first cycle starts before it listens)."""
    deadline = time.monotonic() + 120
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            assert time.monotonic() < deadline, "the collector does not listen"
            time.sleep(0.05)
        finally:
            conn.close()


def test_sigterm_under_load_exits_soon_with_every_acknowledged_round_kept(tmp_path: Path) -> None:
    port = free_port()
    database = tmp_path / "collector.db"
    (tmp_path / "tokens").write_text(f"agent agents {TOKEN} nodes=*\n")
    config = tmp_path / "collector.yaml"
    config.write_text(
        f"port: {port}\ntokens_file: {tmp_path / 'tokens'}\ndatabase: {database}\n"
        "detection_seconds: 1\nsnapshot_seconds: 300\n"
        "recent_metrics: [load.metric.0]\n"  # read over time below: not its latest value only
    )
    argv = ["tests.test_sigterm_load", "--log-level", "INFO", "collector", "--config", str(config)]
    newest = int(time.time()) // STEP_SECONDS * STEP_SECONDS - STEP_SECONDS
    with started(argv, tmp_path) as collector:
        collector.wait_for_line("detection cycle started", 120)
        wait_listening(port)
        loads = [Load(port, f"load-node-{n}", newest) for n in range(NODES)]
        for load in loads:
            load.start()
        deadline = time.monotonic() + 120
        while any(len(load.acknowledged) < ANSWERS_BEFORE_SIGNAL for load in loads):
            assert time.monotonic() < deadline, [load.statuses for load in loads]
            assert all(load.is_alive() for load in loads), [load.statuses for load in loads]
            time.sleep(0.05)
        signalled = time.monotonic()
        collector.proc.terminate()
        code, _, err = collector.finish(120)
        exit_seconds = time.monotonic() - signalled
    for load in loads:
        load.join(60)
    print(
        f"\nSIGTERM to exit under load: {exit_seconds:.2f} s; answers: "
        f"{[load.statuses for load in loads]}"
    )
    assert code == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "the store is closed" not in err, err[-3000:]
    assert "abandoned at shutdown (not waited for; " in err
    assert "committed when the database closes is lost): detection" in err
    assert "background work stopped in" in err
    assert set().union(*(load.statuses for load in loads)) <= {200, 503}
    assert_consistent(database, loads)


def assert_consistent(database: Path, loads: list[Load]) -> None:
    """The database is whole; the snapshot holds each acknowledged slot, and only those."""
    with sqlite3.connect(database) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    # restores the snapshot
    service = build_service(CollectorConfig(database=database, recent_metrics=("load.metric.0",)))
    try:
        now = time.time()
        for load in loads:
            matrix = service.store.matrix(
                "load.metric.0",
                selector={"host.name": load.node},
                start=now - (MAX_ROUNDS + 10) * STEP_SECONDS,
                end=now + STEP_SECONDS,
            )
            assert len(matrix.series) == GPUS
            held = matrix.times[~np.isnan(matrix.values).all(axis=0)]
            assert sorted(held.astype(int).tolist()) == sorted(load.acknowledged), load.node
    finally:
        service.storage.close()


def main() -> int:
    """The real CLI with detection cycles that hold (see the module's docstring)."""
    from gpuwarden.cli import main as cli_main

    DetectionEngine.run_cycle = held_cycle  # type: ignore[method-assign,assignment]
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
