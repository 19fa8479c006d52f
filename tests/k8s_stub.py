"""A stand-in for the Kubernetes API server's pod list endpoints, for the real client to talk to.

Serves ``GET /api/v1/pods`` and ``GET /api/v1/namespaces/{namespace}/pods`` on 127.0.0.1 the
way kube-apiserver does: a ``PodList`` (``apiVersion``, ``kind``, ``metadata.resourceVersion``,
items sorted by namespace and name, without per-item ``kind``), ``limit``/``continue`` paging,
``Status`` objects for errors (401 without the bearer token, 403 when RBAC forbids the list, 404
for any other path). Like the real server, a namespace that does not exist lists as empty (200):
kube-apiserver does not reveal which namespaces exist (kubernetes/kubernetes#75537).
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

RESOURCE_VERSION = "48151623"
SERVICE_ACCOUNT = "system:serviceaccount:gpuwarden:collector"
SHUTDOWN_POLL_SECONDS = 0.02  # how often serve_forever checks for shutdown()


@dataclass(frozen=True, slots=True)
class Request:
    """One request the stub answered."""

    path: str
    query: Mapping[str, str]
    authorization: str | None
    status: int


def status_object(code: int, reason: str, message: str, kind: str | None = None) -> dict[str, Any]:
    """A ``metav1.Status`` failure, as the API server sends with every error."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if kind is not None:
        body["details"] = {"kind": kind}
    return body


def _encode_continue(offset: int) -> str:
    token = json.dumps({"v": "meta.k8s.io/v1", "rv": int(RESOURCE_VERSION), "start": offset})
    return base64.urlsafe_b64encode(token.encode()).decode()


def _decode_continue(token: str) -> int:
    decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
    return int(decoded["start"])


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close joins the handler threads
    stub: KubeApiStub

    def __init__(self, stub: KubeApiStub) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stub = stub
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like the real server
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet; requests are recorded instead."""

    def do_GET(self) -> None:
        stub = self.server.stub
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        authorization = self.headers.get("Authorization")
        status, body = stub.answer(url.path, query, authorization)
        stub.record(Request(url.path, query, authorization, status))
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Audit-Id", "6f1c0f0e-stub")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class KubeApiStub:
    """Serve ``pods`` (API-shaped dicts) to clients that present ``Bearer <token>``.

    Set ``forbidden`` to answer every list with 403, as RBAC does for a service account without
    ``list pods``. Use as a context manager; ``url`` is the server's base URL.
    """

    def __init__(self, pods: Iterable[Mapping[str, Any]], *, token: str) -> None:
        self.pods = sorted(
            pods, key=lambda pod: (pod["metadata"]["namespace"], pod["metadata"]["name"])
        )
        self.token = token
        self.forbidden = False
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL of the running stub."""
        if self._server is None:
            raise RuntimeError("stub not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> KubeApiStub:
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS},
            name="kube-api-stub",
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.shutdown()
        with server.connections_lock:
            connections = list(server.connections)
        for connection in connections:  # end keep-alive connections the client left open
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        server.server_close()
        thread.join()
        self._server = self._thread = None

    def record(self, request: Request) -> None:
        """Remember a request (handler threads call this)."""
        with self._lock:
            self.requests.append(request)

    def answer(
        self, path: str, query: Mapping[str, str], authorization: str | None
    ) -> tuple[int, dict[str, Any]]:
        """Return the status and JSON body the API server would send."""
        if authorization != f"Bearer {self.token}":
            return 401, status_object(401, "Unauthorized", "Unauthorized")
        parts = path.strip("/").split("/")
        if parts == ["api", "v1", "pods"]:
            namespace = None
        elif len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            namespace = parts[3]
        else:
            message = "the server could not find the requested resource"
            return 404, status_object(404, "NotFound", message)
        if self.forbidden:
            scope = (
                "at the cluster scope" if namespace is None else f'in the namespace "{namespace}"'
            )
            message = (
                f'pods is forbidden: User "{SERVICE_ACCOUNT}" cannot list resource "pods" '
                f'in API group "" {scope}'
            )
            return 403, status_object(403, "Forbidden", message, kind="pods")
        return 200, self._page(namespace, query)

    def _page(self, namespace: str | None, query: Mapping[str, str]) -> dict[str, Any]:
        pods = [
            pod
            for pod in self.pods
            if namespace is None or pod["metadata"]["namespace"] == namespace
        ]
        start = _decode_continue(query["continue"]) if query.get("continue") else 0
        limit = int(query["limit"]) if query.get("limit") else len(pods)
        end = start + limit
        metadata: dict[str, Any] = {"resourceVersion": RESOURCE_VERSION}
        if end < len(pods):
            metadata["continue"] = _encode_continue(end)
            metadata["remainingItemCount"] = len(pods) - end
        return {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": metadata,
            "items": pods[start:end],
        }
