"""Prometheus remote-write 1.0 on the wire: a snappy-compressed ``prometheus.WriteRequest``.

The one module that knows the encoding (the generated ``prompb`` classes shipped by
``opentelemetry-exporter-prometheus-remote-write``, and ``cramjam``'s snappy *block* format,
not the framed stream). The sender uses :func:`encode`; a receiver and the tests use
:func:`decode`. Series carry their labels sorted by name (``__name__`` among them) and their
samples in time order, as the protocol asks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import cramjam
from google.protobuf.message import DecodeError
from opentelemetry.exporter.prometheus_remote_write.gen.remote_pb2 import (  # type: ignore[attr-defined]
    WriteRequest,  # generated: the class is built at import, so no stub names it
)

HEADERS: Mapping[str, str] = MappingProxyType(
    {
        "Content-Encoding": "snappy",
        "Content-Type": "application/x-protobuf",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    }
)
"""The headers of every remote-write 1.0 request."""

Labels = tuple[tuple[str, str], ...]
"""A series' labels, sorted by name, ``__name__`` included."""


class WireError(ValueError):
    """A body that is not a snappy-compressed ``WriteRequest``."""


class WireTooLargeError(WireError):
    """A body whose snappy header announces more than the caller's limit (a decompression
    bomb): refused before a byte is inflated."""


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a request: its labels and its samples (milliseconds, value) in order."""

    labels: Labels
    timestamps_ms: tuple[int, ...]
    values: tuple[float, ...]

    @property
    def name(self) -> str:
        """The ``__name__`` label ('' when absent)."""
        return dict(self.labels).get("__name__", "")


def encode(series: Sequence[Series]) -> bytes:
    """The request body for ``series``: protobuf, then snappy (block format)."""
    request: Any = WriteRequest()
    for one in series:
        ts = request.timeseries.add()
        for name, value in sorted(one.labels):
            label = ts.labels.add()
            label.name = name
            label.value = value
        for t, v in zip(one.timestamps_ms, one.values, strict=True):
            sample = ts.samples.add()
            sample.timestamp = t
            sample.value = v
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def decode(body: bytes, max_bytes: int | None = None) -> list[Series]:
    """The series of a request body (raises :class:`WireError` for anything else).

    With ``max_bytes``, a body that inflates to more (its snappy header says how much) raises
    :class:`WireTooLargeError` before anything is inflated.
    """
    try:
        if max_bytes is not None and cramjam.snappy.decompress_raw_len(body) > max_bytes:
            raise WireTooLargeError(f"body inflates past {max_bytes} bytes")
        raw = bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise WireError(f"not snappy block data: {exc}") from None
    request: Any = WriteRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError as exc:
        raise WireError(f"not a WriteRequest: {exc}") from None
    return [
        Series(
            labels=tuple((label.name, label.value) for label in ts.labels),
            timestamps_ms=tuple(int(s.timestamp) for s in ts.samples),
            values=tuple(float(s.value) for s in ts.samples),
        )
        for ts in request.timeseries
    ]
