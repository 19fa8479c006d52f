"""Ingest limits, each on its own: label limits and node names (rejected points counted in the
OTLP partial success, the rest stored), points per request, whole multi-member gzip, and a
series budget that refills and never refuses a node's known series."""

from __future__ import annotations

import gzip
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.credentials import TokenTable, parse_tokens
from gpuwarden.collector.ingest.otlp import flatten, histogram_points
from gpuwarden.collector.ingest.otlp_columns import number_columns
from gpuwarden.collector.ingest.otlp_limits import IngestLimits, valid_node_name
from gpuwarden.collector.ingest.otlp_transport import PROTOBUF, OtlpError, decompress
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.keys import STATS


def agent_tokens() -> TokenTable:
    """:data:`TOKENS` as agent credentials that may write any node (the limits are the subject
    here; tests/test_bound_identity.py binds them)."""
    return parse_tokens(
        "".join(f"agent {name} {token} nodes=*\n" for token, name in TOKENS.items()), "tokens"
    )


TOKENS = {"token-of-agent-a-0123456789": "a"}
HEADERS = {"Content-Type": PROTOBUF, "Authorization": "Bearer token-of-agent-a-0123456789"}
LIMITS = IngestLimits(
    max_attributes=4,
    max_label_key_bytes=12,
    max_label_value_bytes=16,
    max_metric_name_bytes=12,
    max_points_per_request=50,
)


def point_request(
    points: list[dict[str, str]],
    *,
    host: str = "node-1",
    metric: str = "util",
    resource: dict[str, str] | None = None,
) -> ExportMetricsServiceRequest:
    """One gauge with a point per attribute dict (values 1.0, times now)."""
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    for key, value in {"host.name": host, **(resource or {})}.items():
        rm.resource.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    m = rm.scope_metrics.add().metrics.add()
    m.name = metric
    now = time.time_ns()
    for attrs in points:
        dp = m.gauge.data_points.add()
        dp.as_double = 1.0
        dp.time_unix_nano = now
        for key, value in attrs.items():
            dp.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    return req


# --- label limits and node names: the two decoders agree ---------------------------------

CASES = [
    # (points, request options, points rejected over the limits)
    ([{"gpu": "0"}, {"gpu": "1"}], {}, 0),
    ([{"gpu": "0"}, {f"k{i}": "v" for i in range(5)}], {}, 1),  # 5 attributes > 4
    ([{"gpu": "0"}, {"much-too-long-key": "v"}], {}, 1),
    ([{"gpu": "0"}, {"gpu": "v" * 17}], {}, 1),
    ([{"gpu": "0"}, {"gpu": "é" * 9}], {}, 1),  # 9 characters, 18 UTF-8 bytes
    ([{"gpu": "é" * 8}], {}, 0),  # 16 bytes: at the limit
    ([{"gpu": "0"}, {"gpu": "1"}], {"metric": "m" * 13}, 2),
    ([{"gpu": "0"}, {"gpu": "1"}], {"host": "node/../x"}, 2),
    ([{"gpu": "0"}], {"host": "node\x1b[2J"}, 1),
    ([{"gpu": "0"}], {"host": "n" * 254}, 1),
    ([{"gpu": "0"}], {"host": ""}, 1),
    ([{"gpu": "0"}, {"host.name": "node/b"}, {"host.name": "node-b"}], {}, 1),  # point's own
    ([{"gpu": "0"}], {"resource": {f"r{i}": "v" for i in range(4)}}, 1),  # 5 with host.name
    ([{"gpu": "0"}], {"resource": {"service.name": "v" * 17}}, 1),
]


@pytest.mark.parametrize(("points", "options", "over"), CASES)
def test_points_over_the_label_limits_are_rejected_alone(points, options, over):
    request = point_request(points, **options)
    columns = number_columns(request, LIMITS)
    flat = flatten(request, LIMITS)
    assert (columns.rejected, columns.over_limits) == (over, over)
    assert (flat.rejected, flat.over_limits) == (over, over)
    assert columns.points == len(flat.points) == len(points) - over


def test_histograms_over_the_limits_stay_rejected():
    req = point_request([], host="bad/node")
    m = req.resource_metrics[0].scope_metrics[0].metrics.add()
    m.name = "lat"
    m.histogram.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
    dp = m.histogram.data_points.add(time_unix_nano=1, explicit_bounds=[1.0], bucket_counts=[1, 2])
    dp.sum = 3.0
    assert histogram_points(req, LIMITS) == []
    assert len(histogram_points(point_request([], host="node-1"), LIMITS)) == 0
    req.resource_metrics[0].resource.attributes[0].value.string_value = "node-1"
    assert len(histogram_points(req, LIMITS)) == 1


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("gpu-node-01.cluster_a", True),
        ("n" * 253, True),
        ("n" * 254, False),
        ("node/a", False),
        ("node a", False),
        ("node\n", False),
        ("<!channel>", False),
        ("", False),
        (3, False),
    ],
)
def test_node_names(name, valid):
    assert valid_node_name(name) is valid


# --- through the receiver: partial success, and the rest stored ---------------------------


@pytest.fixture
def service(tmp_path: Path) -> CollectorService:
    return build_service(CollectorConfig(database=tmp_path / "c.db"))


@pytest.fixture
async def client(aiohttp_client, service):
    config = CollectorConfig(
        tokens=agent_tokens(),
        max_attributes=4,
        max_label_key_bytes=12,
        max_label_value_bytes=16,
        max_metric_name_bytes=12,
        max_points_per_request=50,
    )
    service.limits = config.ingest_limits
    yield await aiohttp_client(create_app(config, service=service, background=False))
    service.storage.close()


