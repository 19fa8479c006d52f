"""A whole ``WriteRequest`` read as flat columns by upb, for senders that write one sample a series.

Prometheus (and vmagent, Alloy, the OpenTelemetry Collector) remote-write one sample per series
per request, and the same label sets every scrape. Parsing with the generated classes costs one
Python object per series, per label and per sample; here the same bytes are parsed by upb
(``google.protobuf``) through other schemas of the same wire format, each giving a flat
container that Python reads in one C loop:

- ``timeseries`` as ``repeated bytes``: each series' encoded bytes;
- every series merged into one message whose ``samples`` are ``repeated bytes``: each sample's
  encoded bytes, in request order;
- the samples' bytes one after the other, read as one message of ``repeated double value`` /
  ``repeated int64 timestamp``: the values and times (a field equal to 0 is left out by proto3
  senders, which is put back below).

A series is known by its labels' bytes as sent (its *key*): the series' bytes less its one
sample field (whose head, tag and length, protobuf encodes: ``_field_head``). A key is
remembered only after protobuf has encoded that series' labels, then one sample of that body,
and got the very bytes sent; a later series is read flat only when it is such a key, the head
of its sample's length and its sample's bytes, so it *is* those labels and one sample. Each
sample body's length is then checked against what protobuf encodes for its value and time:
exact for what senders write (one value and one time a sample, or the time alone for a 0).
Sample bodies crafted with repeated or unknown fields whose lengths add up could have values or
times shifted between that request's own samples (its series' labels are proven byte for byte
above, so nothing moves to another request's or another sender's series). Anything else (a
series of several samples or none, a label set not seen yet, an unusual encoding, a body that
does not parse) gives None and the caller parses the request series by series
(``wire.Decoder``), which also remembers the new keys.

Where the install built it, the compiled reader (``native/rwflat.c``, :func:`read_native`) does
the same in C, with the same keys: protobuf-c splits the request into its series' bytes (the
same kind of schema), and a series is read when its bytes are a key it learned followed by
bytes that protobuf-c parses as one sample and nothing else (two messages one after the other
parse as their merge, so the series *is* those labels and that sample). It learns a key (after
the decoder parsed a request series by series) where a series ends with its sample field as
protobuf-c packs it and the rest parses as labels alone. The decoder uses it when it is there;
this module's read is what runs without it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

Labels = tuple[tuple[str, str], ...]
Known = dict[bytes, int]
"""A series' labels' bytes (as sent) -> the index of its labels in the decoder's table."""


@dataclass(frozen=True, slots=True)
class FlatRequest:
    """One request, one sample a series: each series' label set (an index into ``label_sets``,
    the decoder's table of the label sets it remembers), time (Unix ms) and value, in request
    order. ``generation`` names the table: it changes when the decoder forgets its label sets
    (so a cache by label-set index knows to forget too)."""

    ids: npt.NDArray[np.int64]
    timestamps_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    label_sets: list[Labels]
    generation: int

    @property
    def labels(self) -> list[Labels]:
        """Each series' labels (the remembered tuples)."""
        return list(map(self.label_sets.__getitem__, self.ids.tolist()))


@dataclass(frozen=True, slots=True)
class _Schemas:
    series_bytes: Any
    sample_bytes: Any
    columns: Any
    sample: Any
    series: Any


