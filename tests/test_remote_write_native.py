"""The compiled remote-write reader (``native/rwflat.c``, through ``wire.Decoder``): for every
request, the same series as the generated classes parse and as the Python flat read gives;
hostile bodies get the same answer; its key table holds what it is given.

It is built by ``pip install`` where protobuf-c is installed (``setup.py``). Without it these
tests skip, unless ``GPUWARDEN_REQUIRE_NATIVE=1`` (``scripts/test.sh`` sets it: CI installs
protobuf-c), where they fail.
"""

from __future__ import annotations

import array
import math
import random
import struct
import threading

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwarden.collector.ingest.prom_write import STALE_NAN_BITS
from gpuwarden.collector.remote_write import wire_flat
from gpuwarden.collector.remote_write.wire import (
    Decoder,
    Series,
    WireError,
    WireTooLargeError,
    decode,
    encode,
)
from tests.native_reader import REQUIRED, require_native
from tests.test_remote_write_wire_flat import encoded_label

STALE = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]
T0_MS = 1_764_000_000_000


@pytest.fixture
def reader() -> wire_flat.NativeReader:
    return require_native()


def bits(series: list[Series]) -> list[tuple[object, ...]]:
    """Series with their values as bits (a NaN is only equal to itself so)."""
    return [
        (s.labels, s.timestamps_ms, tuple(struct.pack("<d", v) for v in s.values)) for s in series
    ]


def outcome(decoder: Decoder, body: bytes, max_bytes: int | None = None) -> object:
    """What a decoder makes of a body: its series as bits, or the class of its error."""
    try:
        return bits(decoder.decode(body, max_bytes))
    except WireError as exc:
        return type(exc)


def dcgm(gpu: int, field: str, node: str = "node-a") -> tuple[tuple[str, str], ...]:
    found = {
        "__name__": field,
        "gpu": str(gpu),
        "UUID": f"GPU-{node}-{gpu}",
        "Hostname": node,
        "modelName": "NVIDIA H100 80GB HBM3",
        "instance": f"{node}:9400",
        "job": "dcgm",
    }
    return tuple(sorted(found.items()))


def scrape(t_ms: int, values: list[float]) -> list[Series]:
    fields = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE")
    sets = [dcgm(gpu, field) for gpu in range(8) for field in fields]
    return [Series(ls, (t_ms,), (values[i % len(values)],)) for i, ls in enumerate(sets)]


def test_the_reader_is_built_where_it_is_required():
    if not REQUIRED:
        pytest.skip("GPUWARDEN_REQUIRE_NATIVE is not 1")
    assert wire_flat.native_reader() is not None
    assert Decoder().native  # what the receiver's decoder uses by default


def test_steady_scrapes_are_read_natively_and_equal_both_other_reads(reader):
    native, python = Decoder(native=True), Decoder(native=False)
    odd = [0.0, -0.0, STALE, math.nan, math.inf, -math.inf, 1e308, -5e-324, 7.0, 3.25]
    rounds = [scrape(T0_MS + 15_000 * i, values) for i, values in enumerate([[1.0], odd, [2.5]])]
    for expected in rounds:
        body = encode(expected)
        got = native.decode(body)
        assert bits(got) == bits(expected) == bits(decode(body)) == bits(python.decode(body))
    assert native.flat_reads == 2  # the first request's label sets were new: parsed
    again = native.decode(encode(rounds[-1]))
    later = native.decode(encode(rounds[-1]))
    assert all(a.labels is b.labels for a, b in zip(again, later, strict=True))


def test_what_the_native_reader_declines_is_parsed_series_by_series(reader):
    decoder = Decoder(native=True)
    steady = scrape(T0_MS, [1.0, 2.0])
    decoder.decode(encode(steady))
    new = [*steady, Series(dcgm(0, "DCGM_FI_DEV_SM_CLOCK"), (T0_MS,), (1410.0,))]
    several = [*steady[1:], Series(steady[0].labels, (T0_MS, T0_MS + 15_000), (1.0, 2.0))]
    empty = [*steady, Series(dcgm(0, "DCGM_FI_DEV_MEM_CLOCK"), (), ())]
    for expected in (new, several, empty):
        before = decoder.flat_reads
        assert bits(decoder.decode(encode(expected))) == bits(expected)
        assert decoder.flat_reads == before
    assert bits(decoder.decode(encode(new))) == bits(new)  # remembered by now
    assert decoder.flat_reads == 1


