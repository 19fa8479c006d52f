"""Bearer credentials: the roles, the tokens file and how a presented token is matched.

The tokens file has one credential per line, ``#`` starts a comment::

    # role        subject        token or its hash                         options
    agent         gpu-node-01    sha256:5e884898da28047151d0e56f8dc6292...  nodes=gpu-node-01
    agent         rack3          sha256:...                                 nodes=gpu-rack3-*
    reader        grafana        sha256:...
    operator      alice          sha256:...
    admin         root           sha256:...
    alert-source  alertmanager   sha256:...
    admission     kube-apiserver sha256:...

The *role* says what the token may do (:class:`Role`; an unknown role is a load error), the
*subject* names who holds it (the audit and the logs show it; one subject may hold several
tokens, to rotate them). The token is written as ``sha256:<64 hex digits>``, the SHA-256 of the
token, or as the token itself (16+ characters; accepted, but the file then holds a secret, so
hashes are recommended: ``gpuwarden collector token`` prints a new token and its line).
A plain SHA-256 is the right tool here, not a password hash (bcrypt, scrypt, argon2): tokens are
random and high-entropy (``secrets.token_urlsafe(32)``, 256 bits), so a slow hash would buy no
resistance to guessing and would cost every request a deliberate delay.

An ``agent`` credential writes only the nodes it is bound to: ``nodes=`` lists ``host.name``
values or shell-style globs (``gpu-rack3-*``; ``*`` alone binds to every node, for a gateway
that forwards many nodes), comma-separated; without ``nodes=`` an agent is bound to the node
named by its subject. ``nodes=`` on another role is a load error.

The old two-column format (``<name> <token>``) is refused with a message naming this one rather
than read as anything: every token of such a file was an administrator, and reading its lines
as admins again would silently keep a node's stolen token an operator's; reading them as agents
would silently cut off API callers. The operator decides each token's role once.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

__all__ = [
    "Credential",
    "CredentialsError",
    "Role",
    "TokenTable",
    "credential",
    "hash_token",
    "new_token",
    "parse_tokens",
    "tokens_line",
]

HASH_PREFIX = "sha256:"
MIN_TOKEN_CHARS = 16
FORMAT = "<role> <subject> <token or sha256:hex> [nodes=a,b]"
_HEX = re.compile(r"[0-9a-fA-F]{64}")


class CredentialsError(ValueError):
    """A tokens file that does not load: one line naming the file and line, never a secret."""


class Role(enum.Enum):
    """What a credential may do; each route declares the roles it admits (least privilege)."""

    AGENT = "agent"
    """Ingest only, for the node names the credential is bound to."""
    READER = "reader"
    """The status page, API reads, ``/metrics``."""
    OPERATOR = "operator"
    """A reader who also approves or rejects actions, resets the breaker and posts jobs,
    models and events."""
    ADMIN = "admin"
    """Every route, including configuration reloads; writes any node."""
    ALERT_SOURCE = "alert-source"
    """The Alertmanager webhook only."""
    ADMISSION = "admission"
    """The admission checks only: the Kubernetes API server's validating webhook calls and the
    Slurm ``job_submit`` hook (``docs/admission.md``)."""


_ROLES = ", ".join(role.value for role in Role)


@dataclass(frozen=True, slots=True)
class Credential:
    """One line of the tokens file: the token's SHA-256, its role, subject and bound nodes.

    ``nodes`` are ``host.name`` values or globs (agents only; empty for other roles).
    """

    role: Role
    subject: str
    digest: bytes
    nodes: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"Credential({self.role.value} {self.subject} nodes={','.join(self.nodes)})"


def hash_token(token: str) -> bytes:
    """The SHA-256 of a token (its UTF-8 bytes): what the file and the table keep."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def credential(token: str, role: Role, subject: str, nodes: tuple[str, ...] = ()) -> Credential:
    """A credential for a plain token (tests, the demo, the CLI); an agent's nodes default to
    its subject."""
    if role is Role.AGENT and not nodes:
        nodes = (subject,)
    return Credential(role, subject, hash_token(token), nodes)


def new_token() -> str:
    """A fresh random token: 32 bytes (256 bits), URL-safe text."""
    return secrets.token_urlsafe(32)


