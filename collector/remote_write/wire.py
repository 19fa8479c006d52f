"""Prometheus remote-write 1.0 on the wire: a snappy-compressed ``prometheus.WriteRequest``.

The one module that knows the encoding (the generated ``prompb`` classes shipped by
``opentelemetry-exporter-prometheus-remote-write``, and ``cramjam``'s snappy *block* format,
not the framed stream). The sender uses :func:`encode`; a receiver and the tests use
:func:`decode`. Series carry their labels sorted by name (``__name__`` among them) and their
samples in time order, as the protocol asks.
"""

from __future__ import annotations

import array
import functools
import threading
from collections.abc import Mapping, Sequence
from itertools import repeat
from types import MappingProxyType
from typing import Any, NamedTuple

import cramjam
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from opentelemetry.exporter.prometheus_remote_write.gen.remote_pb2 import (  # type: ignore[attr-defined]
    WriteRequest,  # generated: the class is built at import, so no stub names it
)
from opentelemetry.exporter.prometheus_remote_write.gen.types_pb2 import (  # type: ignore[attr-defined]
    Label,
)

from gpuwarden.collector.remote_write import wire_flat

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


class Series(NamedTuple):
    """One series of a request: its labels and its samples (milliseconds, value) in order.

    A named tuple rather than a frozen dataclass: a receiver builds one per series of every
    request, and a tuple is built in C (``Decoder.decode``)."""

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


def _inflate(body: bytes, max_bytes: int | None) -> bytes:
    """The snappy block ``body`` inflated, refused past ``max_bytes`` before inflating."""
    try:
        if max_bytes is not None and cramjam.snappy.decompress_raw_len(body) > max_bytes:
            raise WireTooLargeError(f"body inflates past {max_bytes} bytes")
        return bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise WireError(f"not snappy block data: {exc}") from None


def decode(body: bytes, max_bytes: int | None = None) -> list[Series]:
    """The series of a request body (raises :class:`WireError` for anything else).

    With ``max_bytes``, a body that inflates to more (its snappy header says how much) raises
    :class:`WireTooLargeError` before anything is inflated.
    """
    raw = _inflate(body, max_bytes)
    request: Any = WriteRequest()
    try:
        request.ParseFromString(raw)
    except DecodeError as exc:
        raise WireError(f"not a WriteRequest: {exc}") from None
    out = []
    for ts in request.timeseries:  # the receiver's hot loop: list displays, no generators
        samples = ts.samples
        out.append(
            Series(
                tuple([(label.name, label.value) for label in ts.labels]),
                tuple([s.timestamp for s in samples]),
                tuple([s.value for s in samples]),
            )
        )
    return out


@functools.cache
def _raw_write_request() -> Any:
    """A ``WriteRequest`` whose series keep each label as its encoded bytes (the same wire
    format read through another schema: ``repeated bytes labels = 1``), so a label set seen
    before is recognised by its bytes without one Python object per label field."""
    fd = descriptor_pb2.FileDescriptorProto(
        name="gpuwarden/remote_write_raw.proto", package="gpuwarden.rwraw", syntax="proto3"
    )
    field = descriptor_pb2.FieldDescriptorProto
    sample = fd.message_type.add(name="Sample")
    sample.field.add(name="value", number=1, type=field.TYPE_DOUBLE, label=field.LABEL_OPTIONAL)
    sample.field.add(name="timestamp", number=2, type=field.TYPE_INT64, label=field.LABEL_OPTIONAL)
    series = fd.message_type.add(name="Series")
    series.field.add(name="labels", number=1, type=field.TYPE_BYTES, label=field.LABEL_REPEATED)
    series.field.add(
        name="samples",
        number=2,
        type=field.TYPE_MESSAGE,
        label=field.LABEL_REPEATED,
        type_name=".gpuwarden.rwraw.Sample",
    )
    request = fd.message_type.add(name="WriteRequest")
    request.field.add(
        name="timeseries",
        number=1,
        type=field.TYPE_MESSAGE,
        label=field.LABEL_REPEATED,
        type_name=".gpuwarden.rwraw.Series",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("gpuwarden.rwraw.WriteRequest")
    )


def series_of(flat: wire_flat.FlatRequest) -> list[Series]:
    """A flat request's series, each tuple built in C (``tuple.__new__`` through ``map``)."""
    times = zip(flat.timestamps_ms.tolist(), strict=True)  # 1-tuples
    values = zip(flat.values.tolist(), strict=True)
    rows = zip(flat.labels, times, values, strict=True)
    out: list[Series] = list(map(tuple.__new__, repeat(Series), rows))
    return out


