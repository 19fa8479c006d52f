"""Real remote-write receivers on loopback: Debian's VictoriaMetrics and Prometheus.

Each keeps its data folder and port across ``stop()``/``start()``, so a test can take the TSDB
away in the middle of a run and bring the same one back. ``samples(name)`` reads back every raw
sample of a metric's series (labels → [(milliseconds, value), ...]).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.collector_server import free_port
from tests.loopback_process import log_tail, start_ready, stop

Samples = dict[tuple[tuple[str, str], ...], list[tuple[int, float]]]


def binary(name: str) -> str | None:
    """An installed server binary (PATH, then /usr/bin), or None."""
    found = shutil.which(name)
    if found is None and Path(f"/usr/bin/{name}").exists():
        found = f"/usr/bin/{name}"
    return found


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310
        return bytes(response.read())


class _Server:
    name = ""

    def __init__(self) -> None:
        found = binary(self.name)
        if found is None:
            raise RuntimeError(f"{self.name} is not installed")
        self._binary = found
        self._dir = Path(tempfile.mkdtemp(prefix=f"gpuwarden-{self.name}-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.write_url = f"{self.url}/api/v1/write"
        self._log = self._dir / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        """Start (again) on the same port and data folder."""
        self._process = start_ready(self.name, self.argv(), log=self._log, url=self.url)

    def stop(self) -> None:
        """Stop the server (its data stays for ``start``)."""
        stop(self._process)
        self._process = None

    def __enter__(self) -> _Server:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def log_tail(self) -> str:
        """The end of the server's own log."""
        return log_tail(self._log)

    def samples(self, name: str) -> Samples:
        raise NotImplementedError


class VictoriaMetrics(_Server):
    """``victoria-metrics`` on a free port; raw samples through ``/api/v1/export``."""

    name = "victoria-metrics"

    def argv(self) -> list[str]:
        return [
            self._binary,
            f"-storageDataPath={self._dir / 'data'}",
            f"-httpListenAddr=127.0.0.1:{self.port}",
            "-retentionPeriod=100y",
        ]

    def samples(self, name: str) -> Samples:
        _get(f"{self.url}/internal/force_flush")  # make what was written searchable now
        query = urllib.parse.urlencode({"match[]": f'{{__name__="{name}"}}'})
        out: Samples = {}
        for line in _get(f"{self.url}/api/v1/export?{query}").decode().splitlines():
            row = json.loads(line)
            labels = tuple(sorted(row["metric"].items()))
            points = list(zip(row["timestamps"], row["values"], strict=True))
            out.setdefault(labels, []).extend(points)
        return {k: sorted(v) for k, v in out.items()}


class PrometheusReceiver(_Server):
    """``prometheus --web.enable-remote-write-receiver``; raw samples by a range selector."""

    name = "prometheus"

    def argv(self) -> list[str]:
        config = self._dir / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 15s\n")
        return [
            self._binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self._dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-remote-write-receiver",
        ]

    def samples(self, name: str) -> Samples:
        params = {"query": f"{name}[1d]", "time": str(time.time() + 600)}
        body: Any = json.loads(_get(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"))
        out: Samples = {}
        for series in body["data"]["result"]:
            labels = tuple(sorted(series["metric"].items()))
            out[labels] = [(round(float(t) * 1000), float(v)) for t, v in series["values"]]
        return out
