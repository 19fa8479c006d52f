"""Warm start from the TSDB: how long a collector takes to read back its recent window.

Run: ``.venv/bin/python -m bench.warm_start_bench [--gpus 504] [--hours 6]`` (needs Debian's
``victoria-metrics``).

A real VictoriaMetrics (``tests.tsdb_servers``) gets ``--hours`` of 10 s samples of two series
per GPU (``hw.gpu.utilization``, a gauge; ``hw.energy``, a counter) on nodes of 8 GPUs, written
by remote-write as the collector writes them; then an empty default-shaped store is filled from
it by the real reader (``/api/v1/export``, 1 h pages) through ``warm_from_tsdb``. Prints the
samples, the time to read and store them, and the rate. The collector's series per GPU is about
40 (``store_bench``): multiply the time by 20 for a whole fleet's recent window, or bound it with
``read_max_samples``.
"""

from __future__ import annotations

import argparse
import time
import urllib.request

import numpy as np

from gpuwarden.collector.clients.http import HttpClient
from gpuwarden.collector.remote_write.naming import labels
from gpuwarden.collector.remote_write.reader import reader_for
from gpuwarden.collector.remote_write.warm_start import warm_from_tsdb
from gpuwarden.collector.remote_write.wire import Series, encode
from gpuwarden.collector.store.window import WindowStore
from tests.tsdb_servers import VictoriaMetrics

STEP = 10


def write(server: VictoriaMetrics, gpus: int, hours: float, now: int) -> int:
    """Write the history; return the samples written."""
    times = np.arange(now - int(hours * 3600), now, STEP, dtype=np.int64) * 1000
    rng = np.random.default_rng(3)
    written = 0
    for gpu in range(gpus):
        attrs = [("host.name", f"node-{gpu // 8:04d}"), ("hw.id", f"GPU-{gpu:05d}")]
        util = rng.random(times.size)
        energy = np.cumsum(rng.random(times.size) * 3000)
        batch = [
            Series(labels("hw_gpu_utilization", attrs), tuple(times.tolist()), tuple(util)),
            Series(labels("hw_energy_joules_total", attrs), tuple(times.tolist()), tuple(energy)),
        ]
        request = urllib.request.Request(  # noqa: S310 - loopback
            server.write_url,
            data=encode(batch),
            headers={"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"},
        )
        with urllib.request.urlopen(request, timeout=60):  # noqa: S310
            pass
        written += 2 * times.size
    with urllib.request.urlopen(f"{server.url}/internal/force_flush", timeout=60):  # noqa: S310
        pass
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=504)
    parser.add_argument("--hours", type=float, default=6.0)
    args = parser.parse_args()
    now = int(time.time()) // STEP * STEP
    server = VictoriaMetrics()
    with server:
        written = write(server, args.gpus, args.hours, now)
        store = WindowStore(step_seconds=STEP, clock=lambda: float(now))
        reader = reader_for("victoriametrics", HttpClient(), server.url)
        started = time.perf_counter()
        warm = warm_from_tsdb(store, reader, start=now - args.hours * 3600, end=float(now))
        seconds = time.perf_counter() - started
    assert warm.error is None, warm.error
    print(f"{args.gpus} GPUs x 2 series, {args.hours:g} h of 10 s samples: {written:,} written")
    print(f"read back and stored: {warm.samples:,} samples of {warm.series:,} series")
    print(f"time: {seconds:.2f} s ({warm.samples / seconds:,.0f} samples/s)")


if __name__ == "__main__":
    main()
