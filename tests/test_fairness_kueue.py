"""Kueue admission in fairness: Workloads read through the official client from the local API
stub (shaped like ``kueue.x-k8s.io/v1beta1`` objects), merged with the pods of the Kubernetes job
source, each job counted once."""

from __future__ import annotations

import argparse
import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from gpuwarden.collector.accounting.report import add_report_parser, run_report
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import load_collector_config
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.fairness.figures import fairness_figures
from gpuwarden.collector.fairness.kueue import runs_with_workloads
from gpuwarden.collector.jobs import JobSourceError
from gpuwarden.collector.jobs.kube_client import KubeApis
from gpuwarden.collector.jobs.kubernetes import KubernetesJobSource
from gpuwarden.collector.jobs.kueue_workloads import (
    KueueWorkload,
    KueueWorkloadReader,
    parse_workload,
)
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import RuleSet
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.records import IncidentState
from gpuwarden.collector.web.exposition_fairness import fairness_families
from tests.detectors import make_rule, run_rule
from tests.k8s_stub import KubeApiStub
from tests.test_build_actuators import TOKEN, write_kubeconfig

T0 = 1_740_830_400.0  # 2025-03-01T12:00:00Z
H = 3600.0
NOW = T0 + 4 * H
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/namespaces/{ns}/workloads/{name}"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, status: str, at: float, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": "",
        "observedGeneration": 1,
        "lastTransitionTime": iso(at),
    }


def gpu_container(gpus: int) -> dict[str, Any]:
    return {
        "name": "train",
        "image": "trainer:1",
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "4"}},
    }


def workload(
    ns: str,
    name: str,
    *,
    created: float,
    owner: tuple[str, str] = ("Job", ""),
    queue: str = "lq-gpu",
    count: int = 2,
    gpus: int = 4,
    conditions: list[Any] | None = None,
) -> dict[str, Any]:
    """A Workload as Kueue writes it for a batch Job (name ``job-<job>-<hash>``)."""
    kind, owner_name = owner
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "namespace": ns,
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": iso(created),
            "labels": {"kueue.x-k8s.io/job-uid": f"uid-{owner_name}"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1" if kind == "Job" else "v1",
                    "kind": kind,
                    "name": owner_name,
                    "uid": f"uid-{owner_name}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "active": True,
            "queueName": queue,
            "priority": 0,
            "priorityClassSource": "",
            "podSets": [
                {
                    "name": "main",
                    "count": count,
                    "template": {"spec": {"containers": [gpu_container(gpus)]}},
                }
            ],
        },
        "status": {"conditions": conditions or []},
    }


def admitted(at: float) -> list[dict[str, Any]]:
    return [
        condition("QuotaReserved", "True", at, "QuotaReserved"),
        condition("Admitted", "True", at, "Admitted"),
    ]


def pod(
    ns: str, name: str, *, owner: str, created: float, started: float, team: str, gpus: int = 4
) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": ns,
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": iso(created),
            "labels": {"team": team, "kueue.x-k8s.io/queue-name": "lq-gpu"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": owner,
                    "uid": f"uid-{owner}",
                    "controller": True,
                },
            ],
        },
        "spec": {"containers": [gpu_container(gpus)], "nodeName": "gpu-1"},
        "status": {"phase": "Running", "startTime": iso(started)},
    }


@contextmanager
def apis(stub: KubeApiStub) -> Iterator[KubeApis]:
    configuration = Configuration(
        host=stub.url, api_key={"authorization": f"Bearer {TOKEN}"}, retries=0
    )
    with ApiClient(configuration) as client:
        yield KubeApis(client)


def read(stub: KubeApiStub, **options: Any) -> tuple[list[Any], list[KueueWorkload]]:
    with apis(stub) as kube:
        jobs = KubernetesJobSource(kube.core()).jobs(NOW)
        found = KueueWorkloadReader(kube.custom_objects(), **options).workloads()
    return jobs, found


