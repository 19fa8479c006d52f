"""A real Prometheus (Debian's) scrapes a dcgm-exporter-like endpoint and remote-writes to the
real collector: its series arrive as our metrics, and when a GPU's series disappear from the
endpoint, Prometheus' stale markers end their presence in the collector.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import STATS
from tests.prom_translate import translate
from tests.prometheus_server import PrometheusServer, prometheus_binary
from tests.test_remote_write_receiver import TABLE, TOKENS

pytestmark = pytest.mark.skipif(prometheus_binary() is None, reason="prometheus not installed")

PROM_TOKEN = next(t for t, (name, _) in TOKENS.items() if name == "prometheus")


def exposition(gpus: dict[int, float]) -> str:
    """dcgm-exporter's text for node-a's GPUs (metric names, help and labels as 3.x prints)."""
    lines = [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    ]
    for gpu, util in sorted(gpus.items()):
        labels = (
            f'gpu="{gpu}",UUID="GPU-node-a-{gpu}",device="nvidia{gpu}",'
            f'modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",'
            f'DCGM_FI_DRIVER_VERSION="550.90.07"'
        )
        lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util:g}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CollectorService]:
    svc = build_service(CollectorConfig(database=tmp_path / "c.db"))
    yield svc
    svc.storage.close()


def utilisation(service: CollectorService) -> dict[str, float]:
    found = service.store.latest("hw.gpu.utilization", {"host.name": "node-a"})
    return {
        str(info.attributes["hw.id"]): float(v)
        for info, v in zip(found.series, found.values, strict=True)
    }


async def until(what: str, check, prometheus: PrometheusServer, seconds: float = 90) -> None:
    """Await ``check()`` (Prometheus is another process: its scrapes and sends are polled)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in {seconds} s:\n{prometheus.log_tail()}")
        await asyncio.sleep(0.2)


async def test_prometheus_remote_writes_dcgm_series_and_stale_markers(aiohttp_server, service):
    gpus = {0: 75.0, 1: 10.0}

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=exposition(gpus), content_type="text/plain")

    target = web.Application()
    target.router.add_get("/metrics", metrics)
    exporter = await aiohttp_server(target)
    collector_app = create_app(
        CollectorConfig(tokens=TABLE),
        service=service,
        background=False,
        prom_translate=translate,
    )
    collector = await aiohttp_server(collector_app)
    remote_write = {
        "url": f"http://127.0.0.1:{collector.port}/api/v1/write",
        "authorization": {"credentials": PROM_TOKEN},
        "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms"},
    }
    prometheus = PrometheusServer(
        {"dcgm-exporter": f"127.0.0.1:{exporter.port}"}, remote_write=[remote_write]
    )
    with prometheus:
        await until(
            "both GPUs",
            lambda: (
                utilisation(service) == pytest.approx({"GPU-node-a-0": 0.75, "GPU-node-a-1": 0.1})
            ),
            prometheus,
        )
        del gpus[1]  # GPU 1's series leaves the endpoint: Prometheus writes a stale marker
        await until(
            "GPU 1 ended", lambda: math.isnan(utilisation(service)["GPU-node-a-1"]), prometheus
        )
        assert utilisation(service)["GPU-node-a-0"] == pytest.approx(0.75)
    stats = collector_app[STATS]
    assert stats.remote_write_samples["stale_markers"] >= 1
    assert stats.remote_write_samples["stored"] >= 2
    assert set(stats.responses) == {204}  # every request of a real sender accepted
