"""Sign-in sessions and the CSRF guard of the pages that change something.

A session is a signed cookie, not a server-side record: ``v1.<payload>.<mac>``, where the payload
(base64url JSON) holds the person's name, role, expiry and a random session id, and the mac is
HMAC-SHA256 over ``v1.<payload>`` with the collector's session key. The token that signed the
person in is never in it. A cookie whose mac, shape or expiry is wrong reads as "not signed in".
Without a configured key the collector makes one at start, so every session ends at a restart.
Sign-out adds the session id to an in-memory list until the session would have expired anyway.

A page that changes state (the approval POST) carries a CSRF token, an HMAC of what binds it to
the person (the session id; for a proxy identity or a bearer token, how and who) under the same
key, and its ``Origin`` (or ``Referer`` when no ``Origin`` came) must be the collector's own:
the request's own scheme and host, or the configured ``remediation.external_url``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from gpuwarden.collector.web.keys import CONFIG, Caller, Role

COOKIE = "gpuwarden_session"
CSRF_FIELD = "csrf_token"
KEY_BYTES = 32
MAX_NAME_CHARS = 254
_VERSION = "v1"
_SESSION, _CSRF = b"session\0", b"csrf\0"  # one key, two purposes: neither mac passes as the other
#: Roles that name a person; agent and alert-source credentials never sign in.
PERSON_ROLES = frozenset({Role.READER, Role.OPERATOR, Role.ADMIN})
#: Roles that may approve or reject an action.
DECIDING_ROLES = frozenset({Role.OPERATOR, Role.ADMIN})


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in person, as read back from a valid cookie."""

    session_id: str
    name: str
    role: Role
    expires_at: float
    """Unix seconds."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def valid_name(name: str) -> bool:
    """A name fit for the audit: printable, no spaces, at most ``MAX_NAME_CHARS``."""
    return (
        0 < len(name) <= MAX_NAME_CHARS
        and name.isprintable()
        and not any(c.isspace() for c in name)
    )


class SessionSigner:
    """Issues, reads and revokes session cookies; makes and checks CSRF tokens.

    Args:
        key: the HMAC key (``KEY_BYTES``+ bytes).
        ttl_seconds: how long a session lasts.
        clock: Unix seconds (a fake in tests).
    """

    def __init__(
        self, key: bytes, ttl_seconds: float, clock: Callable[[], float] = time.time
    ) -> None:
        if len(key) < KEY_BYTES:
            raise ValueError(f"the session key needs {KEY_BYTES}+ bytes")
        self._key = key
        self._ttl = ttl_seconds
        self._clock = clock
        self._revoked: dict[str, float] = {}  # session id -> its expiry

    def _mac(self, purpose: bytes, text: str) -> str:
        return _b64(hmac.new(self._key, purpose + text.encode(), hashlib.sha256).digest())

    def issue(self, name: str, role: Role) -> tuple[str, Session]:
        """A new session for ``name``: the cookie value and what it says."""
        if role not in PERSON_ROLES or not valid_name(name):
            raise ValueError(f"{role.value} {name!r} cannot have a session")
        session = Session(secrets.token_urlsafe(18), name, role, self._clock() + self._ttl)
        body: dict[str, object] = {"sid": session.session_id, "name": name, "role": role.value}
        body["exp"] = session.expires_at
        signed = f"{_VERSION}.{_b64(json.dumps(body, separators=(',', ':')).encode())}"
        return f"{signed}.{self._mac(_SESSION, signed)}", session

    def read(self, cookie: str | None) -> Session | None:
        """The session a cookie carries, or None when it is absent, altered, expired or revoked."""
        session = self._verified(cookie)
        if session is None or session.role not in PERSON_ROLES:
            return None
        if session.expires_at <= self._clock() or session.session_id in self._revoked:
            return None
        return session

    def _verified(self, cookie: str | None) -> Session | None:
        """What a cookie with our signature says, or None."""
        if not cookie or cookie.count(".") != 2 or not cookie.startswith(f"{_VERSION}."):
            return None
        signed, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(mac.encode(), self._mac(_SESSION, signed).encode()):
            return None
        try:
            body = json.loads(_unb64(signed.split(".")[1]))
            return Session(
                str(body["sid"]), str(body["name"]), Role(body["role"]), float(body["exp"])
            )
        except (binascii.Error, ValueError, KeyError, TypeError):
            return None  # signed with our key, so only a future format gets here

    def revoke(self, session: Session) -> None:
        """End ``session`` before its expiry (sign-out); forgotten at restart."""
        now = self._clock()
        self._revoked = {sid: exp for sid, exp in self._revoked.items() if exp > now}
        self._revoked[session.session_id] = session.expires_at

    def csrf_token(self, binding: str) -> str:
        """The CSRF token for what ``binding`` names (see :func:`csrf_binding`)."""
        return self._mac(_CSRF, binding)

    def csrf_ok(self, binding: str, presented: str | None) -> bool:
        """Whether ``presented`` is the CSRF token for ``binding`` (constant-time)."""
        if not presented:
            return False
        return hmac.compare_digest(presented.encode(), self.csrf_token(binding).encode())

    def ttl_seconds(self) -> float:
        """How long a new session lasts."""
        return self._ttl


def load_session_key(path: Path | None) -> tuple[bytes, bool]:
    """The key from ``path`` (checked at config load), or a random one; and whether it was made
    here (then sessions end at restart).

    Raises:
        ValueError: the file cannot be read or is too short; naming the file, never the key.
    """
    if path is None:
        return secrets.token_bytes(KEY_BYTES), True
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the session key: {exc.strerror}") from None
    if len(key) < KEY_BYTES:
        raise ValueError(f"{path}: the session key needs {KEY_BYTES}+ bytes")
    return key, False


SESSIONS = web.AppKey("sessions", SessionSigner)
SESSION = web.RequestKey("session", Session)
"""The session a request came with, set by :func:`session_caller`."""


def session_caller(request: web.Request) -> Caller | None:
    """The credential source of sessions: the signed-in person, or None."""
    signer = request.app.get(SESSIONS)
    if signer is None:
        return None
    session = signer.read(request.cookies.get(COOKIE))
    if session is None:
        return None
    request[SESSION] = session
    return Caller(session.name, session.role, via="session")


def csrf_binding(request: web.Request, caller: Caller) -> str:
    """What a page's CSRF token is bound to: the session id, else how and who called."""
    session = request.get(SESSION)
    if session is not None and caller.via == "session":
        return f"session:{session.session_id}"
    return f"{caller.via}:{caller.name}"


