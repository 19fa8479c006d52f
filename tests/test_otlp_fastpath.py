"""The receiver's fast path stores exactly what the NumberPoint path stores, and counts the same.

Two collectors get the same requests: one through ``number_points`` + ``CollectorService.accept``
+ ``accept_histograms`` (the handler's generic path), one through
``CollectorService.accept_payload`` (columns, and request shapes read without parsing). Their
answers, totals, node facts, jobs and every series' matrices, latest values and increases must be
identical, for well-formed and hostile requests alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AGGREGATION_TEMPORALITY_CUMULATIVE as CUMULATIVE,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AGGREGATION_TEMPORALITY_DELTA as DELTA,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint

from gpuwarden.collector.ingest.otlp import number_points
from gpuwarden.collector.ingest.otlp_columns import number_columns
from gpuwarden.collector.ingest.otlp_shape import RequestShape, shape_key
from gpuwarden.collector.ingest.otlp_transport import JSON, PROTOBUF, OtlpError, parse_request
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.service import Accepted, CollectorService
from gpuwarden.collector.storage.sqlite import MEMORY, SqliteStorage
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.web.receiver import _accept_parsed

NS = 1_000_000_000
T0 = 1_000_000_000  # a multiple of every step
CLOCK = float(T0 + 100)
Attr = tuple[str, object]


def make_service(max_series: int = 12, budget: int = 8) -> CollectorService:
    storage = SqliteStorage(MEMORY, clock=lambda: CLOCK)
    store = WindowStore(
        step_seconds=10,
        recent_seconds=60,
        long_step_seconds=20,
        long_seconds=120,
        max_series=max_series,
        max_future_seconds=300,
        initial_capacity=2,
        staleness_seconds=1e6,  # the points span minutes around CLOCK: compare values, not ages
        clock=lambda: CLOCK,
    )
    service = CollectorService(
        store=store, storage=storage, registry=JobRegistry(storage, []), clock=lambda: CLOCK
    )
    service.max_new_series_per_source_hour = budget
    return service


def via_points(service: CollectorService, payload: bytes, kind: str, source: str) -> Accepted:
    """The handler's generic path (any sink)."""
    return _accept_parsed(service, parse_request(payload, kind), source)


def via_payload(service: CollectorService, payload: bytes, kind: str, source: str) -> Accepted:
    """The handler's fast path."""
    return service.accept_payload(payload, kind, source)


# --- requests -------------------------------------------------------------------------------


def any_value(value: object) -> AnyValue:
    if value is None:
        return AnyValue()
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=str(value))


def add_attrs(target: object, attrs: list[Attr]) -> None:
    for key, value in attrs:
        target.attributes.append(KeyValue(key=key, value=any_value(value)))  # type: ignore[attr-defined]


@dataclass(frozen=True)
class PointSpec:
    attrs: list[Attr]
    value: float | int | None
    dt: float  # seconds after the round's time


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str
    kind: str  # gauge, sum, counter (monotonic sum), histogram, delta-histogram, summary, none
    points: list[PointSpec]


@dataclass(frozen=True)
class ResourceSpec:
    attrs: list[Attr]
    metrics: list[MetricSpec]


def build(resources: list[ResourceSpec], round_index: int, value_shift: float = 0.0) -> bytes:
    """One request; ``round_index`` moves every time by 10 s, ``value_shift`` adds to values."""
    req = ExportMetricsServiceRequest()
    base_ns = T0 * NS + round_index * 10 * NS
    for res in resources:
        rm = req.resource_metrics.add()
        add_attrs(rm.resource, res.attrs)
        sm = rm.scope_metrics.add()
        for spec in res.metrics:
            metric = sm.metrics.add()
            metric.name = spec.name
            metric.unit = spec.unit
            add_points(metric, spec, base_ns, value_shift)
    return req.SerializeToString()


