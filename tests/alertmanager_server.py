"""A real Alertmanager (Debian ``prometheus-alertmanager``) on loopback, for end-to-end tests.

``AlertmanagerServer`` writes the given config, starts the binary on a free port with gossip
off (``--cluster.listen-address=``) and its data in a temporary directory, waits until it is
ready, and talks to its API v2.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.collector_server import free_port


def alertmanager_binary() -> str | None:
    """The Alertmanager binary, if installed."""
    for name in ("prometheus-alertmanager", "alertmanager"):
        found = shutil.which(name)
        if found is not None:
            return found
    path = Path("/usr/bin/prometheus-alertmanager")
    return str(path) if path.exists() else None


class AlertmanagerServer:
    """Alertmanager with ``config`` (a mapping, written as YAML), on ``port`` (default: a free
    one; give one when other configs must name it before it starts)."""

    def __init__(self, config: Mapping[str, Any], *, port: int | None = None) -> None:
        binary = alertmanager_binary()
        if binary is None:
            raise RuntimeError("no alertmanager (apt-get install prometheus-alertmanager)")
        self._binary = binary
        self._dir = Path(tempfile.mkdtemp(prefix="gpuwarden-alertmanager-"))
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_file = self._dir / "alertmanager.yml"
        self.config_file.write_text(yaml.safe_dump(dict(config)))
        self._log = self._dir / "alertmanager.log"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> AlertmanagerServer:
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    self._binary,
                    f"--config.file={self.config_file}",
                    f"--storage.path={self._dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"alertmanager exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:  # noqa: S310
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"alertmanager did not become ready: {self.log_tail()}")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        """The end of Alertmanager's own log."""
        text = self._log.read_text(errors="replace") if self._log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def request(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        """``method /api/v2/<path>`` with a JSON body; (status, decoded answer)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - loopback
            f"{self.url}/api/v2/{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                raw = response.read()
                return response.status, json.loads(raw) if raw.strip() else None
        except urllib.error.HTTPError as error:
            with error:
                return error.code, error.read().decode(errors="replace")

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts`` (active, silenced and inhibited)."""
        query = "&".join(f"filter={k}%3D%22{v}%22" for k, v in filters.items())
        status, answer = self.request("GET", f"alerts?{query}" if query else "alerts")
        assert status == 200, answer
        return list(answer)

    def silences(self) -> list[dict[str, Any]]:
        """``GET /api/v2/silences``."""
        status, answer = self.request("GET", "silences")
        assert status == 200, answer
        return list(answer)
