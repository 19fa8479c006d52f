"""What remote-write costs the collector: CPU per OTLP request, on and off.

Not a test: it prints figures. Run from the repository root:

    .venv/bin/python bench/remote_write_overhead.py

Feeds 1,000 agent-like OTLP requests (20 nodes x 50 rounds, 8 GPUs x 40 gauges = 320 points)
into a real ``CollectorService``, once without and once with a history writer (queue and intake
log in a temporary folder, the TSDB unreachable so nothing is sent), and prints the CPU of the
receiver's path per request, then of the flush that decodes, names, encodes and queues them.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gpuwarden.collector.clients.http import HttpClient
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.remote_write.intake_log import IntakeLog
from gpuwarden.collector.remote_write.queue import DiskQueue
from gpuwarden.collector.remote_write.sender import RemoteWriteSender
from gpuwarden.collector.remote_write.writer import HistoryWriter
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.sqlite import MEMORY, SqliteStorage
from gpuwarden.collector.store.window import WindowStore

NS = 1_000_000_000
NODES, ROUNDS, GPUS, GAUGES = 20, 50, 8, 40


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def request(node: str, t_ns: int) -> bytes:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(kv("host.name", node))
    sm = rm.scope_metrics.add()
    for m in range(GAUGES):
        metric = sm.metrics.add()
        metric.name, metric.unit = f"hw.gpu.metric{m}", "W"
        for g in range(GPUS):
            p = metric.gauge.data_points.add()
            p.time_unix_nano, p.as_double = t_ns, float(m * g)
            p.attributes.extend([kv("hw.id", f"GPU-{g}"), kv("hw.type", "gpu")])
    return req.SerializeToString()


def writer(folder: Path) -> HistoryWriter:
    queue = DiskQueue(folder, max_bytes=1 << 30)
    sender = RemoteWriteSender(queue, HttpClient(), "http://127.0.0.1:9/api/v1/write")
    return HistoryWriter(queue, sender, batch_samples=5000, log=IntakeLog(folder))


def run(history: HistoryWriter | None) -> tuple[float, float]:
    storage = SqliteStorage(MEMORY)
    service = CollectorService(
        store=WindowStore(step_seconds=10, recent_seconds=3600, staleness_seconds=1e6),
        storage=storage,
        registry=JobRegistry(storage, []),
        history=history,
    )
    t0 = (int(time.time()) // 10 * 10 - 2000) * NS
    payloads = [[request(f"n{n}", t0 + r * 10 * NS) for n in range(NODES)] for r in range(ROUNDS)]
    start = time.process_time()
    for bodies in payloads:
        for n, body in enumerate(bodies):
            service.accept_payload(body, PROTOBUF, f"n{n}")
    receiver = time.process_time() - start
    start = time.process_time()
    if history is not None:
        history.flush()
    flush = time.process_time() - start
    return receiver, flush


def main() -> None:
    requests = NODES * ROUNDS
    points = GPUS * GAUGES
    print(f"{requests} requests of {points} points; CPU ms per request")
    print(f"{'remote-write':<14}{'receiver':>10}{'flush':>10}")
    receiver, _ = run(None)
    print(f"{'off':<14}{receiver / requests * 1e3:>10.3f}{0:>10.3f}")
    with tempfile.TemporaryDirectory() as folder:
        history = writer(Path(folder))
        receiver, flush = run(history)
        print(f"{'on':<14}{receiver / requests * 1e3:>10.3f}{flush / requests * 1e3:>10.3f}")
        queue = history.queue
        samples, size = queue.pending_samples(), queue.pending_bytes()
        print(f"queued: {samples} samples in {size} bytes ({size / samples:.2f} bytes/sample)")


if __name__ == "__main__":
    main()
