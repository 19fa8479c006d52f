"""The Kubernetes adapter, through the official client, against a local stub of the pod list API."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration, CoreV1Api

from gpuwarden.collector.jobs import JobSourceError
from gpuwarden.collector.jobs.kube_client import KubeApis, load_client
from gpuwarden.collector.jobs.kubernetes import (
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    KubernetesJobSource,
)
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from tests.k8s_stub import KubeApiStub

DATA = Path(__file__).parent / "data" / "k8s"
TOKEN = "gw-collector-token-7f3a9c"
NOW = 1_740_830_400.0


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def fixture_pods() -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = json.loads((DATA / "pods.json").read_text())["items"]
    return pods


def fixture_pod(name: str) -> dict[str, Any]:
    return copy.deepcopy(next(pod for pod in fixture_pods() if pod["metadata"]["name"] == name))


@pytest.fixture
def stub() -> Iterator[KubeApiStub]:
    with KubeApiStub(fixture_pods(), token=TOKEN) as server:
        yield server


@contextmanager
def core_api(host: str, token: str = TOKEN) -> Iterator[CoreV1Api]:
    """The official client, configured as for a service account token, closed afterwards."""
    configuration = Configuration(
        host=host,
        api_key={"authorization": f"Bearer {token}"},
        no_proxy="127.0.0.1",
        retries=0,
    )
    with ApiClient(configuration) as client:
        yield CoreV1Api(client)


def list_jobs(host: str, **options: Any) -> dict[str, Job]:
    with core_api(host) as api:
        return {job.job_id: job for job in KubernetesJobSource(api, **options).jobs(NOW)}


def test_gpu_pods_are_jobs_and_cpu_only_pods_are_not(stub: KubeApiStub) -> None:
    jobs = list_jobs(stub.url)

    assert sorted(jobs) == [
        "inference/embed-worker-84f5d7c9b-h7v2n",
        "inference/llm-serving-7d9f6c5b8-x2k4q",
        "research/eval-sweep-7",
        "research/finetune-batch-5xq7m",
        "research/notebook-alice",
        "research/train-resnet-worker-0",
    ]
    request = stub.requests[0]
    assert (request.path, request.authorization) == ("/api/v1/pods", f"Bearer {TOKEN}")
    assert request.query["limit"] == "500"


def test_running_serving_pod_maps_every_field(stub: KubeApiStub) -> None:
    job = list_jobs(stub.url)["inference/llm-serving-7d9f6c5b8-x2k4q"]

    assert job == Job(
        key="k8s:0b7c9a52-3c1e-4f7a-9d0e-1f2a3b4c5d6e",
        scheduler="kubernetes",
        job_id="inference/llm-serving-7d9f6c5b8-x2k4q",
        state=JobState.RUNNING,
        name="llm-serving-7d9f6c5b8-x2k4q",
        owner="ReplicaSet/llm-serving-7d9f6c5b8",
        team="search",
        gpus=1,
        allocations=(GpuAllocation(node="gpu-node-03"),),
        submit_time=ts("2025-03-01T10:00:00+00:00"),
        start_time=ts("2025-03-01T10:00:01+00:00"),
        end_time=None,
        priority=100000,
        model="llama-3-8b-instruct",
        price_tier="premium",
        restarts=2,
        labels=MappingProxyType(
            {
                "app.kubernetes.io/name": "llm-serving",
                "gpuwarden.io/model": "llama-3-8b-instruct",
                "gpuwarden.io/price-tier": "premium",
                "pod-template-hash": "7d9f6c5b8",
                "team": "search",
            }
        ),
    )


@pytest.mark.parametrize(
    ("job_id", "state", "gpus", "owner", "team", "allocations", "end_time"),
    [
        (
            "research/train-resnet-worker-0",
            JobState.COMPLETED,
            8,
            "PyTorchJob/train-resnet",
            "research",  # no team label: the namespace
            (),
            ts("2025-03-01T06:30:10+00:00"),
        ),
        # Unschedulable, two containers asking for MIG slices of two profiles (1 + 2).
        ("research/notebook-alice", JobState.PENDING, 3, "alice", "research", (), None),
        # DisruptionTarget=True (PreemptionByScheduler), phase Failed.
        (
            "research/finetune-batch-5xq7m",
            JobState.PREEMPTED,
            4,
            "Job/finetune-batch",
            "nlp",
            (),
            ts("2025-03-01T09:12:30+00:00"),
        ),
        # reason Evicted; the kubelet lost the container, so no finishedAt.
        (
            "inference/embed-worker-84f5d7c9b-h7v2n",
            JobState.PREEMPTED,
            1,
            "ReplicaSet/embed-worker-84f5d7c9b",
            "search",
            (),
            None,
        ),
        (
            "research/eval-sweep-7",
            JobState.FAILED,
            2,
            None,
            "nlp",
            (),
            ts("2025-03-01T09:41:02+00:00"),
        ),
    ],
)
def test_phases_owners_and_gpus(
    stub: KubeApiStub,
    job_id: str,
    state: JobState,
    gpus: int,
    owner: str | None,
    team: str,
    allocations: tuple[GpuAllocation, ...],
    end_time: float | None,
) -> None:
    job = list_jobs(stub.url)[job_id]

    assert (job.state, job.gpus, job.owner, job.team) == (state, gpus, owner, team)
    assert (job.allocations, job.end_time) == (allocations, end_time)


def test_labels_give_model_and_price_tier(stub: KubeApiStub) -> None:
    jobs = list_jobs(stub.url)

    assert (
        jobs["research/train-resnet-worker-0"].model,
        jobs["research/train-resnet-worker-0"].price_tier,
    ) == (
        "resnet-152",
        None,
    )
    assert jobs["research/finetune-batch-5xq7m"].price_tier == "spot"
    assert jobs["inference/embed-worker-84f5d7c9b-h7v2n"].restarts == 1


def test_label_names_are_configurable(stub: KubeApiStub) -> None:
    jobs = list_jobs(
        stub.url,
        team_label="app",
        model_label="training.kubeflow.org/job-name",
        price_tier_label="sweep",
    )

    assert jobs["inference/embed-worker-84f5d7c9b-h7v2n"].team == "embed-worker"
    assert jobs["research/train-resnet-worker-0"].model == "train-resnet"
    assert jobs["research/eval-sweep-7"].price_tier == "eval-7"


def test_one_namespace(stub: KubeApiStub) -> None:
    jobs = list_jobs(stub.url, namespace="research")

    assert sorted(jobs) == [
        "research/eval-sweep-7",
        "research/finetune-batch-5xq7m",
        "research/notebook-alice",
        "research/train-resnet-worker-0",
    ]
    assert [request.path for request in stub.requests] == ["/api/v1/namespaces/research/pods"]


def test_a_namespace_that_does_not_exist_lists_empty(stub: KubeApiStub) -> None:
    # kube-apiserver answers 200 with no items rather than 404 (it hides which namespaces exist).
    assert list_jobs(stub.url, namespace="no-such-namespace") == {}
    assert [request.status for request in stub.requests] == [200]


def test_pages_are_followed(stub: KubeApiStub) -> None:
    jobs = list_jobs(stub.url, page_size=3)

    assert len(jobs) == 6
    assert [request.query.get("limit") for request in stub.requests] == ["3", "3", "3"]
    assert "continue" not in stub.requests[0].query
    assert all(request.query["continue"] for request in stub.requests[1:])


def test_forbidden_is_a_job_source_error(stub: KubeApiStub) -> None:
    stub.forbidden = True

    with pytest.raises(
        JobSourceError, match=r"403 Forbidden: pods is forbidden: User .* cannot list"
    ):
        list_jobs(stub.url)


def test_a_wrong_token_is_a_job_source_error(stub: KubeApiStub) -> None:
    with (
        core_api(stub.url, token="not-the-token") as api,
        pytest.raises(JobSourceError, match="401 Unauthorized"),
    ):
        KubernetesJobSource(api).jobs(NOW)


def test_a_wrong_api_path_is_a_job_source_error(stub: KubeApiStub) -> None:
    with pytest.raises(JobSourceError, match="404 Not Found: the server could not find"):
        list_jobs(f"{stub.url}/not-the-api-server")


def test_an_unreachable_server_is_a_job_source_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port any more: connection refused.
    with pytest.raises(JobSourceError, match="unreachable"):
        list_jobs(f"http://127.0.0.1:{port}")


def test_an_unreadable_pod_list_is_a_job_source_error() -> None:
    broken = fixture_pod("eval-sweep-7")
    del broken["spec"]["containers"]  # required by the PodSpec schema
    with (
        KubeApiStub([broken], token=TOKEN) as server,
        pytest.raises(JobSourceError, match="unreadable pod list"),
    ):
        list_jobs(server.url)


def _with_resources(pod: dict[str, Any], **resources: Any) -> dict[str, Any]:
    pod["spec"]["containers"][0]["resources"] = resources
    return pod


def _renamed(pod: dict[str, Any], name: str) -> dict[str, Any]:
    pod["metadata"]["name"] = name
    pod["metadata"]["uid"] = f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}"
    return pod


def test_gpu_counting_rules() -> None:
    base = "eval-sweep-7"
    requests_only = _with_resources(
        _renamed(fixture_pod(base), "requests-only"), requests={"nvidia.com/gpu": "2"}
    )
    limits_win = _with_resources(
        _renamed(fixture_pod(base), "limits-win"),
        limits={"nvidia.com/gpu": "3"},
        requests={"nvidia.com/gpu": "1"},
    )
    init_heavy = _renamed(fixture_pod(base), "init-heavy")
    init_heavy["spec"]["initContainers"] = [
        {"name": "warmup", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
    ]
    sidecar = _renamed(fixture_pod(base), "sidecar")
    sidecar["spec"]["initContainers"] = [
        {
            "name": "profiler",
            "image": "busybox",
            "restartPolicy": "Always",
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        }
    ]
    amd = _with_resources(_renamed(fixture_pod(base), "amd"), limits={"amd.com/gpu": "1"})
    zero = _with_resources(_renamed(fixture_pod(base), "zero"), limits={"nvidia.com/gpu": "0"})
    pods = [requests_only, limits_win, init_heavy, sidecar, amd, zero]

    with KubeApiStub(pods, token=TOKEN) as server:
        jobs = list_jobs(server.url, gpu_resource_names=("nvidia.com/gpu", "amd.com/gpu"))

    gpus = {job_id.split("/")[1]: job.gpus for job_id, job in jobs.items()}
    assert gpus == {
        "requests-only": 2,
        "limits-win": 3,
        "init-heavy": 4,  # the init container alone outweighs the containers
        "sidecar": 3,  # a sidecar runs beside the containers: 2 + 1
        "amd": 1,
    }


def test_labels_are_bounded() -> None:
    pod = fixture_pod("eval-sweep-7")
    pod["metadata"]["labels"] = {f"label-{index:02d}": "v" * 300 for index in range(40)}

    with KubeApiStub([pod], token=TOKEN) as server:
        (job,) = list_jobs(server.url).values()

    assert len(job.labels) == MAX_LABELS
    assert sorted(job.labels)[0] == "label-00"
    assert {len(value) for value in job.labels.values()} == {MAX_LABEL_VALUE_CHARS}


def test_a_running_pod_marked_for_disruption_is_preempted_and_keeps_its_node() -> None:
    pod = fixture_pod("llm-serving-7d9f6c5b8-x2k4q")
    pod["status"]["conditions"].append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": "2025-03-01T11:00:00Z",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
        }
    )

    with KubeApiStub([pod], token=TOKEN) as server:
        (job,) = list_jobs(server.url).values()

    assert job.state is JobState.PREEMPTED
    assert job.allocations == (GpuAllocation(node="gpu-node-03"),)
    assert job.end_time is None


def write_kubeconfig(path: Path, server: str, token: str = TOKEN) -> Path:
    """A kubeconfig with one context whose user authenticates with a bearer token."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "lab", "cluster": {"server": server}}],
                "users": [{"name": "gpuwarden", "user": {"token": token}}],
                "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "gpuwarden"}}],
                "current-context": "lab",
            }
        )
    )
    return path


