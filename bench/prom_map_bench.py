"""What translating dcgm-exporter's remote-written series costs, and storing what they become.

Not a test: it prints figures. Run from the repository root:

    .venv/bin/python -m bench.prom_map_bench --nodes 125

``--nodes`` nodes x 8 GPUs of ``tests/dcgm_exposition.py``'s fleet, every GPU held by a pod, one
scrape of every node's page as Prometheus remote-writes it (a series per sample, ``instance`` and
``job`` labels), decoded from the remote-write wire format; then ``prom_map.translate`` and
``CollectorService.accept`` of its points into a collector that has seen the previous scrape (the
steady state: the same series again), best of ``--repeat`` scrapes 15 s apart.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.prom_map import translate
from gpuwarden.collector.remote_write.wire import decode, encode
from tests.dcgm_exposition import DcgmFleet, Pod
from tests.test_prom_map_service import scrape_series

T0 = 1_767_225_600.0


def main() -> None:
    """Print series/s of translate and of translate + accept."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    nodes = [f"node-{i:04d}" for i in range(args.nodes)]
    fleet = DcgmFleet(nodes, 8)
    for node in nodes:
        for gpu in range(8):
            fleet.assign(node, gpu, Pod(f"job-{node}-{gpu}", "ml"))
    bodies = [encode(scrape_series(fleet, T0 + 15 * k)) for k in range(args.repeat + 1)]
    best_translate = best_total = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        config = CollectorConfig(database=Path(tmp) / "c.db", step_seconds=15)
        service = build_service(config, clock=lambda: T0 + 3600)
        try:
            first = time.perf_counter()
            assert service.accept(translate(decode(bodies[0])).points, "bench") == 0
            first = time.perf_counter() - first  # every series new to the store
            for body in bodies[1:]:  # the steady state: the same series, the next scrape
                series = decode(body)
                start = time.perf_counter()
                out = translate(series)
                middle = time.perf_counter()
                assert service.accept(out.points, "bench") == 0
                end = time.perf_counter()
                best_translate = min(best_translate, middle - start)
                best_total = min(best_total, end - start)
        finally:
            service.storage.close()
    n = len(series)
    print(
        f"{args.nodes} nodes x 8 GPUs: {n} series, {len(bodies[0])} B remote-write, "
        f"{len(out.points)} points; first scrape (all series new) {first * 1e3:.0f} ms"
    )
    for label, seconds in (("translate", best_translate), ("translate + accept", best_total)):
        print(f"{label:<20}{seconds * 1e3:8.1f} ms {n / seconds:12,.0f} series/s")


if __name__ == "__main__":
    main()
