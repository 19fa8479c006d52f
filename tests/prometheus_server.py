"""A real Prometheus (Debian ``prometheus``) on loopback, for end-to-end tests.

``PrometheusServer`` writes a config that scrapes the given targets every second (and loads
rule files), starts ``/usr/bin/prometheus`` on a free port with its TSDB in a temporary
directory, waits until it is ready, and runs PromQL through the HTTP API.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from tests.collector_server import free_port
from tests.loopback_process import log_tail, start_ready, stop


def prometheus_binary() -> str | None:
    """The Prometheus server binary, if installed."""
    found = shutil.which("prometheus")
    if found is None and Path("/usr/bin/prometheus").exists():
        found = "/usr/bin/prometheus"
    return found


class PrometheusServer:
    """Scrape ``targets`` (``job name → host:port``) every ``interval`` seconds.

    ``labels`` are added to every target (e.g. ``cluster``), as a real scrape config would.
    ``remote_write`` entries go into the config's ``remote_write`` section as they are.
    ``backfill``: an OpenMetrics file turned into TSDB blocks (``promtool tsdb
    create-blocks-from openmetrics``) in the data folder before Prometheus starts; give a
    ``retention`` that keeps them.
    """

    def __init__(
        self,
        targets: Mapping[str, str],
        *,
        rule_files: Sequence[Path] = (),
        labels: Mapping[str, str] | None = None,
        interval_seconds: int = 1,
        remote_write: Sequence[Mapping[str, Any]] = (),
        backfill: Path | None = None,
        retention: str = "1h",
    ) -> None:
        binary = prometheus_binary()
        if binary is None:
            raise RuntimeError("prometheus is not installed (apt-get install prometheus)")
        self._binary = binary
        self._dir = Path(tempfile.mkdtemp(prefix="gpuwarden-prometheus-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {
                "scrape_interval": f"{interval_seconds}s",
                "evaluation_interval": f"{interval_seconds}s",
            },
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [
                {
                    "job_name": job,
                    "static_configs": [{"targets": [target], "labels": dict(labels or {})}],
                }
                for job, target in targets.items()
            ],
        }
        if remote_write:
            config["remote_write"] = [dict(entry) for entry in remote_write]
        self.config_file = self._dir / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(config))
        self._process: subprocess.Popen[bytes] | None = None
        self._log = self._dir / "prometheus.log"
        self._backfill = backfill
        self._retention = retention

    def __enter__(self) -> PrometheusServer:
        if self._backfill is not None:
            subprocess.run(
                [str(Path(self._binary).with_name("promtool")), "tsdb", "create-blocks-from",
                 "openmetrics", str(self._backfill), str(self._dir / "data")],
                check=True, capture_output=True,
            )  # fmt: skip
        argv = [
            self._binary,
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self._dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--storage.tsdb.retention.time={self._retention}",
        ]
        self._process = start_ready("prometheus", argv, log=self._log, url=self.url)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stop(self._process)
        shutil.rmtree(self._dir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        """The end of Prometheus' own log."""
        return log_tail(self._log, lines)

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` and return ``data`` (raises on an error status)."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:  # noqa: S310
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{path}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (or matrix, or scalar as a one-element list)."""
        data = self.api("query", query=expr)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"value": result}]
        return list(result)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's series."""
        data = self.api("query_range", query=expr, start=str(start), end=str(end), step=f"{step}s")
        return list(data["result"])

    def wait_for(self, expr: str, timeout_seconds: float = 60) -> list[dict[str, Any]]:
        """Poll ``expr`` until it returns something; raise with the log tail otherwise."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.5)
        raise AssertionError(f"no data for {expr!r} after {timeout_seconds} s:\n{self.log_tail()}")
