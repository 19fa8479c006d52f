"""The agent's TLS client context for an ``https://`` collector endpoint.

Verification is never turned off: the collector's certificate must chain to ``ca_file`` (or,
without one, to the system trust store) and name the endpoint's host. A client certificate
(``cert_file``, ``key_file``) is presented when the collector asks for one (mTLS).
"""

from __future__ import annotations

import ssl

from gpuwarden.agent.config import CollectorConfig, ConfigError

#: TLS 1.0 and 1.1 are deprecated (RFC 8996); the collector refuses them too.
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


def client_context(collector: CollectorConfig) -> ssl.SSLContext | None:
    """The context for the https:// endpoints of ``collector``; None without one.

    Raises:
        ConfigError: one line naming the ``collector.*`` key and file that do not load.
    """
    if not any(url.startswith("https://") for url in collector.urls):
        return None
    try:
        # ca_file replaces the system trust store (as curl --cacert does); hostnames are checked
        context = ssl.create_default_context(
            cafile=None if collector.ca_file is None else str(collector.ca_file)
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"collector.ca_file: {collector.ca_file}: not a readable PEM CA bundle ({_reason(exc)})"
        ) from None
    context.minimum_version = MINIMUM_VERSION
    if collector.cert_file is not None:
        try:
            # An encrypted key gets an empty password instead of OpenSSL's terminal prompt.
            context.load_cert_chain(str(collector.cert_file), str(collector.key_file), password=b"")
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"collector.cert_file {collector.cert_file} and collector.key_file "
                f"{collector.key_file}: not a matching PEM certificate and unencrypted key "
                f"({_reason(exc)})"
            ) from None
    return context


def _reason(exc: OSError | ssl.SSLError) -> str:
    """The short reason of an ``ssl`` or file error (never the file's content)."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return exc.strerror or str(exc)
