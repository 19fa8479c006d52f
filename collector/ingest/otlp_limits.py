"""Limits for OTLP requests: how many points one request may hold, how many attributes a point or
resource may carry, how long a key, a value and a metric name may be, and what a node name
(``host.name``) may look like.

A point over a limit is rejected alone and counted (OTLP partial success), the rest of the
request is stored: one runaway label must not cost a node its data, nor a 1 MB label value a
megabyte per series in the store. A resource over a limit, or with a ``host.name`` that is not a
plain node name, rejects every point it carries: the node name becomes a series label, a
status-page row and a drain target, so a ``/``, a space or a control character never gets in.

The checks run while the decoders build their columns (``otlp_columns``) or points
(``otlp.number_points``), before anything is kept for the point. Sizes are counted in UTF-8
bytes; ASCII text (the common case) is measured by its length alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

AttrScalar = str | int | float | bool

HOST_NAME = "host.name"
NODE_NAME = re.compile(r"[A-Za-z0-9._-]{1,253}\Z")
"""A node name as a host name, a Slurm node or a Kubernetes node can have it: letters, digits,
``.``, ``_`` and ``-``, 1 to 253 characters (the DNS name length)."""


def _too_long(text: str, limit: int) -> bool:
    """Whether ``text`` is longer than ``limit`` UTF-8 bytes (no encoding for short ASCII)."""
    if len(text) > limit:
        return True
    return not text.isascii() and len(text.encode("utf-8", "surrogatepass")) > limit


def valid_node_name(name: object) -> bool:
    """Whether ``name`` is a string in the :data:`NODE_NAME` charset and length."""
    return isinstance(name, str) and NODE_NAME.match(name) is not None


@dataclass(frozen=True, slots=True)
class IngestLimits:
    """The limits one collector applies to every OTLP request (config keys of the same names)."""

    max_attributes: int = 64
    """Attributes of one data point, and of one resource."""
    max_label_key_bytes: int = 128
    max_label_value_bytes: int = 1024
    max_metric_name_bytes: int = 256
    max_points_per_request: int = 200_000
    """Data points of every type in one request: a bigger one is refused whole (413) right
    after parsing, before one object per point is built."""

    def metric_ok(self, name: str) -> bool:
        """Whether a metric name is within ``max_metric_name_bytes`` (and not empty)."""
        return bool(name) and not _too_long(name, self.max_metric_name_bytes)

    def items_ok(self, items: Iterable[tuple[str, AttrScalar | None]]) -> bool:
        """Whether a point's attribute items (as sent) are within the limits; a ``host.name``
        among them (it would name the series' node instead of the resource's) must be a plain
        node name too."""
        key_limit, value_limit = self.max_label_key_bytes, self.max_label_value_bytes
        for count, (key, value) in enumerate(items, 1):
            if count > self.max_attributes or _too_long(key, key_limit):
                return False
            if isinstance(value, str) and _too_long(value, value_limit):
                return False
            if key == HOST_NAME and value is not None and not valid_node_name(value):
                return False
        return True

    def resource_ok(self, attributes: Mapping[str, AttrScalar]) -> bool:
        """Whether a resource is within the limits and names its node plainly (if it does)."""
        return len(attributes) <= self.max_attributes and self.items_ok(attributes.items())

    def describe(self) -> str:
        """The limits in one line, for the partial-success message."""
        return (
            f"at most {self.max_attributes} attributes, {self.max_label_key_bytes}-byte keys, "
            f"{self.max_label_value_bytes}-byte values, {self.max_metric_name_bytes}-byte metric "
            "names, host.name of [A-Za-z0-9._-]{1,253}"
        )


DEFAULT_LIMITS = IngestLimits()