def test_the_collector_config_wires_the_adapter_from_a_kubeconfig(
    stub: KubeApiStub, tmp_path: Path
) -> None:
    from gpuwarden.collector.build import build_service
    from gpuwarden.collector.config import CollectorConfig

    config = CollectorConfig(
        database=tmp_path / "c.db",
        kubernetes_kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", stub.url),
        kubernetes_namespace="research",
    )
    service = build_service(config, clock=lambda: NOW)
    service.poll_jobs(NOW)
    expected = {job.key for job in list_jobs(stub.url, namespace="research").values()}
    seen = {job.key for job in service.registry.known()}
    assert expected
    assert expected <= seen
    assert all(job.scheduler == "kubernetes" for job in service.registry.known())
    assert any("/namespaces/research/pods" in r.path for r in stub.requests)
    service.storage.close()


def test_a_missing_kubeconfig_or_an_unknown_context_is_a_config_error(
    stub: KubeApiStub, tmp_path: Path
) -> None:
    from gpuwarden.agent.config import ConfigError
    from gpuwarden.collector.build import build_service
    from gpuwarden.collector.config import CollectorConfig

    with pytest.raises(ConfigError, match="does not exist"):
        build_service(
            CollectorConfig(database=tmp_path / "c.db", kubernetes_kubeconfig=tmp_path / "nope")
        )
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", stub.url)
    with pytest.raises(ConfigError, match="kubernetes") as info:
        build_service(
            CollectorConfig(
                database=tmp_path / "d.db",
                kubernetes_kubeconfig=kubeconfig,
                kubernetes_context="elsewhere",
            )
        )
    assert TOKEN not in str(info.value)
    with pytest.raises(ConfigError, match="exclude"):
        CollectorConfig(kubernetes_kubeconfig=kubeconfig, kubernetes_in_cluster=True)


def test_the_client_factory_imports_the_client_only_when_used() -> None:
    code = (
        "import sys\n"
        "from gpuwarden.collector.jobs import kube_client\n"
        "assert 'kubernetes' not in sys.modules, 'imported at import time'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_client_factory_hands_out_apis_over_one_client(stub: KubeApiStub) -> None:
    configuration = Configuration(host=stub.url, api_key={"authorization": f"Bearer {TOKEN}"})
    with ApiClient(configuration) as client:
        apis = KubeApis(client)
        assert apis.core().api_client is client
        assert apis.apps().api_client is client
        assert apis.autoscaling().api_client is client
        assert apis.custom_objects().api_client is client


def test_a_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    with pytest.raises(JobSourceError, match=r"kubeconfig .*nope does not exist"):
        load_client(kubeconfig=tmp_path / "nope")
