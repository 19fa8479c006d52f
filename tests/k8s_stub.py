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
import copy
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
    method: str = "GET"
    content_type: str | None = None
    body: Any = None


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
        self._send(status, body)

    def do_PATCH(self) -> None:
        self._write("PATCH")

    def do_DELETE(self) -> None:
        self._write("DELETE")

    def _write(self, method: str) -> None:
        stub = self.server.stub
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        authorization = self.headers.get("Authorization")
        content_type = self.headers.get("Content-Type")
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request_body = json.loads(raw) if raw else None
        if authorization != f"Bearer {stub.token}":
            status, body = 401, status_object(401, "Unauthorized", "Unauthorized")
        else:
            status, body = stub.objects.write(method, url.path, query, content_type, request_body)
        stub.record(
            Request(url.path, query, authorization, status, method, content_type, request_body)
        )
        self._send(status, body)

    def _send(self, status: int, body: Mapping[str, Any]) -> None:
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
        self.absent_resources: set[str] = set()
        """Plural names (``workloads``) answered 404, as for a CRD that is not installed."""
        self.objects = ObjectStore()
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
        if any(f"/{plural}" in path for plural in self.absent_resources):
            message = "the server could not find the requested resource"
            return 404, status_object(404, "NotFound", message)
        found = self.objects.read(path)
        if found is not None:
            return found
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


# --- objects that actuators read and write ------------------------------------------------------

_PATCH_TYPES = frozenset(
    {
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    }
)
# Built-in kinds accept strategic merge patches; custom resources answer 415 (as the API does).
_BUILT_IN_PREFIXES = ("/api/v1/", "/apis/apps/v1/", "/apis/autoscaling/v2/")


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch (strategic merge behaves the same on the maps used here)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


def _pointer(document: Any, path: str) -> tuple[Any, str | int]:
    """The container and key a JSON pointer names (its parent must exist)."""
    tokens = [token.replace("~1", "/").replace("~0", "~") for token in path.split("/")[1:]]
    node = document
    for token in tokens[:-1]:
        node = node[int(token)] if isinstance(node, list) else node[token]
    last: str | int = int(tokens[-1]) if isinstance(node, list) else tokens[-1]
    return node, last


