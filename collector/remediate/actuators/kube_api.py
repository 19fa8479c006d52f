"""What the Kubernetes actuators share: names, errors, the call choke point, custom objects.

:mod:`.kubernetes` (scale, requeue, cordon), :mod:`.kueue` (requeue through a Workload) and
:mod:`.routing` (HTTPRoute weights, KServe canary) all import this module and none of them imports
another for these. :func:`call_json` is the one place an actuator calls the client: raw JSON in
and out (so the client's model classes never decide what a field means), every client error
turned into a :class:`KubeError`. API objects come from
:class:`~gpuwarden.collector.jobs.kube_client.KubeApis`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException, OpenApiException

from gpuwarden.collector.jobs.kube_client import KubeApis

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
DEFAULT_REQUEST_TIMEOUT_SECONDS = 10.0
#: RFC 1123 label (namespaces) and subdomain (deployments, pods, nodes), as the API validates.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
#: Valid names that read as "everything": refused rather than risk an operator's intent.
_ALL_WORDS = frozenset({"all", "any", "everything", "cluster", "fleet", "none", "null"})


class KubeError(Exception):
    """An API call failed; ``status`` 0 means no answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def namespaced_name(target: str) -> tuple[str, str] | None:
    """``(namespace, name)`` from ``<namespace>/<name>``, or ``None`` when either is invalid."""
    namespace, slash, name = target.partition("/")
    if not slash or not _DNS_LABEL.fullmatch(namespace) or not _DNS_SUBDOMAIN.fullmatch(name):
        return None
    if name in _ALL_WORDS:
        return None
    return namespace, name


def node_name(target: str) -> str | None:
    """``target`` when it is one valid node name (a DNS subdomain), else ``None``."""
    if target in _ALL_WORDS or not _DNS_SUBDOMAIN.fullmatch(target):
        return None
    return target


def status_message(error: ApiException) -> str:
    """``Kubernetes API answered <status> <reason>``, with the Status body's message if any."""
    try:
        body = json.loads(error.body or "")
    except ValueError:
        body = None
    detail = f": {body['message']}" if isinstance(body, Mapping) and "message" in body else ""
    return f"Kubernetes API answered {error.status} {error.reason}{detail}"


def status_only(error: ApiException) -> str:
    """``Kubernetes API answered <status>`` (the status alone)."""
    return f"Kubernetes API answered {error.status}"


def call_json(
    call: Callable[..., Any],
    *args: Any,
    timeout_seconds: float,
    describe: Callable[[ApiException], str] = status_message,
    **kwargs: Any,
) -> dict[str, Any]:
    """Call one client method for its raw JSON answer; errors become :class:`KubeError`.

    Args:
        call: a bound method of an API object (``CoreV1Api.read_node``, ...).
        *args: its positional arguments.
        timeout_seconds: the request timeout.
        describe: words for an API error answer (:func:`status_message` or :func:`status_only`).
        **kwargs: its keyword arguments (``dry_run``, ``body``, ``_content_type``).

    """
    try:
        response = call(*args, **kwargs, _preload_content=False, _request_timeout=timeout_seconds)
        data: dict[str, Any] = json.loads(response.data or b"{}")
    except ApiException as error:
        raise KubeError(error.status or 0, describe(error)) from None
    except OpenApiException as error:
        raise KubeError(0, f"Kubernetes client error: {error}") from None
    except urllib3.exceptions.HTTPError as error:
        raise KubeError(0, f"Kubernetes API unreachable: {type(error).__name__}") from None
    return data


class CustomObjects:
    """The only user of ``CustomObjectsApi``: JSON in and out, errors as KubeError."""

    def __init__(
        self,
        client: ApiClient,
        *,
        request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        self._api = KubeApis(client).custom_objects()
        self._timeout = request_timeout_seconds

    def get(self, resource: tuple[str, str, str], namespace: str, name: str) -> dict[str, Any]:
        """GET one object."""
        group, version, plural = resource
        return self._json(
            self._api.get_namespaced_custom_object, group, version, namespace, plural, name
        )

    def list(self, resource: tuple[str, str, str], namespace: str) -> list[dict[str, Any]]:
        """The namespace's objects of ``resource``."""
        group, version, plural = resource
        data = self._json(
            self._api.list_namespaced_custom_object, group, version, namespace, plural
        )
        return [item for item in data.get("items") or [] if isinstance(item, dict)]

    def patch(
        self,
        resource: tuple[str, str, str],
        namespace: str,
        name: str,
        body: Any,
        *,
        content_type: str,
        dry_run: bool,
    ) -> dict[str, Any]:
        """PATCH one object with the given patch type."""
        group, version, plural = resource
        return self._json(
            self._api.patch_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            body,
            dry_run="All" if dry_run else None,
            _content_type=content_type,
        )

    def _json(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        # Custom-object errors have always said the status alone.
        return call_json(call, *args, timeout_seconds=self._timeout, describe=status_only, **kwargs)
