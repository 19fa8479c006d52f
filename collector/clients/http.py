"""The collector's one HTTP client: a pooled ``urllib3.PoolManager`` behind one method.

Every outgoing HTTP call of the collector (notifiers, the signed webhooks, the router actuator,
model-server scrapes) goes through :class:`HttpClient`, built once by the composition root and
handed to its users. The client keeps connections open between calls, applies one timeout
policy (connect and read, per call or the default), verifies TLS, and never retries or follows
a redirect: whoever calls decides what an answer means, and the durable alert dispatcher is the
only place that tries a delivery again. Network failures and timeouts are not exceptions here:
they come back as status 0 with a ``detail`` naming the error type.

Proxies come from the environment the composition root hands over (:class:`Proxies`, read from
``HTTPS_PROXY``, ``HTTP_PROXY`` and ``NO_PROXY`` as curl and the standard library read them): a
site that reaches PagerDuty or Slack through a proxy keeps doing so.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import urllib3

DEFAULT_CONNECT_SECONDS = 5.0
DEFAULT_READ_SECONDS = 10.0
POOLS = 16
"""Hosts whose connections are kept (least recently used hosts beyond that are closed)."""
_DETAIL_CHARS = 200


def _no_headers() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class HttpResult:
    """What a server answered; ``status`` 0 when none answered (``detail`` says why).

    ``headers`` keys are lower case. ``truncated`` is set when the body was longer than the
    caller's ``max_body_bytes`` (``body`` then holds that many bytes).
    """

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=_no_headers)
    detail: str = ""
    truncated: bool = False

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return 200 <= self.status < 300

    def header(self, name: str) -> str | None:
        """One header of the answer (case-insensitive), or None."""
        return self.headers.get(name.lower())


@dataclass(frozen=True, slots=True)
class HttpTimeout:
    """How long to wait for a connection and then for each read of the answer."""

    connect_seconds: float = DEFAULT_CONNECT_SECONDS
    read_seconds: float = DEFAULT_READ_SECONDS

    def __post_init__(self) -> None:
        if self.connect_seconds <= 0 or self.read_seconds <= 0:
            raise ValueError("HTTP timeouts must be positive")


@dataclass(frozen=True, slots=True)
class Proxies:
    """Where requests go through a proxy: per scheme, except hosts ``no_proxy`` names."""

    http: str | None = None
    https: str | None = None
    no_proxy: str = ""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Proxies:
        """``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY``, lower-case names first (as curl does)."""

        def get(name: str) -> str | None:
            value = environ.get(name.lower()) or environ.get(name.upper())
            return value.strip() or None if value else None

        return cls(get("http_proxy"), get("https_proxy"), get("no_proxy") or "")

    def for_url(self, url: str) -> str | None:
        """The proxy URL for ``url``, or None to connect directly."""
        parts = urllib.parse.urlsplit(url)
        proxy = self.https if parts.scheme == "https" else self.http
        if proxy is None or not parts.hostname:
            return None
        return None if _bypassed(parts.hostname, parts.port, self.no_proxy) else proxy


def _bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether ``NO_PROXY`` names the host: ``*``, the host itself, a domain it is in
    (``example.com`` and ``.example.com`` both cover ``api.example.com``), optionally with the
    port (``host:8080``)."""
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, wanted = entry.partition(":")
        if wanted and wanted != str(port):
            continue
        name = name.lstrip(".")
        if host.lower() == name or host.lower().endswith("." + name):
            return True
    return False


class HttpClient:
    """Pooled HTTP(S) with one timeout policy, no retries and no redirects.

    Args:
        timeout: the default connect and read timeouts.
        pool: the connection pools (default: a ``PoolManager`` that verifies TLS); tests may
            pass their own.
        proxies: where to go through a proxy (default: never).
    """

    def __init__(
        self,
        *,
        timeout: HttpTimeout | None = None,
        pool: urllib3.PoolManager | None = None,
        proxies: Proxies | None = None,
    ) -> None:
        self._timeout = timeout or HttpTimeout()
        self._pool = pool or urllib3.PoolManager(num_pools=POOLS, cert_reqs="CERT_REQUIRED")
        self._proxies = proxies or Proxies()
        self._via: dict[str, urllib3.ProxyManager] = {}

    def _pool_for(self, url: str) -> urllib3.PoolManager:
        proxy = self._proxies.for_url(url)
        if proxy is None:
            return self._pool
        manager = self._via.get(proxy)
        if manager is None:
            manager = urllib3.ProxyManager(proxy, num_pools=POOLS, cert_reqs="CERT_REQUIRED")
            self._via[proxy] = manager
        return manager

    def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float | None = None,
        max_body_bytes: int | None = None,
    ) -> HttpResult:
        """Send one request and read the answer; never raises for a network failure.

        Args:
            method: ``GET``, ``POST``, ``PUT``, ``DELETE``...
            url: an ``http://`` or ``https://`` URL (anything else: status 0).
            body: the request body.
            headers: the request headers.
            timeout_seconds: both the connect and the read timeout of this call (default: the
                client's policy).
            max_body_bytes: read at most this much of the answer (``truncated`` if longer).
        """
        if not url.startswith(("http://", "https://")):
            return HttpResult(0, detail="not an http(s) URL")
        timeout = (
            urllib3.Timeout(connect=self._timeout.connect_seconds, read=self._timeout.read_seconds)
            if timeout_seconds is None
            else urllib3.Timeout(connect=timeout_seconds, read=timeout_seconds)
        )
        try:
            response = self._pool_for(url).request(
                method,
                url,
                body=body,
                headers=dict(headers or {}),
                timeout=timeout,
                retries=False,
                redirect=False,
                preload_content=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as error:
            return HttpResult(0, detail=_failure(error))
        try:
            limit = max_body_bytes
            data = response.read(None if limit is None else limit + 1)
            truncated = limit is not None and len(data) > limit
            if truncated:
                data = data[:limit]
        except (urllib3.exceptions.HTTPError, OSError) as error:
            response.release_conn()
            return HttpResult(0, detail=_failure(error))
        if truncated:
            response.close()  # the rest stays unread: this connection cannot be reused
        else:
            response.drain_conn()
        response.release_conn()
        answer = {name.lower(): value for name, value in response.headers.items()}
        return HttpResult(
            status=response.status,
            body=data,
            headers=MappingProxyType(answer),
            detail="" if 200 <= response.status < 300 else _reason(response.reason),
            truncated=truncated,
        )

    def close(self) -> None:
        """Close every kept connection."""
        self._pool.clear()
        for manager in self._via.values():
            manager.clear()


def _reason(reason: str | None) -> str:
    return (reason or "")[:_DETAIL_CHARS]


def _failure(error: BaseException) -> str:
    """``unreachable: <Type>``: a timeout by its own kind (connect or read), anything else by its
    innermost cause (``ConnectionRefusedError``, ``gaierror``, ``SSLCertVerificationError``...)."""
    timeout = isinstance(error, urllib3.exceptions.TimeoutError)
    if timeout and not isinstance(error, urllib3.exceptions.NewConnectionError):
        return f"unreachable: {type(error).__name__}"
    cause: BaseException = error
    seen = 0
    while (inner := cause.__cause__ or cause.__context__) is not None and seen < 8:
        cause, seen = inner, seen + 1
    return f"unreachable: {type(cause).__name__}"
