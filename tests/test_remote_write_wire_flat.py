"""The receiver's flat read of remote-write requests in Python (``remote_write.wire_flat``
through ``wire.Decoder(native=False)``, what runs where the compiled reader is not built): the
same series as the generated classes parse, for every request, whether it was read flat or
series by series; steady one-sample requests are read flat. The compiled reader's own tests are
``test_remote_write_native.py``.
"""

from __future__ import annotations

import math
import struct

import cramjam
import pytest
from opentelemetry.exporter.prometheus_remote_write.gen.types_pb2 import (  # type: ignore[attr-defined]
    Label,
)

from gpuwarden.collector.ingest.prom_write import STALE_NAN_BITS, is_stale_marker
from gpuwarden.collector.remote_write import wire_flat
from gpuwarden.collector.remote_write.wire import Decoder, Series, decode, encode

STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
T0_MS = 1_764_000_000_000


def labels(field: str, gpu: int) -> tuple[tuple[str, str], ...]:
    found = {"__name__": field, "gpu": str(gpu), "UUID": f"GPU-{gpu}", "Hostname": "node-a"}
    return tuple(sorted(found.items()))


def fleet(values: list[float], t_ms: int) -> list[Series]:
    """Four GPUs x the fields, one sample each (as Prometheus sends a scrape)."""
    names = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE")
    sets = [labels(name, gpu) for gpu in range(4) for name in names]
    return [Series(ls, (t_ms,), (values[i % len(values)],)) for i, ls in enumerate(sets)]


def same(got: list[Series], expected: list[Series]) -> bool:
    """Equal series, values compared bit for bit (a NaN is only equal to itself so)."""

    def bits(series: list[Series]) -> list[tuple[object, ...]]:
        return [
            (s.labels, s.timestamps_ms, tuple(struct.pack("<d", v) for v in s.values))
            for s in series
        ]

    return bits(got) == bits(expected)


def test_steady_one_sample_requests_are_read_flat_and_equal_the_parse():
    decoder = Decoder(native=False)
    first = fleet([1.0, 2.5], T0_MS)
    assert same(decoder.decode(encode(first)), first)
    assert decoder.flat_reads == 0  # the label sets were new: parsed, and remembered
    # zeros (left out on the wire), -0.0, the stale marker, other NaN, infinities, huge values
    odd = [0.0, -0.0, STALE, math.nan, math.inf, -math.inf, 1e308, -5e-324, 7.0, 0.0, 3.25, 9.0]
    rounds = [fleet([1.5, 2.0], T0_MS + 15_000), fleet(odd, T0_MS + 30_000)]
    rounds.append(fleet([4.0], T0_MS + 45_000))
    for expected in rounds:
        body = encode(expected)
        got = decoder.decode(body)
        assert same(got, expected)
        assert same(got, decode(body))
    assert decoder.flat_reads == 3  # a value of 0 (left out on the wire) is the same series
    again = fleet(odd, T0_MS + 60_000)
    got = decoder.decode(encode(again))
    assert decoder.flat_reads == 4
    assert same(got, again)
    assert is_stale_marker(got[2].values[0])
    assert all(
        g.labels is e.labels for g, e in zip(got, decoder.decode(encode(again)), strict=True)
    )


def test_a_new_series_several_samples_or_none_are_parsed_series_by_series():
    decoder = Decoder(native=False)
    steady = fleet([1.0, 2.0], T0_MS)
    decoder.decode(encode(steady))
    new = [*steady, Series(labels("DCGM_FI_DEV_SM_CLOCK", 0), (T0_MS,), (1410.0,))]
    several = [*steady[1:], Series(steady[0].labels, (T0_MS, T0_MS + 15_000), (1.0, 2.0))]
    empty = [*steady, Series(labels("DCGM_FI_DEV_MEM_CLOCK", 0), (), ())]
    for expected in (new, several, empty):
        before = decoder.flat_reads
        assert same(decoder.decode(encode(expected)), expected)
        assert decoder.flat_reads == before
    assert same(decoder.decode(encode(new)), new)  # remembered by now
    assert decoder.flat_reads == 1


def body_of(series: list[tuple[tuple[tuple[str, str], ...], list[bytes]]]) -> bytes:
    """A request whose samples are given as encoded bytes (another sender's encoder)."""
    schemas = wire_flat._schemas()
    out = []
    for label_items, samples in series:
        raw_labels = [encoded_label(name, value) for name, value in label_items]
        out.append(schemas.series(labels=raw_labels, samples=samples).SerializeToString())
    raw = schemas.series_bytes(timeseries=out).SerializeToString()
    return bytes(cramjam.snappy.compress_raw(raw))


def encoded_label(name: str, value: str) -> bytes:
    encoded: bytes = Label(name=name, value=value).SerializeToString()
    return encoded


def sample(**fields: float) -> bytes:
    encoded: bytes = wire_flat._schemas().sample(**fields).SerializeToString()
    return encoded


@pytest.mark.parametrize(
    ("body", "value", "t_ms"),
    [
        (sample(timestamp=T0_MS + 1) + sample(value=3.0), 3.0, T0_MS + 1),  # time first
        (sample(value=1.0, timestamp=T0_MS + 1) + sample(value=2.0), 2.0, T0_MS + 1),  # twice
        (
            sample(value=5.0) + sample(timestamp=T0_MS + 1) + sample(timestamp=T0_MS + 2),
            5.0,
            T0_MS + 2,
        ),
        (sample(value=6.0), 6.0, 0),  # no time
    ],
)
def test_unusual_sample_encodings_read_as_protobuf_reads_them(body, value, t_ms):
    decoder = Decoder(native=False)
    steady = fleet([1.0, 2.0], T0_MS)
    canonical = [(s.labels, [sample(value=s.values[0], timestamp=T0_MS)]) for s in steady]
    decoder.decode(body_of(canonical))
    assert same(decoder.decode(body_of(canonical)), steady)
    assert decoder.flat_reads == 1
    odd = [*canonical[:-1], (canonical[-1][0], [body])]
    got = decoder.decode(body_of(odd))
    assert same(got, decode(body_of(odd)))
    assert got[-1].values == (value,)
    assert got[-1].timestamps_ms == (t_ms,)


def test_a_label_set_sent_in_another_order_is_its_own_key():
    decoder = Decoder(native=False)
    steady = fleet([1.0], T0_MS)
    canonical = [(s.labels, [sample(value=1.0, timestamp=T0_MS)]) for s in steady]
    decoder.decode(body_of(canonical))
    reordered = [(tuple(reversed(ls)), samples) for ls, samples in canonical]
    got = decoder.decode(body_of(reordered))
    assert got == decode(body_of(reordered))
    assert [s.labels for s in got] == [tuple(reversed(ls)) for ls, _ in canonical]


def test_samples_moved_between_known_series_are_not_read_flat():
    decoder = Decoder(native=False)
    steady = fleet([1.0, 2.0], T0_MS)
    canonical = [(s.labels, [sample(value=s.values[0], timestamp=T0_MS)]) for s in steady]
    decoder.decode(body_of(canonical))
    two = [sample(value=5.0, timestamp=T0_MS), sample(value=6.0, timestamp=T0_MS + 1)]
    moved = [(canonical[0][0], two), (canonical[1][0], []), *canonical[2:]]  # as many samples
    before = decoder.flat_reads
    got = decoder.decode(body_of(moved))
    assert decoder.flat_reads == before
    assert got == decode(body_of(moved))
    assert got[0].values == (5.0, 6.0)
    assert got[1].values == ()
