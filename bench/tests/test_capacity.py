"""The capacity benchmark's requests: a real agent's rounds with every point at the sentinel
time, which one ``bytes.replace`` turns into the send time, point for point; the collector's
store takes the restamped request whole. Also its percentile."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from bench import capacity
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig

NS = 1_000_000_000


def point_times(request: ExportMetricsServiceRequest) -> set[int]:
    times: set[int] = set()
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind is not None:
                    times.update(dp.time_unix_nano for dp in getattr(metric, kind).data_points)
    return times


def test_a_template_restamped_by_replace_carries_the_send_time_on_every_point(tmp_path: Path):
    (rounds,) = capacity.agent_templates([3], variants=2, spool_root=str(tmp_path))
    assert len(rounds) == 2
    for template in rounds:
        request = ExportMetricsServiceRequest.FromString(template)
        assert point_times(request) == {capacity.SENTINEL_NS}
        points = capacity.count_points(request)
        assert points > 100  # an 8-GPU node's round
        now_ns = 1_800_000_000 * NS
        stamped = ExportMetricsServiceRequest.FromString(
            template.replace(capacity.SENTINEL, now_ns.to_bytes(8, "little"))
        )
        assert point_times(stamped) == {now_ns}
        assert capacity.count_points(stamped) == points
        hosts = {
            a.value.string_value
            for rm in stamped.resource_metrics
            for a in rm.resource.attributes
            if a.key == "host.name"
        }
        assert hosts == {capacity.node_name(3)}


def test_the_collector_stores_a_restamped_round_whole(tmp_path: Path):
    (rounds,) = capacity.agent_templates([0], variants=1, spool_root=str(tmp_path / "spool"))
    service = build_service(CollectorConfig(database=tmp_path / "c.db"))
    try:
        now_ns = int(service.clock()) * NS
        payload = rounds[0].replace(capacity.SENTINEL, now_ns.to_bytes(8, "little"))
        done = service.accept_payload(payload, "application/x-protobuf", "bench", None)
        assert done.rejected == 0
        assert done.points == capacity.count_points(ExportMetricsServiceRequest.FromString(payload))
        assert capacity.node_name(0) in service.nodes
    finally:
        service.storage.close()


def test_percentile_is_the_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert capacity.percentile(values, 0.5) == 50.0
    assert capacity.percentile(values, 0.99) == 99.0
    assert capacity.percentile([3.0], 0.99) == 3.0
