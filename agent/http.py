"""The agent's small HTTP endpoint: ``/healthz`` and the optional Prometheus ``/metrics``.

Standard library only (a GPU node pays for every megabyte). The Prometheus text comes from the
OpenTelemetry Prometheus reader's own registry, whose callbacks read the sample cache.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)


class AgentHttpServer:
    """Serves ``/healthz`` (200 while sampling keeps up, else 503) and ``/metrics``."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        healthy: Callable[[], bool],
        registry: CollectorRegistry | None,
    ) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    ok = healthy()
                    body = json.dumps({"status": "ok" if ok else "stale"}).encode()
                    self._send(200 if ok else 503, "application/json", body)
                elif self.path == "/metrics" and server.registry is not None:
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(server.registry))
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _send(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("http: " + format, *args)

        self.registry = registry
        self._address = (host, port)
        self._handler = Handler
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port once started (useful with port 0), else the configured one."""
        if self._httpd is None:
            return self._address[1]
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        """Bind and serve in a daemon thread; raises ``OSError`` (e.g. EADDRINUSE) on bind."""
        self._httpd = ThreadingHTTPServer(self._address, self._handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="gpuwarden-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket (a no-op if never started)."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None
