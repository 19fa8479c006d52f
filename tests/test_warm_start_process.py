"""Warm start end to end: ``gpuwarden collector`` as a real process reads its snapshot at start,
``gpuwarden rules status`` (a real process) shows its rules ready, and SIGTERM writes what
changed since that snapshot before the process exits.

The snapshot the first collector reads is written by a real WindowStore of the collector's
shape holding the last 2 h (real time: the process's clock is the wall clock).
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.store.snapshot import changes_path
from gpuwarden.collector.store.types import AttrValue
from gpuwarden.collector.store.window import WindowStore
from tests.collector_server import free_port

READER = "warm-start-reader-token-0123456789"
STEP = 10


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll an external process's observable state until a deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def two_hours_of_one_gpu(now: float) -> WindowStore:
    """A store of the collector's default shape with 2 h of one busy GPU, up to ``now``."""
    store = WindowStore(step_seconds=STEP, recent_seconds=6 * 3600, clock=lambda: now)
    resource: dict[str, AttrValue] = {"host.name": "n1"}
    attrs: dict[str, AttrValue] = {"hw.id": "GPU-0"}
    t = now - 2 * 3600
    while t <= now:
        ns = int(t * 1e9)
        store.ingest(
            [
                NumberPoint(resource, "hw.gpu.utilization", "1", "gauge", False, attrs, ns, 0.9),
                NumberPoint(
                    resource,
                    "gpuwarden.gpu.info",
                    "1",
                    "gauge",
                    False,
                    {**attrs, "hw.model": "H100", "gpuwarden.gpu.index": 0},
                    ns,
                    1.0,
                ),
            ]
        )
        t += STEP
    return store


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
            return True
    except OSError:
        return False


def test_a_collector_process_starts_warm_and_snapshots_at_sigterm(tmp_path: Path) -> None:
    port = free_port()
    digest = hashlib.sha256(READER.encode()).hexdigest()
    (tmp_path / "tokens").write_text(f"reader tests sha256:{digest}\n")
    (tmp_path / "token").write_text(READER + "\n")
    snapshot = tmp_path / "window.npz"
    config = tmp_path / "collector.yaml"
    config.write_text(
        f"port: {port}\ntokens_file: {tmp_path / 'tokens'}\n"
        f"database: {tmp_path / 'collector.db'}\nsnapshot_file: {snapshot}\n"
    )
    first_at = time.time()
    written = two_hours_of_one_gpu(first_at).write_snapshot(snapshot)
    assert written.series == 2
    before = snapshot.stat().st_mtime_ns

    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "collector", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: healthy(port), 60, "collector start")
        status = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuwarden",
                "rules",
                "status",
                "--url",
                f"http://127.0.0.1:{port}",
                "--token-file",
                str(tmp_path / "token"),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert status.returncode == 3, status.stderr  # some rules want 14 days: warming up
        states = {r["rule"]: r for r in json.loads(status.stdout)}
        assert states["idle-gpu"]["state"] == "ready"  # 30 min covered by the snapshot
        assert states["gpu-utilization-drop"]["state"] == "ready"  # 2 h covered
        drift = states["model-latency-drift"]
        assert drift["state"] == "warming up"
        assert abs(drift["until"] - (time.time() - 2 * 3600 + 14 * 86400)) < 600
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "window restored from" in stderr
    # at the shutdown, only what changed since the snapshot it read: the full one stays
    assert snapshot.stat().st_mtime_ns == before
    assert changes_path(snapshot).exists()
    again = WindowStore(step_seconds=STEP, recent_seconds=6 * 3600).read_snapshot(snapshot)
    assert again is not None
    assert again.series == 2
    assert again.written_at > first_at