@pytest.fixture
def cluster() -> Iterator[KubeApiStub]:
    """Team nlp: job ``train-a`` admitted after 1 h in Kueue, its 2 pods running;
    team vision: ``train-b`` still queued in Kueue (no pods); ``train-c`` evicted (preempted)
    and requeued; one GPU pod of team research without any Workload."""
    pods = [
        pod(
            "nlp", "train-a-0", owner="train-a", created=T0 + H + 5, started=T0 + H + 60, team="nlp"
        ),
        pod(
            "nlp", "train-a-1", owner="train-a", created=T0 + H + 5, started=T0 + H + 90, team="nlp"
        ),
        pod("research", "notebook", owner="", created=T0, started=T0 + 30, team="research", gpus=1),
    ]
    pods[2]["metadata"]["ownerReferences"] = []
    del pods[2]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    with KubeApiStub(pods, token=TOKEN) as stub:
        stub.objects.put(
            WORKLOADS.format(ns="nlp", name="job-train-a-1f2e3"),
            workload(
                "nlp",
                "job-train-a-1f2e3",
                created=T0,
                owner=("Job", "train-a"),
                conditions=admitted(T0 + H),
            ),
        )
        stub.objects.put(
            WORKLOADS.format(ns="vision", name="job-train-b-4a5b6"),
            workload(
                "vision",
                "job-train-b-4a5b6",
                created=T0 + H,
                owner=("Job", "train-b"),
                queue="lq-vision",
                count=1,
                gpus=8,
                conditions=[condition("QuotaReserved", "False", T0 + H, "Pending")],
            ),
        )
        stub.objects.put(
            WORKLOADS.format(ns="vision", name="job-train-c-7c8d9"),
            workload(
                "vision",
                "job-train-c-7c8d9",
                created=T0,
                owner=("Job", "train-c"),
                queue="lq-vision",
                count=1,
                gpus=2,
                conditions=[
                    condition("QuotaReserved", "False", T0 + 2 * H, "Pending"),
                    condition("Admitted", "False", T0 + 2 * H, "NoReservation"),
                    condition("Evicted", "True", T0 + 2 * H, "Preempted"),
                    condition("Preempted", "True", T0 + 2 * H, "InClusterQueue"),
                    condition("Requeued", "True", T0 + 2 * H, "Preempted"),
                ],
            ),
        )
        yield stub


def test_workloads_are_read_in_all_namespaces_with_the_fields_fairness_needs(cluster):
    _, found = read(cluster)
    by_name = {w.name: w for w in found}
    assert sorted(by_name) == ["job-train-a-1f2e3", "job-train-b-4a5b6", "job-train-c-7c8d9"]
    a, b, c = (by_name[n] for n in sorted(by_name))
    assert (a.namespace, a.queue, a.gpus) == ("nlp", "lq-gpu", 8)  # 2 pods × 4 GPUs
    assert (a.created_time, a.admitted_time, a.evicted_time) == (T0, T0 + H, None)
    assert a.owners == (("Job", "train-a"),)
    assert (b.queue, b.gpus, b.admitted_time) == ("lq-vision", 8, None)
    assert (c.admitted_time, c.evicted_time, c.eviction_reason) == (None, T0 + 2 * H, "Preempted")
    assert cluster.requests[-1].path == "/apis/kueue.x-k8s.io/v1beta1/workloads"


def test_a_cluster_without_kueue_has_no_workloads(cluster):
    cluster.absent_resources.add("workloads")
    assert read(cluster)[1] == []
    assert cluster.requests[-1].status == 404


def test_mig_slices_count_as_gpus():
    item = workload("nlp", "mig", created=T0, count=3)
    item["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"nvidia.com/mig-1g.10gb": "2", "cpu": "1"}
    }
    parsed = parse_workload(item)
    assert parsed is not None
    assert parsed.gpus == 6


def test_a_workload_without_gpus_is_not_a_job():
    runs = runs_with_workloads([], [evicted_workload(gpus=0)], since=T0)
    assert runs == []


def test_one_namespace_lists_only_its_workloads(cluster):
    _, found = read(cluster, namespace="vision")
    assert sorted(w.name for w in found) == ["job-train-b-4a5b6", "job-train-c-7c8d9"]


