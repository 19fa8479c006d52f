"""Degrade/restore on Kubernetes (HTTPRoute JSON patch, KServe canary) against the API stub."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from gpuwarden.collector.remediate.actuators.base import ActionRequest, Outcome
from gpuwarden.collector.remediate.actuators.kube_api import (
    JSON_PATCH,
    MERGE_PATCH,
    CustomObjects,
)
from gpuwarden.collector.remediate.actuators.routing import (
    HTTPRouteBinding,
    InferenceServiceBinding,
    KubernetesRoutingActuator,
)
from tests.k8s_stub import KubeApiStub

TOKEN = "routing-token"
ROUTE = "/apis/gateway.networking.k8s.io/v1/namespaces/serving/httproutes/llm"
ISVC = "/apis/serving.kserve.io/v1beta1/namespaces/serving/inferenceservices/chat"
BINDINGS: dict[str, HTTPRouteBinding | InferenceServiceBinding] = {
    "serving/llm-big": HTTPRouteBinding("serving", "llm", "llm-big", "llm-small"),
    "serving/chat": InferenceServiceBinding("serving", "chat"),
}


def _route() -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "llm", "namespace": "serving"},
        "spec": {
            "rules": [
                {"backendRefs": [{"name": "other", "port": 80}]},
                {
                    "backendRefs": [
                        {"name": "llm-big", "port": 8000, "weight": 90},
                        {"name": "llm-small", "port": 8000, "weight": 10},
                    ]
                },
                {
                    "backendRefs": [
                        {"name": "llm-small", "port": 8000},
                        {"name": "llm-big", "port": 8000},
                    ]
                },
            ]
        },
    }


@pytest.fixture
def stub() -> Iterator[KubeApiStub]:
    with KubeApiStub([], token=TOKEN) as server:
        server.objects.put(ROUTE, _route())
        isvc = {"kind": "InferenceService", "metadata": {"name": "chat", "namespace": "serving"}}
        server.objects.put(ISVC, {**isvc, "spec": {"predictor": {"model": {}}}})
        yield server


@pytest.fixture
def actuator(stub: KubeApiStub) -> Iterator[KubernetesRoutingActuator]:
    configuration = Configuration(host=stub.url, api_key={"authorization": f"Bearer {TOKEN}"})
    with ApiClient(configuration) as client:
        yield KubernetesRoutingActuator(CustomObjects(client), BINDINGS)


def _degrade(target: str, *, ratio: float = 0.75, dry_run: bool = False) -> ActionRequest:
    return ActionRequest("degrade", target, "key", dry_run, {"traffic_ratio": ratio})


def _weights(stub: KubeApiStub) -> list[list[tuple[str, Any]]]:
    route = stub.objects.get(ROUTE)
    assert route is not None
    return [
        [(ref["name"], ref.get("weight")) for ref in rule["backendRefs"]]
        for rule in route["spec"]["rules"]
    ]


def test_degrade_json_patches_weights_and_rollback_restores_them(
    stub: KubeApiStub, actuator: KubernetesRoutingActuator
) -> None:
    before = _weights(stub)
    version = stub.objects.get(ROUTE)["metadata"]["resourceVersion"]  # type: ignore[index]
    result = actuator.execute(_degrade("serving/llm-big"))
    assert result.outcome is Outcome.DONE
    assert _weights(stub) == [
        [("other", None)],
        [("llm-big", 25), ("llm-small", 75)],
        [("llm-small", 75), ("llm-big", 25)],
    ]
    [patch] = [r for r in stub.requests if r.method == "PATCH"]
    assert patch.content_type == JSON_PATCH
    assert patch.body[:3] == [
        {"op": "test", "path": "/spec/rules/1/backendRefs/0/name", "value": "llm-big"},
        {"op": "replace", "path": "/spec/rules/1/backendRefs/0/weight", "value": 25},
        {"op": "test", "path": "/spec/rules/1/backendRefs/1/name", "value": "llm-small"},
    ]
    assert {"op": "add", "path": "/spec/rules/2/backendRefs/0/weight", "value": 75} in patch.body
    assert patch.body[-1] == {
        "op": "replace",
        "path": "/metadata/resourceVersion",
        "value": version,
    }
    assert actuator.rollback(_degrade("serving/llm-big"), result).outcome is Outcome.DONE
    assert _weights(stub) == before


def test_degrade_dry_run_changes_nothing(
    stub: KubeApiStub, actuator: KubernetesRoutingActuator
) -> None:
    before = _weights(stub)
    assert actuator.execute(_degrade("serving/llm-big", dry_run=True)).outcome is Outcome.DRY_RUN
    assert [r.query.get("dryRun") for r in stub.requests if r.method == "PATCH"] == ["All"]
    assert _weights(stub) == before


def test_second_degrade_is_already_done(actuator: KubernetesRoutingActuator) -> None:
    assert actuator.execute(_degrade("serving/llm-big")).outcome is Outcome.DONE
    assert actuator.execute(_degrade("serving/llm-big")).outcome is Outcome.ALREADY_DONE


def test_kserve_canary_percent_and_rollback(
    stub: KubeApiStub, actuator: KubernetesRoutingActuator
) -> None:
    result = actuator.execute(_degrade("serving/chat", ratio=0.3))
    assert result.outcome is Outcome.DONE
    isvc = stub.objects.get(ISVC)
    assert isvc is not None
    assert isvc["spec"]["predictor"] == {"model": {}, "canaryTrafficPercent": 30}
    [patch] = [r for r in stub.requests if r.method == "PATCH"]
    assert patch.content_type == MERGE_PATCH
    assert actuator.rollback(_degrade("serving/chat"), result).outcome is Outcome.DONE
    assert stub.objects.get(ISVC)["spec"]["predictor"] == {"model": {}}  # type: ignore[index]


@pytest.mark.parametrize("target", ["serving/unbound", "", "all", "*"])
def test_unbound_targets_are_refused(
    stub: KubeApiStub, actuator: KubernetesRoutingActuator, target: str
) -> None:
    assert actuator.execute(_degrade(target)).outcome is Outcome.REFUSED
    assert stub.requests == []


def test_missing_route_is_not_found(stub: KubeApiStub) -> None:
    configuration = Configuration(host=stub.url, api_key={"authorization": f"Bearer {TOKEN}"})
    bindings = {"serving/x": HTTPRouteBinding("serving", "gone", "a", "b")}
    with ApiClient(configuration) as client:
        actuator = KubernetesRoutingActuator(CustomObjects(client), bindings)
        assert actuator.execute(_degrade("serving/x")).outcome is Outcome.NOT_FOUND


def test_stub_refuses_strategic_merge_on_a_crd_and_stale_json_patch(stub: KubeApiStub) -> None:
    status, _ = stub.objects.write(
        "PATCH", ROUTE, {}, "application/strategic-merge-patch+json", {"spec": {}}
    )
    assert status == 415
    stale = [{"op": "replace", "path": "/metadata/resourceVersion", "value": "1"}]
    status, body = stub.objects.write("PATCH", ROUTE, {}, JSON_PATCH, stale)
    assert (status, body["reason"]) == (409, "Conflict")
