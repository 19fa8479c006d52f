"""The agent's directly encoded OTLP request is, point for point, what the OTel SDK path sends.

The reference is the SDK path the agent used before: a ``MeterProvider`` with an
``InMemoryMetricReader`` whose observable instruments (``register_instruments``) read the same
cache, encoded by the OTLP exporter's ``encode_metrics``. Both get the same snapshots: a
hand-built one with every field and shape of the catalog, and rounds of the real pynvml on the
fake NVML with processes coming and going.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from gpuwarden.agent.attribution import Attributor
from gpuwarden.agent.catalog import rows_by_name
from gpuwarden.agent.model import (
    AgentStats,
    GpuSample,
    GpuStatus,
    HostSample,
    JobRef,
    ProcessSample,
    Snapshot,
)
from gpuwarden.agent.otlp import OtlpEncoder
from gpuwarden.agent.sources.nvml import NvmlSource
from gpuwarden.agent.telemetry import (
    METER_NAME,
    SampleCache,
    Telemetry,
    register_instruments,
    sdk_resource,
)
from tests.fakenvml.control import FakeNvml, FakeProcess

RESOURCE = {"service.name": "gpuwarden-agent", "host.name": "node-1", "cloud.region": "eu"}
VERSION = "9.9.9"
T0 = 1_700_000_000_000_000_000
STEP = 10_000_000_000


class SdkPath:
    """The OTel SDK's collect + encode path over a cache, as the agent pushed before."""

    def __init__(self, cache: SampleCache) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(
            metric_readers=[self.reader],
            resource=sdk_resource(RESOURCE),
            exemplar_filter=AlwaysOffExemplarFilter(),
        )
        register_instruments(self.provider.get_meter(METER_NAME, VERSION), cache)

    def request(self) -> ExportMetricsServiceRequest:
        data = self.reader.get_metrics_data()
        assert data is not None
        return encode_metrics(data)


def rich_snapshot(time_unix_nano: int = T0) -> Snapshot:
    """Every scope and shape of the catalog: info, scalars, mappings, one-hot, bitmask."""
    slurm = JobRef(scheduler="slurm", job_id="4242")
    pod = JobRef(
        scheduler="kubernetes",
        pod_uid="0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
        container_id="ab" * 32,
    )
    full = GpuSample(
        uuid="GPU-0",
        index=0,
        name="NVIDIA H100 80GB HBM3",
        pci_bus_id="00000000:17:00.0",
        utilization_ratio=0.5,
        memory_utilization_ratio=0.25,
        memory_used_bytes=40 << 30,
        memory_total_bytes=80 << 30,
        memory_reserved_bytes=512 << 20,
        power_watts=350.5,
        power_instant_watts=401.0,
        energy_joules=123456.789,
        temperature_celsius=61.0,
        memory_temperature_celsius=70.0,
        sm_clock_hertz=1.98e9,
        memory_clock_hertz=2.6e9,
        clock_event_reasons=0x1 | 0x40,
        pcie_tx_bytes_per_second=1e9,
        pcie_rx_bytes_per_second=2e9,
        pcie_link_generation=5,
        pcie_link_width=16,
        nvlink_tx_bytes=10**12,
        nvlink_rx_bytes=2 * 10**12,
        ecc_corrected_errors=3,
        ecc_uncorrected_errors=0,
        remapped_rows_corrected=1,
        remapped_rows_uncorrected=0,
        remapped_rows_pending=0,
        remapped_rows_failure=0,
        xid_counts={79: 1, 31: 2},
        last_xid=31,
        status=GpuStatus.DEGRADED,
        processes=(
            ProcessSample(101, 4 << 30, 0.4, 0.2, job=slurm),
            ProcessSample(102, 1 << 30, 0.0, 0.0, job=pod),
            ProcessSample(103, None, None, None),
        ),
    )
    mig = GpuSample(
        uuid="MIG-1",
        index=1,
        name="NVIDIA A100 MIG 1g.10gb",
        parent_uuid="GPU-1",
        mig_profile="1g.10gb",
        memory_used_bytes=1 << 30,
        status=GpuStatus.FAILED,
    )
    host = HostSample(
        cpu_time_seconds={"user": 100.5, "system": 20.25, "idle": 1000.0},
        cpu_count=64,
        memory_bytes={"used": 1 << 34, "free": 1 << 33, "cached": 1 << 32, "buffers": 1 << 20},
        memory_limit_bytes=1 << 36,
        disk_io_bytes={("nvme0n1", "read"): 4096, ("nvme0n1", "write"): 8192},
        network_io_bytes={("eth0", "receive"): 1, ("eth0", "transmit"): 2},
        cpu_energy_joules={"package-0": 55.5},
    )
    stats = AgentStats(sample_rounds=7, last_sample_seconds=0.002, spool_bytes=1024)
    return Snapshot(time_unix_nano, (full, mig), host, (), stats)


