"""Where the storage lives, as the config writes it: a SQLite file or a ``postgresql://`` URL.

Free of any database driver, so the config can tell the two apart without importing psycopg.
"""

from __future__ import annotations

import re

_POSTGRESQL = re.compile(r"^postgres(?:ql)?://", re.IGNORECASE)
_PASSWORD = re.compile(r"^(postgres(?:ql)?://[^:/@?#]*):[^@/?#]*@", re.IGNORECASE)


def is_postgresql_url(location: str) -> bool:
    """Whether a ``database`` setting names a PostgreSQL server (else: a SQLite file)."""
    return bool(_POSTGRESQL.match(location))


def has_password(url: str) -> bool:
    """Whether ``url`` carries a password (``postgresql://user:secret@host/db``)."""
    return bool(_PASSWORD.match(url)) or "password=" in url.lower()


def redact_url(url: str) -> str:
    """``url`` with a password it may carry replaced by ``...`` (for messages and logs)."""
    url = _PASSWORD.sub(r"\1:...@", url)
    return re.sub(r"(?i)(password=)[^&\s]*", r"\1...", url)
