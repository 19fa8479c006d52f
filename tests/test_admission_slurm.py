"""The Slurm recipe end to end: real slurmctld (job_submit/lua) → ``deploy/slurm/job_submit.lua``
→ ``gpuwarden policies admit`` → the collector's ``POST /admission/v1/slurm`` over HTTPS.

Account ``physics`` already holds 1 GPU in the collector's job registry and may hold 2: an
``sbatch --gres=gpu:2`` is refused with the policy's message, an ``sbatch --gres=gpu:1`` runs.
With the collector out of reach, the hook has no verdict and lets the job in (``fail_open``).
Needs root and the Debian Slurm packages (as ``tests/slurm``), and Debian's
``slurm-wlm-basic-plugins``, which ships ``job_submit_lua.so`` (linked to liblua5.1).
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwarden.cli import main as gpuwarden_main
from gpuwarden.collector.cli.admit import EXIT_DENY, EXIT_ERROR
from gpuwarden.collector.config import TlsSettings
from gpuwarden.collector.credentials import Role, TokenTable, credential
from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.jobs.registry import JobRegistry
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.web.tls import server_context
from tests.collector_server import CollectorThread, free_port
from tests.slurm.cluster import SlurmCluster, SlurmClusterError, missing_binaries
from tests.test_tls import Authority

NOW = 1_700_002_800.0
TOKEN = "admission-token-for-slurm-0123456789"
PLUGIN = Path("/usr/lib/x86_64-linux-gnu/slurm-wlm/job_submit_lua.so")
SCRIPT = Path(__file__).resolve().parent.parent / "deploy" / "slurm" / "job_submit.lua"
POLICIES = """\
version: 1
policies:
  - name: physics-gpus
    kind: limit
    selector: {teams: [physics]}
    max_gpus_per_team: 2
