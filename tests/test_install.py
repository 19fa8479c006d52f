"""``gpuwarden agent install`` writes a unit systemd accepts and a config the agent loads."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuwarden.agent.config import load_agent_config

ROOT = Path(__file__).resolve().parents[1]


def run_install(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "gpuwarden"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "agent",
            "install",
            "--unit-dir",
            str(tmp_path / "units"),
            "--config-path",
            str(tmp_path / "etc" / "agent.yaml"),
            "--executable",
            str(exe),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_install_writes_unit_and_config(tmp_path):
    proc = run_install(tmp_path, *([] if shutil.which("systemd-analyze") else ["--no-verify"]))
    assert proc.returncode == 0, proc.stderr
    unit = (tmp_path / "units" / "gpuwarden-agent.service").read_text()
    assert f"ExecStart={Path(sys.executable).parent / 'gpuwarden'} agent --config " in unit
    assert str(tmp_path / "etc" / "agent.yaml") in unit
    config = load_agent_config(tmp_path / "etc" / "agent.yaml", env={})
    assert config.source == "nvml"
    # a second run keeps the operator's edits unless --force
    (tmp_path / "etc" / "agent.yaml").write_text("interval_seconds: 3\n")
    proc = run_install(tmp_path, "--no-verify")
    assert proc.returncode == 0
    assert "kept existing" in proc.stdout
    assert load_agent_config(tmp_path / "etc" / "agent.yaml", env={}).interval_seconds == 3


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_rejects_a_broken_unit(tmp_path):
    from gpuwarden.agent.install import verify_unit

    bad = tmp_path / "gpuwarden-agent.service"
    bad.write_text("[Service]\nExecStart=relative/path agent\nRestart=sometimes\n")
    ok, output = verify_unit(bad)
    assert not ok
    assert output


def test_daemonset_manifest_has_what_the_agent_needs(tmp_path):
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "daemonset.yaml").read_text()))
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    container = spec["containers"][0]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {
        "/host/proc",
        "/host/sys/fs/cgroup",
        "/host/nvidia",
        "/var/lib/gpuwarden/spool",
    } <= mounts
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["limits"]["memory"]
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    (tmp_path / "agent.yaml").write_text(cm["data"]["agent.yaml"])
    config = load_agent_config(tmp_path / "agent.yaml", env={})
    assert str(config.nvml_library_path).startswith("/host/nvidia/")
    assert config.proc_root == Path("/host/proc")
    assert config.http.host == "0.0.0.0"
