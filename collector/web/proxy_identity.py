"""The person a trusted reverse proxy (oauth2-proxy or similar) names in a request header.

Accepted only when the request's peer address is in ``signin.trusted_proxies``: anyone else can
write the same header. The first header of :data:`IDENTITY_HEADERS` present names the person;
the role is ``signin.proxy_roles[name]``, else ``signin.proxy_default_role`` (``null``: only the
listed people). The proxy must set (overwrite) these headers on every request it forwards.
Headers from an untrusted peer are ignored and logged once per peer.
"""

from __future__ import annotations

import ipaddress
import logging

from aiohttp import web

from gpuwarden.collector.config import SignInSettings
from gpuwarden.collector.web.keys import Caller, Role
from gpuwarden.collector.web.session import valid_name

log = logging.getLogger(__name__)

#: oauth2-proxy sets X-Auth-Request-* with ``--set-xauthrequest`` (nginx ``auth_request``) and
#: X-Forwarded-* with ``--pass-user-headers``; the e-mail first, it is the stable name.
IDENTITY_HEADERS = (
    "X-Auth-Request-Email",
    "X-Forwarded-Email",
    "X-Forwarded-User",
    "X-Auth-Request-User",
)
_MAX_LOGGED_PEERS = 1024


class ProxyIdentity:
    """A credential source (``request -> Caller | None``) for a trusted proxy's header."""

    def __init__(self, settings: SignInSettings) -> None:
        self._networks = settings.proxy_networks()
        self._roles = {name: Role(role) for name, role in settings.proxy_roles.items()}
        default = settings.proxy_default_role
        self._default = Role(default) if default is not None else None
        self._logged: set[str] = set()

    def trusted(self, peer: str | None) -> bool:
        """Whether ``peer`` (an address) is one of the trusted proxies."""
        if peer is None:
            return False
        try:
            address = ipaddress.ip_address(peer.split("%", 1)[0])
        except ValueError:
            return False
        return any(address in network for network in self._networks)

    def _once(self, peer: str, message: str, *args: object) -> None:
        if peer in self._logged or len(self._logged) >= _MAX_LOGGED_PEERS:
            return
        self._logged.add(peer)
        log.warning(message, *args)

    def __call__(self, request: web.Request) -> Caller | None:
        """The person the proxy names, or None (no header, untrusted peer, unknown person)."""
        header, name = next(
            ((h, request.headers[h].strip()) for h in IDENTITY_HEADERS if request.headers.get(h)),
            (None, ""),
        )
        if header is None:
            return None
        peer = request.remote or "?"
        if not self.trusted(request.remote):
            self._once(
                peer,
                "ignoring %s from %s: not a trusted proxy (signin.trusted_proxies)",
                header,
                peer,
            )
            return None
        if not valid_name(name):
            self._once(peer, "ignoring %s from proxy %s: not a usable name", header, peer)
            return None
        role = self._roles.get(name, self._default)
        if role is None:
            self._once(f"{peer} {name}", "proxy user %r has no role (signin.proxy_roles)", name)
            return None
        return Caller(name, role, via="proxy")