def masked(
    request: ExportMetricsServiceRequest, time_unix_nano: int | None
) -> ExportMetricsServiceRequest:
    """The request with its point times cleared, after checking them.

    Every point has a time (``time_unix_nano`` when given), sums a start time no later than
    it, gauges none.
    """
    for resource_metrics in request.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                is_sum = metric.WhichOneof("data") == "sum"
                data = metric.sum if is_sum else metric.gauge
                for point in data.data_points:
                    assert point.time_unix_nano > 0
                    if time_unix_nano is not None:
                        assert point.time_unix_nano == time_unix_nano
                    if is_sum:
                        assert 0 < point.start_time_unix_nano <= point.time_unix_nano
                    else:
                        assert point.start_time_unix_nano == 0
                    point.ClearField("time_unix_nano")
                    point.ClearField("start_time_unix_nano")
    return request


def ours(encoder: OtlpEncoder, snapshot: Snapshot) -> ExportMetricsServiceRequest:
    """Our request, checked to be canonical (what protobuf itself would serialise)."""
    payload = encoder.encode(snapshot)
    assert payload is not None
    request = ExportMetricsServiceRequest.FromString(payload)
    assert request.SerializeToString() == payload
    return request


def point_sets(request: ExportMetricsServiceRequest) -> dict[tuple[object, ...], list[Any]]:
    """Each metric's description, unit, type, temporality and monotonicity, and its points
    as a sorted list of (attributes, value, time), whatever their order in the request."""
    out: dict[tuple[object, ...], list[Any]] = {}
    (resource_metrics,) = request.resource_metrics
    (scope_metrics,) = resource_metrics.scope_metrics
    for metric in scope_metrics.metrics:
        kind = metric.WhichOneof("data")
        data = metric.sum if kind == "sum" else metric.gauge
        temporality = metric.sum.aggregation_temporality if kind == "sum" else None
        monotonic = metric.sum.is_monotonic if kind == "sum" else None
        key = (metric.name, metric.description, metric.unit, kind, temporality, monotonic)
        assert key not in out
        out[key] = sorted(
            (
                tuple((a.key, a.value.SerializeToString()) for a in point.attributes),
                point.WhichOneof("value"),
                point.as_double,
                point.time_unix_nano,
            )
            for point in data.data_points
        )
    return out


def test_one_round_is_the_sdk_request_byte_for_byte_but_the_times() -> None:
    snapshot = rich_snapshot()
    cache = SampleCache()
    cache.put(snapshot)
    sdk = SdkPath(cache)
    encoder = OtlpEncoder(sdk_resource(RESOURCE).attributes, METER_NAME, VERSION)
    expected = masked(sdk.request(), None)
    got = masked(ours(encoder, snapshot), T0)
    assert got.SerializeToString() == expected.SerializeToString()
    names = [m.name for m in got.resource_metrics[0].scope_metrics[0].metrics]
    assert names == list(rows_by_name())  # every catalog metric has a point in this snapshot
    assert got.resource_metrics[0].scope_metrics[0].scope.version == VERSION


def processes_round(fake: FakeNvml, round_index: int) -> None:
    """Processes that come and go: pid 1 stays on GPU 0, this process moves GPU by GPU."""
    fake.set_processes(0, [FakeProcess(1, 1 << 30, 5, 1)])
    for gpu in range(1, 8):
        here = [FakeProcess(os.getpid(), 4 << 30, 40 + round_index, 20)]
        fake.set_processes(gpu, here if gpu % 3 == round_index % 3 else [])


def nvml_rounds(fake: FakeNvml, tmp_path: Path, rounds: int) -> Iterator[Snapshot]:
    """Snapshots of the real pynvml on the fake NVML, attributed through a recorded /proc."""
    pid = os.getpid()
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "stat").write_text(f"{pid} (python) S" + " 0" * 18 + " 777 0\n")
    (proc / str(pid) / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_77/step_0\n")
    attributor = Attributor(proc)
    with NvmlSource() as source:
        for index in range(rounds):
            processes_round(fake, index)
            gpus = tuple(
                replace(gpu, processes=attributor.attribute(gpu.processes))
                for gpu in source.sample()
            )
            host = HostSample(network_io_bytes={("eth0", "receive"): 10 * index})
            yield Snapshot(T0 + index * STEP, gpus, host, (), AgentStats(sample_rounds=index))


def test_rounds_with_processes_coming_and_going_match_the_sdk(
    fake_nvml: FakeNvml, tmp_path: Path
) -> None:
    cache = SampleCache()
    sdk = SdkPath(cache)
    encoder = OtlpEncoder(sdk_resource(RESOURCE).attributes, METER_NAME, VERSION)
    starts: dict[tuple[str, bytes], int] = {}
    jobs_seen = 0
    for snapshot in nvml_rounds(fake_nvml, tmp_path, 6):
        cache.put(snapshot)
        expected = point_sets(masked(sdk.request(), None))
        got_request = ours(encoder, snapshot)
        got = point_sets(
            masked(
                ExportMetricsServiceRequest.FromString(got_request.SerializeToString()),
                snapshot.time_unix_nano,
            )
        )
        assert got == expected
        # a sum keeps the start time of the round its series first appeared in
        now: dict[tuple[str, bytes], int] = {}
        for metric in got_request.resource_metrics[0].scope_metrics[0].metrics:
            for point in metric.sum.data_points:
                series = (metric.name, b"".join(a.SerializeToString() for a in point.attributes))
                now[series] = point.start_time_unix_nano
                assert point.start_time_unix_nano == starts.get(series, snapshot.time_unix_nano)
            jobs_seen += sum(
                any(
                    a.key == "gpuwarden.job.id" and a.value.string_value == "77"
                    for a in p.attributes
                )
                for p in metric.gauge.data_points
            )
        starts = now
    assert jobs_seen > 0  # attribution reached the encoded points


def test_telemetry_pushes_the_encoded_request_and_keeps_the_pull_reader() -> None:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=True)
    cache = SampleCache()
    telemetry = Telemetry(
        cache, RESOURCE, version=VERSION, extra_readers=[PrometheusMetricReader(registry=registry)]
    )
    assert telemetry.collect_otlp() is None  # nothing sampled yet
    snapshot = rich_snapshot()
    cache.put(snapshot)
    encoder = OtlpEncoder(sdk_resource(RESOURCE).attributes, METER_NAME, VERSION)
    assert telemetry.collect_otlp() == encoder.encode(snapshot)
    exposition = generate_latest(registry).decode()
    (line,) = (line for line in exposition.splitlines() if line.startswith("hw_power_watts{"))
    assert 'hw_id="GPU-0"' in line
    assert line.endswith(" 350.5")
    telemetry.shutdown()