def test_a_series_read_where_another_was_expected_is_its_own(reader):
    """The series that followed another last time is tried first (no hash): a series whose
    bytes begin with that key but carry one more label, or another one altogether, is still
    read as itself."""
    decoder = Decoder(native=True)
    first = dcgm(0, "DCGM_FI_DEV_GPU_UTIL")
    expected = dcgm(1, "DCGM_FI_DEV_GPU_UTIL")
    longer = tuple(sorted((*expected, ("zone", "z1"))))  # the expected key's bytes, then a label
    assert longer[:-1] == expected
    other = dcgm(2, "DCGM_FI_DEV_GPU_UTIL")
    rounds = [[first, expected], [first, longer], [first, other], [first, expected],
              [first, longer], [other, first], [first, expected]]  # fmt: skip
    for r, label_sets in enumerate(rounds * 2):  # the second lap is all known: read flat
        sent = [Series(ls, (T0_MS + r,), (float(r),)) for ls in label_sets]
        assert bits(decoder.decode(encode(sent))) == bits(sent), r
    assert decoder.flat_reads >= len(rounds)


def _raw(body: bytes) -> bytes:
    return bytes(cramjam.snappy.decompress_raw(body))


def _with_unknown_field(body: bytes, where: str) -> bytes:
    """The request with a field neither schema has (field 15, a varint) on each series or on
    the request, appended as protobuf appends an unknown field."""
    schemas = wire_flat._schemas()
    request = schemas.series_bytes.FromString(_raw(body))
    extra = b"\x78\x01"  # field 15, varint 1
    if where == "series":
        series = [one + extra for one in request.timeseries]
        raw = schemas.series_bytes(timeseries=series).SerializeToString()
    else:
        raw = request.SerializeToString() + extra
    return bytes(cramjam.snappy.compress_raw(raw))


def test_a_series_with_another_field_is_not_read_flat_but_still_read(reader):
    decoder = Decoder(native=True)
    steady = scrape(T0_MS, [1.0])
    decoder.decode(encode(steady))
    before = decoder.flat_reads
    body = _with_unknown_field(encode(steady), "series")
    assert outcome(decoder, body) == bits(decode(body)) == bits(steady)
    assert decoder.flat_reads == before
    metadata = _with_unknown_field(encode(steady), "request")  # the request's own: skipped
    assert outcome(decoder, metadata) == bits(steady)
    assert decoder.flat_reads == before + 1


def hostile_bodies() -> list[bytes]:
    good = encode(scrape(T0_MS, [1.0, 2.0]))
    raw = _raw(good)
    huge = [Series(tuple((f"l{i:05d}", "v" * 40) for i in range(5_000)), (T0_MS,), (1.0,))]
    return [
        good[:-7],
        good[:3],
        bytes(cramjam.snappy.compress_raw(raw[:-1])),  # the last series cut short
        bytes(cramjam.snappy.compress_raw(raw[: len(raw) // 2])),
        bytes(cramjam.snappy.compress_raw(b"\xff" * 300)),
        bytes(cramjam.snappy.compress_raw(b"\x0a\xff\xff\xff\xff\x0f")),  # length past the end
        bytes(cramjam.snappy.compress_raw(b"\x0a\x02\x0a\x00" * 50)),  # series of empty labels
        bytes(cramjam.snappy.compress_raw(b"\x08\x01")),  # a varint where a series goes
        bytes(cramjam.snappy.compress_raw(b"")),
        b"not snappy at all",
        encode(huge),
    ]


def test_hostile_bodies_get_the_same_answer_from_both_readers(reader):
    native, python = Decoder(native=True), Decoder(native=False)
    for decoder in (native, python):
        decoder.decode(encode(scrape(T0_MS, [1.0, 2.0])))  # every label set known
    for body in hostile_bodies():
        expected = outcome(python, body)
        assert outcome(native, body) == expected
        assert outcome(Decoder(native=True), body) == expected  # with nothing known too
    bomb = bytes(cramjam.snappy.compress_raw(b"\0" * 10_001))
    assert outcome(native, bomb, max_bytes=10_000) is WireTooLargeError


def test_mangled_known_requests_read_as_protobuf_reads_them(reader):
    rng = random.Random(23)  # noqa: S311 (a reproducible fuzz, not a secret)
    native = Decoder(native=True)
    steady = scrape(T0_MS, [1.0, 2.0])
    native.decode(encode(steady))
    raw = bytearray(_raw(encode(steady)))
    for _ in range(400):
        mangled = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            mangled[rng.randrange(len(mangled))] = rng.randrange(256)
        body = bytes(cramjam.snappy.compress_raw(bytes(mangled)))
        try:
            expected: object = bits(decode(body))
        except WireError as exc:
            expected = type(exc)
        assert outcome(native, body) == expected


labels_st = st.lists(
    st.tuples(st.text(max_size=12), st.text(max_size=20)), min_size=0, max_size=6
).map(tuple)
value_st = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, STALE])
)
time_st = st.one_of(st.integers(-(2**62), 2**62), st.sampled_from([0, T0_MS]))
series_st = st.builds(
    lambda labels, samples: Series(
        labels, tuple(t for t, _ in samples), tuple(v for _, v in samples)
    ),
    labels_st,
    st.lists(st.tuples(time_st, value_st), min_size=0, max_size=3),
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.lists(series_st, max_size=8), min_size=1, max_size=4), st.randoms())
def test_any_requests_read_natively_equal_the_generated_classes(reader, requests, rng):
    native = Decoder(native=True, max_label_sets=5)  # a small table: forgotten and rebuilt
    pool = [s for request in requests for s in request]
    for request in requests:
        for body in (encode(request), encode(rng.sample(pool, min(len(pool), 6)))):
            assert outcome(native, body) == bits(decode(body))