@functools.cache
def _schemas() -> _Schemas:
    """The message classes above, built once (no work at import)."""
    fd = descriptor_pb2.FileDescriptorProto(
        name="gpuwarden/remote_write_flat.proto", package="gpuwarden.rwflat", syntax="proto3"
    )
    field = descriptor_pb2.FieldDescriptorProto
    repeated, optional = field.LABEL_REPEATED, field.LABEL_OPTIONAL

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        added = fd.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            one = added.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                one.type_name = f".gpuwarden.rwflat.{type_name}"

    bytes_, msg = field.TYPE_BYTES, field.TYPE_MESSAGE
    message("SeriesBytes", ("timeseries", 1, bytes_, repeated, ""))
    # timeseries singular: every series merges into one, concatenating its repeated fields
    message("AllSamples", ("labels", 1, bytes_, repeated, ""), ("samples", 2, bytes_, repeated, ""))
    message("SampleBytes", ("timeseries", 1, msg, optional, "AllSamples"))
    message(
        "Columns",
        ("value", 1, field.TYPE_DOUBLE, repeated, ""),
        ("timestamp", 2, field.TYPE_INT64, repeated, ""),
    )
    message(
        "Sample",
        ("value", 1, field.TYPE_DOUBLE, optional, ""),
        ("timestamp", 2, field.TYPE_INT64, optional, ""),
    )
    message("Series", ("labels", 1, bytes_, repeated, ""), ("samples", 2, bytes_, repeated, ""))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)

    def cls(name: str) -> Any:
        return message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"gpuwarden.rwflat.{name}")
        )

    return _Schemas(
        cls("SeriesBytes"), cls("SampleBytes"), cls("Columns"), cls("Sample"), cls("Series")
    )


@functools.cache
def _field_head(length: int) -> bytes:
    """The bytes protobuf puts before a sample body of ``length`` bytes in a series (the
    ``samples`` field's tag and length)."""
    encoded: bytes = _schemas().series(samples=[bytes(length)]).SerializeToString()
    return encoded[: len(encoded) - length]


@dataclass(frozen=True, slots=True)
class Split:
    """A request as upb reads it flat: each series' bytes and each sample's bytes."""

    series: list[bytes]
    samples: list[bytes]


def split(raw: bytes) -> Split | None:
    """Each series' and each sample's bytes (None: the request does not parse)."""
    schemas = _schemas()
    try:
        series = list(schemas.series_bytes.FromString(raw).timeseries)
        samples = list(schemas.sample_bytes.FromString(raw).timeseries.samples)
    except DecodeError:
        return None
    return Split(series, samples)


@dataclass(frozen=True, slots=True)
class Table:
    """The label sets a decoder remembers for the flat read: each key's index into
    ``label_sets`` (``known`` for this module's read; ``native``, the compiled reader's table of
    the same keys, with ``numbers`` for its ``learn``). Only ever added to (the entry first, then
    its key, so a reader that finds a key finds its entry) and replaced whole, with the next
    ``generation``, when full: a reader that took a table keeps a consistent one."""

    known: Known
    label_sets: list[Labels]
    generation: int
    native: NativeIndex | None = None
    numbers: dict[Labels, int] = dataclasses.field(default_factory=dict)
    """Each label set's index in ``label_sets``, for the compiled reader's ``learn``."""

    def number(self, labels: Labels) -> int:
        """``labels``' index in ``label_sets`` (added when new). One writer at a time (the
        decoder's lock), which adds the entry before any key is learned for it."""
        found = self.numbers.get(labels)
        if found is None:
            self.label_sets.append(labels)
            found = self.numbers[labels] = len(self.label_sets) - 1
        return found

    def remember(
        self, series: bytes, sample: bytes, labels_raw: Sequence[bytes], labels: Labels
    ) -> bool:
        """Remember a one-sample series' labels under their bytes (its key) when protobuf
        encodes ``labels_raw`` (its labels' bytes, as sent) and then one sample ``sample`` as
        exactly ``series``; whether it did. One writer at a time (the decoder's lock)."""
        key: bytes = _schemas().series(labels=labels_raw).SerializeToString()
        if key + _field_head(len(sample)) + sample != series:
            return False
        if key not in self.known:
            self.label_sets.append(labels)
            self.known[key] = len(self.label_sets) - 1
        return True