def test_a_refused_list_is_a_job_source_error(cluster):
    with apis(cluster) as kube:
        reader = KueueWorkloadReader(kube.custom_objects())
        cluster.token = "another-token"
        with pytest.raises(JobSourceError, match="401"):
            reader.workloads()


def test_admitted_pending_and_evicted_workloads_and_their_pods_count_once(cluster):
    jobs, found = read(cluster)
    assert len(jobs) == 3  # train-a's two pods and the notebook
    runs = runs_with_workloads(jobs, found, since=T0)
    assert sorted(r.key for r in runs) == [
        "k8s:uid-notebook",
        "kueue:uid-job-train-a-1f2e3",
        "kueue:uid-job-train-b-4a5b6",
        "kueue:uid-job-train-c-7c8d9",
        "kueue:uid-job-train-c-7c8d9#evicted",
    ]
    figures = fairness_figures(runs, since=T0, until=NOW, targets={})
    nlp, vision, research = (figures.team(t) for t in ("nlp", "vision", "research"))
    assert nlp is not None
    assert vision is not None
    assert research is not None
    # Admitted: waited creation → admission (1 h), not pod creation → start (55 s);
    # holds 8 GPUs from admission to now, its pods are not counted again.
    assert (nlp.runs, nlp.pending, nlp.waits) == (1, 0, 1)
    assert nlp.wait_p50_seconds == H
    assert nlp.gpu_seconds == 8 * (NOW - (T0 + H))
    # Pending in Kueue (train-b: 3 h so far) and requeued after its eviction (train-c: 2 h).
    assert (vision.pending, vision.waits, vision.runs) == (2, 2, 0)
    assert vision.wait_p95_seconds == pytest.approx(3 * H - 0.05 * H)
    assert (vision.preemptions, vision.gpu_seconds) == (1, 0.0)
    # No Workload: today's pod timings.
    assert (research.runs, research.wait_p50_seconds, research.gpu_seconds) == (
        1,
        30.0,
        NOW - 30 - T0,
    )
    queues = {q.group: q for q in figures.queues}
    assert sorted(queues) == ["lq-gpu", "lq-vision", "research"]
    assert queues["lq-vision"].pending == 2


def evicted_workload(**fields: Any) -> KueueWorkload:
    base: dict[str, Any] = {
        "namespace": "nlp", "name": "w", "uid": "u", "queue": "lq", "owners": (), "labels": {},
        "gpus": 4, "created_time": T0, "admitted_time": None, "evicted_time": T0 + 3 * H,
        "eviction_reason": "Preempted", "requeued_time": T0 + 3 * H, "finished_time": None,
    }  # fmt: skip
    return KueueWorkload(**{**base, **fields})


EVICTION_CASES = [  # the Workload, (preemptions, pending, GPU-hours lost)
    # Kueue has not released the quota yet: the admission is known, 2 h × 4 GPUs lost
    (evicted_workload(admitted_time=T0 + H, requeued_time=None), (1, 0, 8.0)),
    # released and requeued: waits again
    (evicted_workload(), (1, 1, 0.0)),
    # released, in its requeue backoff (Requeued false): not waiting yet
    (evicted_workload(requeued_time=None), (1, 0, 0.0)),
    # deactivated (spec.active false): not waiting
    (evicted_workload(active=False, eviction_reason="Deactivated"), (1, 0, 0.0)),
]


@pytest.mark.parametrize(("evicted", "want"), EVICTION_CASES)
def test_an_eviction_is_a_preemption_and_a_requeued_workload_waits_again(evicted, want):
    runs = runs_with_workloads([], [evicted], since=T0)
    team = fairness_figures(runs, since=T0, until=NOW, targets={}).team("nlp")
    assert team is not None
    assert (team.preemptions, team.pending, team.preempted_gpu_hours) == want


