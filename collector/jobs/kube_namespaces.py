"""Namespace labels from the Kubernetes API, cached: the admission webhook's team by namespace.

An AdmissionReview carries the object, not its namespace's labels, so a team named by a
namespace label (``gpuwarden.io/team: ml``) is read with ``GET /api/v1/namespaces/{name}``
(RBAC: ``get namespaces``). Answers are kept ``ttl_seconds`` so a burst of pods costs one read;
a namespace that cannot be read (missing, forbidden, API down) is ``None`` (the caller falls
back to the namespace's name), logged once per namespace and status until it reads again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

log = logging.getLogger(__name__)
MAX_NAMESPACES = 10_000
"""Cached namespaces at most (a cluster has far fewer; beyond, the cache starts afresh)."""


class NamespaceReader(Protocol):
    """The one call used of ``kubernetes.client.CoreV1Api``."""

    def read_namespace(self, name: str, *, _request_timeout: float) -> Any:
        """The namespace object (``.metadata.labels``)."""
        ...


class NamespaceLabels:
    """``labels(name)``: a namespace's labels, or ``None`` when it cannot be read."""

    def __init__(
        self,
        api: NamespaceReader,
        *,
        ttl_seconds: float = 60.0,
        timeout_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._ttl = ttl_seconds
        self._timeout = timeout_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Mapping[str, str] | None]] = {}
        self._logged: set[tuple[str, str]] = set()

    def labels(self, name: str) -> Mapping[str, str] | None:
        """The labels of namespace ``name`` (blocking on a cache miss: call it off the loop)."""
        now = self._clock()
        with self._lock:
            hit = self._cache.get(name)
            if hit is not None and now - hit[0] < self._ttl:
                return hit[1]
        found = self._read(name)
        with self._lock:
            if len(self._cache) >= MAX_NAMESPACES:
                self._cache.clear()
            self._cache[name] = (now, found)
        return found

    def _read(self, name: str) -> Mapping[str, str] | None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            namespace = self._api.read_namespace(name, _request_timeout=self._timeout)
        except ApiException as exc:
            self._log_once(name, f"HTTP {exc.status} {exc.reason}")
            return None
        except (HTTPError, OSError, ValueError) as exc:  # no answer: refused, timed out
            self._log_once(name, type(exc).__name__)
            return None
        self._logged = {key for key in self._logged if key[0] != name}
        labels = getattr(getattr(namespace, "metadata", None), "labels", None) or {}
        return MappingProxyType({str(k): str(v) for k, v in labels.items()})

    def _log_once(self, name: str, why: str) -> None:
        if (name, why) not in self._logged:
            self._logged.add((name, why))
            log.warning("namespace %s: labels not readable (%s); its name is the team", name, why)