def read(raw: bytes, parts: Split, table: Table) -> FlatRequest | None:
    """The request as columns, when every series is a known one-sample series (module)."""
    series, samples = parts.series, parts.samples
    n = len(series)
    if len(samples) != n:
        return None
    lengths = np.fromiter(map(len, samples), np.int64, n)
    sizes = lengths.tolist()
    head_of = {size: _field_head(size) for size in set(sizes)}
    heads = list(map(head_of.__getitem__, sizes))
    head_size = {size: len(head) for size, head in head_of.items()}
    # Each series must be a key, then the head of a sample field of its sample's size: a key
    # is a remembered series' labels, so the series *is* those labels and one sample of that
    # size, and (each series holding one) the n-th sample is the n-th series'.
    cut = np.fromiter(map(len, series), np.int64, n) - lengths
    cut -= np.fromiter(map(head_size.__getitem__, sizes), np.int64, n)
    if n and int(cut.min()) < 0:
        return None
    at = cut.tolist()
    if not all(map(bytes.startswith, series, heads, at)):
        return None
    found = list(map(table.known.get, [s[:end] for s, end in zip(series, at, strict=True)]))
    if None in found:
        return None
    columns = _columns(samples, lengths)
    if columns is None:
        return None
    ids = np.array(found, dtype=np.int64)
    return FlatRequest(ids, *columns, table.label_sets, table.generation)


def _columns(
    samples: list[bytes], lengths: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None:
    """Each sample's (time, value), a value of 0 (left out on the wire) put back; None unless
    each body has the length protobuf encodes for its time and value.

    The samples' bodies one after the other are one message of their fields, in order: parsed
    as ``Columns`` (repeated value, repeated timestamp), they are every value and every time."""
    schemas = _schemas()
    n = len(samples)
    try:
        merged = schemas.columns.FromString(b"".join(samples))
    except DecodeError:
        return None
    times = np.fromiter(merged.timestamp, np.int64)
    given = np.fromiter(merged.value, np.float64)
    if times.size != n:  # a time of 0 left out, or a sample with two
        return None
    if times.size and times[0] == times.min() == times.max():  # one scrape: no sort
        distinct, which = times[:1], np.zeros(n, np.int64)
    else:
        distinct, which = np.unique(times, return_inverse=True)
    encode = schemas.sample
    time_only = [encode(timestamp=int(t)).SerializeToString() for t in distinct.tolist()]
    time_bytes = np.fromiter(map(len, time_only), np.int64, distinct.size)[which]
    value_bytes = len(encode(value=1.0).SerializeToString())
    if given.size == n:
        values = given
        expected = time_bytes + value_bytes
    else:
        zero = np.fromiter(map(set(time_only).__contains__, samples), bool, n)
        if given.size != n - int(np.count_nonzero(zero)):
            return None
        values = np.zeros(n, dtype=np.float64)
        values[~zero] = given
        expected = time_bytes + np.where(zero, 0, value_bytes)
    if not np.array_equal(expected, lengths):
        return None
    return times, values


def read_native(reader: NativeReader, raw: bytes, table: Table) -> FlatRequest | None:
    """The request as columns through the compiled reader (``native/rwflat.c``: protobuf-c
    parses it), when every series is a known key followed by one sample."""
    if table.native is None:
        return None
    got = reader.read(raw, table.native)
    if got is None:
        return None
    ids, times, values = got
    return FlatRequest(
        np.frombuffer(ids, np.int64),
        np.frombuffer(times, np.int64),
        np.frombuffer(values, np.float64),
        table.label_sets,
        table.generation,
    )


class NativeIndex(Protocol):
    """The compiled reader's table of keys (``_rwflat.Index``): key -> its label set's index."""

    def add(self, key: bytes, number: int, /) -> bool: ...
    def get(self, key: bytes, /) -> int | None: ...
    def __len__(self) -> int: ...


class NativeReader(Protocol):
    """The compiled reader's module (``_rwflat``)."""

    def Index(self) -> NativeIndex: ...  # noqa: N802 (the extension's type)
    def learn(
        self,
        raw: bytes,
        index: Any,  # an Index of this module (the extension checks)
        numbers: bytes,
        /,
    ) -> int: ...
    def read(
        self,
        raw: bytes,
        index: Any,  # an Index of this module (the extension checks)
        /,
    ) -> tuple[bytearray, bytearray, bytearray] | None: ...


def native_reader() -> NativeReader | None:
    """The compiled reader, or None when the install could not build it (no protobuf-c: then
    this module's read does the same, slower)."""
    try:
        from gpuwarden.collector.remote_write import _rwflat
    except ImportError:
        return None
    reader: NativeReader = _rwflat
    return reader
