"""Masking secret-looking keys before values reach a log, the audit or an alert."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_SECRET_KEY = re.compile(r"secret|token|password|passwd|credential|authorization|api_?key", re.I)


def redact(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``values`` for logs and the audit: secret-looking keys are masked."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if _SECRET_KEY.search(key):
            out[key] = "[redacted]"
        elif isinstance(value, Mapping):
            out[key] = redact(value)
        else:
            out[key] = value
    return out
