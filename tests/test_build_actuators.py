"""Actuators enabled from the collector config: the keys, what gets built, who owns which target,
and the built actuators acting on the Kubernetes API stub, a served router and a webhook."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import MappingProxyType

import pytest

from gpuwarden.agent.config import ConfigError
from gpuwarden.collector.alerts.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from gpuwarden.collector.build import build_actuators as build_actuators_from_build
from gpuwarden.collector.config import CollectorConfig, load_collector_config
from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.remediate.actuators.base import ActionRequest, Actuator, Outcome
from gpuwarden.collector.remediate.actuators.build import build_actuators
from gpuwarden.collector.remediate.actuators.http_router import HttpRouterActuator
from gpuwarden.collector.remediate.actuators.kubernetes import KubernetesActuator
from gpuwarden.collector.remediate.actuators.ownership import NodeOwnership, OwnedActuator
from gpuwarden.collector.remediate.actuators.routing import KubernetesRoutingActuator
from gpuwarden.collector.remediate.actuators.settings import (
    HTTPRouteTarget,
    InferenceServiceTarget,
    RouteSpec,
    WebhookEndpoint,
)
from gpuwarden.collector.remediate.actuators.slurm import SlurmActuator
from gpuwarden.collector.remediate.actuators.webhook import WebhookActuator
from gpuwarden.collector.remediate.policy import PolicyConfig
from gpuwarden.collector.remediate.remediator import Remediator, Targeted
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.demo_router import RouterState, create_router_app
from tests.capture_servers import Capture, ServedApp, webhook_app
from tests.k8s_stub import KubeApiStub
from tests.test_remediator import FakeClock, make_rule, open_incident

TOKEN = "build-actuators-token"
DEPLOYMENT = "/apis/apps/v1/namespaces/serving/deployments/llm-small"
HTTPROUTE = "/apis/gateway.networking.k8s.io/v1/namespaces/serving/httproutes/llm"
POD = "/api/v1/namespaces/research/pods/train-0"
POD_UID = "0b7c9a52-3c1e-4f7a-9d0e-1f2a3b4c5d6e"
K8S_NODE = "/api/v1/nodes/k8s-gpu-1"
SECRET = "webhook-secret-0123456789abcdef"


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig whose one context authenticates to ``server`` with a bearer token."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "lab", "cluster": {"server": server}}],
                "users": [{"name": "gpuwarden", "user": {"token": TOKEN}}],
                "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "gpuwarden"}}],
                "current-context": "lab",
            }
        ),
        encoding="utf-8",
    )
    return path


def load(tmp_path: Path, text: str) -> CollectorConfig:
    path = tmp_path / "collector.yaml"
    path.write_text(f"database: {tmp_path / 'c.db'}\n{text}", encoding="utf-8")
    return load_collector_config(path)


def owners(actuators: Sequence[Actuator], kind: str, target: str) -> list[str]:
    """The actuators the remediator could pick for ``kind`` on ``target`` (names of systems)."""
    found = [a for a in actuators if kind in a.kinds]
    if len(found) > 1:  # as Remediator._actuator_or_none: several → ask each accepts(target)
        found = [a for a in found if isinstance(a, Targeted) and a.accepts(target)]
    return [type(getattr(a, "inner", a)).__name__ for a in found]


@pytest.fixture
def stub() -> Iterator[KubeApiStub]:
    with KubeApiStub([], token=TOKEN) as server:
        yield server


@pytest.fixture
def kubeconfig(tmp_path: Path, stub: KubeApiStub) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", stub.url)


# Config keys -------------------------------------------------------------------------------------

EXAMPLE = """\
slurm_cluster: prod-a
slurm_action_nodes: ["dgx-*"]
kubernetes_kubeconfig: {kubeconfig}
kubernetes_actions: true
kubernetes_action_nodes: ["k8s-gpu-*"]
kubernetes_routes:
  serving/llm-large: {{httproute: llm, primary: llm-large, fallback: llm-small}}
  serving/chat: {{inferenceservice: kserve/chat}}
router_url: http://router.serving:8080
router_token_file: {token_file}
router_routes:
  llama-70b: {{route: llama, primary: llama-70b, fallback: llama-8b}}