def add_points(metric: Metric, spec: MetricSpec, base_ns: int, shift: float) -> None:
    whole = int(shift) if math.isfinite(shift) else 0  # for counts and as_int values
    if spec.kind == "none":
        return
    if spec.kind in ("histogram", "delta-histogram"):
        metric.histogram.aggregation_temporality = CUMULATIVE if spec.kind == "histogram" else DELTA
        for p in spec.points:
            hdp = metric.histogram.data_points.add()
            hdp.time_unix_nano = max(0, base_ns + round(p.dt * NS))
            hdp.explicit_bounds.extend([1.0, 2.0])
            count = abs(whole) + 1
            hdp.bucket_counts.extend([count, 2 * count, 0])
            hdp.count = 3 * count
            hdp.sum = 4.0 * count
            add_attrs(hdp, p.attrs)
        return
    if spec.kind == "summary":
        for _ in spec.points:
            metric.summary.data_points.add().count = 1
        return
    if spec.kind == "gauge":
        dps = metric.gauge.data_points
    else:
        metric.sum.aggregation_temporality = CUMULATIVE
        metric.sum.is_monotonic = spec.kind == "counter"
        dps = metric.sum.data_points
    for p in spec.points:
        dp: NumberDataPoint = dps.add()
        dp.time_unix_nano = max(0, base_ns + round(p.dt * NS))
        if spec.kind != "gauge":
            dp.start_time_unix_nano = T0 * NS - 3600 * NS
        if isinstance(p.value, int) and not isinstance(p.value, bool):
            dp.as_int = p.value + whole
        elif isinstance(p.value, float):
            dp.as_double = p.value + shift if math.isfinite(p.value) else p.value
        add_attrs(dp, p.attrs)


KEYS = ["gpu", "hw.id", "host.name", "hw.type"]
ATTR_VALUES = st.one_of(
    st.sampled_from(["0", "1", "", "GPU-a"]),
    st.integers(0, 2),
    st.booleans(),
    st.sampled_from([0.5, 1.0]),
    st.none(),  # a key without a value
)
VALUES = st.one_of(
    st.floats(0, 1e6, allow_nan=False, width=64),
    st.integers(0, 10**6),
    st.sampled_from([math.nan, math.inf, -math.inf, None, 1e300, -5.0]),
)
DTS = st.sampled_from([0.0, 0.5, 3.0, 9.9, -30.0, -200.0, 150.0, 400.0, -1e9])
points_st = st.builds(
    PointSpec, st.lists(st.tuples(st.sampled_from(KEYS), ATTR_VALUES), max_size=3), VALUES, DTS
)
metrics_st = st.builds(
    MetricSpec,
    st.sampled_from(["g", "c", "s", "h"]),
    st.sampled_from(["1", "J"]),
    st.sampled_from(
        [
            *("gauge", "gauge", "sum", "counter", "counter"),
            *("histogram", "delta-histogram", "summary", "none"),
        ]
    ),
    st.lists(points_st, max_size=4),
)
resource_attrs_st = st.lists(
    st.tuples(
        st.sampled_from(["host.name", "service.name", "gpuwarden.price_tier", "gpuwarden.job.id"]),
        st.sampled_from(["node-1", "node-2", "j7", 3, ""]),
    ),
    max_size=3,
)
resources_st = st.lists(
    st.builds(ResourceSpec, resource_attrs_st, st.lists(metrics_st, min_size=1, max_size=3)),
    min_size=1,
    max_size=2,
)
# What agents send: a host, gauges and sums only, current times; these get request shapes.
steady_points_st = st.builds(
    PointSpec,
    st.lists(st.tuples(st.sampled_from(KEYS), ATTR_VALUES), max_size=2),
    st.one_of(st.floats(0, 1e6, allow_nan=False), st.integers(0, 10**6)),
    st.sampled_from([0.0, 0.5, 3.0, 9.9]),
)
steady_st = st.lists(
    st.builds(
        ResourceSpec,
        st.just([("host.name", "node-1"), ("service.name", "agent")]),
        st.lists(
            st.builds(
                MetricSpec,
                st.sampled_from(["g", "c", "s"]),
                st.just("1"),
                st.sampled_from(["gauge", "sum", "counter", "none"]),
                st.lists(steady_points_st, max_size=3),
            ),
            min_size=1,
            max_size=2,
        ),
    ),
    min_size=1,
    max_size=2,
)


