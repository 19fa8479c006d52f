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
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.collector_server import free_port
from tests.loopback_process import log_tail, start_ready, stop


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
        argv = [
            self._binary,
            f"--config.file={self.config_file}",
            f"--storage.path={self._dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
        ]
        self._process = start_ready("alertmanager", argv, log=self._log, url=self.url)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stop(self._process)
        shutil.rmtree(self._dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        """The end of Alertmanager's own log."""
        return log_tail(self._log, lines)

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