webhooks:
  ticketing: {{url: "https://tickets.example.com/hook", secret_env: GPUWARDEN_TICKETING_SECRET}}
  runner: {{url: "http://127.0.0.1:9/hook", secret_file: /etc/s, timeout_seconds: 3}}
"""


def test_the_defaults_enable_no_actuator(tmp_path: Path) -> None:
    config = load_collector_config(None)
    assert not config.kubernetes_actions
    assert config.kubernetes_routes == {}
    assert config.router_url is None
    assert config.router_routes == {}
    assert config.webhooks == {}
    assert build_actuators(CollectorConfig(database=tmp_path / "c.db").actuators, {}) == []


def test_every_actuator_key_parses_into_frozen_values(tmp_path: Path) -> None:
    text = EXAMPLE.format(kubeconfig=tmp_path / "kc", token_file=tmp_path / "router-token")
    config = load(tmp_path, text)
    assert config.kubernetes_actions is True
    assert config.slurm_action_nodes == ("dgx-*",)
    assert config.kubernetes_action_nodes == ("k8s-gpu-*",)
    assert dict(config.kubernetes_routes) == {
        "serving/llm-large": HTTPRouteTarget("serving", "llm", "llm-large", "llm-small"),
        "serving/chat": InferenceServiceTarget("kserve", "chat"),
    }
    assert config.router_url == "http://router.serving:8080"
    assert config.router_token_file == tmp_path / "router-token"
    assert dict(config.router_routes) == {"llama-70b": RouteSpec("llama", "llama-70b", "llama-8b")}
    assert dict(config.webhooks) == {
        "ticketing": WebhookEndpoint(
            "https://tickets.example.com/hook", secret_env="GPUWARDEN_TICKETING_SECRET"
        ),
        "runner": WebhookEndpoint("http://127.0.0.1:9/hook", Path("/etc/s"), None, 3.0),
    }
    assert isinstance(config.webhooks, MappingProxyType)
    with pytest.raises(TypeError):
        config.webhooks["other"] = config.webhooks["runner"]  # type: ignore[index]


KC = "kubernetes_kubeconfig: /etc/kc\n"
ROUTE = "{httproute: llm, primary: a, fallback: b}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kubernetes_action: true\n", "unknown key 'kubernetes_action'"),
        ("kubernetes_actions: yes please\n", "kubernetes_actions: expected true or false"),
        ("kubernetes_actions: true\n", "need kubernetes_kubeconfig or kubernetes_in_cluster"),
        (
            "kubernetes_routes: {serving/llm: " + ROUTE + "}\n",
            "need kubernetes_kubeconfig or kubernetes_in_cluster",
        ),
        (KC + "kubernetes_action_nodes: [k8s-*]\n", "needs kubernetes_actions: true"),
        (KC + "kubernetes_kueue: true\n", "kubernetes_kueue needs kubernetes_actions: true"),
        ("slurm_action_nodes: [dgx-*]\n", "slurm_action_nodes needs slurm_cluster"),
        (
            "slurm_cluster: a\nslurm_action_nodes: ['gpu *']\n",
            "slurm_action_nodes[0]: expected a node-name glob",
        ),
        (
            "slurm_cluster: a\n" + KC + "kubernetes_actions: true\n",
            "both drain nodes: set slurm_action_nodes and/or kubernetes_action_nodes",
        ),
        (
            KC + "kubernetes_routes: {llm: " + ROUTE + "}\n",
            "kubernetes_routes.llm: expected '<namespace>/<name>'",
        ),
        (
            KC + "kubernetes_routes: [serving/llm]\n",
            "kubernetes_routes: expected a mapping",
        ),
        (
            KC + "kubernetes_routes: {serving/llm: {httproute: llm, primary: a}}\n",
            "kubernetes_routes.serving/llm.fallback: required with httproute",
        ),
        (
            KC + "kubernetes_routes: {serving/llm: {httproute: llm, inferenceservice: x}}\n",
            "serving/llm: set exactly one of httproute, inferenceservice",
        ),
        (
            KC + "kubernetes_routes: {serving/llm: {inferenceservice: x, primary: a}}\n",
            "primary/fallback go with httproute only",
        ),
        (
            KC + "kubernetes_routes: {serving/llm: {httproute: Llm_1, primary: a, fallback: b}}\n",
            "httproute: expected a Kubernetes object name or '<namespace>/<name>', got 'Llm_1'",
        ),
        (
            KC + "kubernetes_routes: {serving/llm: {httproute: llm, primary: a, fallback: a}}\n",
            "primary and fallback are the same backend",
        ),
        (
            KC
            + "kubernetes_routes: {serving/llm: {httproute: l, primary: a, fallback: b, w: 1}}\n",
            "serving/llm: unknown key 'w'",
        ),
        ("router_url: http://router:8080\n", "router_url and router_routes go together"),
        (
            "router_url: ftp://router\nrouter_routes: {m: {route: r, primary: a, fallback: b}}\n",
            "router_url must be an http(s) URL",
        ),
        (
            "router_url: http://r\nrouter_routes: {m: {primary: a, fallback: b}}\n",
            "router_routes.m.route: required",
        ),
        ("router_token_file: /etc/t\n", "router_token_file needs router_url"),
        (
            KC + "kubernetes_routes: {serving/llm: " + ROUTE + "}\n"
            "router_url: http://r\n"
            "router_routes: {serving/llm: {route: r, primary: a, fallback: b}}\n",
            "deployment 'serving/llm' is in both kubernetes_routes and router_routes",
        ),
        ("webhooks: {ticketing: {url: 'https://t/h'}}\n", "webhooks.ticketing: set secret_file"),
        (
            "webhooks: {Tick: {url: 'https://t/h', secret_env: S}}\n",
            "webhooks.Tick: expected a webhook name",
        ),
        ("webhooks: {t: {url: 'ftp://t/h', secret_env: S}}\n", "webhooks.t.url: expected an http"),
        (
            "webhooks: {t: {url: 'http://t', secret_env: 1X}}\n",
            "secret_env: expected an environment",
        ),
        (
            "webhooks: {t: {url: 'http://t', secret_env: S, timeout_seconds: 0}}\n",
            "webhooks.t.timeout_seconds: expected a positive number",
        ),
        ("webhooks: {t: {url: 'http://t', secret: hunter2}}\n", "webhooks.t: unknown key 'secret'"),
    ],
)
def test_bad_actuator_keys_are_errors_naming_the_file_and_key(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert str(tmp_path / "collector.yaml") in str(info.value)
    assert message in str(info.value)
    assert "hunter2" not in str(info.value)


# What gets built ---------------------------------------------------------------------------------


def test_slurm_alone_is_the_plain_slurm_actuator_as_before(tmp_path: Path) -> None:
    built = build_actuators_from_build(load(tmp_path, "slurm_cluster: prod-a\n"), {})
    assert len(built) == 1
    assert isinstance(built[0], SlurmActuator)
    assert built[0].accepts("any-node-7")


def test_each_key_builds_its_actuator(tmp_path: Path, kubeconfig: Path) -> None:
    (tmp_path / "router-token").write_text("router-token-0123456789\n", encoding="utf-8")
    (tmp_path / "s").write_text(SECRET, encoding="utf-8")
    text = EXAMPLE.format(kubeconfig=kubeconfig, token_file=tmp_path / "router-token")
    config = load(tmp_path, text.replace("/etc/s", str(tmp_path / "s")))
    built = build_actuators(config.actuators, {"GPUWARDEN_TICKETING_SECRET": SECRET})
    kinds = [type(getattr(a, "inner", a)).__name__ for a in built]
    assert kinds == [
        "SlurmActuator",
        "KubernetesActuator",
        "KubernetesRoutingActuator",
        "HttpRouterActuator",
        "WebhookActuator",
    ]
    assert all(isinstance(a, OwnedActuator) for a in built[:2])
    assert isinstance(built[2], KubernetesRoutingActuator)
    assert built[2].accepts("serving/llm-large")
    assert built[2].accepts("serving/chat")
    assert isinstance(built[3], HttpRouterActuator)
    assert built[3].accepts("llama-70b")
    assert isinstance(built[4], WebhookActuator)
    webhook = ActionRequest("webhook", "gpu-01", "k", True, {"name": "ticketing"})
    assert built[4].execute(webhook).outcome is Outcome.DRY_RUN
    # the remediator takes them: every kind served twice has accepts(target)
    with SqliteStorage(tmp_path / "r.db") as storage:
        Remediator(storage, [make_rule()], built, config=PolicyConfig())


def test_unusable_client_or_secret_settings_fail_at_start_naming_the_key(
    tmp_path: Path, kubeconfig: Path
) -> None:
    missing = load(
        tmp_path, f"kubernetes_kubeconfig: {tmp_path / 'nope'}\nkubernetes_actions: true\n"
    )
    with pytest.raises(ConfigError, match=r"kubernetes_actions: kubeconfig .* does not exist"):
        build_actuators(missing.actuators, {})
    hooks = load(tmp_path, "webhooks: {ticketing: {url: 'https://t/h', secret_env: HOOK}}\n")
    with pytest.raises(ConfigError, match=r"webhooks\.ticketing: .*no secret"):
        build_actuators(hooks.actuators, {})
    short = "too-short"
    with pytest.raises(ConfigError, match="shorter than 16 bytes") as info:
        build_actuators(hooks.actuators, {"HOOK": short})
    assert short not in str(info.value)
    router = load(
        tmp_path,
        f"router_url: http://r\nrouter_token_file: {tmp_path / 'no-token'}\n"
        "router_routes: {m: {route: r, primary: a, fallback: b}}\n",
    )
    with pytest.raises(ConfigError, match=r"router_token_file .*no-token: cannot read"):
        build_actuators(router.actuators, {})


# Who owns which target when Slurm and Kubernetes both act -------------------------------------


def both(tmp_path: Path, kubeconfig: Path, nodes: str) -> list[Actuator]:
    config = load(
        tmp_path,
        f"slurm_cluster: prod-a\nkubernetes_kubeconfig: {kubeconfig}\n"
        f"kubernetes_actions: true\n{nodes}",
    )
    lookup = {
        f"k8s:{POD_UID}": Job(f"k8s:{POD_UID}", "kubernetes", "research/train-0", JobState.RUNNING),
        "k8s:bare-uid": Job("k8s:bare-uid", "kubernetes", "bare-uid", JobState.RUNNING),
    }
    return build_actuators(config.actuators, {}, jobs=lookup.get)


@pytest.mark.parametrize(
    ("kind", "target", "expected"),
    [
        ("requeue", "slurm:prod-a:4242", ["SlurmActuator"]),
        ("requeue", "slurm:prod-a:4242_3", ["SlurmActuator"]),
        ("requeue", "slurm:other:4242", []),  # another cluster's job: nobody's
        ("requeue", f"k8s:{POD_UID}", ["KubernetesActuator"]),
        ("requeue", "k8s:unknown-uid", []),  # not in the registry: no pod to delete
        ("requeue", "k8s:bare-uid", []),  # registry entry without a pod name
        ("requeue", "research/train-0", ["KubernetesActuator"]),
        ("drain", "dgx-07", ["SlurmActuator"]),
        ("drain", "k8s-gpu-1", ["KubernetesActuator"]),
        ("drain", "cpu-1", []),  # in neither list of globs: proposed, never guessed
        ("drain", "all", []),
        ("scale_up", "serving/llm-small", ["KubernetesActuator"]),
    ],
)
def test_each_target_goes_to_its_scheduler(
    tmp_path: Path, kubeconfig: Path, kind: str, target: str, expected: list[str]
) -> None:
    nodes = "slurm_action_nodes: [dgx-*]\nkubernetes_action_nodes: [k8s-gpu-*]\n"
    assert owners(both(tmp_path, kubeconfig, nodes), kind, target) == expected


def test_one_list_of_globs_gives_the_other_scheduler_the_rest(
    tmp_path: Path, kubeconfig: Path
) -> None:
    built = both(tmp_path, kubeconfig, "kubernetes_action_nodes: [k8s-*]\n")
    assert owners(built, "drain", "k8s-gpu-1") == ["KubernetesActuator"]
    assert owners(built, "drain", "dgx-07") == ["SlurmActuator"]
    assert owners(built, "drain", "cpu-1") == ["SlurmActuator"]


def test_a_node_both_lists_match_belongs_to_neither(tmp_path: Path, kubeconfig: Path) -> None:
    built = both(
        tmp_path, kubeconfig, "slurm_action_nodes: [gpu-*]\nkubernetes_action_nodes: [gpu-k*]\n"
    )
    assert owners(built, "drain", "gpu-k1") == []
    assert owners(built, "drain", "gpu-s1") == ["SlurmActuator"]
    refused = built[0].execute(ActionRequest("drain", "gpu-k1", "k", True))
    assert refused.outcome is Outcome.REFUSED
    assert "not a Slurm target" in refused.detail


@pytest.mark.parametrize(
    ("globs", "node", "owner"),
    [
        ({"slurm": ()}, "anything", "slurm"),
        ({"slurm": ("dgx-*",)}, "k8s-1", None),
        ({"slurm": (), "kubernetes": ()}, "gpu-1", None),
        ({"slurm": ("dgx-*",), "kubernetes": ()}, "gpu-1", "kubernetes"),
        ({"slurm": ("dgx-*",), "kubernetes": ("gpu-[0-4]",)}, "gpu-3", "kubernetes"),
        ({"slurm": ("dgx-*",), "kubernetes": ("gpu-[0-4]",)}, "gpu-5", None),
        ({"slurm": ("*",), "kubernetes": ("k8s-*",)}, "k8s-1", None),
    ],
)
def test_node_ownership_table(
    globs: dict[str, tuple[str, ...]], node: str, owner: str | None
) -> None:
    assert NodeOwnership(MappingProxyType(globs)).owner(node) == owner


# Built from config, acting on the API stub, a router and a webhook receiver ---------------------


def _deployment(replicas: int) -> dict[str, object]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm-small", "namespace": "serving"},
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas},
    }


def _kubernetes(built: Sequence[Actuator]) -> Actuator:
    found = [a for a in built if isinstance(getattr(a, "inner", None), KubernetesActuator)]
    assert len(found) == 1
    return found[0]


def test_a_configured_kubernetes_actuator_scales_a_deployment_dry_run_then_for_real(
    tmp_path: Path, stub: KubeApiStub, kubeconfig: Path
) -> None:
    stub.objects.put(DEPLOYMENT, _deployment(2))
    config = load(tmp_path, f"kubernetes_kubeconfig: {kubeconfig}\nkubernetes_actions: true\n")
    kubernetes = _kubernetes(build_actuators(config.actuators, {}))
    scale = ActionRequest("scale_up", "serving/llm-small", "k", True, {"step_replicas": 2})

    dry = kubernetes.execute(scale)
    assert dry.outcome is Outcome.DRY_RUN, dry.detail
    assert stub.objects.get(DEPLOYMENT)["spec"]["replicas"] == 2  # type: ignore[index]
    done = kubernetes.execute(
        ActionRequest("scale_up", "serving/llm-small", "k", False, scale.parameters)
    )
    assert done.outcome is Outcome.DONE, done.detail
    assert stub.objects.get(DEPLOYMENT)["spec"]["replicas"] == 4  # type: ignore[index]

    writes = [
        (r.method, r.path, r.query.get("dryRun"), r.body)
        for r in stub.requests
        if r.method != "GET"
    ]
    assert [(method, path, dry_run) for method, path, dry_run, _ in writes] == [
        ("PATCH", f"{DEPLOYMENT}/scale", "All"),  # server-side dry run: validated, not stored
        ("PATCH", f"{DEPLOYMENT}/scale", None),
    ]
    assert all(body["spec"] == {"replicas": 4} for *_, body in writes)
    assert all(r.authorization == f"Bearer {TOKEN}" for r in stub.requests)


def test_a_k8s_job_key_is_requeued_by_deleting_its_pod_through_the_remediator(
    tmp_path: Path, stub: KubeApiStub, kubeconfig: Path
) -> None:
    stub.objects.put(
        POD,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "train-0",
                "namespace": "research",
                "uid": POD_UID,
                "ownerReferences": [{"kind": "Job", "name": "train", "controller": True}],
            },
        },
    )
    stub.objects.put(
        K8S_NODE,
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "k8s-gpu-1"}, "spec": {}},
    )
    built = both(
        tmp_path, kubeconfig, "slurm_action_nodes: [dgx-*]\nkubernetes_action_nodes: [k8s-gpu-*]\n"
    )
    clock = FakeClock()
    with SqliteStorage(tmp_path / "r.db", clock=clock) as storage:
        rules = [make_rule("idle-gpu", "requeue"), make_rule("gpu-fault", "drain")]
        remediator = Remediator(
            storage, rules, built, config=PolicyConfig(dry_run=False), clock=clock
        )
        open_incident(storage, clock, rule_id="idle-gpu", job=f"k8s:{POD_UID}")
        open_incident(
            storage, clock, rule_id="gpu-fault", job="slurm:prod-a:1", extra={"node": "k8s-gpu-1"}
        )
        remediator.tick()
        results = {(r.action, r.target): r.state for r in storage.actions()}
    deletes = [r for r in stub.requests if r.method == "DELETE"]
    assert [(r.path, r.body, r.query.get("dryRun")) for r in deletes][-1] == (
        POD,
        {"preconditions": {"uid": POD_UID}},
        None,
    )
    assert stub.objects.get(POD) is None  # its controller re-creates it
    assert stub.objects.get(K8S_NODE)["spec"]["unschedulable"] is True  # type: ignore[index]
    assert set(results) == {("requeue", f"k8s:{POD_UID}"), ("drain", "k8s-gpu-1")}


def test_kubernetes_routes_degrade_an_httproute_built_from_config(
    tmp_path: Path, stub: KubeApiStub, kubeconfig: Path
) -> None:
    rule = {"backendRefs": [{"name": "llm-large", "port": 80}, {"name": "llm-small", "port": 80}]}
    stub.objects.put(
        HTTPROUTE,
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
         "metadata": {"name": "llm", "namespace": "serving"}, "spec": {"rules": [rule]}},
    )  # fmt: skip
    config = load(
        tmp_path,
        f"kubernetes_kubeconfig: {kubeconfig}\n"
        "kubernetes_routes:\n"
        "  serving/llm-large: {httproute: llm, primary: llm-large, fallback: llm-small}\n",
    )
    (routing,) = build_actuators(config.actuators, {})
    degrade = ActionRequest("degrade", "serving/llm-large", "k", False, {"traffic_ratio": 0.25})
    assert routing.execute(degrade).outcome is Outcome.DONE
    refs = stub.objects.get(HTTPROUTE)["spec"]["rules"][0]["backendRefs"]  # type: ignore[index]
    assert [ref["weight"] for ref in refs] == [75, 25]


def test_router_and_webhook_built_from_config_use_their_secrets(tmp_path: Path) -> None:
    state = RouterState({"llama": {"llama-70b": 100.0, "llama-8b": 0.0}})
    router = ServedApp(create_router_app(state, token="router-token-0123456789"))
    capture = Capture()
    receiver = ServedApp(webhook_app(capture))
    try:
        (tmp_path / "router-token").write_text("router-token-0123456789\n", encoding="utf-8")
        config = load(
            tmp_path,
            f"router_url: {router.url}\nrouter_token_file: {tmp_path / 'router-token'}\n"
            "router_routes: {llama-70b: {route: llama, primary: llama-70b, fallback: llama-8b}}\n"
            f"webhooks: {{ticketing: {{url: '{receiver.url}/hook', secret_env: HOOK}}}}\n",
        )
        assert SECRET not in repr(config)
        routed, hooks = build_actuators(
            config.actuators, {"HOOK": SECRET}, clock=lambda: 1_800_000_000.0
        )
        degrade = ActionRequest("degrade", "llama-70b", "k", False, {"traffic_ratio": 0.5})
        assert routed.execute(degrade).outcome is Outcome.DONE
        assert state.share("llama", "llama-8b") == pytest.approx(0.5)
        assert isinstance(hooks, WebhookActuator)
        assert SECRET not in repr(hooks._webhooks)
        sent = hooks.execute(
            ActionRequest("webhook", "gpu-01", "idem", False, {"name": "ticketing"})
        )
        assert sent.outcome is Outcome.DONE, sent.detail
    finally:
        router.stop()
        receiver.stop()
    (request,) = capture.requests
    body = json.dumps(request["body"], sort_keys=True, separators=(",", ":")).encode()
    headers = request["headers"]
    assert verify(
        SECRET.encode(),
        timestamp=headers[TIMESTAMP_HEADER],
        body=body,
        header=headers[SIGNATURE_HEADER],
        now=1_800_000_000.0,
    )
