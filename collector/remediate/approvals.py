"""Signed, single-use, expiring approval links for actions in mode ``approve``.

A token is ``v1.<action id>.<expires unix s>.<nonce>.<mac>`` with ``mac`` =
HMAC-SHA256(secret, everything before it), base64url without padding. The token travels in a
Slack or PagerDuty message; the store keeps only its SHA-256, so a copy of the database cannot
approve anything. A token is valid when its MAC matches (constant-time), it has not expired, and
its stored row is unused and unexpired (the remediator expires the rows of an action that stopped
waiting for approval, ``Storage.revoke_approvals``); redeeming marks the row used in one
conditional UPDATE, so two clicks (or two collectors) approve once.

Chat apps prefetch links: :meth:`Approvals.peek` (the confirmation page) never changes state;
only :meth:`Approvals.redeem` (the page's POST) does.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.collector.storage.base import ApprovalRecord, Storage

SECRET_ENV = "GPUWARDEN_APPROVAL_SECRET"  # noqa: S105 - a variable name, not a secret
"""Environment variable holding the approval secret (alternative to a secret file)."""
MIN_SECRET_BYTES = 32
_VERSION = "v1"


class ApprovalError(Exception):
    """A token that does not approve anything; ``reason`` says why (for the HTTP status)."""

    def __init__(self, reason: TokenProblem, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class TokenProblem(enum.StrEnum):
    """Why a token was refused."""

    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    UNKNOWN = "unknown"  # well signed, but not issued by this store (or pruned)
    USED = "used"


@dataclass(frozen=True, slots=True)
class ApprovalClaim:
    """What a valid token says: which action, until when."""

    action_id: int
    expires_at: float
    token_sha256: str


def load_secret(path: Path | None, environ: Mapping[str, str]) -> bytes:
    """The HMAC secret from ``path`` (preferred) or ``environ[SECRET_ENV]``.

    Raises:
        ValueError: neither is set, or the secret is shorter than ``MIN_SECRET_BYTES``; the
            message names the source, never the secret.
    """
    if path is not None:
        try:
            secret = path.read_bytes().strip()
        except OSError as exc:
            raise ValueError(f"{path}: cannot read the approval secret: {exc.strerror}") from None
        where = str(path)
    elif environ.get(SECRET_ENV):
        secret = environ[SECRET_ENV].strip().encode()
        where = f"${SECRET_ENV}"
    else:
        raise ValueError(
            f"no approval secret: set remediation.approval_secret_file or ${SECRET_ENV} "
            f"(e.g. `head -c 48 /dev/urandom | base64`)"
        )
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"{where}: the approval secret needs {MIN_SECRET_BYTES}+ bytes")
    return secret


def token_sha256(token: str) -> str:
    """The hex SHA-256 the store keeps instead of the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenSigner:
    """Mints and checks tokens with one secret (no storage)."""

    def __init__(self, secret: bytes, *, clock: Callable[[], float] = time.time) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the approval secret needs {MIN_SECRET_BYTES}+ bytes")
        self._secret = secret
        self._clock = clock

    def __repr__(self) -> str:  # never show the secret
        return "TokenSigner(<secret>)"

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._secret, body.encode(), hashlib.sha256).digest())

    def mint(self, action_id: int, expires_at: float) -> str:
        """A new token for ``action_id``, valid until ``expires_at``."""
        body = f"{_VERSION}.{action_id}.{int(expires_at)}.{_b64(secrets.token_bytes(16))}"
        return f"{body}.{self._mac(body)}"

    def check(self, token: str) -> ApprovalClaim:
        """The claim of a well-formed, correctly signed, unexpired token.

        Raises:
            ApprovalError: malformed, bad signature or expired.
        """
        parts = token.split(".")
        if len(token) > 256 or len(parts) != 5 or parts[0] != _VERSION:
            raise ApprovalError(TokenProblem.MALFORMED, "malformed approval token")
        body, mac = ".".join(parts[:4]), parts[4]
        if not hmac.compare_digest(mac.encode(), self._mac(body).encode()):
            raise ApprovalError(TokenProblem.BAD_SIGNATURE, "approval token signature is wrong")
        try:
            action_id, expires = int(parts[1]), int(parts[2])
        except ValueError:
            raise ApprovalError(TokenProblem.MALFORMED, "malformed approval token") from None
        if self._clock() >= expires:
            raise ApprovalError(TokenProblem.EXPIRED, "approval link expired")
        return ApprovalClaim(action_id, float(expires), token_sha256(token))


class Approvals:
    """Issue, inspect and redeem approval tokens against the store."""

    def __init__(
        self,
        storage: Storage,
        signer: TokenSigner,
        *,
        ttl_seconds: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._storage = storage
        self._signer = signer
        self._ttl = ttl_seconds
        self._clock = clock

    def issue(self, action_id: int) -> str:
        """A new token for ``action_id``; only its hash is stored. Show it once, log never."""
        now = self._clock()
        expires = float(int(now + self._ttl))
        token = self._signer.mint(action_id, expires)
        self._storage.insert_approval(
            ApprovalRecord(action_id, token_sha256(token), created_at=now, expires_at=expires)
        )
        return token

    def peek(self, token: str) -> ApprovalClaim:
        """The claim of a token that would approve now, without changing anything.

        Raises:
            ApprovalError: invalid, expired, unknown or already used.
        """
        claim = self._signer.check(token)
        record = self._storage.approval(claim.token_sha256)
        if record is None or record.action_id != claim.action_id:
            raise ApprovalError(TokenProblem.UNKNOWN, "unknown approval link")
        if record.used_at is not None:
            raise ApprovalError(TokenProblem.USED, "approval link already used")
        # Revoked (stored expiry moved before the token's): its action expired unapproved.
        if record.expires_at < claim.expires_at and record.expires_at <= self._clock():
            raise ApprovalError(
                TokenProblem.EXPIRED, "approval link expired: the action no longer awaits approval"
            )
        return claim

    def redeem(self, token: str, *, used_by: str) -> ApprovalClaim:
        """Use the token (once); return its claim.

        Raises:
            ApprovalError: invalid, expired, unknown, or already used (also by a racing click).
        """
        claim = self.peek(token)
        if not self._storage.use_approval(claim.token_sha256, now=self._clock(), used_by=used_by):
            raise ApprovalError(TokenProblem.USED, "approval link already used or expired")
        return claim