def _origin(url: str) -> str | None:
    """``scheme://host[:port]`` of ``url``, lower-case, default ports left out; None if none."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host:
        return None
    if ":" in host:
        host = f"[{host}]"
    default = 443 if scheme == "https" else 80
    return f"{scheme}://{host}" if port in (None, default) else f"{scheme}://{host}:{port}"


def origin_problem(request: web.Request) -> str | None:
    """Why the request's ``Origin`` (or ``Referer``) is not the collector's own, or None.

    Own means the request's own scheme and host, or ``remediation.external_url`` (the
    collector's address behind a proxy that terminates TLS).
    """
    claimed = request.headers.get("Origin")
    if claimed is None:
        referer = request.headers.get("Referer")
        if referer is None:
            return "cross-origin check: no Origin or Referer header"
        claimed = referer
    origin = _origin(claimed)
    own = {_origin(f"{request.scheme}://{request.host}")}
    own.add(_origin(request.app[CONFIG].remediation.external_url))
    own.discard(None)
    if origin is None or origin not in own:
        return f"cross-origin request refused (from {claimed[:100]!r})"
    return None


def csrf_problem(request: web.Request, caller: Caller, presented: str | None) -> str | None:
    """Why a state-changing page request is refused (origin, then CSRF token), or None."""
    problem = origin_problem(request)
    if problem is not None:
        return problem
    signer = request.app.get(SESSIONS)
    if signer is None or not signer.csrf_ok(csrf_binding(request, caller), presented):
        return "missing or wrong CSRF token (reload the page and try again)"
    return None


def page_csrf_token(request: web.Request, caller: Caller) -> str:
    """The CSRF token a page puts in its form for ``caller``."""
    signer = request.app[SESSIONS]
    return signer.csrf_token(csrf_binding(request, caller))
