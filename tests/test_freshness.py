"""Freshness: a series silent for longer than the store's staleness bound is unknown now.

One test per class of read a detector (or ``/metrics``) makes: ``latest``, series x time
matrices (numbers and counters), histograms, the accounting timelines, and two detectors fed
through the detection view (idle: stale must not be idle; faults: stale must not be healthy).
Each asserts what the same data reads as while fresh, so none can pass on an empty read.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig, ConfigError, load_collector_config
from gpuwarden.collector.detect.faults import detect_hardware_faults
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.detect.idle_gpu import IdleGpuParams, idle_verdicts, run_idle_gpu
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.store.fresh import FreshReads
from gpuwarden.collector.store.types import SeriesMatrix
from gpuwarden.collector.store.window import WindowStore
from tests.detectors import make_rule
from tests.test_detect_faults import status
from tests.test_detect_waste import T0, feed, gauge, gpu_points, job

BOUND = 60.0


def service_at(tmp_path: Path, now: list[float]) -> CollectorService:
    return build_service(CollectorConfig(database=tmp_path / "c.db"), clock=lambda: now[0])


def counter(node: str, t: float, value: float) -> NumberPoint:
    return NumberPoint(
        {"host.name": node}, "hw.energy", "J", "sum", True,
        {"hw.id": f"GPU-{node}-0", "hw.type": "gpu"}, int(t * 1e9), value,
    )  # fmt: skip


# --- configuration ------------------------------------------------------------------------------


def test_the_bound_is_configured_once_and_reaches_the_store(tmp_path):
    assert CollectorConfig().staleness_seconds == BOUND
    config = load_collector_config(None, {"staleness_seconds": 90, "database": tmp_path / "c.db"})
    service = build_service(config)
    assert service.store.staleness_seconds == 90.0
    service.storage.close()
    with pytest.raises(ConfigError, match="staleness_seconds"):
        load_collector_config(None, {"staleness_seconds": 0})
    with pytest.raises(ValueError, match="staleness_seconds"):
        WindowStore(staleness_seconds=0)


# --- latest -------------------------------------------------------------------------------------


def test_latest_reads_a_stale_point_as_unknown_and_keeps_when_it_was_seen():
    now = [T0 + 100.0]
    store = WindowStore(clock=lambda: now[0])
    store.ingest([gauge("hw.gpu.utilization", "a", T0 + 90, 0.95, **{"hw.id": "GPU-a"})])
    store.ingest([gauge("hw.gpu.utilization", "b", T0 + 30, 0.95, **{"hw.id": "GPU-b"})])
    latest = store.latest("hw.gpu.utilization")
    by_node = {
        info.attributes["host.name"]: (float(v), t)
        for info, v, t in zip(latest.series, latest.values, latest.times, strict=True)
    }
    assert by_node["a"][0] == pytest.approx(0.95)  # 10 s old
    assert by_node["a"][1] == T0 + 90
    assert math.isnan(by_node["b"][0])  # 70 s old: not 0.95 now
    assert by_node["b"][1] == T0 + 30  # but still known when it was seen
    old = store.latest("hw.gpu.utilization", {"host.name": "b"}, max_age_seconds=math.inf)
    assert old.values.tolist() == [pytest.approx(0.95)]
    now[0] = T0 + 90 + BOUND + 1
    assert np.isnan(store.latest("hw.gpu.utilization").values).all()


def test_last_seen_per_node_counts_every_series_and_forgets_evicted_nodes():
    store = WindowStore(clock=lambda: T0 + 100.0, stale_after_seconds=3600)
    store.ingest([gauge("hw.gpu.utilization", "a", T0 + 10, 0.5, **{"hw.id": "GPU-a"})])
    store.ingest([gauge("system.cpu.utilization", "a", T0 + 40, 0.5)])
    store.ingest([gauge("hw.gpu.utilization", "b", T0 + 20, 0.5, **{"hw.id": "GPU-b"})])
    store.ingest_histogram(
        "gpuwarden.model.request.latency", {"host.name": "b", "model": "m"},
        time_unix_nano=int((T0 + 50) * 1e9), bounds=(1.0,), bucket_counts=(1, 0), sum_value=0.5,
    )  # fmt: skip
    assert store.last_seen_by_host() == {"a": T0 + 40, "b": T0 + 50}
    assert store.evict_stale(now=T0 + 45 + 3600) == 3  # a's and b's number series
    assert store.last_seen_by_host() == {"b": T0 + 50}


# --- matrices (numbers and counters), through the detectors' view --------------------------------


def test_a_stale_series_is_unknown_in_reads_ending_now_and_readable_in_the_past():
    now = [T0 + 600.0]
    store = WindowStore(clock=lambda: now[0])
    for t in np.arange(T0, T0 + 600, 10.0):
        store.ingest([gauge("hw.gpu.utilization", "a", t, 0.9, **{"hw.id": "GPU-a-0"})])
        store.ingest([counter("a", t, 1000 * (t - T0))])
        if t < T0 + 300:  # b stops 5 min ago
            store.ingest([gauge("hw.gpu.utilization", "b", t, 0.9, **{"hw.id": "GPU-b-0"})])
            store.ingest([counter("b", t, 1000 * (t - T0))])
            store.ingest([gauge("gpuwarden.gpu.info", "b", t, 1.0, **{"hw.id": "GPU-b-0"})])
    view = FreshReads(store)

    def util(s: WindowStore, end: float) -> SeriesMatrix:
        return s.matrix("hw.gpu.utilization", start=end - 600, end=end)

    def energy(s: WindowStore, end: float) -> SeriesMatrix:
        return s.increase_matrix("hw.energy", start=end - 600, end=end)

    for read in (util, energy):
        raw, fresh = read(store, now[0]), read(view, now[0])
        nodes = [i.attributes["host.name"] for i in raw.series]
        b = nodes.index("b")
        assert np.isfinite(raw.values[b]).sum() >= 29  # the data is there ...
        assert np.isnan(fresh.values[b]).all()  # ... but b is silent: unknown
        assert np.array_equal(fresh.values[1 - b], raw.values[1 - b], equal_nan=True)
        past = read(view, T0 + 300.0)  # a window that ended when b still reported
        assert np.isfinite(past.values[b]).sum() >= 29
    info = view.matrix("gpuwarden.gpu.info", start=now[0] - 600, end=now[0])
    assert np.isfinite(info.values).sum() == 30  # the inventory is identity, never hidden
    assert math.isnan(view.latest("hw.gpu.utilization", {"host.name": "b"}).values[0])
    (key,) = [i.key for i in store.matrix("hw.energy", start=T0, end=T0 + 10).series if
              i.attributes["host.name"] == "b"]  # fmt: skip
    assert store.increase(key, T0, now[0]) == pytest.approx(290_000)
    assert view.increase(key, T0, now[0]) is None


# --- histograms ---------------------------------------------------------------------------------


def test_a_stale_histogram_has_no_counts_and_no_quantile():
    now = [T0 + 100.0]
    store = WindowStore(clock=lambda: now[0])
    attrs = {"host.name": "serve-1", "model": "llama"}
    for i, t in enumerate((T0 + 10, T0 + 20)):
        store.ingest_histogram(
            "gpuwarden.model.request.latency", attrs, time_unix_nano=int(t * 1e9),
            bounds=(0.1, 1.0), bucket_counts=(10 * i, 5 * i, 0), sum_value=2.0 * i,
        )  # fmt: skip
    (key,) = store.histogram_keys("gpuwarden.model.request.latency")
    view = FreshReads(store)
    now[0] = T0 + 20 + BOUND  # at the bound: still fresh
    counts = view.bucket_counts(key, T0, now[0])
    assert counts is not None
    assert counts.counts.tolist() == [10, 5, 0]
    assert view.quantile(key, 0.5, T0, now[0]) == store.quantile(key, 0.5, T0, now[0])
    now[0] += 1  # past it
    assert store.bucket_counts(key, T0, now[0]) is not None
    assert view.bucket_counts(key, T0, now[0]) is None
    assert math.isnan(view.quantile(key, 0.5, T0, now[0]))


# --- accounting timelines and the detectors that read them --------------------------------------


def idle_fleet(tmp_path: Path) -> tuple[CollectorService, float]:
    """Two 1-GPU jobs idle since T0; node b's agent stops at T0 + 1620 (3 min before END)."""
    end = T0 + 1800.0
    svc = service_at(tmp_path, [end])
    svc.registry.put([job("slurm:c:1", "a", (0,), T0 - 600), job("slurm:c:2", "b", (0,), T0 - 600)])

    def points(t: float) -> list[NumberPoint]:
        out = gpu_points("a", 0, t, 0.0)
        return out + (gpu_points("b", 0, t, 0.0) if t < end - 180 else [])

    feed(svc, np.arange(T0, end, 10.0), points)
    return svc, end


