"""A whole ``WriteRequest`` read as flat columns by upb, for senders that write one sample a series.

Prometheus (and vmagent, Alloy, the OpenTelemetry Collector) remote-write one sample per series
per request, and the same label sets every scrape. Parsing with the generated classes costs one
Python object per series, per label and per sample; here the same bytes are parsed by upb
(``google.protobuf``) through three other schemas of the same wire format, each giving a flat
container that Python reads in one C loop:

- ``timeseries`` as ``repeated bytes``: each series' encoded bytes;
- every series merged into one message whose ``samples`` are ``repeated bytes``: each sample's
  encoded bytes, in request order;
- every sample merged into one message of ``repeated double value`` / ``repeated int64
  timestamp``: the values and times (a field equal to 0 is left out by proto3 senders, which is
  put back below).

A series is known by its bytes without its sample's body (:func:`series_key`): its labels as
sent and its sample field's tag and length. A key is remembered only after protobuf has encoded
that series' labels followed by one sample of that body and got the very bytes sent (so a later
series of the same key *is* those labels and one sample of a body of the remembered length).
Each sample body's length is then checked against what protobuf encodes for its value and time.
Anything else (a series of several samples or none, a label set not seen yet, an unusual
encoding, a body that does not parse) gives None and the caller parses the request series by
series (``wire.Decoder``), which also remembers the new keys.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

Labels = tuple[tuple[str, str], ...]
Known = dict[bytes, tuple[Labels, int]]
"""A series key -> (its labels, the length of its sample's body)."""

_label_of = itemgetter(0)
_length_of = itemgetter(1)


@dataclass(frozen=True, slots=True)
class FlatRequest:
    """One request, one sample a series: each series' labels (the remembered tuples), time
    (Unix ms) and value, in request order."""

    labels: list[Labels]
    timestamps_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class _Schemas:
    series_bytes: Any
    sample_bytes: Any
    sample_columns: Any
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
        "AllColumns", ("labels", 1, bytes_, repeated, ""), ("samples", 2, msg, optional, "Columns")
    )
    message("SampleColumns", ("timeseries", 1, msg, optional, "AllColumns"))
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
        cls("SeriesBytes"), cls("SampleBytes"), cls("SampleColumns"), cls("Sample"), cls("Series")
    )


def series_key(series: bytes, sample: bytes) -> bytes:
    """What identifies a one-sample series: its bytes without its sample's body."""
    return series[: len(series) - len(sample)]


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


def remember(
    known: Known, series: bytes, sample: bytes, labels_raw: Sequence[bytes], labels: Labels
) -> bool:
    """Remember a one-sample series' key when protobuf encodes ``labels_raw`` (its labels'
    bytes, as sent) and one sample ``sample`` as exactly ``series``; whether it did."""
    encoded = _schemas().series(labels=labels_raw, samples=[sample]).SerializeToString()
    if encoded != series:
        return False
    known[series_key(series, sample)] = (labels, len(sample))
    return True


def read(raw: bytes, parts: Split, known: Known) -> FlatRequest | None:
    """The request as columns, when every series is a known one-sample series (module)."""
    series, samples = parts.series, parts.samples
    n = len(series)
    if len(samples) != n or not all(map(bytes.endswith, series, samples)):
        return None
    found = list(
        map(known.get, [s[: len(s) - len(p)] for s, p in zip(series, samples, strict=True)])
    )
    if None in found:
        return None
    entries: list[tuple[Labels, int]] = found  # type: ignore[assignment] # no None left
    lengths = np.fromiter(map(len, samples), np.int64, n)
    if not np.array_equal(lengths, np.fromiter(map(_length_of, entries), np.int64, n)):
        return None
    columns = _columns(raw, samples, lengths)
    if columns is None:
        return None
    return FlatRequest(list(map(_label_of, entries)), *columns)


def _columns(
    raw: bytes, samples: list[bytes], lengths: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None:
    """Each sample's (time, value), a value of 0 (left out on the wire) put back; None unless
    each body is what protobuf encodes for its time and value (lengths checked)."""
    schemas = _schemas()
    n = len(samples)
    try:
        merged = schemas.sample_columns.FromString(raw).timeseries.samples
    except DecodeError:
        return None
    times = np.fromiter(merged.timestamp, np.int64)
    given = np.fromiter(merged.value, np.float64)
    if times.size != n:  # a time of 0 left out, or a sample with two
        return None
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