# --- comparing collectors -------------------------------------------------------------------


def snapshot(service: CollectorService) -> dict[str, object]:
    """Everything observable about a collector's ingest, as plain comparable values."""
    store = service.store
    out: dict[str, object] = {
        "series": store.series_count(),
        "totals": service.totals,
        "nodes": service.nodes,
        "jobs": sorted(job.key for job in service.registry.known()),
    }
    start, end = T0 - 1000, T0 + 1000
    for metric in sorted(store.metric_names()):
        recent = store.matrix(metric, start=start, end=end)
        long = store.matrix(metric, start=start, end=end, resolution="long")
        latest = store.latest(metric)
        increases = store.increase_matrix(metric, start=start, end=end)
        out[metric] = (
            [(s.key, s.unit, s.kind) for s in recent.series],
            plain(recent.values),
            plain(long.values),
            plain(latest.times),
            plain(latest.values),
            [s.key for s in increases.series],
            plain(increases.values),
        )
        for info in recent.series:
            if info.kind.value == "counter":
                try:
                    out[f"{info.key}/increase"] = store.increase(info.key, T0 - 50, T0 + 100)
                except ValueError as exc:  # the window moved past the range
                    out[f"{info.key}/increase"] = str(exc)
    return out


def plain(values: np.ndarray) -> tuple[object, ...]:
    """Shape and values, NaN (whatever its bits) as None."""
    return (values.shape, *[None if math.isnan(v) else v for v in values.ravel().tolist()])


def assert_same(a: CollectorService, b: CollectorService) -> None:
    left, right = snapshot(a), snapshot(b)
    assert left.keys() == right.keys()
    for key, value in left.items():
        assert value == right[key], key


def run_both(
    payloads: list[bytes], kind: str = PROTOBUF, sources: list[str] | None = None
) -> tuple[CollectorService, CollectorService, list[Accepted]]:
    slow, fast = make_service(), make_service()
    answers = []
    for i, payload in enumerate(payloads):
        source = sources[i] if sources else "agents"
        outcomes = []
        for service, path in ((slow, via_points), (fast, via_payload)):
            try:
                outcomes.append(path(service, payload, kind, source))
            except OtlpError as exc:
                outcomes.append(Accepted(-exc.status, 0, 0))
        assert outcomes[0] == outcomes[1], i
        answers.append(outcomes[1])
        assert_same(slow, fast)
    for service in (slow, fast):
        service.storage.close()
    return slow, fast, answers


# --- property tests -------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resources_st)
def test_number_columns_flatten_like_number_points(resources: list[ResourceSpec]) -> None:
    request = parse_request(build(resources, 0), PROTOBUF)
    points, rejected = number_points(request)
    columns = number_columns(request)
    assert (columns.points, columns.rejected) == (len(points), rejected)
    assert columns.histograms == any(
        m.kind in ("histogram", "delta-histogram") for r in resources for m in r.metrics
    )
    flat = [
        (columns.resources[m.resource], m.name, m.unit, m.counter, items, t, v)
        for m in columns.metrics
        for items, t, v in zip(m.items, m.times, m.values, strict=True)
    ]
    assert len(flat) == len(points)
    for p, (resource, name, unit, counter, items, t, v) in zip(points, flat, strict=True):
        assert (p.resource, p.metric, p.unit, p.time_unix_nano, p.value) == (
            resource,
            name,
            unit,
            t,
            v,
        )
        assert (p.kind == "sum" and p.monotonic) == counter
        assert p.attributes == {k: value for k, value in items if value is not None}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(resources_st, steady_st),
    st.lists(
        st.sampled_from([0.0, 7.0, 7.0, 250.0, 250.0, -1000.0, math.nan]), min_size=3, max_size=6
    ),
    st.data(),
)
def test_fast_path_stores_and_counts_exactly_like_number_points(
    resources: list[ResourceSpec], shifts: list[float], data: st.DataObject
) -> None:
    # The same structure round after round (so request shapes are built and used), values
    # moved (a NaN shift makes every double point non-finite), and now and then a new layout.
    payloads = []
    for i, shift in enumerate(shifts):
        if i and data.draw(st.integers(0, 4)) == 0:
            resources = data.draw(st.one_of(resources_st, steady_st))
        payloads.append(build(resources, i, shift))
    run_both(payloads)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resources_st, st.data())
