"""Start and stop a server binary on loopback for the end-to-end tests (Prometheus,
Alertmanager): its output goes to a log file, it is ready once ``GET <url>/-/ready`` answers
200, and a failure to start raises with the end of that log. ``wait_for`` polls any external
process's observable state until a deadline."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path


def log_tail(log: Path, lines: int = 20) -> str:
    """The end of a server's own log."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def start_ready(
    name: str, argv: Sequence[str], *, log: Path, url: str, timeout_seconds: float = 60
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with its output in ``log``; return once ``url/-/ready`` answers 200."""
    with log.open("wb") as out:
        process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:  # an external process: poll its readiness endpoint
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {log_tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:  # noqa: S310
                if response.status == 200:
                    return process
        except OSError:
            time.sleep(0.2)
    stop(process)
    raise RuntimeError(f"{name} did not become ready: {log_tail(log)}")


def stop(process: subprocess.Popen[bytes] | None) -> None:
    """Terminate, then kill after 20 s."""
    if process is None:
        return
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll an external process's observable state until a deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