"""
DENIAL = (
    "team physics would hold 3 GPUs (1 held + 2 requested); policy physics-gpus allows at "
    "most 2 (max_gpus_per_team)"
)


def _skip_reason() -> str | None:
    missing = missing_binaries()
    if missing:
        return f"Slurm/munge programs not installed: {', '.join(missing)}"
    if os.geteuid() != 0:
        return "the private Slurm cluster must run as root (daemons, mknod)"
    if not PLUGIN.exists():
        return f"{PLUGIN} not installed (Debian package slurm-wlm-basic-plugins)"
    return None


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CollectorThread, Path]]:
    """The collector over HTTPS with the physics limit, and the files the hook reads."""
    folder = tmp_path_factory.mktemp("slurm-admission")
    ca = Authority(folder, "gpuwarden slurm CA")
    server = ca.issue("collector", "collector", ips=("127.0.0.1",))
    (folder / "policies").mkdir()
    (folder / "policies" / "limits.yaml").write_text(POLICIES)
    (folder / "token").write_text(TOKEN + "\n")
    tls = TlsSettings(cert_file=server.cert, key_file=server.key)
    storage = SqliteStorage(":memory:", clock=lambda: NOW)
    store = WindowStore(step_seconds=10, recent_seconds=600, long_step_seconds=60, long_seconds=600)
    service = CollectorService(
        store=store, storage=storage, registry=JobRegistry(storage), clock=lambda: NOW
    )
    held = Job(
        key="slurm:gwtest:1", scheduler="slurm", job_id="1", state=JobState.RUNNING,
        team="physics", gpus=1,
    )  # fmt: skip
    service.registry.put([held])
    settings = {
        "tokens": TokenTable((credential(TOKEN, Role.ADMISSION, "slurmctld"),)),
        "tls": tls,
        "policies_dir": folder / "policies",
    }
    thread = CollectorThread(service=service, settings=settings, ssl_context=server_context(tls))
    with thread:
        yield thread, folder
    storage.close()


def hook_settings(
    thread: CollectorThread, folder: Path, port: int | None = None, *, fail_open: bool = True
) -> str:
    """``job_submit_gpuwarden.lua``: how the hook reaches the collector (on ``port``)."""
    return (
        "return {\n"
        f"  command = {{{json.dumps(sys.executable)}, '-m', 'gpuwarden'}},\n"
        f"  url = 'https://127.0.0.1:{port or thread.port}',\n"
        f"  token_file = {json.dumps(str(folder / 'token'))},\n"
        f"  ca_file = {json.dumps(str(folder / 'gpuwarden-slurm-CA.pem'))},\n"
        "  timeout_seconds = 10,\n"
        f"  fail_open = {'true' if fail_open else 'false'},\n"
        "}\n"
    )


@pytest.fixture(scope="module")
def cluster(setup: tuple[CollectorThread, Path]) -> Iterator[SlurmCluster]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    thread, folder = setup
    files = {
        "job_submit.lua": SCRIPT.read_text(),
        "job_submit_gpuwarden.lua": hook_settings(thread, folder),
    }
    with SlurmCluster(job_submit_lua=files) as cluster:
        yield cluster


def test_a_job_over_the_team_limit_is_refused_with_the_policys_message(cluster):
    with pytest.raises(SlurmClusterError) as refused:
        cluster.sbatch("#!/bin/sh\ntrue\n", "--account=physics", "--gres=gpu:2")
    stderr = str(refused.value).split("\n")[0]
    assert DENIAL in stderr
    assert "gpuwarden: denied" in stderr


def test_a_job_within_the_limit_is_submitted_and_runs(cluster):
    job_id = cluster.sbatch("#!/bin/sh\ntrue\n", "--account=physics", "--gres=gpu:1")
    state = cluster.wait_for_state(job_id, {"RUNNING", "COMPLETED"}, timeout_seconds=60)
    assert state in {"RUNNING", "COMPLETED"}


def test_gpus_per_task_count_times_the_tasks(cluster):
    with pytest.raises(SlurmClusterError) as refused:
        cluster.sbatch("#!/bin/sh\ntrue\n", "--account=physics", "--ntasks=2", "--gpus-per-task=1")
    assert DENIAL in str(refused.value)


def test_without_a_collector_the_hook_lets_jobs_in(cluster, setup):
    """The hook reads its settings at each submission: point it at a port nobody serves."""
    thread, folder = setup
    settings = cluster.root / "job_submit_gpuwarden.lua"
    settings.write_text(hook_settings(thread, folder, port=free_port()))
    try:
        job_id = cluster.sbatch("#!/bin/sh\ntrue\n", "--account=physics", "--gres=gpu:2")
        assert cluster.job_state(job_id) is not None
        log = (cluster.root / "log" / "slurmctld.log").read_text()
        assert "gpuwarden admission: no verdict: no answer from the collector" in log
    finally:
        settings.write_text(hook_settings(thread, folder))


def test_failing_closed_the_hook_refuses_jobs_without_a_verdict(cluster, setup):
    thread, folder = setup
    settings = cluster.root / "job_submit_gpuwarden.lua"
    settings.write_text(hook_settings(thread, folder, port=free_port(), fail_open=False))
    try:
        with pytest.raises(SlurmClusterError) as refused:
            cluster.sbatch("#!/bin/sh\ntrue\n", "--account=physics", "--gres=gpu:1")
        assert "gpuwarden admission is unavailable; try again later" in str(refused.value)
    finally:
        settings.write_text(hook_settings(thread, folder))


def test_the_cli_says_deny_or_error_on_one_line(setup, monkeypatch, capsys):
    """``gpuwarden policies admit`` as the hook runs it (stdin JSON, one line out)."""
    thread, folder = setup
    request = {"account": "physics", "tres_per_node": "gres:gpu:2", "min_nodes": 1}
    args = [
        "policies", "admit", "--url", f"https://127.0.0.1:{thread.port}",
        "--token-file", str(folder / "token"), "--ca-file", str(folder / "gpuwarden-slurm-CA.pem"),
    ]  # fmt: skip
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(request)))
    assert gpuwarden_main(args) == EXIT_DENY
    assert capsys.readouterr().out == f"DENY gpuwarden: denied: {DENIAL}\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps({"acount": "typo"})))
    assert gpuwarden_main(args) == EXIT_ERROR
    out = capsys.readouterr().out
    assert out.startswith("ERROR collector answered 400: ")
    assert "acount" in out
