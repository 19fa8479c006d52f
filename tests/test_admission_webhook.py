"""The Kubernetes validating webhook on the real collector app, over HTTPS on 127.0.0.1.

A throwaway CA signs the collector's certificate; the client trusts only that CA, as the API
server trusts the ``caBundle`` of a ValidatingWebhookConfiguration. The reviews are shaped as
kube-apiserver sends them (``admission.k8s.io/v1``: request uid, kind, resource, requestKind,
userInfo, the object, ``oldObject: null``, ``dryRun``, ``options``). Team ``ml`` already holds
6 GPUs in the job registry; the policy lets it hold 8 and any one of its jobs 4.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.collector.config import CollectorConfig, ConfigError, TlsSettings
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.policy.admission import AdmissionSettings
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.web.admission import REVIEW_PATH
from gpuwarden.collector.web.app import create_app
from gpuwarden.collector.web.tls import server_context
from tests.collector_server import CollectorThread
from tests.k8s_stub import KubeApiStub
from tests.test_build_actuators import TOKEN as KUBE_TOKEN
from tests.test_build_actuators import write_kubeconfig
from tests.test_tls import Authority

NOW = 1_700_002_800.0
ADMISSION_TOKEN = "admission-token-for-tests-0123456789"
READER_TOKEN = "reader-token-for-tests-0123456789"
MAX_REVIEW_BYTES = 256 * 1024
POLICIES = """\
version: 1
policies:
  - name: ml-gpus
    kind: limit
    selector: {teams: [ml]}
    max_gpus_per_job: 4
    max_gpus_per_team: 8
  - name: llama-gpus
    kind: limit
    selector: {models: ["llama-*"]}
    max_gpus_per_model: 3
