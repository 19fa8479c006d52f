"""Orderly shutdown, as an operator sees it: the collector and the demo run as processes and are
stopped by SIGINT or SIGTERM while detection runs, or refused a busy port. Their stderr has no
traceback and no ``the store is closed``: the loops finish their running step before the
database closes. Exit codes: 0 when stopped by a signal, 1 for a busy port.

The collector runs under ``tests.slow_detection``, whose cycles hold until shutdown begins, so
the signal always lands mid-cycle. Nothing here sleeps: it waits for lines of output, each wait
bounded by a deadline.
"""

from __future__ import annotations

import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from tests.collector_server import free_port

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "shutdown-test-token-0123456789abcdef"
SIGNALS = [pytest.param(signal.SIGINT, id="SIGINT"), pytest.param(signal.SIGTERM, id="SIGTERM")]


@dataclass
class Process:
    """A process whose stdout lines are read as they come and whose stderr goes to a file."""

    proc: subprocess.Popen[str]
    stderr_path: Path
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    def read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for_line(self, text: str, timeout_seconds: float) -> str:
        """The first stdout line containing ``text``; fails at the deadline or at EOF."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {text!r} within {timeout_seconds} s") from None
            if line is None:
                raise AssertionError(f"exited before {text!r}: {self.stderr()[-3000:]}")
            self.seen.append(line)
            if text in line:
                return line

    def finish(self, timeout_seconds: float) -> tuple[int, str, str]:
        """Exit code, all of stdout, stderr."""
        code = self.proc.wait(timeout_seconds)
        deadline = time.monotonic() + timeout_seconds
        while (line := self.lines.get(timeout=max(0.0, deadline - time.monotonic()))) is not None:
            self.seen.append(line)
        return code, "\n".join(self.seen), self.stderr()

    def stderr(self) -> str:
        return self.stderr_path.read_text()


@contextmanager
def started(argv: Sequence[str], tmp_path: Path) -> Iterator[Process]:
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv], stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT
        )
    process = Process(proc, stderr_path)
    assert proc.stdout is not None
    reader = threading.Thread(target=process.read, args=(proc.stdout,), daemon=True)
    reader.start()
    try:
        yield process
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def assert_clean(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "the store is closed" not in stderr, stderr[-3000:]


def collector_config(tmp_path: Path, port: int) -> Path:
    (tmp_path / "tokens").write_text(f"agent agents {TOKEN} nodes=*\n")
    config = tmp_path / "collector.yaml"
    config.write_text(
        f"port: {port}\ntokens_file: {tmp_path / 'tokens'}\n"
        f"database: {tmp_path / 'collector.db'}\ndetection_seconds: 1\n"
    )
    return config


@pytest.mark.parametrize("signum", SIGNALS)
def test_a_signal_mid_cycle_lets_the_cycle_finish_then_closes_the_store(
    tmp_path: Path, signum: signal.Signals
) -> None:
    config = collector_config(tmp_path, free_port())
    argv = ["tests.slow_detection", "collector", "--config", str(config)]
    with started(argv, tmp_path) as collector:
        collector.wait_for_line("detection cycle started", 60)
        collector.proc.send_signal(signum)
        code, out, err = collector.finish(60)
    assert_clean(err)
    assert "detection cycle finished" in out
    assert code == 0


def test_a_busy_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = collector_config(tmp_path, port)
        argv = ["tests.slow_detection", "collector", "--config", str(config)]
        with started(argv, tmp_path) as collector:
            code, _, err = collector.finish(60)
    assert_clean(err)
    assert (
        f"gpuwarden collector: 127.0.0.1:{port} is in use; choose another port with --port or "
        "stop the other process"
    ) in err.splitlines()
    assert code == 1


def demo_argv(*args: str) -> list[str]:
    return ["gpuwarden", "--log-level", "WARNING", "demo", "--speed", "60", *args]


@pytest.mark.parametrize("signum", SIGNALS)
def test_a_signal_ends_the_demo_with_the_report_and_removes_its_database(
    tmp_path: Path, signum: signal.Signals
) -> None:
    with started(demo_argv("--duration", "120"), tmp_path) as demo:
        demo.wait_for_line("fleet: ", 60)
        demo.proc.send_signal(signum)
        code, out, err = demo.finish(120)
    assert_clean(err)
    assert "interrupted: finishing with the report" in out
    assert "gpuwarden demo report" in out
    removed = re.search(r"^database (\S+) is removed at exit", out, re.MULTILINE)
    assert removed is not None, out[-2000:]
    db = Path(removed.group(1))
    assert db.name == "demo.db"
    assert db.parent.name.startswith("gpuwarden-demo-")
    assert not db.parent.exists()
    assert code == 0


def test_lingering_keeps_the_temporary_database_and_says_where(tmp_path: Path) -> None:
    with started(demo_argv("--duration", "2", "--linger", "120"), tmp_path) as demo:
        kept = demo.wait_for_line("database kept at ", 120)
        demo.wait_for_line("more seconds (Ctrl-C stops)", 30)
        demo.proc.send_signal(signal.SIGINT)
        code, _, err = demo.finish(60)
    db = Path(kept.removeprefix("database kept at ").split(":")[0])
    try:
        assert_clean(err)
        assert db.exists()
        assert db.parent.name.startswith("gpuwarden-demo-")
        assert not (db.parent / "spool").exists()
        assert code == 0
    finally:
        shutil.rmtree(db.parent, ignore_errors=True)


def test_the_demo_on_a_busy_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with started(demo_argv("--port", str(port)), tmp_path) as demo:
            code, out, err = demo.finish(60)
    assert_clean(err)
    assert (
        f"gpuwarden demo: 127.0.0.1:{port} is in use; choose another port with --port "
        "or leave it out"
    ) in err.splitlines()
    assert "database" not in out
    assert code == 1
