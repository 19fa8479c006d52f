"""Memory of hostile OTLP requests: the collector's RSS before and after one request.

Not a test: it prints figures. Run from the repository root:

    .venv/bin/python bench/hostile_rss.py

Each case runs in a fresh child process (so RSS is that request's alone): a ``CollectorService``
as ``build_service`` makes it from the default config (but the series budget the case names),
one warm-up request of 10 series, then one hostile request through ``accept_payload`` (the
receiver's path). Printed: the body size, what was stored and rejected, RSS growth (``VmRSS``)
and peak growth (``VmHWM``, the high-water mark during the request), per new series where
series were created. The bound the hostile-load test states comes from these figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

CASES = {
    # name: (series in the request, label value bytes, per-source budget)
    "100k new series, default budget (100,000/h)": (100_000, 8, 100_000),
    "100k new series, budget 5,000/h": (100_000, 8, 5_000),
    "6 series with 1 MB label values": (6, 1 << 20, 100_000),
}


def request(series: int, value_bytes: int, host: str = "attacker") -> bytes:
    """One gauge with ``series`` points, each its own series (``hw.id`` differs)."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(KeyValue(key="host.name", value=AnyValue(string_value=host)))
    metric = rm.scope_metrics.add().metrics.add()
    metric.name = "hw.gpu.utilization"
    now = time.time_ns()
    pad = "x" * max(0, value_bytes - 8)
    for i in range(series):
        dp = metric.gauge.data_points.add()
        dp.as_double = 0.5
        dp.time_unix_nano = now
        value = f"{i:08d}{pad}"
        dp.attributes.append(KeyValue(key="hw.id", value=AnyValue(string_value=value)))
    return req.SerializeToString()


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def run_case(name: str) -> dict[str, object]:
    """In this process: build the service, send the case's request, measure."""
    from gpuwarden.collector.build import build_service
    from gpuwarden.collector.config import CollectorConfig
    from gpuwarden.collector.ingest.otlp_transport import PROTOBUF

    series, value_bytes, budget = CASES[name]
    with tempfile.TemporaryDirectory() as tmp:
        config = CollectorConfig(database=Path(tmp) / "c.db", max_new_series_per_source_hour=budget)
        service = build_service(config)
        service.accept_payload(request(10, 8, host="warm"), PROTOBUF, "warm")
        body = request(series, value_bytes)
        rss0, hwm0 = _status_kib("VmRSS"), _status_kib("VmHWM")
        done = service.accept_payload(body, PROTOBUF, "attacker")
        del body
        rss1, hwm1 = _status_kib("VmRSS"), _status_kib("VmHWM")
        created = service.store.series_count() - 10
        service.storage.close()
    return {
        "case": name,
        "body_bytes": len(request(series, value_bytes)),
        "series_created": created,
        "rejected": done.rejected,
        "over_limits": done.over_limits,
        "rss_growth_mib": round((rss1 - rss0) / 1024, 1),
        "peak_growth_mib": round((max(hwm1, hwm0) - rss0) / 1024, 1),
        "rss_kib_per_new_series": round((rss1 - rss0) / created, 2) if created else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case)))
        return 0
    for name in CASES:
        out = subprocess.run(
            [sys.executable, __file__, "--case", name],
            capture_output=True,
            text=True,
            check=True,
        )
        print(out.stdout.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
