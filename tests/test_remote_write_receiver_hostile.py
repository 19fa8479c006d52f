"""Hostile remote-write bodies against a real collector app and service: each gets its answer
(400, 413, 415, 503, or 204 with the bad samples counted), never a 5xx, and the collector
still stores a good request afterwards.
"""

from __future__ import annotations

import io
import math
import random
import struct
from collections.abc import Iterator
from pathlib import Path

import cramjam
import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.prom_write import STALE_NAN_BITS, is_stale_marker
from gpuwarden.collector.remote_write.wire import Series, encode
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import STATS
from tests.prom_translate import SeriesTranslator, translate
from tests.test_collector_hostile import many_series
from tests.test_remote_write_receiver import TABLE, dcgm, headers, latest, now_ms

STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
MAX_BODY = 4 << 20
MAX_INFLATED = 16 << 20


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CollectorService]:
    svc = build_service(CollectorConfig(database=tmp_path / "c.db"))
    yield svc
    svc.storage.close()


@pytest.fixture(params=["series", "columns"])
async def client(aiohttp_client, service, request):
    """The app with a translator of points (every request series by series) or one that maps
    series one by one (requests read flat go through the columns, ``ingest.prom_columns``)."""
    config = CollectorConfig(
        tokens=TABLE, max_body_bytes=MAX_BODY, max_decompressed_bytes=MAX_INFLATED
    )
    translator = translate if request.param == "series" else SeriesTranslator()
    return await aiohttp_client(
        create_app(config, service=service, background=False, prom_translate=translator)
    )


async def post(client, body: bytes) -> int:
    resp = await client.post("/api/v1/write", data=io.BytesIO(body), headers=headers())
    await resp.read()
    return int(resp.status)


async def still_healthy(client, service: CollectorService) -> None:
    """The collector answers its probe and stores a good request."""
    assert (await client.get("/healthz")).status == 200
    good = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-ok", 0, [(now_ms(), 42.0)])])
    assert await post(client, good) == 204
    assert latest(service, "hw.gpu.utilization", "node-ok") == pytest.approx(
        {"GPU-node-ok-0": 0.42}
    )


def good_body(n: int = 4) -> bytes:
    t = now_ms()
    return encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", i, [(t, 10.0 * i)]) for i in range(n)])


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(good_body()[:-7], id="truncated-snappy"),
        pytest.param(good_body()[:3], id="snappy-header-only"),
        pytest.param(bytes(cramjam.snappy.compress_raw(b"\xff" * 300)), id="snappy-of-garbage"),
        pytest.param(b"definitely not snappy", id="not-snappy"),
        pytest.param(bytes(cramjam.snappy.compress(b"x" * 100)), id="framed-snappy"),
        pytest.param(bytes(cramjam.snappy.compress_raw(many_series(3, "n"))), id="otlp-proto"),
        pytest.param(
            encode([Series((("job", "x"),), (1,), (1.0,))]), id="series-without-metric-name"
        ),
        pytest.param(
            encode([Series((("__name__", "m"), ("a\nb", "x")), (1,), (1.0,))]),
            id="control-character-in-a-label-name",
        ),
    ],
)
async def test_malformed_bodies_are_400_and_store_nothing(client, service, body):
    assert await post(client, body) == 400
    assert service.store.series_count() == 0
    await still_healthy(client, service)


async def test_a_decompression_bomb_is_413_before_it_inflates(client, service):
    bomb = bytes(cramjam.snappy.compress_raw(b"\0" * (MAX_INFLATED + 1)))
    assert len(bomb) < MAX_BODY  # it passes the body limit: only the inflated size stops it
    assert await post(client, bomb) == 413
    # a header announcing 4 GiB (snappy's most), with nothing behind it
    forged = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F]) + b"\0" * 16
    assert await post(client, forged) == 413
    await still_healthy(client, service)


async def test_a_body_over_the_limit_is_413(client, service):
    assert await post(client, b"\0" * (MAX_BODY + 1)) == 413
    await still_healthy(client, service)