def tokens_line(role: Role, subject: str, token: str, nodes: tuple[str, ...] = ()) -> str:
    """The tokens-file line holding ``token``'s hash (what ``gpuwarden collector token`` prints)."""
    line = f"{role.value} {subject} {HASH_PREFIX}{hash_token(token).hex()}"
    return f"{line} nodes={','.join(nodes)}" if nodes else line


def node_allowed(patterns: tuple[str, ...] | frozenset[str], node: str) -> bool:
    """Whether ``node`` (a ``host.name``; "" when a resource has none) matches a pattern."""
    return any(fnmatchcase(node, pattern) for pattern in patterns)


@dataclass(frozen=True)
class TokenTable:
    """Every credential, looked up by the SHA-256 of the presented token.

    The lookup is a dict by digest, then ``hmac.compare_digest`` on the match: a timing
    difference could only tell an attacker something about the digest of what they sent, which
    they cannot steer toward a stored digest (that would be a preimage), so the lookup leaks
    nothing about a stored token; comparing against every credential in turn instead would cost
    each request time linear in the fleet's size.
    """

    credentials: tuple[Credential, ...] = ()
    _by_digest: Mapping[bytes, Credential] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_digest", {c.digest: c for c in self.credentials})

    def __bool__(self) -> bool:
        return bool(self.credentials)

    def __len__(self) -> int:
        return len(self.credentials)

    def __repr__(self) -> str:
        return f"TokenTable({len(self.credentials)} credentials)"

    def match(self, presented: str) -> Credential | None:
        """The credential of a presented token, or None."""
        try:
            digest = hash_token(presented)
        except UnicodeError:  # a header byte no token has (tokens are text)
            return None
        found = self._by_digest.get(digest)
        if found is None or not hmac.compare_digest(found.digest, digest):
            return None
        return found


def parse_tokens(text: str, where: str) -> TokenTable:
    """Parse a tokens file (see the module); errors name ``where`` and the line.

    Raises:
        CredentialsError: one line, ``<where>:<line>: <what is wrong>``, never the token.
    """
    found: list[Credential] = []
    lines: dict[bytes, int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        at = f"{where}:{lineno}"
        item = _parse_line(line.split(), at)
        if item.digest in lines:
            raise CredentialsError(
                f"{at}: the same token as line {lines[item.digest]} (each holder needs its own)"
            )
        lines[item.digest] = lineno
        found.append(item)
    return TokenTable(tuple(found))


def _parse_line(parts: list[str], at: str) -> Credential:
    if len(parts) == 2:
        raise CredentialsError(
            f"{at}: two columns is the old '<name> <token>' format, which made every token an "
            f"admin; write '{FORMAT}' (roles: {_ROLES})"
        )
    if len(parts) < 3:
        raise CredentialsError(f"{at}: expected '{FORMAT}'")
    written_role, subject, secret, *options = parts
    try:
        role = Role(written_role)
    except ValueError:
        # A role is short; a long first column may be a token written in the wrong place.
        shown = f" '{written_role}'" if len(written_role) < MIN_TOKEN_CHARS else ""
        raise CredentialsError(f"{at}: unknown role{shown}; roles: {_ROLES}") from None
    digest = _digest(secret, at)
    nodes: tuple[str, ...] = ()
    for option in options:
        name, eq, value = option.partition("=")
        if name != "nodes" or not eq:
            raise CredentialsError(f"{at}: unknown option '{name}'; the only one is nodes=")
        if role is not Role.AGENT:
            raise CredentialsError(f"{at}: nodes= binds agent tokens only, not {role.value}")
        if nodes:
            raise CredentialsError(f"{at}: nodes= given twice")
        nodes = tuple(value.split(","))
        if not all(nodes):
            raise CredentialsError(f"{at}: nodes= needs node names or globs, comma-separated")
    if role is Role.AGENT and not nodes:
        nodes = (subject,)
    return Credential(role, subject, digest, nodes)


def _digest(secret: str, at: str) -> bytes:
    if secret.startswith(HASH_PREFIX):
        hexdigits = secret[len(HASH_PREFIX) :]
        if not _HEX.fullmatch(hexdigits):
            raise CredentialsError(f"{at}: {HASH_PREFIX} needs 64 hex digits (a SHA-256)")
        return bytes.fromhex(hexdigits)
    if len(secret) < MIN_TOKEN_CHARS:
        raise CredentialsError(
            f"{at}: a token needs {MIN_TOKEN_CHARS}+ characters (or write {HASH_PREFIX}<hex>)"
        )
    return hash_token(secret)
