"""The Prometheus remote-write receiver (``POST /api/v1/write``) on a real collector app and
service: dcgm-exporter series stored as our metrics, authentication like OTLP, the answers to
wrong media types, and no loop back into our own remote-write.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.remote_write.settings import RemoteWriteSettings
from gpuwarden.collector.remote_write.wire import (
    HEADERS,
    Decoder,
    Series,
    WireTooLargeError,
    decode,
    encode,
)
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import AUTH_STATS, STATS
from gpuwarden.collector.web.remote_write_receiver import RW_WORKERS, worker_count
from tests.prom_translate import translate
from tests.test_collector_hostile import many_series

TOKENS = {
    "prom-token-0123456789abcdef": ("prometheus", ("*",)),
    "node-a-token-0123456789abcdef": ("agent-a", ("node-a",)),
    "reader-token-0123456789abcdef": ("reader", ()),
}
TABLE = TokenTable(
    tuple(
        credential(t, Role.READER if n == "reader" else Role.AGENT, n, nodes)
        for t, (n, nodes) in TOKENS.items()
    )
)


def headers(name: str = "prometheus", **extra: str) -> dict[str, str]:
    token = next(t for t, (n, _) in TOKENS.items() if n == name)
    return {**HEADERS, "Authorization": f"Bearer {token}", **extra}


def dcgm(name: str, host: str, gpu: int, samples: Sequence[tuple[int, float]]) -> Series:
    """One dcgm-exporter series, labelled as dcgm-exporter 3.x prints it."""
    labels = {
        "__name__": name,
        "gpu": str(gpu),
        "UUID": f"GPU-{host}-{gpu}",
        "device": f"nvidia{gpu}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": host,
        "job": "dcgm-exporter",
        "instance": f"{host}:9400",
    }
    return Series(
        tuple(sorted(labels.items())),
        tuple(t for t, _ in samples),
        tuple(v for _, v in samples),
    )


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CollectorService]:
    svc = build_service(CollectorConfig(database=tmp_path / "c.db"))
    yield svc
    svc.storage.close()


def app_for(service: CollectorService, **config: object):
    return create_app(
        CollectorConfig(tokens=TABLE, **config),  # type: ignore[arg-type]
        service=service,
        background=False,
        prom_translate=translate,
    )


@pytest.fixture
async def client(aiohttp_client, service):
    return await aiohttp_client(app_for(service))


def latest(service: CollectorService, metric: str, host: str) -> dict[str, float]:
    found = service.store.latest(metric, {"host.name": host}, max_age_seconds=math.inf)
    return {
        str(info.attributes["hw.id"]): float(v)
        for info, v in zip(found.series, found.values, strict=True)
    }


async def test_dcgm_series_are_stored_as_our_metrics_with_units_converted(client, service):
    t = now_ms()
    body = encode(
        [
            dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(t, 75.0)]),
            dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 1, [(t, 0.0)]),
            dcgm("DCGM_FI_DEV_FB_USED", "node-a", 0, [(t, 1024.0)]),
            dcgm("DCGM_FI_DEV_SM_CLOCK", "node-a", 0, [(t, 1980.0)]),  # no mapping: skipped
        ]
    )
    resp = await client.post("/api/v1/write", data=body, headers=headers())
    assert resp.status == 204, await resp.text()
    assert latest(service, "hw.gpu.utilization", "node-a") == pytest.approx(
        {"GPU-node-a-0": 0.75, "GPU-node-a-1": 0.0}
    )
    assert latest(service, "hw.gpu.memory.usage", "node-a") == {"GPU-node-a-0": float(1 << 30)}
    counts = client.server.app[STATS].remote_write_samples
    assert counts == {"stored": 3, "unmapped_series": 1}
    assert client.server.app[STATS].responses[204] == 1
    reader = {"Authorization": headers("reader")["Authorization"]}
    text = await (await client.get("/metrics", headers=reader)).text()
    assert 'gpuwarden_collector_remote_write_samples_total{outcome="stored"} 3.0' in text
    assert 'gpuwarden_collector_remote_write_samples_total{outcome="unmapped_series"} 1.0' in text


async def test_a_token_bound_to_other_nodes_stores_nothing(client, service):
    body = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-b", 0, [(now_ms(), 50.0)])])
    resp = await client.post("/api/v1/write", data=body, headers=headers("agent-a"))
    assert resp.status == 403
    assert "node-b" in await resp.text()
    assert service.store.series_count() == 0
    refusals = client.server.app[AUTH_STATS].refusals
    assert refusals[("POST", "/api/v1/write", 403, "node")] == 1
    body = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(now_ms(), 50.0)])])
    resp = await client.post("/api/v1/write", data=body, headers=headers("agent-a"))
    assert resp.status == 204


@pytest.mark.parametrize(
    ("name", "status"),
    [(None, 401), ("reader", 403)],
)
async def test_callers_other_than_agents_are_refused(client, service, name, status):
    body = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(now_ms(), 50.0)])])
    sent = dict(HEADERS) if name is None else headers(name)
    resp = await client.post("/api/v1/write", data=body, headers=sent)
    assert resp.status == status
    assert service.store.series_count() == 0


@pytest.mark.parametrize(
    "wrong",
    [
        {"Content-Type": "application/json"},
        {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},
        {"Content-Encoding": "gzip"},
        {"Content-Encoding": "identity"},
    ],
)
async def test_other_media_types_and_encodings_are_415(client, service, wrong):
    body = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(now_ms(), 50.0)])])
    resp = await client.post("/api/v1/write", data=body, headers=headers(**wrong))
    assert resp.status == 415
    assert service.store.series_count() == 0


async def test_the_version_1_proto_parameter_is_taken(client):
    body = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(now_ms(), 50.0)])])
    typed = {"Content-Type": "application/x-protobuf; proto=prometheus.WriteRequest"}
    resp = await client.post("/api/v1/write", data=body, headers=headers(**typed))
    assert resp.status == 204


class RecordingTap:
    """An ``IngestTap`` that keeps what the intake hands the history writer."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.taken: list[NumberPoint] = []

    def payload(self, payload: bytes, kind: str) -> None:
        self.bodies.append(payload)

    def points(self, points: Sequence[NumberPoint]) -> None:
        self.taken.extend(points)