async def test_huge_label_sets_are_rejected_per_series_and_counted(client, service):
    t = now_ms()
    many = dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(t, 10.0)])
    many = Series(
        tuple(sorted([*many.labels, *((f"l{i:04d}", "v") for i in range(2000))])),
        many.timestamps_ms,
        many.values,
    )
    long_value = dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 1, [(t, 10.0)])
    long_value = Series(
        (*long_value.labels, ("pod", "p" * (1 << 20))), long_value.timestamps_ms, (10.0,)
    )
    long_name = dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 2, [(t, 10.0)])
    long_name = Series(((("x" * 4096), "v"), *long_name.labels), (t,), (10.0,))
    fine = dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 3, [(t, 30.0)])
    assert await post(client, encode([many, long_value, long_name, fine])) == 204
    assert latest(service, "hw.gpu.utilization", "node-a") == pytest.approx({"GPU-node-a-3": 0.3})
    assert client.server.app[STATS].remote_write_samples["over_label_limits"] == 3
    await still_healthy(client, service)


async def test_nan_and_inf_are_rejected_per_sample_and_counted(client, service):
    t = now_ms()
    body = encode(
        [
            dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(t - 20_000, math.nan), (t, 20.0)]),
            dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 1, [(t - 20_000, 5.0), (t, math.inf)]),
            dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 2, [(t, -math.inf)]),
        ]
    )
    assert await post(client, body) == 204
    assert latest(service, "hw.gpu.utilization", "node-a") == pytest.approx(
        {"GPU-node-a-0": 0.2, "GPU-node-a-1": 0.05}
    )
    counts = client.server.app[STATS].remote_write_samples
    assert counts["nonfinite"] == 3
    assert counts["stored"] == 2
    await still_healthy(client, service)


def test_only_the_stale_bit_pattern_is_a_stale_marker():
    assert is_stale_marker(STALE)
    assert not is_stale_marker(math.nan)
    assert not is_stale_marker(1.0)
    assert not is_stale_marker(math.inf)


async def test_stale_markers_end_a_series_presence_and_are_not_values(client, service):
    t = now_ms()
    first = encode(
        [
            dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(t - 30_000, 60.0)]),
            dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 1, [(t - 30_000, 70.0)]),
        ]
    )
    assert await post(client, first) == 204
    assert latest(service, "hw.gpu.utilization", "node-a") == pytest.approx(
        {"GPU-node-a-0": 0.6, "GPU-node-a-1": 0.7}
    )
    # GPU 0's target is gone: Prometheus writes a stale marker; GPU 1 keeps reporting
    gone = encode(
        [
            dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(t, STALE)]),
            dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 1, [(t, 80.0)]),
        ]
    )
    assert await post(client, gone) == 204
    counts = client.server.app[STATS].remote_write_samples
    assert counts["stale_markers"] == 1
    assert "nonfinite" not in counts  # an end, not a bad value
    now = latest(service, "hw.gpu.utilization", "node-a")
    assert math.isnan(now["GPU-node-a-0"])  # unknown at once, not after staleness_seconds
    assert now["GPU-node-a-1"] == pytest.approx(0.8)
    window = service.store.matrix(
        "hw.gpu.utilization",
        selector={"hw.id": "GPU-node-a-0"},
        start=(t - 60_000) / 1000,
        end=t / 1000 + 1,
    )
    held = [round(float(v), 3) for v in window.values[0] if not math.isnan(v)]
    assert held == [0.6]  # the value before the marker stays history
    # a marker older than the series' newest point erases nothing
    late = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 1, [(t - 10_000, STALE)])])
    assert await post(client, late) == 204
    assert latest(service, "hw.gpu.utilization", "node-a")["GPU-node-a-1"] == pytest.approx(0.8)
    # the series comes back with its next value
    back = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(t + 10_000, 50.0)])])
    assert await post(client, back) == 204
    assert latest(service, "hw.gpu.utilization", "node-a")["GPU-node-a-0"] == pytest.approx(0.5)
    await still_healthy(client, service)