class Decoder:
    """:func:`decode` for a receiver: the same series, each label set decoded once.

    A sender writes the same series every scrape. The decoder remembers each label set by its
    labels' encoded bytes (at most ``max_label_sets``, then it forgets them all at once), so a
    series seen before costs a dict lookup instead of a Python object per label, and its
    ``labels`` is the same tuple every time (whose strings keep their hashes: cheaper for every
    later lookup). A request whose series are all known one-sample series (what Prometheus
    sends every scrape) is read flat, without a Python object per series or sample before the
    ``Series`` themselves (:mod:`.wire_flat`).
    """

    def __init__(
        self, max_label_sets: int = 200_000, *, flat: bool = True, native: bool | None = None
    ) -> None:
        self.max_label_sets = max_label_sets
        self.flat = flat
        """Whether to read requests flat at all (False: series by series, as before it could;
        for comparisons)."""
        self._native = wire_flat.native_reader() if flat and native is not False else None
        """The compiled flat reader (``native/rwflat.c``) when the install built it (``native``
        None: use it if there; False: never, for comparisons; True: it must be there)."""
        if native and self._native is None:
            raise RuntimeError(
                "the compiled remote-write reader is not built (install Debian's "
                "protobuf-c-compiler libprotobuf-c-dev libxxhash-dev, then reinstall gpuwarden)"
            )
        self._known: dict[tuple[bytes, ...], Labels] = {}
        self._table = self._new_table(0)
        self._lock = threading.Lock()  # one writer of the table (requests run in threads)
        self.flat_reads = 0
        """Requests read flat (the rest were parsed series by series)."""

    def decode(self, body: bytes, max_bytes: int | None = None) -> list[Series]:
        """The series of a request body (raises :class:`WireError`, :class:`WireTooLargeError`
        as :func:`decode` does)."""
        got = self.decode_flat(body, max_bytes)
        return series_of(got) if isinstance(got, wire_flat.FlatRequest) else got

    def decode_flat(
        self, body: bytes, max_bytes: int | None = None
    ) -> wire_flat.FlatRequest | list[Series]:
        """:meth:`decode`, but a request read flat stays columns (``wire_flat.FlatRequest``)."""
        raw = _inflate(body, max_bytes)
        if self._native is not None:
            flat = wire_flat.read_native(self._native, raw, self._table)
            if flat is not None:
                self.flat_reads += 1
                return flat
            return self._parse(raw, None)
        parts = wire_flat.split(raw) if self.flat else None
        if parts is not None:
            flat = wire_flat.read(raw, parts, self._table)
            if flat is not None:
                self.flat_reads += 1
                return flat
        return self._parse(raw, parts)

    def _parse(self, raw: bytes, parts: wire_flat.Split | None) -> list[Series]:
        """Parse a request series by series (remembering the flat keys of its series)."""
        request: Any = _raw_write_request()()
        try:
            request.ParseFromString(raw)
        except DecodeError as exc:
            raise WireError(f"not a WriteRequest: {exc}") from None
        known = self._known
        out = []
        keys = []
        for ts in request.timeseries:
            key = tuple(ts.labels)
            labels = known.get(key)
            if labels is None:
                labels = self._labels(key)
            keys.append(key)
            samples = ts.samples
            if len(samples) == 1:  # what a scrape's remote-write sends: one sample a series
                one = samples[0]
                out.append(Series(labels, (one.timestamp,), (one.value,)))
            else:
                times = tuple([sample.timestamp for sample in samples])
                out.append(Series(labels, times, tuple([sample.value for sample in samples])))
        if self._native is not None:
            self._remember_native(raw, out)
        elif parts is not None and len(parts.samples) == len(out):
            self._remember(parts, keys, out)
        return out

    def _new_table(self, generation: int) -> wire_flat.Table:
        native = self._native.Index() if self._native is not None else None
        return wire_flat.Table({}, [], generation, native)

    @property
    def native(self) -> bool:
        """Whether the compiled reader reads requests flat."""
        return self._native is not None

    def _remember_native(self, raw: bytes, out: list[Series]) -> None:
        """Have the compiled reader learn the keys of a request's series when each has one
        sample (``native/rwflat.c``: ``learn``)."""
        if self._native is None or any(len(one.values) != 1 for one in out):
            return
        with self._lock:
            table = self._table
            if table.label_sets and len(table.label_sets) + len(out) > self.max_label_sets:
                table = self._table = self._new_table(table.generation + 1)  # readers keep theirs
            numbers = array.array("q", [table.number(one.labels) for one in out])
            self._native.learn(raw, table.native, numbers.tobytes())

    def _remember(
        self, parts: wire_flat.Split, keys: list[tuple[bytes, ...]], out: list[Series]
    ) -> None:
        """Remember the flat keys of a request's series when each has one sample (then the
        request's n-th sample is its n-th series')."""
        if any(len(one.values) != 1 for one in out):
            return
        with self._lock:
            for series, sample, key, one in zip(
                parts.series, parts.samples, keys, out, strict=True
            ):
                table = self._table
                if len(table.known) >= self.max_label_sets:  # a new table; readers keep theirs
                    table = self._table = self._new_table(table.generation + 1)
                table.remember(series, sample, key, one.labels)

    def _labels(self, key: tuple[bytes, ...]) -> Labels:
        try:
            parsed = [Label.FromString(one) for one in key]
        except DecodeError as exc:
            raise WireError(f"not a WriteRequest: a label does not parse: {exc}") from None
        labels = tuple([(label.name, label.value) for label in parsed])
        if len(self._known) >= self.max_label_sets:
            self._known.clear()
        self._known[key] = labels
        return labels