"""
HELD = (
    # ml holds 6 GPUs: 4 running and 2 queued; its finished job does not count
    ("k8s:ml-a", JobState.RUNNING, "ml", 4, None),
    ("k8s:ml-b", JobState.PENDING, "ml", 2, "llama-70b"),
    ("k8s:ml-old", JobState.COMPLETED, "ml", 8, None),
    ("k8s:vision-a", JobState.RUNNING, "vision", 8, None),
)


def pod(name: str, gpus: int, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod as the API server puts it in a review: defaults filled in, one GPU container."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": "",
            "creationTimestamp": None,
            "labels": labels or {},
        },
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example/train:1",
                    "resources": {
                        "limits": {"nvidia.com/gpu": str(gpus), "cpu": "4"},
                        "requests": {"nvidia.com/gpu": str(gpus), "cpu": "4"},
                    },
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                },
                {"name": "log-shipper", "image": "registry.example/ship:2", "resources": {}},
            ],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {},
    }


def review(
    obj: dict[str, Any],
    *,
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
    operation: str = "CREATE",
    gvk: tuple[str, str, str] = ("", "v1", "Pod"),
    resource: str = "pods",
) -> dict[str, Any]:
    """The AdmissionReview kube-apiserver posts for ``obj``."""
    group, version, kind = gvk
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uid,
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": obj["metadata"].get("name", ""),
            "namespace": obj["metadata"].get("namespace", ""),
            "operation": operation,
            "userInfo": {
                "username": "alice@example.com",
                "uid": "c3a1",
                "groups": ["ml-team", "system:authenticated"],
            },
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def job(name: str, gpus_per_pod: int, parallelism: int) -> dict[str, Any]:
    """A batch/v1 Job of ``parallelism`` pods of ``gpus_per_pod`` GPUs, team label on its pods."""
    template = pod(name, gpus_per_pod, labels={"team": "ml"})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "research"},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }


@contextlib.contextmanager
def serving(folder: Path, **settings: Any) -> Iterator[tuple[CollectorThread, Path]]:
    """The collector over HTTPS (a throwaway CA), ``HELD`` in its registry, ``POLICIES``."""
    ca = Authority(folder, "gpuwarden test CA")
    server = ca.issue("collector", "collector", dns=("localhost",), ips=("127.0.0.1",))
    (folder / "policies").mkdir()
    (folder / "policies" / "limits.yaml").write_text(POLICIES)
    tls = TlsSettings(cert_file=server.cert, key_file=server.key)
    storage = SqliteStorage(":memory:", clock=lambda: NOW)
    store = WindowStore(step_seconds=10, recent_seconds=600, long_step_seconds=60, long_seconds=600)
    service = CollectorService(
        store=store, storage=storage, registry=JobRegistry(storage), clock=lambda: NOW
    )
    service.registry.put(
        Job(key=key, scheduler="kubernetes", job_id=key, state=state, team=team, gpus=n, model=m)
        for key, state, team, n, m in HELD
    )
    tokens = TokenTable(
        (
            credential(ADMISSION_TOKEN, Role.ADMISSION, "kube-apiserver"),
            credential(READER_TOKEN, Role.READER, "grafana"),
        )
    )
    keys = {"tokens": tokens, "tls": tls, "policies_dir": folder / "policies", **settings}
    try:
        with CollectorThread(service=service, settings=keys, ssl_context=server_context(tls)) as c:
            yield c, ca.ca_file
    finally:
        storage.close()


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CollectorThread, Path]]:
    folder = tmp_path_factory.mktemp("admission")
    with serving(folder, admission=AdmissionSettings(max_review_bytes=MAX_REVIEW_BYTES)) as c:
        yield c


def post(
    collector: tuple[CollectorThread, Path],
    body: bytes | dict[str, Any],
    *,
    token: str | None = ADMISSION_TOKEN,
    content_type: str = "application/json",
) -> tuple[int, dict[str, Any]]:
    """POST to the webhook as the API server does: HTTPS, trusting only the test CA."""
    thread, ca_file = collector
    context = ssl.create_default_context(cafile=str(ca_file))
    connection = http.client.HTTPSConnection("127.0.0.1", thread.port, context=context, timeout=10)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": content_type, "Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        connection.request("POST", REVIEW_PATH + "?timeout=10s", body=data, headers=headers)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        connection.close()


def verdict(
    collector: tuple[CollectorThread, Path], obj: dict[str, Any], **kw: Any
) -> dict[str, Any]:
    sent = review(obj, **kw)
    status, answer = post(collector, sent)
    assert status == 200, answer
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == sent["request"]["uid"]
    response: dict[str, Any] = answer["response"]
    return response


def test_a_pod_within_the_team_limit_is_allowed(collector):
    response = verdict(collector, pod("train-1", 2), uid="uid-allowed")
    assert response == {"uid": "uid-allowed", "allowed": True}


def test_a_pod_over_the_team_limit_is_denied_naming_policy_and_numbers(collector):
    response = verdict(collector, pod("train-2", 3))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert "team ml would hold 9 GPUs (6 held + 3 requested)" in message
    assert "policy ml-gpus allows at most 8 (max_gpus_per_team)" in message


def test_init_containers_count_by_their_max_against_the_job_limit(collector):
    obj = pod("train-3", 1)
    obj["metadata"]["namespace"] = "tools"
    obj["metadata"]["labels"] = {"team": "ml"}
    obj["spec"]["initContainers"] = [
        {"name": "warm-cache", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 5}}},
        {"name": "fetch", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
    ]
    response = verdict(collector, obj)
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "job tools/train-3 would hold 5 GPUs" in message
    assert "policy ml-gpus allows at most 4 (max_gpus_per_job)" in message


def test_another_team_and_other_operations_are_not_limited(collector):
    other = pod("render", 6)
    other["metadata"]["namespace"] = "vision"
    assert verdict(collector, other)["allowed"] is True
    assert verdict(collector, pod("train-4", 7), operation="UPDATE")["allowed"] is True
    deleted = review(pod("train-5", 7), operation="DELETE")
    deleted["request"]["object"] = None
    assert post(collector, deleted)[1]["response"]["allowed"] is True


def test_a_model_limit_counts_the_models_gpus(collector):
    obj = pod("serve", 2, labels={"gpuwarden.io/model": "llama-70b"})
    obj["metadata"]["namespace"] = "serving"
    response = verdict(collector, obj)
    assert response["allowed"] is False
    assert (
        "model llama-70b would hold 4 GPUs (2 held + 2 requested)" in response["status"]["message"]
    )


def test_a_batch_job_counts_parallelism_times_its_pods(collector):
    small = verdict(collector, job("sweep", 1, 2), gvk=("batch", "v1", "Job"), resource="jobs")
    assert small["allowed"] is True  # 6 + 2 <= 8
    big = verdict(collector, job("sweep", 2, 2), gvk=("batch", "v1", "Job"), resource="jobs")
    assert big["allowed"] is False
    assert "team ml would hold 10 GPUs (6 held + 4 requested)" in big["status"]["message"]


def test_a_kueue_workload_sums_its_pod_sets(collector):
    template = pod("w", 1, labels={"team": "ml"})
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {"name": "job-sweep-1a2b", "namespace": "research"},
        "spec": {
            "queueName": "user-queue",
            "podSets": [
                {
                    "name": "main",
                    "count": 3,
                    "template": {"metadata": template["metadata"], "spec": template["spec"]},
                },
            ],
        },
    }
    response = verdict(
        collector, workload, gvk=("kueue.x-k8s.io", "v1beta1", "Workload"), resource="workloads"
    )
    assert response["allowed"] is False
    assert "team ml would hold 9 GPUs (6 held + 3 requested)" in response["status"]["message"]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"{not json", "not an AdmissionReview"),
        (b"[]", "not an AdmissionReview"),
        (
            {
                "apiVersion": "admission.k8s.io/v1beta1",
                "kind": "AdmissionReview",
                "request": review(pod("p", 1))["request"],
            },
            "expected apiVersion admission.k8s.io/v1",
        ),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request"),
        (
            {**review(pod("p", 1)), "request": {**review(pod("p", 1))["request"], "uid": ""}},
            "request.uid",
        ),
    ],
)
def test_a_malformed_review_is_a_400_naming_the_problem(collector, body, why):
    status, answer = post(collector, body)
    assert status == 400
    assert why in answer["error"]


def test_a_pod_without_containers_or_with_a_fractional_gpu_is_a_400(collector):
    broken = review(pod("p", 1))
    del broken["request"]["object"]["spec"]["containers"]
    status, answer = post(collector, broken)
    assert (status, "request.object" in answer["error"]) == (400, True)
    fractional = review(pod("p", 1))
    limits = fractional["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]
    limits["nvidia.com/gpu"] = "500m"
    status, answer = post(collector, fractional)
    assert status == 400
    assert "containers[0].resources.limits[nvidia.com/gpu]" in answer["error"]


def test_an_oversized_review_is_a_413(collector):
    big = review(pod("p", 1))
    big["request"]["object"]["metadata"]["annotations"] = {"blob": "x" * MAX_REVIEW_BYTES}
    status, answer = post(collector, big)
    assert status == 413
    assert str(MAX_REVIEW_BYTES) in answer["error"]


def test_a_review_of_another_content_type_is_a_415(collector):
    status, _ = post(collector, review(pod("p", 1)), content_type="text/plain")
    assert status == 415


def test_only_an_admission_token_may_call(collector):
    assert post(collector, review(pod("p", 1)), token=None)[0] == 401
    assert post(collector, review(pod("p", 1)), token="wrong-token-0123456789abc")[0] == 401
    status, answer = post(collector, review(pod("p", 1)), token=READER_TOKEN)
    assert status == 403
    assert "role reader" in answer["error"]


def test_usage_is_read_from_the_registry_at_each_review(collector):
    """A job that ends frees its GPUs for the next review (usage is read per request)."""
    thread, _ = collector
    assert thread.service is not None
    before = verdict(collector, pod("train-6", 3))
    assert before["allowed"] is False
    ended = thread.service.registry.get("k8s:ml-b")
    assert ended is not None
    thread.service.registry.put(
        [
            Job(
                key=ended.key,
                scheduler=ended.scheduler,
                job_id=ended.job_id,
                state=JobState.COMPLETED,
                team="ml",
                gpus=2,
                model="llama-70b",
            )
        ]
    )
    try:
        assert verdict(collector, pod("train-6", 3))["allowed"] is True  # 4 + 3 <= 8
    finally:
        thread.service.registry.put([ended])


def test_a_namespace_label_names_the_team_of_an_unlabelled_pod(tmp_path):
    """``team_namespace_label``: the namespace is read from the Kubernetes API (the stub),
    once for two reviews (cached); a pod's own team label still wins."""
    with KubeApiStub([], token=KUBE_TOKEN) as stub:
        stub.objects.put(
            "/api/v1/namespaces/research",
            {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": "research", "labels": {"gpuwarden.io/team": "ml"}}},
        )  # fmt: skip
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", stub.url)
        admission = AdmissionSettings(team_namespace_label="gpuwarden.io/team")
        with serving(tmp_path, admission=admission, kubernetes_kubeconfig=kubeconfig) as c:
            unlabelled = pod("train-7", 3)
            unlabelled["metadata"]["namespace"] = "research"
            first, again = verdict(c, unlabelled), verdict(c, unlabelled)
            assert first == again
            assert first["allowed"] is False
            assert "team ml would hold 9 GPUs" in first["status"]["message"]
            labelled = pod("train-8", 3, labels={"team": "vision"})
            labelled["metadata"]["namespace"] = "research"
            assert verdict(c, labelled)["allowed"] is True
            elsewhere = pod("train-9", 3)
            elsewhere["metadata"]["namespace"] = "sandbox"  # no such namespace: its name
            assert verdict(c, elsewhere)["allowed"] is True
        reads = [r.path for r in stub.requests if r.path.startswith("/api/v1/namespaces/")]
        assert reads == ["/api/v1/namespaces/research", "/api/v1/namespaces/sandbox"]


def test_a_namespace_label_without_a_kubernetes_client_stops_the_start():
    admission = AdmissionSettings(team_namespace_label="gpuwarden.io/team")
    storage = SqliteStorage(":memory:")
    service = CollectorService(
        store=WindowStore(step_seconds=10, recent_seconds=60),
        storage=storage,
        registry=JobRegistry(storage),
    )
    config = CollectorConfig(admission=admission, allow_unauthenticated=True)
    try:
        with pytest.raises(ConfigError, match=r"^admission\.team_namespace_label: needs kube"):
            create_app(config, service=service, background=False)
    finally:
        storage.close()


def admission_counts(collector: tuple[CollectorThread, Path]) -> dict[tuple[str, str], float]:
    """``gpuwarden_admission_reviews_total`` from ``GET /metrics`` (a reader's token)."""
    thread, ca_file = collector
    context = ssl.create_default_context(cafile=str(ca_file))
    connection = http.client.HTTPSConnection("127.0.0.1", thread.port, context=context, timeout=10)
    try:
        connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {READER_TOKEN}"})
        answer = connection.getresponse()
        assert answer.status == 200
        text = answer.read().decode()
    finally:
        connection.close()
    return {
        (sample.labels["source"], sample.labels["verdict"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "gpuwarden_admission_reviews"
        for sample in family.samples
        if sample.name == "gpuwarden_admission_reviews_total"
    }


def test_verdicts_are_counted_on_metrics(collector):
    before = admission_counts(collector)
    verdict(collector, pod("count-1", 1))  # allowed
    verdict(collector, pod("count-2", 3))  # denied
    verdict(collector, pod("count-3", 3))  # denied
    assert post(collector, b"{")[0] == 400  # malformed
    after = admission_counts(collector)

    def delta(verdict: str) -> float:
        key = ("kubernetes", verdict)
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert (delta("allowed"), delta("denied"), delta("malformed")) == (1.0, 2.0, 1.0)