def test_fast_path_matches_on_json_and_corrupted_bodies(
    resources: list[ResourceSpec], data: st.DataObject
) -> None:
    payload = build(resources, 0)
    as_json = json_format.MessageToJson(parse_request(payload, PROTOBUF)).encode()
    run_both([as_json], kind=JSON)
    cut = data.draw(st.integers(0, len(payload)))
    flip = data.draw(st.integers(0, max(0, len(payload) - 1)))
    corrupted = bytearray(payload)
    if corrupted:
        corrupted[flip] ^= data.draw(st.integers(1, 255))
    run_both([payload, payload[:cut], bytes(corrupted), payload])


# --- the shape cache ------------------------------------------------------------------------


def agent(host: str, gpus: int = 3, extra: bool = False) -> list[ResourceSpec]:
    points = [
        PointSpec([("hw.id", f"GPU-{g}"), ("hw.type", "gpu")], 100.0 + g, 0.0) for g in range(gpus)
    ]
    counters = [PointSpec([("hw.id", f"GPU-{g}")], 1000 * (g + 1), 0.0) for g in range(gpus)]
    metrics = [
        MetricSpec("hw.gpu.utilization", "1", "gauge", points),
        MetricSpec("hw.energy", "J", "counter", counters),
    ]
    if extra:
        metrics.append(MetricSpec("hw.errors", "1", "counter", [PointSpec([], 0, 0.0)]))
    return [ResourceSpec([("host.name", host), ("service.name", "agent")], metrics)]


def rounds(spec: Callable[[int], list[ResourceSpec]], n: int) -> Iterator[bytes]:
    for i in range(n):
        yield build(spec(i), i, value_shift=7.5 * i)


def test_an_agents_steady_requests_are_read_through_its_shape():
    payloads = list(rounds(lambda _: agent("node-1"), 6))
    _, fast, answers = run_both(payloads)
    assert fast.store.shape_hits == 5  # the first is parsed and leaves its shape
    assert [a.points for a in answers] == [6] * 6
    key = ("hw.energy", (("host.name", "node-1"), ("hw.id", "GPU-1")))
    increase = fast.store.increase(key, T0, T0 + 60)
    assert increase == int(7.5 * 5)  # as_int values moved by int(7.5 * round)


def test_a_new_series_rebuilds_the_shape_at_once():
    payloads = list(rounds(lambda i: agent("node-1", extra=i >= 3), 6))
    _, fast, _ = run_both(payloads)
    assert fast.store.shape_hits == 4  # rounds 1, 2, 4, 5; round 3's new layout is shaped at once


def test_shape_hits_count_non_finite_and_future_points_like_the_parser():
    def spec(i: int) -> list[ResourceSpec]:
        resources = agent("node-1")
        if i == 3:  # a NaN utilisation and a point far in the future, same layout
            points = resources[0].metrics[0].points
            points[0] = PointSpec(points[0].attrs, math.nan, 0.0)
            points[1] = PointSpec(points[1].attrs, 5.0, 5000.0)
        return resources

    _, fast, answers = run_both(list(rounds(spec, 5)))
    assert fast.store.shape_hits == 4
    assert answers[3].rejected == 2


