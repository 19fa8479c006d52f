"""``prom_map.translate``: dcgm-exporter and model-server series become the agent's points.

The expected values are worked out here from the units dcgm-exporter documents (percent, MiB,
mJ, MHz), not read back from the table; the points are compared with what the real agent code
(``gpuwarden.agent.points``) builds for the same GPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpuwarden.agent.catalog import CATALOG, Instrument, Scope, Shape
from gpuwarden.agent.model import GpuSample, Snapshot
from gpuwarden.agent.points import info_attributes, points
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.prom_catalog import (
    BEGIN,
    DCGM_ROWS,
    END,
    render_markdown,
    spliced,
)
from gpuwarden.collector.ingest.prom_map import translate
from gpuwarden.collector.ingest.scrape import ScrapeTarget, convert
from gpuwarden.collector.remote_write.wire import Series, decode, encode
from tests.dcgm_exposition import FIELDS

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
UUID = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
MODEL = "NVIDIA H100 80GB HBM3"
T_MS = 1_767_225_600_000


def series(
    name: str,
    value: float,
    *,
    gpu: str = "0",
    uuid: str = UUID,
    host: str | None = "node-a",
    host_label: str = "Hostname",
    uuid_label: str = "UUID",
    **labels: str,
) -> Series:
    """One series as dcgm-exporter 3.x/4.x labels it (``render_metrics.go``), Prometheus'
    ``instance``/``job`` target labels added."""
    all_labels = {
        "__name__": name,
        "gpu": gpu,
        uuid_label: uuid,
        "pci_bus_id": f"00000000:{int(gpu) + 0x18:02X}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": MODEL,
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
        "instance": "10.0.0.5:9400",
        "job": "dcgm-exporter",
        **labels,
    }
    if host is not None:
        all_labels[host_label] = host
    return Series(tuple(sorted(all_labels.items())), (T_MS,), (value,))


def only(points: list[NumberPoint], metric: str, **attrs: object) -> NumberPoint:
    found = [
        p
        for p in points
        if p.metric == metric and all(p.attributes.get(k) == v for k, v in attrs.items())
    ]
    assert len(found) == 1, (metric, attrs, found)
    return found[0]


def named(points: list[NumberPoint], metric: str) -> list[NumberPoint]:
    return [p for p in points if p.metric == metric]


# --- units --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "value", "metric", "attrs", "expected"),
    [
        ("DCGM_FI_DEV_GPU_UTIL", 37.0, "hw.gpu.utilization", {}, 0.37),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", 12.0, "gpuwarden.gpu.memory_controller.utilization", {},
         0.12),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.25, "gpuwarden.gpu.activity",
         {"gpuwarden.gpu.unit": "graphics_engine"}, 0.25),
        ("DCGM_FI_DEV_FB_USED", 2048.0, "hw.gpu.memory.usage", {}, 2 * 1024**3),
        ("DCGM_FI_DEV_FB_FREE", 1.0, "gpuwarden.gpu.memory.free", {}, 1024**2),
        ("DCGM_FI_DEV_POWER_USAGE", 312.5, "hw.power", {"hw.type": "gpu"}, 312.5),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 5_000_000.0, "hw.energy", {"hw.type": "gpu"},
         5000.0),
        ("DCGM_FI_DEV_GPU_TEMP", 61.0, "hw.temperature", {"hw.sensor_location": "gpu"}, 61.0),
        ("DCGM_FI_DEV_MEMORY_TEMP", 70.0, "hw.temperature", {"hw.sensor_location": "memory"},
         70.0),
        ("DCGM_FI_DEV_SM_CLOCK", 1410.0, "gpuwarden.gpu.clock.frequency",
         {"gpuwarden.clock.domain": "sm"}, 1.41e9),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", 4096.0, "gpuwarden.gpu.pcie.throughput",
         {"network.io.direction": "receive"}, 4096.0),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 3.0, "gpuwarden.gpu.nvlink.bandwidth", {},
         3 * 1024 * 1000),
        ("DCGM_FI_DEV_XID_ERRORS", 79.0, "gpuwarden.gpu.xid.last", {}, 79.0),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2.0, "hw.errors", {"error.type": "uncorrected"}, 2.0),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0, "gpuwarden.gpu.memory.remapped_rows",
         {"gpuwarden.remap.cause": "uncorrectable"}, 1.0),
    ],
)  # fmt: skip
def test_units_are_converted(source, value, metric, attrs, expected):
    out = translate([series(source, value)])
    point = only(out.points, metric, **attrs)
    assert point.value == pytest.approx(expected)
    assert point.resource == {"host.name": "node-a"}
    assert point.attributes["hw.id"] == UUID
    assert point.time_unix_nano == T_MS * 1_000_000
    assert out.skipped == 0


def test_memory_limit_is_used_plus_free_plus_reserved_without_a_total():
    out = translate(
        [
            series("DCGM_FI_DEV_FB_USED", 1000.0),
            series("DCGM_FI_DEV_FB_FREE", 80000.0),
            series("DCGM_FI_DEV_FB_RESERVED", 500.0),
        ]
    )
    assert only(out.points, "hw.gpu.memory.limit").value == 81500 * 1024**2
    with_total = translate([series("DCGM_FI_DEV_FB_USED", 1.0), series("DCGM_FI_DEV_FB_FREE", 2.0),
                            series("DCGM_FI_DEV_FB_TOTAL", 4.0)])  # fmt: skip
    assert only(with_total.points, "hw.gpu.memory.limit").value == 4 * 1024**2


# --- the agent's shape --------------------------------------------------------------------------

_KIND = {
    Instrument.GAUGE: ("gauge", False),
    Instrument.COUNTER: ("sum", True),
    Instrument.UPDOWNCOUNTER: ("sum", False),
}


def _agent_gpu() -> GpuSample:
    return GpuSample(uuid=UUID, index=0, name=MODEL, pci_bus_id="00000000:18:00.0",
                     utilization_ratio=0.5, memory_utilization_ratio=0.5, memory_used_bytes=1,
                     memory_total_bytes=2, memory_reserved_bytes=1, power_watts=1.0,
                     energy_joules=1.0, temperature_celsius=1.0, memory_temperature_celsius=1.0,
                     sm_clock_hertz=1.0, memory_clock_hertz=1.0, pcie_tx_bytes_per_second=1.0,
                     pcie_rx_bytes_per_second=1.0, pcie_link_generation=4, pcie_link_width=16,
                     ecc_corrected_errors=0, ecc_uncorrected_errors=0, remapped_rows_corrected=0,
                     remapped_rows_uncorrected=0, remapped_rows_pending=0,
                     remapped_rows_failure=0, last_xid=0)  # fmt: skip


def _agent_points() -> dict[str, list[tuple[Mapping[str, object], Instrument, str]]]:
    """Metric name -> the attribute sets, instrument and unit the agent sends for one GPU."""
    snapshot = Snapshot(time_unix_nano=0, gpus=(_agent_gpu(),))
    out: dict[str, list[tuple[Mapping[str, object], Instrument, str]]] = {}
    for row in CATALOG:
        if row.scope is Scope.GPU and row.shape is Shape.SCALAR:
            for _, attrs in points(row, snapshot):
                out.setdefault(row.name, []).append((dict(attrs), row.instrument, row.unit))
    return out


@pytest.mark.parametrize("row", DCGM_ROWS, ids=lambda r: r.source)
def test_each_row_looks_like_the_agent_or_is_declared_our_own(row):
    point = only(translate([series(row.source, 1.0)]).points, row.name, **row.attributes)
    agent = _agent_points()
    assert (point.kind, point.monotonic) == _KIND[row.instrument]
    assert point.unit == row.unit
    if row.name in {r.name for r in CATALOG}:
        sent = [(a, i, u) for a, i, u in agent.get(row.name, []) if a == point.attributes]
        assert sent == [(point.attributes, row.instrument, row.unit)], row.name
    else:  # dcgm-exporter only: our namespace, and never an agent name with other attributes
        assert re.fullmatch(r"gpuwarden\.gpu\.[a-z0-9_.]+", row.name), row.name


def test_info_point_is_the_agents():
    out = translate([series("DCGM_FI_DEV_GPU_UTIL", 1.0)])
    info = only(out.points, "gpuwarden.gpu.info")
    assert info.attributes == info_attributes(_agent_gpu())
    assert (info.kind, info.value, info.unit) == ("gauge", 1.0, "1")


def test_sources_are_unique_and_look_like_dcgm_fields():
    sources = [row.source for row in DCGM_ROWS]
    assert len(sources) == len(set(sources))
    assert all(re.fullmatch(r"DCGM_FI_(DEV|PROF)_[A-Z0-9_]+", s) for s in sources)


# --- labels -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("host_label", "uuid_label"), [("Hostname", "UUID"), ("hostname", "uuid")])
def test_both_spellings_of_host_and_uuid(host_label, uuid_label):
    out = translate([series("DCGM_FI_DEV_GPU_UTIL", 10.0, host_label=host_label,
                            uuid_label=uuid_label)])  # fmt: skip
    point = only(out.points, "hw.gpu.utilization")
    assert point.resource["host.name"] == "node-a"
    assert point.attributes["hw.id"] == UUID


def test_mig_instances_are_devices_of_their_parent():
    mig = {"GPU_I_ID": "3", "GPU_I_PROFILE": "1g.10gb"}
    out = translate([series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.5, **mig),
                     series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.1, GPU_I_ID="5",
                            GPU_I_PROFILE="3g.40gb")])  # fmt: skip
    infos = {p.attributes["hw.id"]: p.attributes for p in named(out.points, "gpuwarden.gpu.info")}
    assert set(infos) == {UUID, f"{UUID}/gi-3", f"{UUID}/gi-5"}
    assert infos[f"{UUID}/gi-3"]["hw.parent"] == UUID
    assert infos[f"{UUID}/gi-3"]["gpuwarden.gpu.mig_profile"] == "1g.10gb"
    assert "hw.parent" not in infos[UUID]
    activity = {p.attributes["hw.id"]: p.value for p in named(out.points, "gpuwarden.gpu.activity")}
    assert activity == {f"{UUID}/gi-3": 0.5, f"{UUID}/gi-5": 0.1}


def test_a_pod_becomes_the_kubernetes_jobs_per_process_points():
    pod = {"pod": "trainer-0", "namespace": "ml", "container": "main"}
    out = translate([series("DCGM_FI_DEV_GPU_UTIL", 0.0, **pod),
                     series("DCGM_FI_DEV_FB_USED", 4096.0, **pod)])  # fmt: skip
    memory = only(out.points, "gpuwarden.gpu.process.memory.usage")
    assert memory.attributes == {
        "hw.id": UUID,
        "gpuwarden.job.scheduler": "kubernetes",
        "gpuwarden.job.id": "ml/trainer-0",
        "k8s.namespace.name": "ml",
        "k8s.pod.name": "trainer-0",
        "k8s.container.name": "main",
    }
    assert memory.value == 4096 * 1024**2
    assert only(out.points, "hw.gpu.utilization").attributes == {
        "hw.id": UUID,
        "hw.gpu.task": "general",
    }  # the job travels on the per-process points, never on GPU metrics


def test_pod_uid_and_hpc_job_name_the_job_as_the_schedulers_do():
    by_uid = translate([series("DCGM_FI_DEV_GPU_UTIL", 1.0, pod="p", namespace="ns",
                               pod_uid="3f1c")])  # fmt: skip
    attrs = only(by_uid.points, "gpuwarden.gpu.process.memory.usage").attributes
    assert attrs["k8s.pod.uid"] == "3f1c"
    assert "gpuwarden.job.id" not in attrs  # the agent's Kubernetes form: resolved to k8s:<uid>
    slurm = translate([series("DCGM_FI_DEV_GPU_UTIL", 1.0, hpc_job="4242")])
    attrs = only(slurm.points, "gpuwarden.gpu.process.memory.usage").attributes
    assert (attrs["gpuwarden.job.scheduler"], attrs["gpuwarden.job.id"]) == ("slurm", "4242")


def test_time_slicing_keeps_one_gpu_and_splits_it_between_the_pods():
    # dcgm-exporter --kubernetes-virtual-gpus: every GPU series once per pod sharing the GPU
    pods = [{"pod": f"infer-{i}", "namespace": "serve", "container": "c"} for i in range(3)]
    out = translate(
        [series("DCGM_FI_DEV_GPU_UTIL", 60.0, **pod) for pod in pods]
        + [series("DCGM_FI_DEV_FB_USED", 3000.0, **pod) for pod in pods]
        + [series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 9e6, **pod) for pod in pods]
    )
    assert len(named(out.points, "hw.gpu.utilization")) == 1
    assert len(named(out.points, "hw.energy")) == 1
    assert only(out.points, "hw.gpu.memory.usage").value == 3000 * 1024**2
    memory = named(out.points, "gpuwarden.gpu.process.memory.usage")
    assert sorted(str(p.attributes["k8s.pod.name"]) for p in memory) == [
        "infer-0",
        "infer-1",
        "infer-2",
    ]
    assert sum(p.value for p in memory) == pytest.approx(3000 * 1024**2)
    assert len(named(out.points, "gpuwarden.gpu.info")) == 1


def test_per_process_values_beside_the_device_value_become_the_pods_own():
    # dcgm-exporter with per-process data: the device series, then one per pod with its own part
    pods = [{"pod": f"p{i}", "namespace": "ns", "pod_uid": f"uid-{i}"} for i in range(2)]
    out = translate(
        [series("DCGM_FI_DEV_GPU_UTIL", 70.0), series("DCGM_FI_DEV_FB_USED", 3000.0)]
        + [series("DCGM_FI_DEV_GPU_UTIL", 50.0 + 20 * i, **p) for i, p in enumerate(pods)]
        + [series("DCGM_FI_DEV_FB_USED", 1000.0 * (i + 1), **p) for i, p in enumerate(pods)]
    )
    assert only(out.points, "hw.gpu.utilization").value == pytest.approx(0.70)
    assert only(out.points, "hw.gpu.memory.usage").value == 3000 * 1024**2
    util = {p.attributes["k8s.pod.uid"]: p.value
            for p in named(out.points, "gpuwarden.gpu.process.utilization")}  # fmt: skip
    assert util == pytest.approx({"uid-0": 0.5, "uid-1": 0.7})
    memory = {p.attributes["k8s.pod.uid"]: p.value
              for p in named(out.points, "gpuwarden.gpu.process.memory.usage")}  # fmt: skip
    assert memory == {"uid-0": 1000 * 1024**2, "uid-1": 2000 * 1024**2}


# --- what is skipped ----------------------------------------------------------------------------


def test_unknown_and_unlabelled_series_are_skipped_with_a_reason():
    out = translate(
        [
            series("DCGM_FI_DEV_GPU_UTIL", 5.0),
            series("DCGM_FI_DEV_GPU_UTIL", 5.0, host=None),
            series("DCGM_FI_DEV_POWER_USAGE", 5.0, uuid=""),
            series("DCGM_FI_DEV_VGPU_LICENSE_STATUS", 1.0),
            Series((("__name__", "node_cpu_seconds_total"), ("cpu", "0")), (T_MS,), (1.0,)),
            Series((("__name__", "vllm:e2e_request_latency_seconds_bucket"), ("le", "1")),
                   (T_MS,), (3.0,)),
        ]
    )  # fmt: skip
    assert out.skipped == 5
    assert out.skipped_by_reason == {
        "no_hostname": 1,
        "no_gpu_uuid": 1,
        "unmapped": 2,
        "histogram": 1,
    }
    assert len(named(out.points, "hw.gpu.utilization")) == 1


def test_non_finite_samples_and_stale_markers_are_dropped():
    stale = float("nan")
    one = Series(series("DCGM_FI_DEV_GPU_UTIL", 0.0).labels, (T_MS, T_MS + 15_000, T_MS + 30_000),
                 (20.0, stale, math.inf))  # fmt: skip
    out = translate([one])
    assert [p.value for p in named(out.points, "hw.gpu.utilization")] == [0.2]
    assert out.dropped_samples == 2
    assert len(named(out.points, "gpuwarden.gpu.info")) == 1  # no GPU seen at the dropped times


def test_counters_renamed_with_total_by_an_otel_collector_still_map():
    # the OpenTelemetry Collector's prometheusremotewrite exporter appends _total to counters
    out = translate([series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total", 7000.0),
                     series("DCGM_FI_DEV_GPU_UTIL_total", 1.0)])  # fmt: skip
    assert only(out.points, "hw.energy").value == pytest.approx(7.0)
    assert out.skipped_by_reason == {"unmapped": 1}  # a gauge never gets _total


def test_the_wire_round_trip_keeps_everything():
    batch = [series("DCGM_FI_DEV_GPU_UTIL", 33.0, pod="a", namespace="b")]
    assert translate(decode(encode(batch))) == translate(batch)


# --- model servers ------------------------------------------------------------------------------


def _model_series(name: str, value: float, **labels: str) -> Series:
    all_labels = {"__name__": name, "instance": "10.0.0.9:8000", "job": "vllm", **labels}
    return Series(tuple(sorted(all_labels.items())), (T_MS,), (value,))


def test_vllm_and_triton_series_map_as_the_scraper_maps_them():
    out = translate(
        [
            _model_series("vllm:request_success_total", 12.0, model_name="llama",
                          finished_reason="abort"),
            _model_series("vllm:num_requests_waiting", 3.0, model_name="llama"),
            _model_series("nv_inference_request_duration_us", 2_500_000.0, model="resnet",
                          version="1"),
        ]
    )  # fmt: skip
    requests = only(out.points, "gpuwarden.model.requests")
    assert (requests.kind, requests.monotonic, requests.value) == ("sum", True, 12.0)
    assert requests.attributes["model"] == "llama"
    assert (requests.attributes["reason"], requests.attributes["outcome"]) == ("abort", "cancelled")
    assert requests.attributes["service.instance.id"] == "10.0.0.9:8000"
    waiting = only(out.points, "gpuwarden.model.queue.size")
    assert (waiting.kind, waiting.value, waiting.attributes["state"]) == ("gauge", 3.0, "waiting")
    seconds = only(out.points, "gpuwarden.model.request.time")
    assert seconds.value == pytest.approx(2.5)
    assert seconds.attributes["model.version"] == "1"


def test_a_superseded_vllm_series_is_skipped_when_its_successor_is_sent():
    both = translate([_model_series("vllm:kv_cache_usage_perc", 0.4),
                      _model_series("vllm:gpu_cache_usage_perc", 0.4)])  # fmt: skip
    assert len(named(both.points, "gpuwarden.model.kv_cache.utilization")) == 1
    old = translate([_model_series("vllm:gpu_cache_usage_perc", 0.4)])
    assert only(old.points, "gpuwarden.model.kv_cache.utilization").value == 0.4


# --- the docs -----------------------------------------------------------------------------------


def test_docs_hold_the_generated_table():
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text
    assert END in text
    hint = "run: python -m gpuwarden.collector.ingest.prom_catalog docs/metrics.md"
    assert spliced(text) == text, hint
    assert render_markdown() in text


def test_docs_and_table_name_the_same_series_both_ways():
    section = DOC.read_text(encoding="utf-8").partition(BEGIN)[2].partition(END)[0]
    documented = re.findall(r"^\| `(DCGM_FI_[A-Z0-9_]+)` \| (\w+) \| [^|]+ \| \**`([a-z0-9_.]+)`",
                            section, flags=re.M)  # fmt: skip
    assert sorted(documented) == sorted((r.source, r.source_type, r.name) for r in DCGM_ROWS)


# --- TGI, scraped and remote-written ------------------------------------------------------------

# as metrics-exporter-prometheus 0.15 (TGI's) prints a page: TYPE lines, counters without
# ``_total``, latency as a summary (no buckets configured for it)
TGI_PAGE = """\
# TYPE tgi_request_success counter
tgi_request_success 42
# TYPE tgi_request_failure counter
tgi_request_failure{err="validation"} 3
tgi_request_failure{err="overloaded"} 1
# TYPE tgi_queue_size gauge
tgi_queue_size 5
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 8
# TYPE tgi_request_duration summary
tgi_request_duration{quantile="0.5"} 1.25
tgi_request_duration_sum 40.5
tgi_request_duration_count 42
"""


def _tgi_rows(points: list[NumberPoint]) -> set[tuple[str, bool, float, str, str]]:
    out = set()
    for p in points:
        kind = p.attributes.get("outcome", p.attributes.get("state"))
        out.add((p.metric, p.monotonic, p.value, str(kind), str(p.attributes.get("reason", ""))))
    return out


TGI_EXPECTED = {
    ("gpuwarden.model.requests", True, 42.0, "success", ""),
    ("gpuwarden.model.requests", True, 3.0, "failure", "validation"),
    ("gpuwarden.model.requests", True, 1.0, "failure", "overloaded"),
    ("gpuwarden.model.queue.size", False, 5.0, "waiting", ""),
    ("gpuwarden.model.queue.size", False, 8.0, "running", ""),
}


def test_a_tgi_page_scrapes_into_model_metrics():
    target = ScrapeTarget("http://10.0.0.3:3000/metrics", model="mistral-7b", server="tgi")
    numbers, histograms, result = convert(target, TGI_PAGE, 1)
    assert _tgi_rows(numbers) == TGI_EXPECTED
    assert all(p.attributes["model"] == "mistral-7b" for p in numbers)
    assert histograms == []
    assert result.unmapped_families == 1  # the duration summary


def test_tgi_series_remote_written_map_the_same():
    lines = [line for line in TGI_PAGE.splitlines() if not line.startswith("#")]
    series = []
    for line in lines[:5]:
        name = line.split("{")[0].split(" ")[0]
        labels = {"__name__": name, "instance": "10.0.0.3:3000"}
        if "err=" in line:
            labels["err"] = line.split('"')[1]
        series.append(Series(tuple(sorted(labels.items())), (T_MS,), (float(line.split()[-1]),)))
    assert _tgi_rows(translate(series).points) == TGI_EXPECTED


# --- dcgm-exporter's own counters file ----------------------------------------------------------

COUNTERS_CSV = Path(__file__).parent / "data" / "dcgm-exporter-default-counters.csv"


def dcgm_counters() -> dict[str, tuple[str, str, bool]]:
    """Field -> (Prometheus type, help, enabled) from dcgm-exporter's default counters file,
    commented-out (not enabled) rows included."""
    out = {}
    for line in COUNTERS_CSV.read_text(encoding="utf-8").splitlines():
        enabled = not line.startswith("#")
        text = line.lstrip("# ").strip()
        parts = [p.strip() for p in text.split(",", 2)]
        if len(parts) == 3 and re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", parts[0]):
            out[parts[0]] = (parts[1], parts[2], enabled)
    return out


def test_rows_agree_with_dcgm_exporters_counters_file():
    counters = dcgm_counters()
    assert len(counters) > 40  # the file was read
    for row in DCGM_ROWS:
        if row.source in counters:
            kind, _, on = counters[row.source]
            assert row.source_type == kind, row.source
            assert row.default == on, row.source
        else:  # fields the file does not list at all are never "default"
            assert not row.default, row.source
    enabled = {name for name, (kind, _, on) in counters.items() if on and kind != "label"}
    unmapped = enabled - {row.source for row in DCGM_ROWS}
    assert unmapped == {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"}  # the one default we do not keep


def test_the_fixture_serves_exactly_the_default_fields():
    counters = dcgm_counters()
    served = {name: (kind, help_text) for name, kind, help_text, _ in FIELDS}
    enabled = {name: (kind, help_text) for name, (kind, help_text, on) in counters.items()
               if on and kind != "label"}  # fmt: skip
    assert served == enabled
