"""Optional extras: a setting whose extra is not installed stops the collector at start with one
line naming the extra. The real start-up runs in a subprocess where the extra's modules cannot
be imported, as on a site that did not install them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.collector.extras import MissingExtraError, needs_extra

# Argument 1: the top-level modules to hide (comma-separated); the rest go to ``gpuwarden``.
WITHOUT = """
import sys

class Absent:  # as if their distributions were not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in sys.argv[1].split(","):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Absent())
from gpuwarden.cli import main
sys.exit(main(sys.argv[2:]))
"""
KUBERNETES = "kubernetes"
SLACK = "slack_sdk"
NEEDS_KUBERNETES = "needs the 'kubernetes' extra: pip install 'gpuwarden[kubernetes]'"
NEEDS_SLACK = "needs the 'slack' extra: pip install 'gpuwarden[slack]'"


def _start_without(
    hidden: str, config: str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "collector.yaml"
    base = f"allow_unauthenticated: true\ndatabase: {tmp_path / 'collector.db'}\n"
    path.write_text(base + config, encoding="utf-8")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT,
            hidden,
            "--log-level=ERROR",
            "collector",
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environ | (env or {}),
        timeout=120,  # it would serve forever if the check let it start
        check=False,
    )


@pytest.mark.parametrize(
    ("hidden", "config", "env", "expected"),
    [
        (
            KUBERNETES,
            "kubernetes_kubeconfig: kubeconfig\nkubernetes_actions: true\n",
            {},
            "{file}: kubernetes_kubeconfig: " + NEEDS_KUBERNETES,
        ),
        (
            SLACK,
            "slack_webhooks_file: hooks\n",
            {},
            "{file}: slack_webhooks_file: " + NEEDS_SLACK,
        ),
        (
            SLACK,
            "",
            {"GPUWARDEN_SLACK_WEBHOOK_URL": "https://hooks.example.com/T/B/x"},
            "environment: GPUWARDEN_SLACK_WEBHOOK_URL: " + NEEDS_SLACK,
        ),
    ],
    ids=["kubeconfig", "slack-file", "slack-env"],
)
def test_a_setting_without_its_extra_stops_the_start_with_one_line(
    hidden: str, config: str, env: dict[str, str], expected: str, tmp_path: Path
) -> None:
    (tmp_path / "hooks").write_text("#gpu-waste https://hooks.example.com/T/B/y\n")
    done = _start_without(hidden, config, tmp_path, env)
    where = tmp_path / "collector.yaml"
    assert done.stderr.splitlines() == [f"gpuwarden collector: {expected.format(file=where)}"]
    assert done.returncode == 2


def test_a_config_without_those_settings_starts_without_the_extras(tmp_path: Path) -> None:
    """A Slurm-only site: everything is built; the collector stops only at its busy port."""
    (tmp_path / "keys").write_text("gpu-fleet 0123456789abcdef\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = f"port: {port}\npagerduty_keys_file: keys\n"
        done = _start_without(f"{KUBERNETES},{SLACK}", config, tmp_path)
    # the only line: the loops end before the store closes
    assert done.stderr.splitlines() == [
        f"gpuwarden collector: 127.0.0.1:{port} is in use; choose another port with --port or "
        "stop the other process"
    ]
    assert done.returncode == 1


@pytest.mark.parametrize("missing", ["kubernetes", "kubernetes.client"])
def test_a_missing_module_of_the_extra_names_setting_and_extra(missing: str) -> None:
    with pytest.raises(MissingExtraError) as raised, needs_extra("kubernetes", "kubernetes_routes"):
        raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)
    assert str(raised.value) == f"kubernetes_routes: {NEEDS_KUBERNETES}"
    assert (raised.value.setting, raised.value.extra) == ("kubernetes_routes", "kubernetes")


@pytest.mark.parametrize("missing", ["dateutil", "slack_sdk", "urllib3", None])
def test_another_missing_module_is_a_broken_install_not_a_missing_extra(
    missing: str | None,
) -> None:
    with pytest.raises(ModuleNotFoundError) as raised, needs_extra("kubernetes", "x"):
        raise ModuleNotFoundError("No module", name=missing)
    assert type(raised.value) is ModuleNotFoundError
    assert raised.value.name == missing


def test_a_kubeconfig_that_does_not_exist_is_one_line_too(tmp_path: Path, capsys) -> None:
    """The same start-up path with the extra installed: the client's own error, no traceback."""
    from gpuwarden.collector.cli.collector import run_collector

    path = tmp_path / "collector.yaml"
    path.write_text(
        f"allow_unauthenticated: true\ndatabase: {tmp_path / 'c.db'}\n"
        f"kubernetes_kubeconfig: {tmp_path / 'nowhere'}\n"
    )
    assert run_collector(path, host=None, port=None, environ={}) == 2
    assert capsys.readouterr().err.splitlines() == [
        "gpuwarden collector: configuration error: kubernetes: "
        f"kubeconfig {tmp_path / 'nowhere'} does not exist"
    ]
