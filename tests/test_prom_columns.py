"""``ingest.prom_columns`` on a real ``CollectorService``: the label-set cache follows the
decoder's table across generations, a request of an older table is handed back (None), and
requests stored from several threads at once land on their own series.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.prom_columns import (
    LabelSetCache,
    LabelSetColumns,
    Stored,
    store_columns,
)
from gpuwarden.collector.ingest.prom_write import LabelVerdicts
from gpuwarden.collector.remote_write.wire import Decoder, Series, encode
from gpuwarden.collector.remote_write.wire_flat import FlatRequest
from gpuwarden.collector.service import CollectorService
from tests.prom_translate import SeriesTranslator
from tests.test_remote_write_receiver import dcgm

LIMITS = CollectorConfig().ingest_limits


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CollectorService]:
    svc = build_service(CollectorConfig(database=tmp_path / "c.db"))
    svc.max_new_series_per_source_hour = 10**6
    yield svc
    svc.storage.close()


def node(host: str, t_ms: int, value: float) -> list[Series]:
    return [dcgm("DCGM_FI_DEV_GPU_UTIL", host, gpu, [(t_ms, value + gpu)]) for gpu in range(4)]


def flat(decoder: Decoder, series: list[Series]) -> FlatRequest:
    for _ in range(3):  # new label sets are parsed and remembered: then read flat
        got = decoder.decode_flat(encode(series))
        if isinstance(got, FlatRequest):
            return got
    raise AssertionError("never read flat")


def columns(got: FlatRequest) -> LabelSetColumns:
    return LabelSetColumns(got.ids, got.timestamps_ms, got.values, got.label_sets, got.generation)


def store(got: FlatRequest, cache: LabelSetCache, service: CollectorService) -> Stored | None:
    return store_columns(columns(got), cache, service, lambda host: True, 10_000, "test")


def utilization(service: CollectorService, host: str) -> dict[str, float]:
    found = service.store.latest(
        "hw.gpu.utilization", {"host.name": host}, max_age_seconds=math.inf
    )
    return {
        str(info.attributes["hw.id"]): round(float(v), 6)
        for info, v in zip(found.series, found.values, strict=True)
    }


def test_the_cache_follows_the_decoders_table_and_hands_back_older_requests(service, native):
    decoder = Decoder(max_label_sets=6, native=native)  # two nodes of 4 series: a new table
    cache = LabelSetCache(LabelVerdicts(LIMITS), SeriesTranslator())
    t = int(time.time() * 1000) - 60_000
    old = flat(decoder, node("node-a", t, 10.0))
    done = store(old, cache, service)
    assert done is not None
    assert done.stored == 4
    newer = flat(decoder, node("node-b", t, 20.0))
    assert newer.generation > old.generation
    done = store(newer, cache, service)
    assert done is not None
    assert done.stored == 4
    assert store(old, cache, service) is None  # the caller takes the series path
    again = flat(decoder, node("node-b", t + 15_000, 30.0))
    done = store(again, cache, service)
    assert done is not None
    assert done.outcomes == {"stored": 4}
    assert utilization(service, "node-a") == {
        f"GPU-node-a-{g}": round((10 + g) / 100, 6) for g in range(4)
    }
    assert utilization(service, "node-b") == {
        f"GPU-node-b-{g}": round((30 + g) / 100, 6) for g in range(4)
    }
    assert service.store.series_count() == 8


def test_requests_stored_from_several_threads_land_on_their_own_series(service, native):
    decoder = Decoder(native=native)
    cache = LabelSetCache(LabelVerdicts(LIMITS), SeriesTranslator())
    hosts = [f"node-{i:02d}" for i in range(24)]
    t = int(time.time() * 1000) - 300_000
    rounds = [
        [encode(node(h, t + r * 15_000, 10.0 * r + i)) for i, h in enumerate(hosts)]
        for r in range(4)
    ]

    def one(body: bytes) -> int:
        got = decoder.decode_flat(body)
        if isinstance(got, FlatRequest):
            done = store(got, cache, service)
            if done is not None:
                return done.stored
        return 0

    with ThreadPoolExecutor(max_workers=4) as pool:
        stored = [sum(pool.map(one, bodies)) for bodies in rounds]
    assert stored[0] == 0  # new label sets: parsed (and remembered), not stored here
    assert stored[1:] == [4 * len(hosts)] * 3
    for i, host in enumerate(hosts):
        expected = {f"GPU-{host}-{g}": round((30.0 + i + g) / 100, 6) for g in range(4)}
        assert utilization(service, host) == expected
