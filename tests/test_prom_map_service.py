"""dcgm-exporter's pages, translated, through a real ``CollectorService``: GPUs, GPU-hours, idle.

Two nodes x 4 GPUs for 2 h, scraped every 15 s as a Prometheus would (the pages of
``tests/dcgm_exposition.py`` parsed by prometheus_client's text parser, each sample a series with
the target's ``instance`` and ``job`` labels), through the remote-write wire format, then
``prom_map.translate`` and ``service.accept``. Truth comes from the script: which pod holds which
GPU, and when it is busy.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuwarden.collector.accounting.gpu_time import UNALLOCATED, totals
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.ingest.prom_map import translate
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.remote_write.wire import Series, decode, encode
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.sqlite import MEMORY, SqliteStorage
from tests.dcgm_exposition import DcgmFleet, Pod
from tests.detectors import make_rule, run_rule

T0 = 1_767_225_600.0
STEP = 15
HOURS = 2
END = T0 + HOURS * 3600
BUSY_W, IDLE_W = 650.0, 70.0

TRAINER = Pod("trainer-0", "ml", uid="uid-trainer")
IDLER = Pod("notebook-7", "research")
INFER = [Pod(f"infer-{i}", "serve") for i in range(2)]
# (node, gpu) -> pods holding it; busy GPUs
HOLDERS = {
    ("node-a", 0): [TRAINER],
    ("node-a", 1): [TRAINER],
    ("node-a", 2): [IDLER],
    ("node-a", 3): [IDLER],
    ("node-b", 0): INFER,  # time-sliced: one GPU, two pods
}
BUSY = {("node-a", 0), ("node-a", 1), ("node-b", 0)}


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape_series(fleet: DcgmFleet, t: float) -> list[Series]:
    """Every node's page at ``t`` as Prometheus remote-writes it: a series per sample, named as
    exposed (Prometheus adds no ``_total``), with the target's ``instance`` and ``job``."""
    out = []
    for node in fleet.nodes:
        target = {"instance": f"{node}:9400", "job": "dcgm-exporter"}
        for line in fleet.render(node).splitlines():
            if line.startswith("#"):
                continue
            match = _SAMPLE.match(line)
            assert match is not None, line
            labels = dict(_LABEL.findall(match[2]))
            labels.update(target, __name__=match[1])
            value = float(match[3])
            out.append(Series(tuple(sorted(labels.items())), (int(t * 1000),), (value,)))
    return out


