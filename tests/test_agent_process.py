"""The agent as an operator runs it: a process with /healthz, /metrics, and a flushing SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.collector_server import TOKEN, CollectorThread, free_port
from tests.loopback_process import wait_for


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback only
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuwarden", "agent", *args]


def test_agent_process_serves_health_and_metrics_and_flushes_on_sigterm(tmp_path: Path):
    http_port = free_port()
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"node_name: proc-node\nsource: simulated\nscenario: training\ninterval_seconds: 0.2\n"
        f"http:\n  port: {http_port}\nspool:\n  directory: {tmp_path / 'spool'}\n  fsync: false\n"
    )
    with CollectorThread() as collector:
        env = {**os.environ, "GPUWARDEN_AGENT_TOKEN": TOKEN}
        proc = subprocess.Popen(
            agent_command("--config", str(config), "--collector", collector.endpoint),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            base = f"http://127.0.0.1:{http_port}"
            wait_for(lambda: http_get(base + "/healthz")[0] == 200, 30, "/healthz")
            status, body = http_get(base + "/metrics")
            assert status == 200
            assert "hw_gpu_utilization{" in body
            assert "hw_energy_joules_total{" in body
            wait_for(lambda: len(collector.log.series("gpuwarden.agent.samples")) == 1, 30, "data")
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, stderr
        assert "flushing and stopping" in stderr
        assert TOKEN not in stderr
        # the last round taken before SIGTERM was delivered: the spool is empty
        assert list((tmp_path / "spool").glob("*.otlp")) == []
        rounds = [
            v for _, v in next(iter(collector.log.series("gpuwarden.agent.samples").values()))
        ]
        assert rounds == [float(n) for n in range(1, len(rounds) + 1)]


@pytest.mark.parametrize(
    "library", ["/nonexistent/libnvidia-ml.so.1", "/etc/hostname"], ids=["missing", "not-a-library"]
)
def test_missing_nvml_library_is_a_start_up_error_that_names_the_fix(tmp_path, library):
    proc = subprocess.run(
        agent_command("--nvml-library", library, "--once", "--spool-dir", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "nvml_library_path" in proc.stderr
    assert "driver" in proc.stderr.lower()
    assert "Traceback" not in proc.stderr


def test_busy_http_port_is_a_clear_start_up_error(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        config = tmp_path / "agent.yaml"
        config.write_text(f"source: simulated\nhttp:\n  port: {port}\n")
        proc = subprocess.run(
            agent_command("--config", str(config), "--spool-dir", str(tmp_path / "s")),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 1
    assert f"port {port}" in proc.stderr
    assert "in use" in proc.stderr