async def test_the_receiver_counts_points_over_the_limits_and_stores_the_rest(client, service):
    body = point_request([{"gpu": "0"}, {"gpu": "x" * 1000}, {"gpu": "1"}]).SerializeToString()
    resp = await client.post("/v1/metrics", data=body, headers=HEADERS)
    assert resp.status == 200
    answer = ExportMetricsServiceResponse.FromString(await resp.read()).partial_success
    assert answer.rejected_data_points == 1
    assert "1 points over the label limits (at most 4 attributes" in answer.error_message
    assert service.store.series_count() == 2
    assert client.server.app[STATS].points_over_limits == 1


async def test_a_node_name_with_a_slash_never_reaches_the_store(client, service):
    body = point_request([{"gpu": "0"}], host="node-a/../../etc").SerializeToString()
    resp = await client.post("/v1/metrics", data=body, headers=HEADERS)
    assert resp.status == 200
    answer = ExportMetricsServiceResponse.FromString(await resp.read()).partial_success
    assert answer.rejected_data_points == 1
    assert service.store.series_count() == 0
    assert service.nodes == {}


async def test_too_many_points_in_one_request_is_413(client, service):
    body = point_request([{"gpu": str(i)} for i in range(51)]).SerializeToString()
    resp = await client.post("/v1/metrics", data=body, headers=HEADERS)
    assert resp.status == 413
    assert service.store.series_count() == 0


# --- gzip: every member, or 400 -----------------------------------------------------------


def test_every_gzip_member_is_read():
    assert decompress(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 100) == b"abcd"


def test_members_share_one_size_cap():
    body = gzip.compress(b"\0" * 60) + gzip.compress(b"\0" * 60)
    with pytest.raises(OtlpError) as err:
        decompress(body, "gzip", 100)
    assert err.value.status == 413


@pytest.mark.parametrize(
    "tail", [b"garbage", gzip.compress(b"cd")[:-3]], ids=["garbage", "cut member"]
)
def test_anything_after_a_member_that_is_not_a_whole_member_is_400(tail):
    with pytest.raises(OtlpError) as err:
        decompress(gzip.compress(b"ab") + tail, "gzip", 100)
    assert err.value.status == 400


async def test_a_two_member_body_stores_both_members(client, service):
    first = point_request([{"gpu": "0"}]).SerializeToString()
    second = point_request([{"gpu": "1"}], host="node-2").SerializeToString()
    body = gzip.compress(first) + gzip.compress(second)
    resp = await client.post(
        "/v1/metrics", data=body, headers={**HEADERS, "Content-Encoding": "gzip"}
    )
    assert resp.status == 200
    assert service.store.series_count() == 2
    assert set(service.nodes) == {"node-1", "node-2"}


# --- the series budget --------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def payload(n: int, host: str, offset: int = 0) -> bytes:
    return point_request(
        [{"gpu": str(i + offset)} for i in range(n)], host=host
    ).SerializeToString()


def test_a_spent_budget_refills_and_never_refuses_known_series(tmp_path):
    clock = Clock()
    service = build_service(
        CollectorConfig(database=tmp_path / "c.db", max_new_series_per_source_hour=3600),
        clock=clock,
    )
    service.intake.clock = clock
    # the node's own series, then a flood with the same token spends the budget
    assert service.accept_payload(payload(10, "node-1"), PROTOBUF, "a").rejected == 0
    flood = service.accept_payload(payload(5000, "node-1", offset=100), PROTOBUF, "a")
    assert flood.rejected == 5000 - 3590
    # the node's known series are still taken; a new one is refused
    assert service.accept_payload(payload(10, "node-1"), PROTOBUF, "a").rejected == 0
    assert service.accept_payload(payload(11, "node-1"), PROTOBUF, "a").rejected == 1
    # one series per second comes back (3600 an hour): 10 s later, ten new series fit
    clock.now += 10
    assert service.accept_payload(payload(20, "node-1", offset=50), PROTOBUF, "a").rejected == 10
    service.storage.close()


def test_a_node_series_that_was_evicted_is_known_when_it_comes_back(tmp_path):
    clock = Clock()
    service = build_service(
        CollectorConfig(database=tmp_path / "c.db", max_new_series_per_source_hour=10),
        clock=clock,
    )
    service.intake.clock = clock
    assert service.accept_payload(payload(10, "node-1"), PROTOBUF, "a").rejected == 0
    clock.now += 7 * 3600  # silent beyond the recent window: its series are evicted
    service.store.evict_stale(clock.now)
    assert service.store.series_count() == 0
    flood = service.accept_payload(payload(100, "other", offset=500), PROTOBUF, "a")
    assert flood.rejected == 90  # the budget, refilled after 7 h, is spent again
    back = service.accept_payload(payload(10, "node-1"), PROTOBUF, "a")
    assert back.rejected == 0
    assert service.store.series_count() == 20
    service.storage.close()


def test_concurrent_requests_of_one_sender_share_one_budget(tmp_path):
    service = build_service(
        CollectorConfig(database=tmp_path / "c.db", max_new_series_per_source_hour=1000)
    )
    bodies = [payload(1000, "node-1", offset=1000 * i) for i in range(4)]
    start = threading.Barrier(4)

    def send(body: bytes) -> int:
        start.wait()
        return service.accept_payload(body, PROTOBUF, "a").rejected

    with ThreadPoolExecutor(4) as pool:
        rejected = list(pool.map(send, bodies))
    assert sum(rejected) == 3000
    assert service.store.series_count() == 1000
    service.storage.close()