async def test_out_of_order_samples_go_where_the_store_puts_them(client, service):
    t = now_ms()
    newest = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(t, 10.0)])])
    assert await post(client, newest) == 204
    # within one request, backwards; then a late request; then one older than the window
    backwards = [(t - 30_000, 30.0), (t - 60_000, 60.0)]
    body = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, backwards)])
    assert await post(client, body) == 204
    too_old = encode([dcgm("DCGM_FI_DEV_GPU_UTIL", "node-a", 0, [(t - 7 * 3600_000, 70.0)])])
    assert await post(client, too_old) == 204
    assert latest(service, "hw.gpu.utilization", "node-a") == pytest.approx({"GPU-node-a-0": 0.1})
    found = service.store.matrix("hw.gpu.utilization", start=(t - 90_000) / 1000, end=t / 1000 + 1)
    held = sorted(round(float(v), 3) for v in found.values[0] if not math.isnan(v))
    assert held == [0.1, 0.3, 0.6]
    counts = client.server.app[STATS].remote_write_samples
    assert counts["stored"] == 3
    assert counts["refused_by_store"] == 1
    await still_healthy(client, service)


async def test_100k_series_in_one_request(client, service):
    t = now_ms()
    series = [
        Series(
            (("Hostname", f"n{i // 8}"), ("UUID", f"G{i}"), ("__name__", "DCGM_FI_DEV_GPU_UTIL")),
            (t,),
            (float(i % 100),),
        )
        for i in range(100_000)
    ]
    body = encode(series)
    assert len(body) < MAX_BODY
    assert await post(client, body) == 204
    assert service.store.series_count() == 100_000
    assert client.server.app[STATS].remote_write_samples["stored"] == 100_000
    await still_healthy(client, service)


async def test_more_series_than_the_request_limit_is_413(aiohttp_client, service):
    config = CollectorConfig(tokens=TABLE, max_points_per_request=1000)
    client = await aiohttp_client(
        create_app(config, service=service, background=False, prom_translate=translate)
    )
    t = now_ms()
    over = [dcgm("DCGM_FI_DEV_GPU_UTIL", f"n{i}", 0, [(t, 1.0)]) for i in range(1001)]
    assert await post(client, encode(over)) == 413
    samples = [dcgm("DCGM_FI_DEV_GPU_UTIL", "n", 0, [(t - i, 1.0) for i in range(1001)])]
    assert await post(client, encode(samples)) == 413
    assert service.store.series_count() == 0
    await still_healthy(client, service)


async def test_back_pressure_is_503_with_retry_after(aiohttp_client, service):
    config = CollectorConfig(tokens=TABLE, max_inflight_requests=0)
    client = await aiohttp_client(
        create_app(config, service=service, background=False, prom_translate=translate)
    )
    resp = await client.post("/api/v1/write", data=good_body(), headers=headers())
    assert resp.status == 503
    assert resp.headers["Retry-After"] == "2"
    assert service.store.series_count() == 0


async def test_mangled_bodies_never_get_a_5xx(client, service):
    rng = random.Random(17)  # noqa: S311 (a reproducible fuzz, not a secret)
    base = bytearray(good_body(8))
    seen = set()
    for _ in range(300):
        body = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        seen.add(await post(client, bytes(body)))
    assert seen <= {204, 400, 413}
    assert 400 in seen
    await still_healthy(client, service)


async def test_a_failing_translator_is_a_400_not_a_resend_forever(aiohttp_client, service, caplog):
    def broken(series):
        raise KeyError("a mapping bug")

    app = create_app(
        CollectorConfig(tokens=TABLE), service=service, background=False, prom_translate=broken
    )
    client = await aiohttp_client(app)
    assert await post(client, good_body()) == 400
    assert service.store.series_count() == 0
    assert "the translator failed" in caplog.text
    assert (await client.get("/healthz")).status == 200