async def test_received_points_are_not_written_back_to_the_tsdb(aiohttp_client, service):
    tap = RecordingTap()
    service.intake.tap = tap
    client = await aiohttp_client(app_for(service))
    body = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(now_ms(), 50.0)])])
    assert (await client.post("/api/v1/write", data=body, headers=headers())).status == 204
    assert service.store.series_count() == 1
    assert tap.taken == []
    assert tap.bodies == []
    # the agent's OTLP still goes to the history writer
    otlp = {"Authorization": headers()["Authorization"], "Content-Type": "application/x-protobuf"}
    resp = await client.post("/v1/metrics", data=many_series(1, "node-a"), headers=otlp)
    assert resp.status == 200
    assert len(tap.bodies) == 1


async def test_forward_received_writes_them_to_another_tsdb(aiohttp_client, service, tmp_path):
    tap = RecordingTap()
    service.intake.tap = tap
    settings = RemoteWriteSettings(
        url="http://127.0.0.1:9/api/v1/write", queue_dir=tmp_path / "q", forward_received=True
    )
    client = await aiohttp_client(app_for(service, remote_write=settings))
    body = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(now_ms(), 50.0)])])
    assert (await client.post("/api/v1/write", data=body, headers=headers())).status == 204
    assert [(p.metric, p.value) for p in tap.taken] == [("hw.gpu.utilization", 0.5)]


async def test_without_a_translator_there_is_no_route(aiohttp_client, service):
    app = create_app(CollectorConfig(tokens=TABLE), service=service, background=False)
    client = await aiohttp_client(app)
    body = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(now_ms(), 50.0)])])
    resp = await client.post("/api/v1/write", data=body, headers=headers())
    assert resp.status == 404


def test_the_receivers_decoder_reads_what_decode_reads(native):
    series = [
        dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(1000, 1.5), (2000, -2.0)]),
        Series((("__name__", "é_unicode"), ("x", "")), (3000,), (float("inf"),)),
        Series((("__name__", "no_samples"),), (), ()),
    ]
    body = encode(series)
    decoder = Decoder(max_label_sets=3, native=native)
    first = decoder.decode(body)
    assert first == decode(body) == series
    again = decoder.decode(body)  # label sets remembered: the same tuples
    assert again == series
    assert all(a.labels is f.labels for a, f in zip(again, first, strict=True))
    small = Decoder(max_label_sets=2, native=native)  # forgets them all when full: still right
    assert small.decode(body) == small.decode(body) == series
    with pytest.raises(WireTooLargeError):
        decoder.decode(body, max_bytes=len(body))


def test_end_series_ends_gauges_only(service):
    t_ns = now_ms() * 1_000_000
    resource: dict[str, str | int | float | bool] = {"host.name": "node-a"}

    def point(metric: str, kind: str, value: float, at_ns: int) -> NumberPoint:
        monotonic = kind == "sum"
        return NumberPoint(resource, metric, "1", kind, monotonic, {"hw.id": "G0"}, at_ns, value)

    service.accept(
        [
            point("hw.gpu.utilization", "gauge", 0.5, t_ns - 20 * 10**9),
            point("hw.energy", "sum", 100.0, t_ns - 20 * 10**9),
            point("hw.energy", "sum", 150.0, t_ns - 10 * 10**9),
        ],
        "test",
    )
    assert service.end_series([point("hw.energy", "sum", 0.0, t_ns)]) == 0  # a counter
    assert service.end_series([point("hw.unknown", "gauge", 0.0, t_ns)]) == 0
    assert service.end_series([point("hw.gpu.utilization", "gauge", 0.0, t_ns)]) == 1
    found = service.store.latest("hw.gpu.utilization", max_age_seconds=math.inf)
    assert math.isnan(float(found.values[0]))
    energy = service.store.latest("hw.energy", max_age_seconds=math.inf)
    assert float(energy.values[0]) == pytest.approx(5.0)  # 50 J over 10 s, as it was


async def test_requests_are_stored_by_one_thread_a_core_and_the_rest_wait(aiohttp_client, service):
    app = app_for(service)
    client = await aiohttp_client(app)
    workers = app[RW_WORKERS]
    assert workers._max_workers == worker_count() == len(os.sched_getaffinity(0))
    t = now_ms()
    bodies = [
        encode([dcgm("DCGM_FI_DEV_GPU_UTIL", f"node-{n}", g, [(t, 10.0 + g)]) for g in range(8)])
        for n in range(12)
    ]
    answers = await asyncio.gather(
        *(client.post("/api/v1/write", data=body, headers=headers()) for body in bodies)
    )
    assert [a.status for a in answers] == [204] * len(bodies)  # waited for a thread, none shed
    assert len(workers._threads) <= worker_count()
    assert all(t.name.startswith("remote-write") for t in workers._threads)
    assert all(len(latest(service, "hw.gpu.utilization", f"node-{n}")) == 8 for n in range(12))
    await client.close()  # the app's cleanup lets the threads go
    with pytest.raises(RuntimeError):
        workers.submit(int)
