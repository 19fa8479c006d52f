"""The Kubernetes actuator through the real client against the API stub: exact requests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient, Configuration

from gpuwarden.collector.remediate.actuators.base import ActionRequest, Outcome
from gpuwarden.collector.remediate.actuators.kubernetes import KubeCalls, KubernetesActuator
from tests.k8s_stub import KubeApiStub

TOKEN = "remediate-token"
DEPLOYMENT = "/apis/apps/v1/namespaces/serving/deployments/llm-small"
HPAS = "/apis/autoscaling/v2/namespaces/serving/horizontalpodautoscalers"
NODE = "/api/v1/nodes/gpu-node-7"
POD = "/api/v1/namespaces/research/pods/train-0"


def _deployment(replicas: int) -> dict[str, object]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm-small", "namespace": "serving"},
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas},
    }


def _hpa(min_replicas: int, max_replicas: int) -> dict[str, object]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "llm-small-hpa", "namespace": "serving"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm-small"},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
        },
    }


@pytest.fixture
def stub() -> Iterator[KubeApiStub]:
    with KubeApiStub([], token=TOKEN) as server:
        yield server


@pytest.fixture
def actuator(stub: KubeApiStub) -> Iterator[KubernetesActuator]:
    configuration = Configuration(host=stub.url, api_key={"authorization": f"Bearer {TOKEN}"})
    with ApiClient(configuration) as client:
        yield KubernetesActuator(KubeCalls(client))


def _request(kind: str, target: str, *, dry_run: bool = False, **params: int) -> ActionRequest:
    return ActionRequest(kind, target, "key", dry_run, params)


def _writes(stub: KubeApiStub) -> list[tuple[str, str, str | None, object, str | None]]:
    return [
        (r.method, r.path, r.content_type, r.body, r.query.get("dryRun"))
        for r in stub.requests
        if r.method != "GET"
    ]


def test_scale_up_patches_the_scale_subresource(
    stub: KubeApiStub, actuator: KubernetesActuator
) -> None:
    stub.objects.put(DEPLOYMENT, _deployment(2))
    version = stub.objects.get(DEPLOYMENT)["metadata"]["resourceVersion"]  # type: ignore[index]
    result = actuator.execute(_request("scale_up", "serving/llm-small", step_replicas=2))
    assert result.outcome is Outcome.DONE
    assert dict(result.undo) == {"replicas": 2, "set": 4}
    body = {"metadata": {"resourceVersion": version}, "spec": {"replicas": 4}}
    strategic = "application/strategic-merge-patch+json"
    assert _writes(stub) == [("PATCH", f"{DEPLOYMENT}/scale", strategic, body, None)]
    assert stub.objects.get(DEPLOYMENT)["spec"]["replicas"] == 4  # type: ignore[index]
    assert actuator.rollback(_request("scale_up", "serving/llm-small"), result).ok
    assert stub.objects.get(DEPLOYMENT)["spec"]["replicas"] == 2  # type: ignore[index]


def test_scale_up_dry_run_is_server_side(stub: KubeApiStub, actuator: KubernetesActuator) -> None:
    stub.objects.put(DEPLOYMENT, _deployment(2))
    result = actuator.execute(_request("scale_up", "serving/llm-small", dry_run=True))
    assert result.outcome is Outcome.DRY_RUN
    assert [write[4] for write in _writes(stub)] == ["All"]
    assert stub.objects.get(DEPLOYMENT)["spec"]["replicas"] == 2  # type: ignore[index]


def test_scale_up_raises_the_hpa_minimum_instead(
    stub: KubeApiStub, actuator: KubernetesActuator
) -> None:
    stub.objects.put(DEPLOYMENT, _deployment(3))
    stub.objects.put(f"{HPAS}/llm-small-hpa", _hpa(2, 10))
    result = actuator.execute(_request("scale_up", "serving/llm-small"))
    assert result.outcome is Outcome.DONE
    [(method, path, _, body, _)] = _writes(stub)
    assert (method, path) == ("PATCH", f"{HPAS}/llm-small-hpa")
    assert body["spec"] == {"minReplicas": 3}  # type: ignore[index]
    assert stub.objects.get(DEPLOYMENT)["spec"]["replicas"] == 3  # type: ignore[index]
    actuator.rollback(_request("scale_up", "serving/llm-small"), result)
    assert stub.objects.get(f"{HPAS}/llm-small-hpa")["spec"]["minReplicas"] == 2  # type: ignore[index]


def test_scale_up_at_the_cap_is_refused(stub: KubeApiStub, actuator: KubernetesActuator) -> None:
    stub.objects.put(DEPLOYMENT, _deployment(4))
    result = actuator.execute(_request("scale_up", "serving/llm-small", max_replicas=4))
    assert result.outcome is Outcome.REFUSED
    assert _writes(stub) == []


def test_missing_deployment_is_not_found(actuator: KubernetesActuator) -> None:
    assert actuator.execute(_request("scale_up", "serving/gone")).outcome is Outcome.NOT_FOUND


@pytest.mark.parametrize(
    "target", ["", "all", "*", "serving/*", "serving/all", "Serving/x", "a/b/c"]
)
def test_bad_targets_are_refused_without_a_call(
    stub: KubeApiStub, actuator: KubernetesActuator, target: str
) -> None:
    assert actuator.execute(_request("scale_up", target)).outcome is Outcome.REFUSED
    assert actuator.execute(_request("requeue", target)).outcome is Outcome.REFUSED
    assert stub.requests == []


def test_cordon_then_uncordon(stub: KubeApiStub, actuator: KubernetesActuator) -> None:
    stub.objects.put(NODE, {"kind": "Node", "metadata": {"name": "gpu-node-7"}, "spec": {}})
    result = actuator.execute(_request("drain", "gpu-node-7"))
    assert result.outcome is Outcome.DONE
    assert stub.objects.get(NODE)["spec"]["unschedulable"] is True  # type: ignore[index]
    again = actuator.execute(_request("drain", "gpu-node-7"))
    assert again.outcome is Outcome.ALREADY_DONE
    assert actuator.rollback(_request("drain", "gpu-node-7"), result).outcome is Outcome.DONE
    assert stub.objects.get(NODE)["spec"]["unschedulable"] is False  # type: ignore[index]
    for drain_target in ("node*", "ALL", ""):
        assert actuator.execute(_request("drain", drain_target)).outcome is Outcome.REFUSED
    assert actuator.execute(_request("drain", "all")).outcome is Outcome.REFUSED


def test_requeue_deletes_an_owned_pod_with_a_uid_precondition(
    stub: KubeApiStub, actuator: KubernetesActuator
) -> None:
    owner = {"kind": "Job", "name": "train", "uid": "j1", "controller": True}
    metadata = {"name": "train-0", "namespace": "research", "uid": "p1", "ownerReferences": [owner]}
    stub.objects.put(POD, {"kind": "Pod", "metadata": metadata})
    dry = actuator.execute(_request("requeue", "research/train-0", dry_run=True))
    assert dry.outcome is Outcome.DRY_RUN
    assert stub.objects.get(POD) is not None
    assert actuator.execute(_request("requeue", "research/train-0")).outcome is Outcome.DONE
    assert stub.objects.get(POD) is None
    deletes = [w for w in _writes(stub) if w[0] == "DELETE"]
    assert [(w[3], w[4]) for w in deletes] == [
        ({"preconditions": {"uid": "p1"}}, "All"),
        ({"preconditions": {"uid": "p1"}}, None),
    ]
    gone = actuator.execute(_request("requeue", "research/train-0"))
    assert gone.outcome is Outcome.NOT_FOUND


def test_requeue_refuses_a_bare_pod(stub: KubeApiStub, actuator: KubernetesActuator) -> None:
    metadata = {"name": "train-0", "namespace": "research", "uid": "p1"}
    stub.objects.put(POD, {"kind": "Pod", "metadata": metadata})
    assert actuator.execute(_request("requeue", "research/train-0")).outcome is Outcome.REFUSED
    assert stub.objects.get(POD) is not None


def test_stale_resource_version_is_a_conflict(stub: KubeApiStub) -> None:
    stub.objects.put(DEPLOYMENT, _deployment(1))
    status, body = stub.objects.write(
        "PATCH",
        f"{DEPLOYMENT}/scale",
        {},
        "application/merge-patch+json",
        {"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 5}},
    )
    assert (status, body["reason"]) == (409, "Conflict")
    assert stub.objects.get(DEPLOYMENT)["spec"]["replicas"] == 1  # type: ignore[index]
