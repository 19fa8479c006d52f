"""The production mapping on the column path (``ingest.prom_map_columns.PromTranslator``) stores
what ``prom_map.translate`` on the series path stores.

Two real receivers (aiohttp on loopback, real ``CollectorService``s), one given
``prom_map.translate`` (every request parsed series by series), the other ``PromTranslator``
(requests read flat go through the columns), get the same remote-write bodies: dcgm-exporter's
pages (``tests/dcgm_exposition.py``, as Prometheus scrapes them) with whole, shared
(time-sliced) and free GPUs, pods named by uid or by name, per-pod values beside the device's
(``--kubernetes-virtual-gpus``), a GPU that sends its total memory, MIG devices, vLLM series with
a newer family beside the old, histograms, unmapped and unplaceable series, NaN, stale markers,
series over the label limits, two scrapes in one request, a refused node. The answers, the
receiver's counts and every series in the store (all metrics, every slot) must match.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cramjam
import numpy as np
import numpy.typing as npt
import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.prom_columns import Samples
from gpuwarden.collector.ingest.prom_map import translate
from gpuwarden.collector.ingest.prom_map_columns import PromTranslator
from gpuwarden.collector.ingest.prom_map_sets import Part
from gpuwarden.collector.ingest.prom_write import STALE_NAN_BITS
from gpuwarden.collector.remote_write.wire import Series, encode
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import STATS
from gpuwarden.collector.web.remote_write_receiver import RW_STATE, Translator
from tests.dcgm_exposition import DcgmFleet, Pod
from tests.test_prom_map_service import scrape_series
from tests.test_remote_write_receiver import TABLE, headers

STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]


def labelled(name: str, value: float, t_ms: int, **labels: str) -> Series:
    return Series(tuple(sorted({**labels, "__name__": name}.items())), (t_ms,), (value,))


def extras(t_ms: int, r: int) -> list[Series]:
    """Series the fleet's pages do not have: MIG, per-pod values beside the device's, a total,
    model servers, histograms, and series no mapping places."""
    mig = {"Hostname": "node-c", "UUID": "GPU-node-c-0", "gpu": "0", "GPU_I_ID": "3",
           "GPU_I_PROFILE": "1g.10gb", "modelName": "A100", "instance": "c:9400"}  # fmt: skip
    shared = {"Hostname": "node-c", "UUID": "GPU-node-c-1", "gpu": "1", "instance": "c:9400"}
    pod_a = {"namespace": "ml", "pod": "p-a", "container": "c"}
    pod_b = {"namespace": "ml", "pod": "p-b", "pod_uid": "uid-b"}
    vllm = {"instance": "vllm-0:8000", "job": "vllm", "model_name": "llama"}
    return [
        labelled("DCGM_FI_DEV_FB_USED", 100.0 + r, t_ms, **mig, **pod_a),
        labelled("DCGM_FI_DEV_FB_FREE", 9000.0 - r, t_ms, **mig, **pod_a),
        labelled("DCGM_FI_DEV_GPU_UTIL", 40.0 + r, t_ms, **mig, **pod_a),
        # the MIG device's parent itself, described otherwise: the first in a request names it
        labelled(
            "DCGM_FI_DEV_GPU_TEMP",
            50.0,
            t_ms,
            Hostname="node-c",
            UUID="GPU-node-c-0",
            gpu="0",
            modelName="A100 (parent)",
        ),
        # a GPU whose description changes from round 5 (a new gpuwarden.gpu.info series)
        labelled(
            "DCGM_FI_DEV_GPU_TEMP",
            45.0,
            t_ms,
            Hostname="node-c",
            UUID="GPU-node-c-2",
            gpu="2",
            modelName="A100" if r < 5 else "A100-SXM4",
        ),
        # --kubernetes-virtual-gpus: the device's value, then each pod's
        labelled("DCGM_FI_DEV_FB_USED", 3000.0 + r, t_ms, **shared),
        labelled("DCGM_FI_DEV_FB_USED", 1000.0, t_ms, **shared, **pod_a),
        labelled("DCGM_FI_DEV_FB_USED", 2000.0 + r, t_ms, **shared, **pod_b),
        labelled("DCGM_FI_DEV_GPU_UTIL", 30.0 + r, t_ms, **shared, **pod_a),
        labelled("DCGM_FI_DEV_GPU_UTIL", 80.0, t_ms, **shared),
        labelled("DCGM_FI_DEV_FB_FREE", 70000.0, t_ms, **shared),
        labelled("DCGM_FI_DEV_FB_TOTAL", 81559.0, t_ms, **shared),
        labelled("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e6 * (r + 1), t_ms, **shared),
        labelled("vllm:num_requests_running", 3.0 + r, t_ms, **vllm),
        labelled("vllm:gpu_cache_usage_perc", 0.5, t_ms, **vllm),  # superseded by the next
        labelled("vllm:kv_cache_usage_perc", 0.25, t_ms, **vllm),
        labelled("vllm:request_success_total", 10.0 * r, t_ms, **vllm, finished_reason="stop"),
        labelled("vllm:e2e_request_latency_seconds_count", 5.0, t_ms, **vllm),  # histogram
        labelled("nv_inference_request_duration_us", 2e6 * r, t_ms, instance="triton:8002"),
        labelled("DCGM_FI_DEV_GPU_UTIL", 10.0, t_ms, UUID="GPU-no-host"),  # no node
        labelled("node_cpu_seconds_total", 5.0, t_ms, instance="n:9100"),  # unmapped
    ]


def scripted() -> DcgmFleet:
    fleet = DcgmFleet(("node-a", "node-b"), 4, pod_uid=True)
    fleet.assign("node-a", 0, Pod("trainer", "ml", uid="uid-trainer"))
    fleet.assign("node-a", 1, Pod("idle", "research"))
    fleet.assign("node-b", 0, Pod("infer-0", "serve"), Pod("infer-1", "serve"))  # time-sliced
    fleet.set("node-a", 0, {"DCGM_FI_DEV_GPU_UTIL": 90.0, "DCGM_FI_DEV_FB_USED": 40_000.0})
    fleet.set("node-b", 0, {"DCGM_FI_DEV_GPU_UTIL": 55.0, "DCGM_FI_DEV_FB_USED": 20_000.0})
    return fleet


def scrape(fleet: DcgmFleet, t_ms: int, r: int) -> list[Series]:
    fleet.set("node-a", 2, {"DCGM_FI_DEV_GPU_UTIL": float(r)})
    fleet.advance(15)
    return [*scrape_series(fleet, t_ms / 1000), *extras(t_ms, r)]


@pytest.fixture
def services(tmp_path: Path) -> Iterator[tuple[CollectorService, CollectorService]]:
    # every series keeps its recent ring: the test compares every slot of every series
    pair = (
        build_service(CollectorConfig(database=tmp_path / "a.db", recent_metrics=("*",))),
        build_service(CollectorConfig(database=tmp_path / "b.db", recent_metrics=("*",))),
    )
    yield pair
    for one in pair:
        one.storage.close()


def store_state(service: CollectorService, end_s: float) -> dict[str, object]:
    """Every series of every metric: its attributes, every slot, its newest value."""
    out: dict[str, object] = {"series": service.store.series_count()}
    for metric in sorted(service.store.metric_names()):
        found = service.store.matrix(metric, start=end_s - 900, end=end_s + 60)
        order = np.argsort([str(info) for info in found.series])
        newest = service.store.latest(metric, {}, max_age_seconds=math.inf)
        out[metric] = (
            [str(found.series[i]) for i in order],
            np.nan_to_num(found.values[order], nan=-1.0).round(9).tolist(),
            sorted(
                zip(
                    map(str, newest.series),
                    np.nan_to_num(newest.values, nan=-1.0).round(9).tolist(),
                    strict=True,
                )
            ),
        )
    totals = service.totals
    out["totals"] = (totals.accepted, totals.rejected, totals.new_series)
    return out


def with_values(series: list[Series], values: dict[int, float]) -> list[Series]:
    return [
        Series(s.labels, s.timestamps_ms, (values[i],)) if i in values else s
        for i, s in enumerate(series)
    ]


async def both(aiohttp_client, services, **config: int) -> list[Any]:
    """A receiver given ``prom_map.translate`` and one given a ``PromTranslator``."""
    translators: tuple[Translator, ...] = (translate, PromTranslator())
    return [
        await aiohttp_client(
            create_app(
                CollectorConfig(tokens=TABLE, **config),  # type: ignore[arg-type]
                service=svc,
                background=False,
                prom_translate=tr,
            )
        )
        for svc, tr in zip(services, translators, strict=True)
    ]


async def post_both(clients: list[Any], body: bytes, who: str = "prometheus") -> int:
    """Post ``body`` to both; their answers must be the same; the status."""
    answers = []
    for client in clients:
        resp = await client.post("/api/v1/write", data=body, headers=headers(who))
        answers.append((resp.status, await resp.text()))
    assert answers[0] == answers[1], who
    return int(answers[0][0])


async def test_the_column_path_stores_what_translate_stores(aiohttp_client, services):
    by_series, by_columns = services
    clients = await both(aiohttp_client, services)
    assert clients[1].server.app[RW_STATE].columns is not None
    assert clients[0].server.app[RW_STATE].columns is None
    fleet = scripted()
    t = int(time.time() * 1000) - 600_000
    rounds = [scrape(fleet, t + r * 15_000, r) for r in range(8)]
    over = dict(rounds[0][0].labels) | {"pod": "x" * 5000}
    requests: list[tuple[str, list[Series]]] = [
        ("prometheus", rounds[0]),  # new label sets: parsed series by series on both
        ("prometheus", rounds[1]),  # read flat from here on
        ("prometheus", rounds[2][:150]),  # one scrape split over requests
        ("prometheus", rounds[2][150:]),
        ("prometheus", with_values(rounds[3], {0: math.nan, 5: STALE, 40: math.inf, 41: STALE})),
        ("prometheus", [*rounds[4], Series(tuple(sorted(over.items())), (t,), (1.0,))]),
        ("prometheus", [*rounds[5], Series(tuple(sorted(over.items())), (t,), (1.0,))]),
        ("agent-a", rounds[6]),  # 403: node-b is not agent-a's
        ("prometheus", [*rounds[6], *rounds[7]]),  # two scrapes in one request
        ("prometheus", rounds[7][::-1]),  # the same again, in another order
    ]
    for who, series in requests:
        await post_both(clients, encode(series), who)
        end_s = (t + 8 * 15_000) / 1000
        assert store_state(by_series, end_s) == store_state(by_columns, end_s)
    stats = [client.server.app[STATS] for client in clients]
    assert stats[0].remote_write_samples == stats[1].remote_write_samples
    assert stats[1].remote_write_samples["stale_markers"] == 2
    assert stats[1].remote_write_samples["unmapped_series"] > 0
    assert (stats[0].points_accepted, stats[0].points_rejected) == (
        stats[1].points_accepted,
        stats[1].points_rejected,
    )
    assert stats[0].responses == stats[1].responses
    decoder = clients[1].server.app[RW_STATE].decoder
    assert decoder.flat_reads >= 7  # the columns were taken, not only the series path
    names = by_columns.store.metric_names()
    assert {"gpuwarden.gpu.info", "hw.gpu.memory.limit", "gpuwarden.gpu.process.memory.usage",
            "gpuwarden.gpu.process.utilization", "gpuwarden.model.queue.size"} <= names  # fmt: skip


def gpu_series(host: str, gpu: int, t_ms: int, value: float, **extra: str) -> Series:
    labels = {"Hostname": host, "UUID": f"GPU-{host}-{gpu}", "gpu": str(gpu), **extra}
    return labelled("DCGM_FI_DEV_GPU_UTIL", value, t_ms, **labels)


async def test_hostile_bodies_get_the_series_paths_answers(aiohttp_client, services):
    """Each body twice (the second time its label sets are known: read flat), to both."""
    clients = await both(aiohttp_client, services)
    for service in services:  # every series admitted: the order of new series is not compared
        service.max_new_series_per_source_hour = 10**9
    t = int(time.time() * 1000) - 60_000
    good = [gpu_series("node-a", g, t, 10.0 * g) for g in range(4)]
    huge = gpu_series("node-a", 5, t, 1.0, **{f"l{i:04d}": "v" for i in range(2000)})
    bodies = [
        encode(good)[:-7],  # truncated snappy
        b"definitely not snappy",
        bytes(cramjam.snappy.compress_raw(b"\xff" * 300)),
        encode([labelled("", 1.0, t, job="x")]),  # a series without a metric name
        encode([*good, huge]),
        encode([gpu_series("node-a", 0, t - 30_000, 5.0), *good]),  # out of order
        encode([gpu_series("node-b", g, t, math.inf if g else math.nan) for g in range(3)]),
        encode([gpu_series(f"n{i // 8}", i % 8, t, float(i % 100)) for i in range(5_000)]),
    ]
    statuses = [await post_both(clients, body) for body in bodies for _ in range(2)]
    assert statuses == [400] * 8 + [204] * 8
    end_s = t / 1000
    assert store_state(services[0], end_s) == store_state(services[1], end_s)
    assert services[1].store.series_count() > 5_000
    stats = [client.server.app[STATS].remote_write_samples for client in clients]
    assert stats[0] == stats[1]


class Broken(PromTranslator):
    """The production mapper with a bug in its column path."""

    def _dcgm(self, samples: Samples, dcgm: npt.NDArray[np.bool_]) -> list[Part]:
        raise KeyError("a mapping bug")


async def test_a_failing_column_mapper_is_a_400_not_a_resend_forever(
    aiohttp_client, services, caplog
):
    service = services[0]
    client = await aiohttp_client(
        create_app(
            CollectorConfig(tokens=TABLE), service=service, background=False,
            prom_translate=Broken(),
        )
    )  # fmt: skip
    body = encode([gpu_series("node-a", g, int(time.time() * 1000), 5.0) for g in range(4)])
    statuses = []
    for _ in range(2):  # the first is parsed series by series (translate), the second flat
        resp = await client.post("/api/v1/write", data=body, headers=headers())
        statuses.append(resp.status)
    assert statuses == [204, 400]
    assert "the translator failed" in caplog.text
    assert (await client.get("/healthz")).status == 200
