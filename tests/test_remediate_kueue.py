"""Requeue through Kueue against the API stub, with a stand-in for Kueue's controller that
evicts a deactivated Workload the way Kueue does (condition ``Evicted``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from gpuwarden.collector.remediate.actuators.base import ActionRequest, Outcome
from gpuwarden.collector.remediate.actuators.kube_api import CustomObjects
from gpuwarden.collector.remediate.actuators.kubernetes import KubeCalls, KubernetesActuator
from gpuwarden.collector.remediate.actuators.kueue import KueueRequeue
from tests.k8s_stub import KubeApiStub

TOKEN = "remediate-token"
POD = "/api/v1/namespaces/research/pods/train-0"
WORKLOAD = "/apis/kueue.x-k8s.io/v1beta1/namespaces/research/workloads/job-train-5b7c1"
JOB_UID = "0b6c9e9e-4d4f-4f7e-9a59-7f0c6d3f2a11"


def pod() -> dict[str, Any]:
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": JOB_UID,
             "controller": True}  # fmt: skip
    return {
        "kind": "Pod",
        "metadata": {
            "name": "train-0",
            "namespace": "research",
            "uid": "p1",
            "ownerReferences": [owner],
        },
    }


def workload(active: bool = True) -> dict[str, Any]:
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": JOB_UID,
             "controller": True}  # fmt: skip
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {
            "name": "job-train-5b7c1",
            "namespace": "research",
            "ownerReferences": [owner],
        },
        "spec": {"active": active, "queueName": "team-a"},
        "status": {"conditions": [{"type": "Admitted", "status": "True"}]},
    }


class KueueController:
    """Evicts a Workload once it is inactive; admits it again once it is active."""

    def __init__(self, stub: KubeApiStub, *, evicts: bool = True) -> None:
        self._stub, self._evicts = stub, evicts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.evictions = 0

    def __enter__(self) -> KueueController:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            current = self._stub.objects.get(WORKLOAD)
            if current is None or not self._evicts:
                continue
            types = {c["type"] for c in current["status"]["conditions"] if c["status"] == "True"}
            if current["spec"]["active"] is False and "Evicted" not in types:
                current["status"]["conditions"] = [
                    {"type": "Evicted", "status": "True", "reason": "InactiveWorkload"}
                ]
                self._stub.objects.put(WORKLOAD, current)
                self.evictions += 1


@pytest.fixture
def stub() -> Iterator[KubeApiStub]:
    with KubeApiStub([], token=TOKEN) as server:
        yield server


def actuator(stub: KubeApiStub, timeout: float = 5.0) -> tuple[KubernetesActuator, ApiClient]:
    configuration = Configuration(host=stub.url, api_key={"authorization": f"Bearer {TOKEN}"})
    client = ApiClient(configuration)
    kueue = KueueRequeue(CustomObjects(client), evict_timeout_seconds=timeout, poll_seconds=0.02)
    return KubernetesActuator(KubeCalls(client), kueue=kueue), client


def request(dry_run: bool = False) -> ActionRequest:
    return ActionRequest("requeue", "research/train-0", "key", dry_run, {})


def patches(stub: KubeApiStub) -> list[tuple[object, str | None, str | None]]:
    return [
        (r.body, r.content_type, r.query.get("dryRun"))
        for r in stub.requests
        if r.method == "PATCH" and r.path == WORKLOAD
    ]


def test_a_kueue_job_is_requeued_through_its_workload(stub: KubeApiStub) -> None:
    stub.objects.put(POD, pod())
    stub.objects.put(WORKLOAD, workload())
    act, client = actuator(stub)
    with client, KueueController(stub) as kueue:
        dry = act.execute(request(dry_run=True))
        assert dry.outcome is Outcome.DRY_RUN
        assert kueue.evictions == 0  # nothing was stored
        done = act.execute(request())
    assert done.outcome is Outcome.DONE, done.detail
    assert "deactivated, evicted, reactivated" in done.detail
    merge = "application/merge-patch+json"
    assert patches(stub) == [
        ({"spec": {"active": False}}, merge, "All"),
        ({"spec": {"active": False}}, merge, None),
        ({"spec": {"active": True}}, merge, None),
    ]
    assert stub.objects.get(POD) is not None  # the pod is Kueue's to stop, not ours to delete
    final = stub.objects.get(WORKLOAD)
    assert final is not None
    assert final["spec"]["active"] is True


def test_no_eviction_in_time_reactivates_and_fails(stub: KubeApiStub) -> None:
    stub.objects.put(POD, pod())
    stub.objects.put(WORKLOAD, workload())
    act, client = actuator(stub, timeout=0.2)
    with client, KueueController(stub, evicts=False):
        result = act.execute(request())
    assert result.outcome is Outcome.FAILED
    assert "did not evict" in result.detail
    final = stub.objects.get(WORKLOAD)
    assert final is not None
    assert final["spec"]["active"] is True  # never left held by us


def test_an_inactive_workload_is_someone_elses_hold(stub: KubeApiStub) -> None:
    stub.objects.put(POD, pod())
    stub.objects.put(WORKLOAD, workload(active=False))
    act, client = actuator(stub)
    with client:
        result = act.execute(request())
    assert result.outcome is Outcome.REFUSED
    assert patches(stub) == []


def test_without_a_workload_the_pod_is_deleted(stub: KubeApiStub) -> None:
    stub.objects.put(POD, pod())
    act, client = actuator(stub)
    with client:
        result = act.execute(request())
    assert result.outcome is Outcome.DONE
    assert stub.objects.get(POD) is None
