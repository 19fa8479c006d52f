"""The real agent (fake NVML) → real OTLP over loopback → collector: the store holds it exactly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.agent.build import AgentRuntime, build_agent
from gpuwarden.agent.catalog import CATALOG, Instrument
from gpuwarden.agent.config import AgentConfig, CollectorConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.model import Snapshot
from gpuwarden.agent.telemetry import points
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig as ServerConfig
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.store.types import label_text
from tests.collector_server import TOKEN, CollectorThread
from tests.fakenvml import control as fk
from tests.fakenvml.control import FakeNvml
from tests.test_agent_e2e import PIDS
from tests.test_attribution import build_proc
from tests.test_host import write_rapl, write_tree
from tests.test_nvml_source import program

NODE = "store-node"
Key = tuple[tuple[str, str], ...]


@pytest.fixture
def pipeline(
    fake_nvml: FakeNvml, tmp_path: Path
) -> Iterator[tuple[AgentRuntime, CollectorService]]:
    for gpu in range(8):
        program(fake_nvml, gpu)
        pid = PIDS.get(gpu, 1000 + gpu)
        fake_nvml.set_processes(gpu, [fk.FakeProcess(pid, (gpu + 1) << 28, 10 * gpu, 5 * gpu)])
    proc = build_proc(tmp_path / "proc")
    write_tree(tmp_path)
    write_rapl(tmp_path / "sys", "intel-rapl:0", "package-0", 5_000_000)
    # every metric's recent ring: the increases of every catalog counter are read below
    service = build_service(ServerConfig(database=tmp_path / "c.db", recent_metrics=("*",)))
    with CollectorThread(service=service) as collector:
        config = AgentConfig(
            node_name=NODE,
            source="nvml",
            proc_root=proc,
            sys_root=tmp_path / "sys",
            collector=CollectorConfig(endpoint=collector.endpoint, token=TOKEN),
            spool=SpoolConfig(directory=tmp_path / "spool", fsync=False),
            http=HttpConfig(enabled=False),
        )
        runtime = build_agent(config, machine_id_file=tmp_path / "machine-id")
        assert fake_nvml.push_xid(6, 13) == 1
        try:
            yield runtime, service
        finally:
            runtime.agent.shutdown(flush_timeout_seconds=5)
            service.storage.close()


def one_round(runtime: AgentRuntime) -> Snapshot:
    snapshot = runtime.agent.sample_once().snapshot
    assert runtime.agent.sender is not None
    assert runtime.agent.sender.flush(timeout_seconds=10)
    return snapshot


def stored(service: CollectorService, metric: str) -> dict[Key, float]:
    latest = service.store.latest(metric)
    return {
        tuple(
            sorted((k, label_text(v)) for k, v in info.attributes.items() if k != "host.name")
        ): float(value)
        for info, value in zip(latest.series, latest.values, strict=True)
    }


def increases(service: CollectorService, metric: str, start: float, end: float) -> dict[Key, float]:
    m = service.store.increase_matrix(metric, start=start, end=end)
    return {
        tuple(
            sorted((k, label_text(v)) for k, v in s.attributes.items() if k != "host.name")
        ): float(np.nansum(row))
        for s, row in zip(m.series, m.values, strict=True)
    }


def expected(snapshot: Snapshot, metric: str) -> dict[Key, float]:
    want: dict[Key, float] = {}
    for row in CATALOG:
        if row.name != metric:
            continue
        for value, attrs in points(row, snapshot):
            want[tuple(sorted((k, str(v)) for k, v in attrs.items()))] = value
    return want


def test_every_catalog_metric_lands_in_the_store_exactly(pipeline):
    runtime, service = pipeline
    first = one_round(runtime)
    second = one_round(runtime)
    start, end = first.time_unix_nano / 1e9 - 60, second.time_unix_nano / 1e9 + 60
    assert set(service.store.metric_names()) == {row.name for row in CATALOG}
    for name in sorted({row.name for row in CATALOG}):
        instrument = next(r.instrument for r in CATALOG if r.name == name)
        want_after = expected(second, name)
        if instrument is Instrument.COUNTER:
            # counters are kept as exact increases (and rates): the increase between the rounds
            want_before = expected(first, name)
            got = increases(service, name, start, end)
            assert set(got) == set(want_after), name
            for key, after in want_after.items():
                assert got[key] == pytest.approx(after - want_before[key], abs=1e-6), (name, key)
        else:
            # the store's latest value: the second round's, or the first's where the second
            # had none (NVML has no new per-process utilisation sample between the rounds)
            want = {**expected(first, name), **want_after}
            got = stored(service, name)
            assert set(got) == set(want), name
            for key, value in want.items():  # float32 storage: 7 significant digits
                assert got[key] == pytest.approx(value, rel=1e-6), (name, key)


def test_energy_increase_is_exact(pipeline, fake_nvml):
    runtime, service = pipeline
    first = one_round(runtime)
    for gpu in range(8):
        fake_nvml.set_u64(gpu, "energy_mj", 5_000_000_000 + 7 * gpu + 1_234_567 * (gpu + 1))
    second = one_round(runtime)
    start, end = first.time_unix_nano / 1e9 - 60, second.time_unix_nano / 1e9 + 60
    got = {
        dict(k)["hw.id"]: v
        for k, v in increases(service, "hw.energy", start, end).items()
        if dict(k)["hw.type"] == "gpu"
    }
    for gpu in range(8):
        assert got[fake_nvml.uuid(gpu)] == pytest.approx(1_234.567 * (gpu + 1), rel=1e-9)
