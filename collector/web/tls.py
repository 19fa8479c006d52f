"""HTTPS for the collector: the server's ``ssl.SSLContext``, its certificate reload (on SIGHUP
and ``POST /v1/admin/reload``, through :mod:`~.reload`), and the names of a request's verified
client certificate (mTLS).

One context serves every connection for the life of the process: the aiohttp site holds it,
so a renewed certificate is loaded into that same context (OpenSSL uses the context's current
certificate for each new handshake; connections already open keep theirs). A reload first
loads the new pair into a scratch context, so a bad or mismatched pair never touches the
serving one: the old certificate stays and one line says why.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gpuwarden.collector.config import ConfigError, TlsSettings

__all__ = [
    "MINIMUM_VERSION",
    "certificate_names",
    "client_names",
    "reload_certificate",
    "server_context",
]

log = logging.getLogger(__name__)

#: TLS 1.0 and 1.1 are deprecated (RFC 8996); every agent's Python speaks 1.2 and 1.3.
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


def server_context(tls: TlsSettings) -> ssl.SSLContext:
    """The serving context for ``tls`` (which must be enabled).

    Raises:
        ConfigError: one line naming the ``tls.*`` key and file that do not load.
    """
    if tls.cert_file is None:
        raise ConfigError("tls.cert_file: required to serve HTTPS")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MINIMUM_VERSION
    _load_pair(context, tls)
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(tls.client_ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"tls.client_ca_file: {tls.client_ca_file}: not a usable PEM CA bundle "
                f"({_reason(exc)})"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL
    return context


def reload_certificate(context: ssl.SSLContext, tls: TlsSettings) -> bool:
    """Load ``tls.cert_file`` and ``tls.key_file`` again into ``context``; return whether it did.

    New connections get the new certificate. If the files do not hold a matching, readable pair,
    the context keeps serving the certificate it had, and one error line says why. The client
    CA (``tls.client_ca_file``) is not reloaded: OpenSSL can add CAs to a context but not
    remove them, so a changed client CA needs a restart.
    """
    try:
        _load_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), tls)  # a bad pair stops here
        _load_pair(context, tls)
    except ConfigError as exc:
        log.error("TLS certificate not reloaded, still serving the previous one: %s", exc)
        return False
    log.info("TLS certificate reloaded from %s", tls.cert_file)
    return True


def client_names(request: web.BaseRequest) -> tuple[str, ...]:
    """The names of the request's verified client certificate: subject CN, then SAN DNS names.

    Empty when the connection is plain HTTP, the client sent no certificate, or mTLS is off
    (Python exposes a peer certificate only once it was verified against ``client_ca_file``).
    """
    transport = request.transport
    if transport is None:
        return ()
    cert = transport.get_extra_info("peercert")
    return certificate_names(cert) if cert else ()


def certificate_names(cert: Mapping[str, Any]) -> tuple[str, ...]:
    """The subject common names and ``DNS`` subject alternative names of a certificate as
    ``ssl.SSLSocket.getpeercert()`` decodes it, in that order, each once."""
    names = [
        value
        for rdn in cert.get("subject", ())
        for key, value in rdn
        if key == "commonName" and isinstance(value, str)
    ]
    names += [
        value
        for kind, value in cert.get("subjectAltName", ())
        if kind == "DNS" and isinstance(value, str)
    ]
    return tuple(dict.fromkeys(names))


def _load_pair(context: ssl.SSLContext, tls: TlsSettings) -> None:
    """Load the certificate chain and key; raise ``ConfigError`` naming both files."""
    try:
        # An encrypted key gets an empty password instead of OpenSSL's terminal prompt.
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file), password=b"")
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"tls.cert_file {tls.cert_file} and tls.key_file {tls.key_file}: not a matching "
            f"PEM certificate and unencrypted key ({_reason(exc)})"
        ) from None


def _reason(exc: OSError | ssl.SSLError) -> str:
    """The short reason of an ``ssl`` or file error (never the file's content)."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return exc.strerror or str(exc)
