"""End to end: fake NVML (8 GPUs) → real pynvml → agent → real OTel SDK → OTLP → collector.

Every catalog metric arrives, with exact values and attributes, and nothing arrives that the
catalog does not declare. Prometheus scrapes read the cache and never call NVML.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.agent.build import AgentRuntime, build_agent
from gpuwarden.agent.catalog import CATALOG, metric_names
from gpuwarden.agent.config import AgentConfig, CollectorConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.model import GpuStatus, Snapshot
from gpuwarden.agent.telemetry import points
from tests.collector_server import TOKEN, CollectorThread
from tests.fakenvml import control as fk
from tests.fakenvml.control import FakeNvml
from tests.test_attribution import build_proc
from tests.test_host import write_rapl, write_tree
from tests.test_nvml_source import expected, program

NODE = "e2e-node"
# recorded processes: Slurm v1 cgroup, Kubernetes systemd slice, Slurm via environ, none
PIDS = {0: 4101, 1: 4104, 2: 4106, 3: 4107}


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    proc = build_proc(tmp_path / "proc")
    write_tree(tmp_path)  # host files (stat, meminfo, diskstats, net/dev) into the same tree
    write_rapl(tmp_path / "sys", "intel-rapl:0", "package-0", 5_000_000)
    return proc, tmp_path / "sys"


@pytest.fixture
def runtime(
    fake_nvml: FakeNvml, trees: tuple[Path, Path], tmp_path: Path
) -> Iterator[tuple[AgentRuntime, CollectorThread]]:
    for gpu in range(8):
        program(fake_nvml, gpu)
        pid = PIDS.get(gpu, 1000 + gpu)
        fake_nvml.set_processes(
            gpu, [fk.FakeProcess(pid, (gpu + 1) * 256 << 20, 10 * gpu, 5 * gpu)]
        )
    proc, sys = trees
    with CollectorThread() as collector:
        config = AgentConfig(
            node_name=NODE,
            source="nvml",
            proc_root=proc,
            sys_root=sys,
            collector=CollectorConfig(endpoint=collector.endpoint, token=TOKEN),
            spool=SpoolConfig(directory=tmp_path / "spool", fsync=False),
            http=HttpConfig(port=0),
        )
        rt = build_agent(config, machine_id_file=tmp_path / "machine-id")
        assert fake_nvml.push_xid(6, 13) == 1  # the agent registered for XID events at start
        try:
            yield rt, collector
        finally:
            rt.agent.shutdown(flush_timeout_seconds=5)


Key = tuple[tuple[str, str], ...]


def normalise(attrs: dict[str, object] | tuple[tuple[str, object], ...]) -> Key:
    items = attrs.items() if isinstance(attrs, dict) else attrs
    return tuple(sorted((k, str(v)) for k, v in items))


def received(collector: CollectorThread, metric: str) -> dict[Key, float]:
    return {normalise(key[2]): value for key, value in collector.log.latest(metric, NODE).items()}


def one_round(rt: AgentRuntime) -> Snapshot:
    result = rt.agent.sample_once()
    assert rt.agent.sender is not None
    assert rt.agent.sender.flush(timeout_seconds=10)
    return result.snapshot


def test_every_catalog_metric_arrives_exactly_and_nothing_else(runtime):
    rt, collector = runtime
    snapshot = one_round(rt)
    # the source converted NVML's units as the catalog says (the NVML tests pin every field)
    gpus = {g.index: g for g in snapshot.gpus}
    assert gpus[5].power_watts == 256.25  # 256_250 mW
    assert gpus[5].energy_joules == 5_000_000.035  # 5_000_000_035 mJ
    assert gpus[5].nvlink_tx_bytes == 6_000_000 * 1024  # KiB
    assert gpus[5].utilization_ratio == 0.15  # 15 %
    assert gpus[5].sm_clock_hertz == 1_415e6  # MHz
    for gpu in (4, 5, 7):
        assert gpus[gpu] == expected(gpu)
    # catalog ⇔ emitted, both directions, by metric name
    assert collector.log.metric_names() == metric_names()
    # and point by point, row by row: every attribute set and value
    for name in metric_names():
        want: dict[Key, float] = {}
        for row in (r for r in CATALOG if r.name == name):
            for value, attrs in points(row, snapshot):
                want[normalise(dict(attrs))] = value
        assert received(collector, name) == pytest.approx(want), name
    # units travel with the data
    assert collector.log.unit("hw.power") == "W"
    assert collector.log.unit("hw.energy") == "J"
    assert collector.log.unit("hw.gpu.memory.usage") == "By"


def test_attribution_is_on_process_metrics_only(runtime):
    rt, collector = runtime
    one_round(rt)
    procs = received(collector, "gpuwarden.gpu.process.memory.usage")
    jobs = {dict(k)["process.pid"]: dict(k) for k in procs}
    assert jobs["4101"]["gpuwarden.job.id"] == "123"
    assert jobs["4101"]["gpuwarden.job.scheduler"] == "slurm"
    assert jobs["4104"]["gpuwarden.job.scheduler"] == "kubernetes"
    assert jobs["4104"]["k8s.pod.uid"].startswith("9b2d4e6f-")
    assert jobs["4106"]["gpuwarden.job.id"] == "5150"
    assert "gpuwarden.job.id" not in jobs["4107"]
    for key in received(collector, "hw.gpu.utilization"):
        assert not any(k.startswith(("gpuwarden.job", "k8s.", "process.")) for k, _ in key)


def test_resource_attributes_describe_the_node(runtime):
    rt, collector = runtime
    one_round(rt)
    (host,) = collector.log.hosts()
    assert host == NODE
    # resource attributes are checked on the wire by the collector tests; here the identity
    (series,) = collector.log.series("gpuwarden.agent.samples", NODE).values()
    assert [v for _, v in series] == [1.0]


def test_a_lost_gpu_reports_failed_while_the_others_keep_reporting(runtime, fake_nvml):
    rt, collector = runtime
    one_round(rt)
    fake_nvml.set_error("*", fk.ERROR_GPU_IS_LOST, gpu=3)
    snapshot = one_round(rt)
    lost = fake_nvml.uuid(3)
    status = {
        (dict(k)["hw.id"], dict(k)["hw.state"]): v
        for k, v in received(collector, "hw.status").items()
    }
    assert status[(lost, "failed")] == 1.0
    assert status[(lost, "ok")] == 0.0
    assert [g.status for g in snapshot.gpus].count(GpuStatus.FAILED) == 1
    util = collector.log.series("hw.gpu.utilization", NODE)
    by_gpu = {dict(k[2])["hw.id"]: len(v) for k, v in util.items()}
    assert by_gpu.pop(lost) == 1  # its utilisation series stopped
    assert set(by_gpu.values()) == {2}  # the other seven reported both rounds
    assert len(by_gpu) == 7


def test_prometheus_scrapes_read_the_cache_not_nvml(runtime, fake_nvml):
    rt, _ = runtime
    assert rt.http is not None
    rt.http.start()
    try:
        one_round(rt)
        before = fake_nvml.call_counts()
        for _ in range(3):
            with urllib.request.urlopen(f"http://127.0.0.1:{rt.http.port}/metrics") as resp:
                body = resp.read().decode()
        assert fake_nvml.call_counts() == before
        lines = [ln for ln in body.splitlines() if ln.startswith("hw_gpu_utilization{")]
        assert len(lines) == 8
        assert "job" not in "".join(lines)
        with urllib.request.urlopen(f"http://127.0.0.1:{rt.http.port}/healthz") as resp:
            assert resp.status == 200
    finally:
        rt.http.stop()