def scripted_fleet() -> DcgmFleet:
    fleet = DcgmFleet(("node-a", "node-b"), 4)
    for (node, index), pods in HOLDERS.items():
        fleet.assign(node, index, *pods)
    for node, gpus in fleet.nodes.items():
        for gpu in gpus:
            busy = (node, gpu.index) in BUSY
            fleet.set(node, gpu.index, {
                "DCGM_FI_DEV_GPU_UTIL": 92.0 if busy else 0.0,
                "DCGM_FI_DEV_POWER_USAGE": BUSY_W if busy else IDLE_W,
                "DCGM_FI_DEV_FB_USED": 40_000.0 if busy else 0.0,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.9 if busy else 0.0,
            })  # fmt: skip
    return fleet


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> CollectorService:
    tmp: Path = tmp_path_factory.mktemp("prom")
    config = CollectorConfig(database=tmp / "c.db", recent_hours=6, step_seconds=STEP)
    svc = build_service(config, clock=lambda: END + STEP)
    # the Kubernetes job source lists the trainer (key by pod UID, id namespace/name, node only)
    trainer = Job(key="k8s:uid-trainer", scheduler="kubernetes", job_id="ml/trainer-0",
                  state=JobState.RUNNING, name="trainer-0", team="ml", gpus=2,
                  start_time=T0 - 600, allocations=(GpuAllocation("node-a"),))  # fmt: skip
    svc.registry.put([trainer])
    fleet = scripted_fleet()
    for k in range(HOURS * 3600 // STEP):
        if k:
            fleet.advance(STEP)
        out = translate(decode(encode(scrape_series(fleet, T0 + k * STEP))))
        # DCGM_FI_DEV_VGPU_LICENSE_STATUS maps to nothing of ours: a line per GPU and shared pod
        assert out.skipped_by_reason == {"unmapped": 8 + len(INFER) - 1}
        assert svc.accept(out.points, "prometheus") == 0
    return svc


def test_the_store_sees_each_gpu_once_as_the_agent_describes_it(service):
    gpus = sorted((g.node, g.index, g.model, g.uuid) for g in service.gpus())
    fleet = scripted_fleet()
    assert gpus == sorted(
        (node, gpu.index, gpu.model, gpu.uuid) for node, all_gpus in fleet.nodes.items()
        for gpu in all_gpus
    )  # fmt: skip
    latest = service.store.latest("hw.gpu.utilization")
    assert len(latest.series) == 8  # the time-sliced GPU once, not once per pod


def test_gpu_hours_per_job_match_the_script_within_one_percent(service):
    by_job = {t.group: t for t in totals(service.usage(T0, END))}
    hours = HOURS
    expected = {
        "k8s:uid-trainer": (2 * hours, 0.0),  # resolved to the Kubernetes source's job
        "k8s:research/notebook-7": (2 * hours, 2 * hours),  # idle all along
        "k8s:serve/infer-0": (hours / 2, 0.0),  # one GPU shared by two pods: half each
        "k8s:serve/infer-1": (hours / 2, 0.0),
        UNALLOCATED: (3 * hours, 3 * hours),  # node-b GPUs 1-3
    }
    assert set(by_job) == set(expected)
    for key, (gpu_h, idle_h) in expected.items():
        assert by_job[key].gpu_hours_allocated == pytest.approx(gpu_h, rel=0.01), key
        assert by_job[key].gpu_hours_idle == pytest.approx(idle_h, rel=0.01, abs=1e-9), key
    total = sum(t.gpu_hours_allocated for t in by_job.values())
    assert total == pytest.approx(8 * hours, rel=0.01)  # 8 GPUs, none counted twice


def test_energy_follows_the_counter(service):
    by_job = {t.group: t for t in totals(service.usage(T0, END))}
    # the shared GPU's energy is split between its two pods like its time
    expected_kwh = BUSY_W * HOURS / 1000 / 2
    assert by_job["k8s:serve/infer-0"].energy_kwh == pytest.approx(expected_kwh, rel=0.01)
    assert by_job["k8s:uid-trainer"].energy_kwh == pytest.approx(2 * BUSY_W * HOURS / 1000,
                                                                 rel=0.01)  # fmt: skip


def test_the_idle_pod_fires_idle_gpu_by_name(service):
    rule = make_rule("idle_gpu", "idle-gpu", window_seconds=1800.0, utilization_below=0.05)
    found = {f.subject: f for f in run_rule(service, rule, END)}
    assert found["k8s:research/notebook-7"].verdict is Verdict.FIRING
    assert found["k8s:uid-trainer"].verdict is not Verdict.FIRING
    evidence = dict(found["k8s:research/notebook-7"].evidence)
    assert evidence["idle_gpus"] == 2
    assert sorted(str(evidence["gpu_ids"]).split(",")) == [
        f"node-a/{scripted_fleet().gpu('node-a', i).uuid}" for i in (2, 3)
    ]


def test_a_pod_named_by_namespace_and_name_resolves_to_the_kubernetes_sources_key():
    def pod(uid: str, node: str, start: float) -> Job:
        return Job(key=f"k8s:{uid}", scheduler="kubernetes", job_id="ml/worker-0",
                   state=JobState.RUNNING, start_time=start,
                   allocations=(GpuAllocation(node),))  # fmt: skip

    with SqliteStorage(MEMORY) as storage:
        registry = JobRegistry(storage)
        unknown = registry.resolve("kubernetes", "ml/worker-0", "node-a")
        registry.put([pod("old", "node-a", T0), pod("new", "node-b", T0 + 60)])
        on_node = registry.resolve("kubernetes", "ml/worker-0", "node-a")
        elsewhere = registry.resolve("kubernetes", "ml/worker-0", "node-c")
        by_uid = registry.resolve("kubernetes", "a-pod-uid", "node-a")
    assert unknown == "k8s:ml/worker-0"  # no source knows it: the pod's own name
    assert on_node == "k8s:old"  # the pod of that name on the node first
    assert elsewhere == "k8s:new"  # then the latest started
    assert by_uid == "k8s:a-pod-uid"  # the agent's form is untouched


def test_a_scrape_interval_longer_than_the_step_still_bills_every_slot(tmp_path):
    """A Prometheus scraping every 15 s into a collector whose step is 10 s: every third slot
    holds no sample. A pod seen on its GPUs before and after such a slot held them through it
    (as utilisation does), so no GPU-hour is lost; before, the pods were billed 2/3 of their time.
    """
    step, hours = 10, 1
    end = T0 + hours * 3600
    config = CollectorConfig(database=tmp_path / "c.db", recent_hours=6, step_seconds=step)
    svc = build_service(config, clock=lambda: end + STEP)
    fleet = scripted_fleet()
    for k in range(hours * 3600 // STEP + 1):
        if k:
            fleet.advance(STEP)
        assert svc.accept(translate(decode(encode(scrape_series(fleet, T0 + k * STEP)))).points,
                          "prometheus") == 0  # fmt: skip
    by_job = {t.group: t for t in totals(svc.usage(T0, end))}
    notebook = by_job["k8s:research/notebook-7"]
    assert notebook.gpu_hours_allocated == pytest.approx(2 * hours, rel=0.01)
    assert by_job["k8s:serve/infer-0"].gpu_hours_allocated == pytest.approx(hours / 2, rel=0.01)
    total = sum(t.gpu_hours_allocated for t in by_job.values())
    assert total == pytest.approx(8 * hours, rel=0.01)  # nothing billed twice either