def test_the_key_table_holds_what_it_is_given(reader):
    index = reader.Index()
    assert len(index) == 0
    assert index.get(b"") is None
    assert index.add(b"", 7) is True
    assert index.add(b"", 8) is False  # the first number stays
    keys = [f"label-{i}".encode() + b"x" * (i % 50) for i in range(50_000)]
    for number, key in enumerate(keys, start=1):
        assert index.add(key, number)
    assert len(index) == 50_001
    assert index.get(b"") == 7
    assert all(index.get(key) == number for number, key in enumerate(keys, start=1))
    assert index.get(keys[0] + b"\0") is None
    assert index.get(keys[0][:-1]) is None
    with pytest.raises(ValueError, match=">= 0"):
        index.add(b"negative", -1)
    with pytest.raises(TypeError):
        reader.read(b"", {})


def test_a_key_is_learned_where_the_series_ends_with_its_canonical_sample(reader):
    schemas = wire_flat._schemas()
    labels = [encoded_label(name, value) for name, value in dcgm(0, "DCGM_FI_DEV_GPU_UTIL")]
    key = schemas.series(labels=labels).SerializeToString()
    canonical = schemas.sample(value=2.5, timestamp=T0_MS).SerializeToString()
    time_first = (
        schemas.sample(timestamp=T0_MS).SerializeToString()
        + schemas.sample(value=2.5).SerializeToString()
    )
    for body, learned in ((time_first, 0), (canonical, 1)):
        series = schemas.series(labels=labels, samples=[body]).SerializeToString()
        raw = schemas.series_bytes(timeseries=[series]).SerializeToString()
        index = reader.Index()
        assert reader.learn(raw, index, array.array("q", [7]).tobytes()) == learned
        assert index.get(key) == (7 if learned else None)
        got = reader.read(raw, index)
        if learned:
            assert got is not None
            assert [bytes(column) for column in got] == [
                array.array("q", [7]).tobytes(),
                array.array("q", [T0_MS]).tobytes(),
                array.array("d", [2.5]).tobytes(),
            ]
        else:
            assert got is None
    assert reader.learn(b"\xff\xff", reader.Index(), b"") == 0  # does not parse: none
    assert reader.learn(raw, reader.Index(), b"") == 0  # a number a series, or none


def test_threads_reading_at_once_each_get_their_own_request(reader):
    decoder = Decoder(native=True)
    rounds = [scrape(T0_MS + 15_000 * i, [float(i), i + 0.5]) for i in range(8)]
    for expected in rounds:
        decoder.decode(encode(expected))
    bodies = [encode(expected) for expected in rounds]
    wrong: list[int] = []

    def work(offset: int) -> None:
        for k in range(200):
            i = (offset + k) % len(rounds)
            if bits(decoder.decode(bodies[i])) != bits(rounds[i]):
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong
    assert decoder.flat_reads >= 800


def test_a_large_request_then_small_ones_read_right(reader):
    decoder = Decoder(native=True)
    gpus = range(20_000)
    big = [Series(dcgm(i, "DCGM_FI_DEV_GPU_UTIL", f"n{i}"), (T0_MS,), (float(i),)) for i in gpus]
    small = scrape(T0_MS, [3.0])
    for request in (big, small, big, small, small):
        body = encode(request)
        assert bits(decoder.decode(body)) == bits(request)
    assert decoder.flat_reads == 3