@pytest.mark.parametrize("value", [True, -3, 2.5, ""])
def test_attribute_values_encode_as_protobuf_does(value: bool | int | float | str) -> None:
    from opentelemetry.exporter.otlp.proto.common._internal import _encode_attributes
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue

    from gpuwarden.agent.otlp import encode_attributes

    (reference,) = _encode_attributes({"k": value})
    assert encode_attributes(1, {"k": value}) == b"\x0a" + bytes([reference.ByteSize()]) + (
        reference.SerializeToString()
    )
    assert isinstance(reference, KeyValue)


_maybe_float = st.none() | st.floats(width=64)  # NaN and ±inf too: both paths drop them
_maybe_count = st.none() | st.integers(0, 2**53)
_jobs = st.none() | st.builds(
    JobRef,
    scheduler=st.sampled_from(["slurm", "kubernetes"]),
    job_id=st.none() | st.text(max_size=8),
    pod_uid=st.none() | st.text(max_size=8),
    container_id=st.none() | st.text(max_size=8),
)
_processes = st.lists(
    st.builds(
        ProcessSample,
        pid=st.sampled_from([1, 2, 2**22]),  # few pids: the same series twice in one round
        gpu_memory_bytes=_maybe_count,
        sm_utilization_ratio=_maybe_float,
        memory_utilization_ratio=_maybe_float,
        job=_jobs,
    ),
    max_size=3,
)
_gpus = st.lists(
    st.builds(
        GpuSample,
        uuid=st.sampled_from(["GPU-a", "GPU-b", "MIG-ü"]),  # repeats: merged as the SDK merges
        index=st.integers(0, 16),
        name=st.text(max_size=6),
        status=st.sampled_from(list(GpuStatus)),
        parent_uuid=st.none() | st.just("GPU-a"),
        utilization_ratio=_maybe_float,
        power_watts=_maybe_float,
        energy_joules=_maybe_float,
        clock_event_reasons=st.none() | st.integers(0, 0x1FF),
        nvlink_tx_bytes=_maybe_count,
        ecc_corrected_errors=_maybe_count,
        xid_counts=st.dictionaries(st.integers(1, 200), st.integers(0, 9), max_size=2),
        last_xid=st.none() | st.integers(1, 200),
        processes=_processes.map(tuple),
    ),
    max_size=4,
).map(tuple)
_hosts = st.none() | st.builds(
    HostSample,
    cpu_time_seconds=st.dictionaries(st.sampled_from(["user", "idle"]), st.floats(0, 1e9)),
    cpu_count=st.none() | st.integers(1, 512),
    network_io_bytes=st.dictionaries(
        st.tuples(st.text(min_size=1, max_size=4), st.sampled_from(["receive", "transmit"])),
        st.integers(0, 2**53),
        max_size=3,
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpus=_gpus, host=_hosts)
@example(  # the SDK sums from 0: a counter's -0.0 goes out as 0.0
    gpus=(GpuSample(uuid="GPU-a", index=0, name="", energy_joules=-0.0),), host=None
)
def test_any_snapshot_encodes_as_the_sdk_encodes_it(
    gpus: tuple[GpuSample, ...], host: HostSample | None
) -> None:
    snapshot = Snapshot(T0, gpus, host, (), AgentStats(sample_rounds=1))
    cache = SampleCache()
    cache.put(snapshot)
    sdk = SdkPath(cache)
    encoder = OtlpEncoder(sdk_resource(RESOURCE).attributes, METER_NAME, VERSION)
    expected = masked(sdk.request(), None)
    assert masked(ours(encoder, snapshot), T0).SerializeToString() == expected.SerializeToString()
    sdk.provider.shutdown()