def test_a_readmitted_workload_is_admitted_again(cluster):
    """After a new admission Kueue turns Evicted and Preempted back to False."""
    cluster.objects.put(
        WORKLOADS.format(ns="vision", name="job-train-c-7c8d9"),
        workload("vision", "job-train-c-7c8d9", created=T0, owner=("Job", "train-c"),
                 queue="lq-vision", count=1, gpus=2, conditions=[
                     *admitted(T0 + 3 * H),
                     condition("Evicted", "False", T0 + 3 * H, "QuotaReserved"),
                     condition("Preempted", "False", T0 + 3 * H, "QuotaReserved"),
                     condition("Requeued", "True", T0 + 2 * H, "Preempted"),
                 ]),
    )  # fmt: skip
    _, found = read(cluster, namespace="vision")
    runs = {r.key: r for r in runs_with_workloads([], found, since=T0)}
    readmitted = runs["kueue:uid-job-train-c-7c8d9"]
    assert (readmitted.start_time, readmitted.preempted) == (T0 + 3 * H, False)
    assert "kueue:uid-job-train-c-7c8d9#evicted" not in runs


def test_pod_integration_workload_owned_by_the_pod_is_the_same_job():
    """Kueue's pod integration: the Workload is owned by the (gated) pod itself."""
    with KubeApiStub(
        [pod("nlp", "solo", owner="x", created=T0, started=T0 + 2 * H, team="nlp")], token=TOKEN
    ) as stub:
        stub.objects.put(
            WORKLOADS.format(ns="nlp", name="pod-solo-0a1b2"),
            workload(
                "nlp",
                "pod-solo-0a1b2",
                created=T0,
                owner=("Pod", "solo"),
                count=1,
                conditions=admitted(T0 + 2 * H),
            ),
        )
        stub.pods[0]["metadata"]["ownerReferences"] = []
        jobs, found = read(stub)
    runs = runs_with_workloads(jobs, found, since=T0)
    assert [r.key for r in runs] == ["kueue:uid-pod-solo-0a1b2"]
    assert runs[0].team == "nlp"
    assert runs[0].start_time == T0 + 2 * H


# --- report fairness --db --kueue ---------------------------------------------------------------


def report(*args: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_report_parser(parser.add_subparsers(dest="command", required=True))
    out = io.StringIO()
    return run_report(parser.parse_args(["report", "fairness", *args]), out=out), out.getvalue()


def test_report_adds_the_workloads_to_the_stored_pods(cluster, tmp_path, capsys):
    """The collector polls the pods into its database; the report reads the Workloads through
    the same config's Kubernetes client: train-a waited 1 h in Kueue, train-b and train-c wait."""
    config = tmp_path / "collector.yaml"
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster.url)
    config.write_text(f"database: {tmp_path / 'c.db'}\nkubernetes_kubeconfig: {kubeconfig}\n")
    service = build_service(load_collector_config(config), clock=lambda: NOW)
    assert service.poll_jobs(NOW) == 3
    service.storage.close()
    common = ["--db", str(tmp_path / "c.db"), "--since", "4h", "--until", str(NOW)]
    code, text = report(*common, "--config", str(config), "--format", "json", "--kueue")
    assert code == 0
    teams = {t["group"]: t for t in json.loads(text)["teams"]}
    assert (teams["nlp"]["runs"], teams["nlp"]["wait_p50_seconds"]) == (1, H)
    assert (teams["vision"]["pending"], teams["vision"]["preemptions"]) == (2, 1)
    code, text = report(*common, "--config", str(config), "--format", "json")
    teams = {t["group"]: t for t in json.loads(text)["teams"]}
    assert (teams["nlp"]["runs"], teams["nlp"]["wait_p50_seconds"]) == (2, 70.0)  # pods only
    assert "vision" not in teams
    code, _ = report(*common, "--kueue")
    assert code == 1
    assert "--kueue needs --config with kubernetes_kubeconfig" in capsys.readouterr().err


# --- live: the collector polls the Workloads; /metrics and the rules read them -----------------


@pytest.fixture
def queued_cluster() -> Iterator[KubeApiStub]:
    """Team vision: ``train-b`` queued in Kueue since 3 h ago (8 GPUs, LocalQueue lq-vision, no
    pods yet); team nlp: a pod without any Workload, started 1 min after its creation."""
    pods = [pod("nlp", "serve-0", owner="serve", created=T0 + H, started=T0 + H + 60, team="nlp")]
    with KubeApiStub(pods, token=TOKEN) as stub:
        stub.objects.put(
            WORKLOADS.format(ns="vision", name="job-train-b-4a5b6"),
            workload(
                "vision",
                "job-train-b-4a5b6",
                created=T0 + H,
                owner=("Job", "train-b"),
                queue="lq-vision",
                count=1,
                gpus=8,
                conditions=[condition("QuotaReserved", "False", T0 + H, "Pending")],
            ),
        )
        yield stub