def test_two_senders_with_the_same_resource_and_size_never_share_rows():
    # Same resource bytes and request size, different GPU ids: the shape must not match.
    one = list(rounds(lambda _: agent("node-1"), 3))
    other = build(
        [
            ResourceSpec(
                agent("node-1")[0].attrs,
                [
                    MetricSpec(
                        m.name,
                        m.unit,
                        m.kind,
                        [
                            PointSpec([("hw.id", f"GPU-{9 - g}"), *p.attrs[1:]], p.value, 0.0)
                            for g, p in enumerate(m.points)
                        ],
                    )
                    for m in agent("node-1")[0].metrics
                ],
            )
        ],
        3,
    )
    assert len(other) == len(one[-1])
    assert shape_key(other) == shape_key(one[-1])
    _, fast, _ = run_both([*one, other], sources=["a", "a", "a", "b"])
    assert fast.store.series_count() == 12


def test_evicted_series_drop_the_shapes_that_point_at_them():
    slow, fast = make_service(budget=100), make_service(budget=100)
    for payload in rounds(lambda _: agent("node-1"), 3):
        assert via_points(slow, payload, PROTOBUF, "a") == via_payload(fast, payload, PROTOBUF, "a")
    for service in (slow, fast):
        assert service.store.evict_stale(now=T0 + 10_000) == 6
    late = build(agent("node-1"), 40)  # same shape, but its rows were freed
    assert via_points(slow, late, PROTOBUF, "a") == via_payload(fast, late, PROTOBUF, "a")
    assert fast.store.shape_hits == 2  # rounds 1 and 2, not the late one
    assert fast.store.series_count() == 6
    assert_same(slow, fast)


def ld(field: int, body: bytes) -> bytes:
    """A length-delimited protobuf field (lengths below 2**14)."""
    size = len(body)
    length = bytes([size]) if size < 0x80 else bytes([size & 0x7F | 0x80, size >> 7])
    return bytes([field << 3 | 2]) + length + body


def test_a_non_canonical_body_is_parsed_every_time():
    request = parse_request(build(agent("node-1"), 0), PROTOBUF)
    rm = request.resource_metrics[0]
    metrics = b"".join(
        ld(2, b"\x0a\x01x" + m.SerializeToString())  # the name twice: the last one counts
        for m in rm.scope_metrics[0].metrics
    )
    payload = ld(1, ld(1, rm.resource.SerializeToString()) + ld(2, metrics))
    assert parse_request(payload, PROTOBUF) == request
    assert shape_key(payload) is not None
    assert RequestShape.of(payload, request) is None
    _, fast, _ = run_both([payload] * 4)
    assert fast.store.shape_hits == 0


def test_histograms_keep_the_parsed_path_and_their_counts():
    def spec(i: int) -> list[ResourceSpec]:
        resources = agent("node-1")
        resources[0].metrics.append(
            MetricSpec("latency", "s", "histogram", [PointSpec([("route", "/")], None, 0.0)])
        )
        return resources

    _, fast, answers = run_both(list(rounds(spec, 4)))
    assert fast.store.shape_hits == 0
    assert [a.rejected for a in answers] == [0] * 4
    assert fast.store.series_count() == 7


@pytest.mark.parametrize("body", [b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x05\x0a\x03\x0a"])
def test_malformed_bodies_raise_400_and_change_nothing(body: bytes):
    service = make_service()
    with pytest.raises(OtlpError) as caught:
        service.accept_payload(body, PROTOBUF, "a")
    assert caught.value.status == 400
    assert service.store.series_count() == 0
    assert service.totals.accepted == 0


def test_the_new_series_budget_is_kept_per_source():
    many = [
        ResourceSpec(
            [("host.name", "n")],
            [MetricSpec("g", "1", "gauge", [PointSpec([("i", i)], 1.0, 0.0) for i in range(11)])],
        )
    ]
    payload = build(many, 0)
    _, fast, answers = run_both([payload, payload, build(many, 1)], sources=["a", "a", "b"])
    assert [a.rejected for a in answers] == [3, 3, 0]  # budget 8 for a; b fills up to 12 series
    assert fast.store.series_count() == 11
    assert np.isfinite(fast.store.latest("g").values).sum() == 11