def _json_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902 ``add``/``replace``/``remove``/``test``; raises ``ValueError`` when one fails."""
    result = copy.deepcopy(document)
    for operation in operations:
        try:
            parent, key = _pointer(result, operation["path"])
            op = operation["op"]
            if op == "test":
                if parent[key] != operation["value"]:
                    raise ValueError(f"testing value {operation['path']} failed")
            elif op == "replace":
                parent[key]  # replace needs an existing member
                parent[key] = operation["value"]
            elif op == "add":
                if isinstance(parent, list):
                    parent.insert(int(key), operation["value"])
                else:
                    parent[key] = operation["value"]
            elif op == "remove":
                del parent[key]
            else:
                raise ValueError(f"unexpected op {op}")
        except (KeyError, IndexError, TypeError) as error:
            raise ValueError(f"doc is missing path: {operation.get('path')}: {error}") from None
    return result


class ObjectStore:
    """Objects by API path; PATCH and DELETE on them as kube-apiserver answers.

    Each write bumps ``metadata.resourceVersion``; a patch whose result carries a different
    ``resourceVersion`` than the stored one is a 409 conflict; ``dryRun=All`` answers the result
    without storing it; a JSON patch whose operation fails is a 422; an unknown object is a 404.
    ``.../deployments/<name>/scale`` is the scale subresource of a stored deployment.
    """

    def __init__(self) -> None:
        self._objects: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._version = int(RESOURCE_VERSION)

    def put(self, path: str, obj: Mapping[str, Any]) -> None:
        """Store ``obj`` at ``path`` (a fresh resourceVersion is set)."""
        with self._lock:
            stored = copy.deepcopy(dict(obj))
            stored.setdefault("metadata", {})["resourceVersion"] = self._next()
            self._objects[path] = stored

    def get(self, path: str) -> dict[str, Any] | None:
        """A copy of the object at ``path``."""
        with self._lock:
            found = self._objects.get(path)
            return copy.deepcopy(found) if found is not None else None

    def _next(self) -> str:
        self._version += 1
        return str(self._version)

    def read(self, path: str) -> tuple[int, dict[str, Any]] | None:
        """GET an object, its scale, or a list of objects under ``path``; ``None``: not ours."""
        with self._lock:
            if path in self._objects:
                return 200, copy.deepcopy(self._objects[path])
            if path.endswith("/scale") and path.removesuffix("/scale") in self._objects:
                return 200, _scale(self._objects[path.removesuffix("/scale")])
            if path.endswith("/scale") and "/deployments/" in path:
                return 404, _not_found(path.removesuffix("/scale"))
            items = [obj for key, obj in sorted(self._objects.items()) if _parent(key) == path]
            if _cluster_scoped_list(path):  # e.g. /apis/kueue.x-k8s.io/v1beta1/workloads
                items = [
                    obj
                    for key, obj in sorted(self._objects.items())
                    if _cluster_parent(key) == path
                ]
            if items or path.endswith(("/horizontalpodautoscalers", "/workloads")):
                return 200, {
                    "kind": "List",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self._version)},
                    "items": copy.deepcopy(items),
                }
            if _parent(path).endswith(("/nodes", "/httproutes", "/inferenceservices")):
                return 404, _not_found(path)
            return None

    def write(
        self,
        method: str,
        path: str,
        query: Mapping[str, str],
        content_type: str | None,
        body: Any,
    ) -> tuple[int, dict[str, Any]]:
        """Answer a PATCH or DELETE."""
        dry_run = query.get("dryRun")
        if dry_run not in (None, "All"):
            message = f'Invalid dryRun value: "{dry_run}"'
            return 400, status_object(400, "BadRequest", message)
        with self._lock:
            scale = path.endswith("/scale")
            key = path.removesuffix("/scale") if scale else path
            if key not in self._objects:
                return 404, _not_found(key)
            current = self._objects[key]
            if method == "DELETE":
                uid = ((body or {}).get("preconditions") or {}).get("uid")
                if uid is not None and uid != current["metadata"].get("uid"):
                    message = (
                        f"Precondition failed: UID in precondition: {uid}, "
                        f"UID in object meta: {current['metadata'].get('uid')}"
                    )
                    return 409, status_object(409, "Conflict", message)
                if not dry_run:
                    del self._objects[key]
                return 200, copy.deepcopy(current)
            return self._patch(key, current, scale, content_type, body, dry_run=dry_run)

    def _patch(
        self,
        key: str,
        current: dict[str, Any],
        scale: bool,
        content_type: str | None,
        body: Any,
        *,
        dry_run: str | None,
    ) -> tuple[int, dict[str, Any]]:
        kind = (content_type or "").split(";")[0].strip()
        if kind not in _PATCH_TYPES or (
            kind == "application/strategic-merge-patch+json"
            and not key.startswith(_BUILT_IN_PREFIXES)
        ):
            message = (
                "the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(sorted(_PATCH_TYPES))}"
            )
            return 415, status_object(415, "UnsupportedMediaType", message)
        before = _scale(current) if scale else current
        try:
            if kind == "application/json-patch+json":
                after = _json_patch(before, body)
            else:
                after = _merge(before, body)
        except ValueError as error:
            return 422, status_object(422, "Invalid", str(error))
        if after["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            message = (
                f'Operation cannot be fulfilled on {_resource(key)} "{key.rsplit("/", 1)[-1]}": '
                "the object has been modified; please apply your changes to the latest version "
                "and try again"
            )
            return 409, status_object(409, "Conflict", message)
        if scale:
            replicas = after["spec"]["replicas"]
            after = copy.deepcopy(current)
            after["spec"]["replicas"] = replicas
        if dry_run:
            return 200, _scale(after) if scale else after
        after["metadata"]["resourceVersion"] = self._next()
        self._objects[key] = after
        return 200, _scale(after) if scale else copy.deepcopy(after)


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]


def _cluster_scoped_list(path: str) -> bool:
    """``/apis/<group>/<version>/<plural>``: a custom resource listed in all namespaces."""
    parts = path.strip("/").split("/")
    return len(parts) == 4 and parts[0] == "apis" and parts[3] != "namespaces"


def _cluster_parent(path: str) -> str:
    """The all-namespaces list path of a namespaced custom object's path, else ``""``."""
    parts = path.strip("/").split("/")
    if len(parts) != 7 or parts[0] != "apis" or parts[3] != "namespaces":
        return ""
    return "/" + "/".join([*parts[:3], parts[5]])


def _resource(path: str) -> str:
    parts = path.strip("/").split("/")
    plural = parts[-2]
    group = parts[1] if parts[0] == "apis" else ""
    return f"{plural}.{group}" if group else plural


def _not_found(path: str) -> dict[str, Any]:
    name = path.rsplit("/", 1)[-1]
    resource = _resource(path)
    return status_object(404, "NotFound", f'{resource} "{name}" not found', kind=resource)


def _scale(deployment: Mapping[str, Any]) -> dict[str, Any]:
    metadata = deployment["metadata"]
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata.get("namespace"),
            "resourceVersion": metadata["resourceVersion"],
        },
        "spec": {"replicas": deployment["spec"].get("replicas", 1)},
        "status": {"replicas": deployment.get("status", {}).get("replicas", 0)},
    }
