"""``gpuwarden agent`` as a new user runs it: ``--once`` stays local, and input mistakes end in
one line on stderr (the problem, the key, the fix) and exit code 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.collector_server import TOKEN, CollectorThread

# The backtest's CSV exactly as docs/backtest.md shows it.
DOCS_TRACE = """\
time_seconds,gpu_uuid,node,job,name,utilization_ratio,memory_used_bytes
0,GPU-0,n1,train-1,NVIDIA H100 80GB HBM3,0.93,68719476736
0,GPU-1,n1,train-1,NVIDIA H100 80GB HBM3,0.0,1073741824
10,GPU-0,n1,train-1,NVIDIA H100 80GB HBM3,0.91,68719476736
"""


def agent(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, with the spool and HTTP port kept away from the machine's."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_")}
    return subprocess.run(
        [sys.executable, "-m", "gpuwarden", "agent", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={**base, **(env or {})},
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_an_endpoint_without_a_scheme_names_the_flag_key_and_fix(tmp_path):
    line = one_line(agent(tmp_path, "--source", "simulated", "--collector", "127.0.0.1:4318"))
    assert line == (
        "gpuwarden agent: configuration error: --collector: collector.endpoint: expected an "
        "http:// or https:// URL such as http://collector:4318/v1/metrics, got '127.0.0.1:4318'"
    )


def test_an_endpoint_without_a_scheme_in_the_file_or_environment_names_them(tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text("source: simulated\ncollector:\n  endpoint: collector:4318\n")
    line = one_line(agent(tmp_path, "--config", str(config), "--once"))
    assert line.startswith(f"gpuwarden agent: configuration error: {config}: collector.endpoint: ")
    assert "http:// or https:// URL" in line
    env = {"GPUWARDEN_COLLECTOR_ENDPOINT": "collector:4318"}
    line = one_line(agent(tmp_path, "--source", "simulated", "--once", env=env))
    assert ": GPUWARDEN_COLLECTOR_ENDPOINT: collector.endpoint: expected an http://" in line


def test_a_refused_endpoint_never_echoes_its_password(tmp_path):
    for endpoint in ("alice:s3cret@collector:4318", "ftp://alice:s3cret@collector/v1"):
        line = one_line(agent(tmp_path, "--source", "simulated", "--collector", endpoint))
        assert "s3cret" not in line
        assert "***@collector" in line


def test_an_unknown_scenario_lists_the_presets(tmp_path):
    line = one_line(agent(tmp_path, "--source", "simulated", "--scenario", "nosuch", "--once"))
    assert line == (
        "gpuwarden agent: configuration error: scenario 'nosuch': not a preset (faults, idle, "
        "inference, input-bound, mixed, training) and no such file; give --scenario "
        "(or scenario:) a preset name or a scenario YAML file"
    )


def test_a_missing_replay_file_names_the_key_and_the_file(tmp_path):
    missing = tmp_path / "missing.csv"
    line = one_line(agent(tmp_path, "--source", "replay", "--replay", str(missing), "--once"))
    assert line == (
        f"gpuwarden agent: configuration error: replay_path: cannot read {missing}: "
        "No such file or directory; give --replay (or replay_path:) an existing trace file"
    )


@pytest.mark.parametrize("once", [["--once", "--push"], []], ids=["once-push", "daemon"])
def test_an_unwritable_spool_names_the_key_and_the_fix(tmp_path, once):
    (tmp_path / "a-file").write_text("")
    spool = tmp_path / "a-file" / "spool"  # not a directory, whoever runs the test
    line = one_line(agent(tmp_path, "--source", "simulated", "--spool-dir", str(spool), *once))
    assert line == (
        f"gpuwarden agent: configuration error: spool.directory: cannot write {spool}: "
        "Not a directory; set spool.directory (--spool-dir, GPUWARDEN_SPOOL_DIR) to a "
        "writable directory"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only directory")
def test_a_read_only_spool_directory_is_refused_at_start_up(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o500)
    line = one_line(agent(tmp_path, "--source", "simulated", "--spool-dir", str(spool)))
    assert f"spool.directory: cannot write {spool}: Permission denied" in line


def test_a_trace_in_the_docs_csv_format_says_which_command_reads_it(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text(DOCS_TRACE)
    line = one_line(agent(tmp_path, "--source", "replay", "--replay", str(trace), "--once"))
    assert line == (
        f"gpuwarden agent: configuration error: replay_path: {trace}:1: column 'node' belongs "
        "to backtest traces (docs/backtest.md); the agent replays one node's GPUs: drop the "
        f"node, job, index columns, or run 'gpuwarden backtest --data {trace}'"
    )
    # the same trace without the backtest's columns replays
    trace.write_text(
        "\n".join(
            ",".join(c for i, c in enumerate(row.split(",")) if i not in (2, 3))
            for row in DOCS_TRACE.splitlines()
        )
        + "\n"
    )
    replayed = agent(tmp_path, "--source", "replay", "--replay", str(trace), "--once")
    assert replayed.returncode == 0, replayed.stderr
    assert '"uuid": "GPU-0"' in replayed.stdout


def test_push_without_once_is_a_usage_error(tmp_path):
    assert one_line(agent(tmp_path, "--push")) == (
        "gpuwarden agent: --push only applies to --once (the agent always pushes); "
        "drop --push or add --once"
    )


def test_once_prints_and_neither_pushes_nor_spools_unless_asked(tmp_path):
    spool = tmp_path / "spool"
    with CollectorThread() as collector:
        env = {
            "GPUWARDEN_COLLECTOR_ENDPOINT": collector.endpoint,
            "GPUWARDEN_AGENT_TOKEN": TOKEN,
            "GPUWARDEN_SPOOL_DIR": str(spool),
        }
        once = agent(tmp_path, "--source", "simulated", "--once", env=env)
        assert once.returncode == 0, once.stderr
        assert '"uuid": "GPU-' in once.stdout
        assert not spool.exists()
        assert collector.log.series("gpuwarden.agent.samples") == {}

        pushed = agent(tmp_path, "--source", "simulated", "--once", "--push", env=env)
        assert pushed.returncode == 0, pushed.stderr
        assert '"uuid": "GPU-' in pushed.stdout
        assert len(collector.log.series("gpuwarden.agent.samples")) == 1
        assert list(spool.glob("*.otlp")) == []  # sent, so nothing stays behind
