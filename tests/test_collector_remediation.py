"""The real ``gpuwarden collector`` process serves remediation: runbooks, incidents, actions."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.collector_server import free_port

TOKEN = "tok-0123456789abcdef0123"


def start(tmp: Path, extra: str = "") -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    (tmp / "tokens").write_text(f"operator ops {TOKEN}\n")
    (tmp / "c.yaml").write_text(
        f"port: {port}\ntokens_file: {tmp / 'tokens'}\ndatabase: {tmp / 'c.db'}\n{extra}"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "collector", "--config", str(tmp / "c.yaml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, port


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def wait_ready(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while True:  # the external process's health endpoint, polled until a deadline
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if get(f"http://127.0.0.1:{port}/healthz")[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "collector did not start"
        time.sleep(0.1)


def test_runbooks_and_the_remediation_api_are_served(tmp_path):
    proc, port = start(tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(port, proc)
        first = get(f"{base}/runbooks/idle-gpu")  # a person's page: the sign-in form
        assert (first[0], b'action="/login"' in first[1]) == (200, True)
        status, body = get(f"{base}/runbooks/idle-gpu", TOKEN)
        assert status == 200
        assert b"What automation does" in body
        assert get(f"{base}/v1/actions")[0] == 401
        status, body = get(f"{base}/v1/actions", TOKEN)
        assert status == 200
        assert json.loads(body) is not None
        status, body = get(f"{base}/v1/breaker", TOKEN)
        assert status == 200
        assert b"closed" in body
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


def test_a_bad_remediation_section_stops_the_start_with_the_key(tmp_path):
    proc, _ = start(tmp_path, "remediation:\n  dry_runn: false\n")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "remediation: unknown key 'dry_runn'; did you mean 'dry_run'?" in err


def test_incidents_and_actions_commands_read_the_database(tmp_path):
    from gpuwarden.collector.storage.records import Incident
    from gpuwarden.collector.storage.sqlite import SqliteStorage

    db = tmp_path / "c.db"
    with SqliteStorage(db) as storage:
        storage.open_incident(
            Incident(fingerprint="fp", rule_id="idle-gpu", severity="warning",
                     first_seen=1.0, last_seen=2.0, evidence={"summary": "GPU 3 idle"})
        )  # fmt: skip

    def gw(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuwarden", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    listed = gw("incidents", "list", "--db", str(db))
    assert listed.returncode == 0, listed.stderr
    assert "idle-gpu" in listed.stdout
    assert "GPU 3 idle" in listed.stdout
    actions = gw("actions", "list", "--db", str(db))
    assert actions.returncode == 0, actions.stderr
    missing = gw("actions", "approve", "42", "--db", str(db))
    assert missing.returncode != 0
    assert "42" in missing.stderr