def live_service(stub: KubeApiStub, tmp_path: Path) -> CollectorService:
    config = tmp_path / "collector.yaml"
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", stub.url)
    config.write_text(f"database: {tmp_path / 'c.db'}\nkubernetes_kubeconfig: {kubeconfig}\n")
    return build_service(load_collector_config(config), clock=lambda: NOW)


def fairness_samples(service: CollectorService) -> dict[tuple[str, frozenset[Any]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in fairness_families(service, NOW, 24 * H)
        for s in family.samples
    }


def test_polled_workloads_are_in_metrics_and_the_starved_rule(queued_cluster, tmp_path):
    service = live_service(queued_cluster, tmp_path)
    try:
        assert ("gpuwarden_fairness_pending_jobs", frozenset({("team", "vision")})) not in (
            fairness_samples(service)
        )  # not polled yet: only what the registry holds is read
        result = service.registry.poll(NOW)
        assert (result.jobs, result.failed_sources) == (1, ())
        got = fairness_samples(service)
        vision, nlp = frozenset({("team", "vision")}), frozenset({("team", "nlp")})
        assert got[("gpuwarden_fairness_pending_jobs", vision)] == 1
        assert got[("gpuwarden_fairness_wait_seconds", vision | {("quantile", "0.5")})] == 3 * H
        assert got[("gpuwarden_fairness_wait_seconds", nlp | {("quantile", "0.5")})] == 60
        lq = frozenset({("queue", "lq-vision"), ("quantile", "0.95")})
        assert got[("gpuwarden_fairness_queue_wait_seconds", lq)] == 3 * H

        found = run_rule(service, make_rule("team_starved", window_seconds=6 * H), NOW)
        starved = {f.facts.team: f for f in found}["vision"]
        assert starved.verdict is Verdict.FIRING
        assert (starved.evidence["pending"], starved.evidence["job"]) == (
            1,
            "kueue:uid-job-train-b-4a5b6",
        )
    finally:
        service.storage.close()


def test_a_failed_list_keeps_the_last_workloads_and_logs_once(queued_cluster, tmp_path, caplog):
    service = live_service(queued_cluster, tmp_path)
    try:
        service.registry.poll(NOW)
        queued_cluster.token = "another-token"  # the API now refuses every call (401)
        with caplog.at_level(logging.WARNING, logger="gpuwarden.collector.jobs.registry"):
            assert service.registry.poll(NOW).failed_sources == ("kubernetes", "kueue")
            service.registry.poll(NOW)
        assert [w.name for w in service.registry.kueue_workloads()] == ["job-train-b-4a5b6"]
        kueue_logs = [r for r in caplog.records if "Kueue Workloads failed" in r.getMessage()]
        assert len(kueue_logs) == 1
        assert "401" in kueue_logs[0].getMessage()
    finally:
        service.storage.close()


def test_a_forked_detection_cycle_sees_the_polled_workloads(queued_cluster, tmp_path):
    """The default team-starved rule, run by the engine in a forked child: the child reads the
    registry's Workloads as they were at the fork and the incident is about team vision."""
    service = live_service(queued_cluster, tmp_path)
    try:
        service.registry.poll(NOW)
        rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
        starved = rules.get("team-starved")
        assert starved is not None
        engine = DetectionEngine(
            service.detection_view, RuleSet((starved,)), storage=service.storage, fork=True
        )
        result = engine.run_cycle(now=NOW)
        assert (result.failed_rules, result.opened) == ((), 1)
        (incident,) = service.storage.incidents(state=IncidentState.OPEN)
        assert (incident.rule_id, incident.evidence["job"]) == (
            "team-starved",
            "kueue:uid-job-train-b-4a5b6",
        )
    finally:
        service.storage.close()
