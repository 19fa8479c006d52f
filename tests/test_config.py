"""Agent and collector configuration: file, environment, defaults; clear errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.agent.config import ConfigError, load_agent_config
from gpuwarden.agent.install import default_config
from gpuwarden.collector.config import load_collector_config
from gpuwarden.collector.credentials import Role


def write(tmp_path: Path, text: str, name: str = "agent.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_shipped_commented_config_loads_to_the_defaults(tmp_path):
    config = load_agent_config(write(tmp_path, default_config()), env={})
    defaults = load_agent_config(None, env={})
    assert config == defaults
    assert config.interval_seconds == 10.0
    assert config.spool.max_bytes == 256 * 1024 * 1024


def test_file_then_environment_then_overrides(tmp_path):
    path = write(
        tmp_path,
        "interval_seconds: 2\ncollector:\n  endpoint: http://a:4318/v1/metrics\n"
        "spool:\n  directory: /tmp/s\n  fsync: false\n",
    )
    env = {"GPUWARDEN_COLLECTOR_ENDPOINT": "http://b:4318/v1/metrics", "GPUWARDEN_NODE_NAME": "n7"}
    config = load_agent_config(path, env, {"interval_seconds": 0.5})
    assert config.collector.endpoint == "http://b:4318/v1/metrics"
    assert config.node_name == "n7"
    assert config.interval_seconds == 0.5
    assert config.spool.directory == Path("/tmp/s")
    assert config.spool.fsync is False


def test_token_from_file_and_never_in_repr(tmp_path):
    token_file = write(tmp_path, "s3cret-token-value\n", "token")
    config = load_agent_config(write(tmp_path, f"collector:\n  token_file: {token_file}\n"), env={})
    assert config.token() == "s3cret-token-value"
    env_config = load_agent_config(None, {"GPUWARDEN_AGENT_TOKEN": "from-env-token"})
    assert env_config.token() == "from-env-token"
    assert "from-env-token" not in repr(env_config)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "intervall_seconds: 3\n",
            ": unknown key 'intervall_seconds'; did you mean 'interval_seconds'?",
        ),
        (
            "collector:\n  endpiont: x\n",
            ": collector: unknown key 'endpiont'; did you mean 'endpoint'?",
        ),
        ("http:\n  zzz: 1\n", ": http: unknown key 'zzz' (known: enabled, host, port, prometheus)"),
        ("interval_seconds: fast\n", ": interval_seconds: expected a number, got 'fast'"),
        ("interval_seconds: 0\n", ": interval_seconds: expected a number >= 0.05, got 0"),
        ("interval_seconds: 4000\n", ": interval_seconds: expected a number <= 3600, got 4000"),
        ("source: gpu\n", ": source: expected one of nvml, simulated, replay, got 'gpu'"),
        ("source: replay\n", ": source 'replay' needs replay_path"),
        ("spool:\n  fsync: 1\n", ": spool.fsync: expected true or false, got 1"),
        (
            "spool:\n  max_bytes: 1024\n",
            ": spool.max_bytes: expected an integer >= 65536, got 1024",
        ),
        ("spool: 3\n", ": spool: expected a mapping, got 3"),
        ("collector:\n  token_file: [a]\n", ": collector.token_file: expected a path, got ['a']"),
        ("collector:\n  token: [s3cr3t]\n", ": collector.token: expected a string, got a list"),
        ("http:\n  port: 70000\n", ": http.port: expected an integer <= 65535, got 70000"),
        (
            "resource:\n  price_tier: cheap\n",
            ": resource.price_tier: expected one of on-demand, spot, reserved, got 'cheap'",
        ),
        ("- a\n- b\n", "expected a mapping"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_errors_name_the_file_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_agent_config(path, env={})
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)
    assert "s3cr3t" not in str(info.value)


def test_collector_tokens_file(tmp_path):
    tokens = write(
        tmp_path,
        "# role subject token\nagent node-a aaaaaaaaaaaaaaaaaaaa\nreader b bbbbbbbbbbbbbbbbbbbb\n",
        "t",
    )
    config = load_collector_config(
        write(tmp_path, f"tokens_file: {tokens}\nport: 9999\n", "c.yaml")
    )
    node_a = config.tokens.match("aaaaaaaaaaaaaaaaaaaa")
    reader = config.tokens.match("bbbbbbbbbbbbbbbbbbbb")
    assert node_a is not None
    assert (node_a.role, node_a.subject, node_a.nodes) == (
        Role.AGENT,
        "node-a",
        ("node-a",),
    )
    assert reader is not None
    assert (reader.role, reader.subject) == (Role.READER, "b")
    assert config.port == 9999
    assert "aaaa" not in repr(config)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prot: 1\n", "unknown key 'prot'"),
        ("port: '80'\n", "port: expected an integer"),
        ("max_body_bytes: 0\n", "max_body_bytes"),
    ],
)
def test_collector_config_errors(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_collector_config(write(tmp_path, text, "c.yaml"))


def test_an_old_two_column_tokens_file_is_refused_naming_the_new_format(tmp_path):
    tokens = write(tmp_path, "node-a aaaaaaaaaaaaaaaaaaaa\n", "t")
    with pytest.raises(ConfigError) as info:
        load_collector_config(write(tmp_path, f"tokens_file: {tokens}\n", "c.yaml"))
    assert str(info.value).startswith(f"{tokens}:1: two columns is the old '<name> <token>'")
    assert "<role> <subject> <token or sha256:hex> [nodes=a,b]" in str(info.value)
    assert "aaaa" not in str(info.value)


def test_tokens_and_allow_unauthenticated_exclude_each_other(tmp_path):
    tokens = write(tmp_path, "agent node-a aaaaaaaaaaaaaaaaaaaa\n", "t")
    config = f"tokens_file: {tokens}\nallow_unauthenticated: true\n"
    with pytest.raises(ConfigError, match="allow_unauthenticated makes every caller"):
        load_collector_config(write(tmp_path, config, "c.yaml"))


def test_collector_model_servers(tmp_path):
    from gpuwarden.collector.build import build_service

    config = load_collector_config(
        write(
            tmp_path,
            f"database: {tmp_path / 'c.db'}\nmodel_servers:\n"
            "  - {url: 'http://127.0.0.1:8000/metrics', server: vllm, model: llama, node: n1}\n",
            "c.yaml",
        )
    )
    assert config.model_servers[0].server == "vllm"
    service = build_service(config)
    try:
        assert service.scraper is not None
    finally:
        service.storage.close()
    with pytest.raises(ConfigError, match=r"model_servers\[0\]: unknown key 'uri'"):
        load_collector_config(write(tmp_path, "model_servers:\n  - {uri: x}\n", "d.yaml"))
    bad = load_collector_config(
        write(
            tmp_path,
            f"database: {tmp_path / 'e.db'}\nmodel_servers:\n  - {{url: 'ftp://x'}}\n",
            "e.yaml",
        )
    )
    with pytest.raises(ConfigError, match="model_servers: scrape target"):
        build_service(bad)


# The collector config's error messages: one line, the file first, then the dotted key -------

COLLECTOR_ERRORS = [
    # unknown keys, with did-you-mean at every level
    ("prot: 1\n", "unknown key 'prot'; did you mean 'port'?"),
    ("tokens_fil: /t\n", "unknown key 'tokens_fil'; did you mean 'tokens_file'?"),
    ("tokens: {s3cr3t-token-0123456: a}\n", "unknown key 'tokens'; did you mean 'tokens_file'?"),
    (
        "remediation: {dry_runn: false}\n",
        "remediation: unknown key 'dry_runn'; did you mean 'dry_run'?",
    ),
    (
        "webhooks: {t: {url: 'http://t', secret_file: /s, secrett: s3cr3t}}\n",
        "webhooks.t: unknown key 'secrett'; did you mean 'secret_env'?",
    ),
    ("model_servers: [{uri: x}]\n", "model_servers[0]: unknown key 'uri'; did you mean 'url'?"),
    # wrong types
    ("port: '80'\n", "port: expected an integer, got '80'"),
    (
        "allow_unauthenticated: yes please\n",
        "allow_unauthenticated: expected true or false, got 'yes please'",
    ),
    ("tokens_file: 3\n", "tokens_file: expected a path, got 3"),
    ("rules: [1]\n", "rules[0]: expected a path, got 1"),
    ("remediation: 3\n", "remediation: expected a mapping, got 3"),
    (
        "kubernetes_routes: [serving/llm]\n",
        "kubernetes_routes: expected a mapping, got ['serving/llm']",
    ),
    # out of range
    ("port: 70000\n", "port: expected an integer <= 65535, got 70000"),
    ("max_body_bytes: 0\n", "max_body_bytes: expected an integer >= 1, got 0"),
    ("step_seconds: 0\n", "step_seconds: expected an integer >= 1, got 0"),
    ("alerting: {resend_seconds: 0}\n", "alerting.resend_seconds: expected a number >= 1, got 0"),
    (
        "remediation: {breaker_max_fleet_ratio: 2}\n",
        "remediation.breaker_max_fleet_ratio: expected a number <= 1, got 2",
    ),
    # nested key paths: mapping entries by name, list items by index, a mapping key itself
    ("model_servers: [{server: vllm}]\n", "model_servers[0].url: required"),
    (
        "alerting: {routing: [{routes: [nope]}]}\n",
        "alerting.routing[0].routes[0]: expected <slack|pagerduty|alertmanager|webhook>:<target>,"
        " got 'nope'",
    ),
    (
        "kubernetes_kubeconfig: /k\n"
        "kubernetes_routes: {serving/llm: {httproute: llm, primary: a}}\n",
        "kubernetes_routes.serving/llm.fallback: required with httproute",
    ),
    (
        "kubernetes_kubeconfig: /k\nkubernetes_routes: {llm: {inferenceservice: x}}\n",
        "kubernetes_routes.llm: expected '<namespace>/<name>', got 'llm'",
    ),
    # checks across keys: at the top, in one place (the tls section's, in test_tls)
    (
        "max_body_bytes: 10\nmax_decompressed_bytes: 5\n",
        "need 0 < max_body_bytes <= max_decompressed_bytes",
    ),
    (
        "kubernetes_in_cluster: true\nkubernetes_kubeconfig: /k\n",
        "kubernetes_in_cluster and kubernetes_kubeconfig exclude each other",
    ),
    # secret values never shown
    (
        "webhooks: {t: {url: 'http://t', secret_env: s3cr3t-value}}\n",
        "webhooks.t.secret_env: expected an environment variable name, got a str (not shown)",
    ),
]


@pytest.mark.parametrize(("text", "message"), COLLECTOR_ERRORS)
def test_collector_config_error_messages(tmp_path, text, message):
    path = write(tmp_path, text, "collector.yaml")
    with pytest.raises(ConfigError) as info:
        load_collector_config(path)
    assert str(info.value) == f"{path}: {message}"
    assert "s3cr3t" not in str(info.value)


def test_collector_tokens_file_that_cannot_be_read(tmp_path):
    path = write(tmp_path, f"tokens_file: {tmp_path / 'nope'}\n", "collector.yaml")
    with pytest.raises(ConfigError) as info:
        load_collector_config(path)
    assert str(info.value) == f"{path}: tokens_file {tmp_path / 'nope'}: No such file or directory"


def test_collector_cli_overrides_win_over_the_file(tmp_path):
    path = write(tmp_path, "port: 9999\nhost: 0.0.0.0\n", "collector.yaml")
    config = load_collector_config(path, {"port": 7000, "host": None})
    assert (config.host, config.port) == ("0.0.0.0", 7000)
    with pytest.raises(ConfigError, match=r"^<defaults>: port: expected an integer"):
        load_collector_config(None, {"port": "x"})