def test_a_silent_gpus_timeline_is_unknown_and_its_jobs_unseen(tmp_path):
    svc, end = idle_fleet(tmp_path)
    _, raw = svc.timelines(end - 1800, end)
    _, seen = svc.detection_view.timelines(end - 1800, end)
    by_node = {t.node: t for t in seen}
    assert np.isfinite(next(t for t in raw if t.node == "b").utilization_ratio).sum() == 162
    assert np.isnan(by_node["b"].utilization_ratio).all()
    assert np.isnan(by_node["b"].energy_joules).all()
    assert not any(by_node["b"].process_jobs)
    assert np.isfinite(by_node["a"].utilization_ratio).all()
    svc.storage.close()


def test_idle_gpu_calls_a_silent_idle_gpu_unknown_not_idle(tmp_path):
    """27 idle minutes then 3 silent ones: 90 % coverage would fire on the raw data."""
    svc, end = idle_fleet(tmp_path)
    _times, raw = svc.timelines(end - 1800, end)
    util = np.vstack([t.utilization_ratio for t in raw])
    held = np.ones_like(util, dtype=bool)
    raw_verdicts = idle_verdicts(util, held, threshold_ratio=0.05, min_coverage=0.8)
    assert [Verdict(int(v)) for v in raw_verdicts] == [Verdict.FIRING, Verdict.FIRING]
    found = run_idle_gpu(svc.detection_view, make_rule("idle_gpu"), IdleGpuParams(), end)
    assert {f.subject: f.verdict for f in found} == {
        "slurm:c:1": Verdict.FIRING,  # idle-gpu judges per job
        "slurm:c:2": Verdict.UNKNOWN,
    }
    svc.storage.close()


def test_hardware_fault_does_not_call_a_silent_node_healthy(tmp_path):
    """A GPU lost 3 min ago on a node silent since: fires on the raw store, and through the
    view it is neither firing nor clear (no finding: its incident stays as it is)."""
    now = [T0 + 3600.0]
    svc = service_at(tmp_path, now)
    points: list[NumberPoint] = []
    for t in (now[0] - 200, now[0] - 180):
        points += status("GPU-ok", "ok", t) + status("GPU-lost", "failed", t)
    assert svc.accept(points, "t") == 0
    rule = make_rule("hardware_fault")

    class Raw:  # the same view, reading the raw store: what the detector saw before
        store = svc.store

        def now(self) -> float:
            return now[0]

    raw = detect_hardware_faults(Raw(), rule, window_seconds=300, now=now[0])  # type: ignore[arg-type]
    assert {f.subject: f.verdict for f in raw} == {
        "n1/GPU-lost": Verdict.FIRING,
        "n1/GPU-ok": Verdict.CLEAR,
    }
    assert detect_hardware_faults(svc.detection_view, rule, window_seconds=300, now=now[0]) == []
    svc.storage.close()
