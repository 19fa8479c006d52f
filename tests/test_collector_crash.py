"""kill -9 the collector during ingest, restart it: jobs, accounting and incidents are intact, and
the agent's spool fills the gap."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.collector.storage.records import Incident, IncidentState
from gpuwarden.collector.storage.sqlite import SqliteStorage
from tests.collector_server import free_port
from tests.loopback_process import wait_for
from tests.spooled_agent import make_agent

TOKEN = "crash-test-token-0123456789abcdef"
NODE = "crash-node"


class Collector:
    """``gpuwarden collector`` as a real process."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.port = port
        # the hashed form: the file holds no secret (this token pushes, posts jobs and reads)
        digest = hashlib.sha256(TOKEN.encode()).hexdigest()
        (tmp / "tokens").write_text(f"admin crash-tests sha256:{digest}\n")
        self.config = tmp / "collector.yaml"
        self.config.write_text(
            f"port: {port}\ntokens_file: {tmp / 'tokens'}\ndatabase: {tmp / 'collector.db'}\n"
            "step_seconds: 1\nrecent_hours: 1\naccounting_period_seconds: 1\n"
        )
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "collector", "--config", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: self.get("/healthz") is not None, 30, "collector start")

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def request(self, path: str, body: object | None = None) -> bytes | None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310
                return bytes(resp.read())
        except OSError:
            return None

    def get(self, path: str) -> bytes | None:
        return self.request(path)

    def json(self, path: str) -> Any:
        body = self.get(path)
        assert body is not None, path
        return json.loads(body)

    def accepted_points(self) -> float:
        body = self.get("/metrics")
        assert body is not None
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if (
                    sample.name == "gpuwarden_collector_points_total"
                    and sample.labels.get("outcome") == "accepted"
                ):
                    return float(sample.value)
        return 0.0


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    c = Collector(tmp_path, free_port())
    yield c
    c.stop()


def test_kill_9_during_ingest_loses_nothing(collector: Collector, tmp_path: Path) -> None:
    collector.start()
    start = time.time()
    job = {
        "job_id": "train-9",
        "state": "running",
        "start_time": start - 5,
        "team": "ml",
        "allocations": [{"node": NODE, "indices": list(range(8))}],
        "price_tier": "spot",
    }
    assert collector.request("/v1/jobs", job) is not None
    with SqliteStorage(tmp_path / "collector.db") as storage:
        incident_id = storage.open_incident(
            Incident(
                fingerprint="idle:train-9",
                rule_id="idle-gpu",
                severity="warning",
                first_seen=start,
                last_seen=start,
                state=IncidentState.OPEN,
            )
        )
    assert incident_id is not None
    runtime = make_agent(tmp_path, collector.port, node=NODE, token=TOKEN)
    agent, sender = runtime.agent, runtime.agent.sender
    assert sender is not None

    def rows_of_job() -> float:
        acc = collector.json("/v1/accounting?since=1h&by=job_key")
        return sum(
            float(g["gpu_hours_allocated"])
            for g in acc["groups"]
            if g["group"]["job_key"] == "api:train-9"
        )

    # ingest until the collector has written accounting for the job
    def ingest_and_check() -> bool:
        agent.sample_once()
        sender.send_once()
        return rows_of_job() > 0

    wait_for(ingest_and_check, 30, "accounting rows")
    before = rows_of_job()
    # kill -9 while the agent keeps sending from another thread
    stop = threading.Event()

    def keep_sending() -> None:
        while not stop.is_set():
            agent.sample_once()
            sender.send_once()
            stop.wait(0.05)

    sending = threading.Thread(target=keep_sending)
    sending.start()
    try:
        wait_for(lambda: sender.sent_records >= 20, 30, "ingest under way")
        collector.kill9()
        spooled_before = len(agent.spool or [])
        wait_for(lambda: len(agent.spool or []) >= spooled_before + 10, 30, "the spool to fill")
    finally:
        stop.set()
        sending.join(10)
    outage_rounds = len(agent.spool or [])
    sent_before_restart = sender.sent_records
    collector.start()  # same port, same database
    assert sender.flush(timeout_seconds=30)
    assert sender.sent_records == sent_before_restart + outage_rounds
    # the new process received every spooled round: 8 GPUs × dozens of metrics each
    assert collector.accepted_points() >= outage_rounds * 200
    # jobs, accounting and incidents survived the kill
    jobs = collector.json("/v1/jobs")["jobs"]
    assert any(j["key"] == "api:train-9" for j in jobs)
    assert rows_of_job() >= before
    with SqliteStorage(tmp_path / "collector.db") as storage:
        incident = storage.incident(incident_id)
        assert incident is not None
        assert incident.state is IncidentState.OPEN
    agent.shutdown(flush_timeout_seconds=2)
