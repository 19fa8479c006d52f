"""The WindowStore's snapshot: written atomically, read back into an empty store at start.

Real stores on both sides; the clock is a plain function the test moves.
"""

from __future__ import annotations

import logging
import math
import zipfile
from collections.abc import Collection

import numpy as np
import pytest

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.store.types import AttrValue, series_key
from gpuwarden.collector.store.window import WindowStore

T0 = 1_767_225_600.0
STEP = 10
HOUR = 3600


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def new_store(
    clock: Clock,
    *,
    long_metrics: Collection[str] | None = None,
    recent_metrics: Collection[str] | None = None,
    **shape: int,
) -> WindowStore:
    params = {"recent_seconds": 2 * HOUR, "long_seconds": 6 * HOUR} | shape
    return WindowStore(
        step_seconds=STEP,
        clock=clock,
        long_metrics=long_metrics,
        recent_metrics=recent_metrics,
        **params,
    )


def point(
    metric: str, t: float, value: float, attrs: dict[str, AttrValue], *, counter: bool = False
) -> NumberPoint:
    return NumberPoint(
        {"host.name": "n1"},
        metric,
        "J" if counter else "1",
        "sum" if counter else "gauge",
        counter,
        dict(attrs),
        int(t * 1e9),
        value,
    )


def feed(store: WindowStore, clock: Clock, start: float, end: float) -> None:
    """Two GPUs' utilisation (a ramp), their energy counters (500 W), and a latency histogram."""
    t = start
    while t < end:
        clock.now = t
        k = (t - T0) / STEP
        store.ingest(
            [
                point("hw.gpu.utilization", t, (k % 100) / 100, {"hw.id": "G0"}),
                point("hw.gpu.utilization", t, 0.5, {"hw.id": "G1", "gpuwarden.gpu.index": 1}),
                point("hw.energy", t, 500.0 * (t - T0), {"hw.id": "G0"}, counter=True),
            ]
        )
        n = int(k) + 1
        store.ingest_histogram(
            "latency",
            {"host.name": "n1", "model": "m"},
            time_unix_nano=int(t * 1e9),
            bounds=(0.1, 1.0),
            bucket_counts=(n, 2 * n, 3),
            sum_value=1.5 * n,
            unit="s",
        )
        t += STEP


ENERGY = series_key("hw.energy", {"host.name": "n1", "hw.id": "G0"})
LATENCY = series_key("latency", {"host.name": "n1", "model": "m"})


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a, b, equal_nan=True))


@pytest.mark.parametrize("chunk_bytes", [8 << 20, 1])  # one chunk; a row per chunk
def test_a_restored_store_reads_as_the_one_that_wrote_it(tmp_path, chunk_bytes):
    clock = Clock(T0)
    a = new_store(clock)
    feed(a, clock, T0, T0 + 3 * HOUR)  # more than the recent window: the long ring rolled too
    stats = a.write_snapshot(tmp_path / "w.npz", chunk_bytes=chunk_bytes)
    assert stats.series == 3
    assert stats.histograms == 1
    assert stats.size_bytes == (tmp_path / "w.npz").stat().st_size
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]  # no temporary left
    assert (tmp_path / "w.npz").stat().st_mode & 0o077 == 0  # the owner's alone

    b = new_store(clock)
    restored = b.read_snapshot(tmp_path / "w.npz", chunk_bytes=chunk_bytes)
    assert restored is not None
    assert (restored.series, restored.histograms) == (3, 1)
    assert restored.held_since == a.held_since() == T0
    for resolution in ("recent", "long"):
        for metric in ("hw.gpu.utilization", "hw.energy"):
            want = a.matrix(metric, start=T0, end=clock.now, resolution=resolution)
            got = b.matrix(metric, start=T0, end=clock.now, resolution=resolution)
            assert got.series == want.series
            assert same(got.times, want.times)
            assert same(got.values, want.values), (metric, resolution)
    window = (clock.now - HOUR, clock.now)
    assert b.increase(ENERGY, *window) == a.increase(ENERGY, *window)
    assert b.bucket_counts(LATENCY, *window) is not None
    want_counts = a.bucket_counts(LATENCY, *window)
    got_counts = b.bucket_counts(LATENCY, *window)
    assert want_counts is not None
    assert got_counts is not None
    assert same(got_counts.counts, want_counts.counts)
    assert b.last_seen_by_host() == a.last_seen_by_host()

    # both go on from the same raw state: the next points give the same increases and rates
    feed(a, clock, clock.now + STEP, clock.now + 2 * STEP)
    clock.now -= STEP
    feed(b, clock, clock.now + STEP, clock.now + 2 * STEP)
    assert b.increase(ENERGY, clock.now - 60, clock.now + STEP) == a.increase(
        ENERGY, clock.now - 60, clock.now + STEP
    )
    assert b.increase(ENERGY, clock.now - 60, clock.now + STEP) == pytest.approx(
        500.0 * (60 + STEP)
    )


def test_the_downtime_is_a_gap_and_data_past_retention_is_dropped(tmp_path):
    clock = Clock(T0)
    a = new_store(clock)
    feed(a, clock, T0, T0 + HOUR)
    a.write_snapshot(tmp_path / "w.npz")
    snapshot_at = clock.now
    clock.now = snapshot_at + 90 * 60  # 1.5 h down: the recent ring (2 h) keeps half an hour
    b = new_store(clock)
    assert b.read_snapshot(tmp_path / "w.npz") is not None
    feed(b, clock, clock.now, clock.now + 60)
    recent = b.matrix("hw.gpu.utilization", start=T0, end=clock.now + STEP)
    row = recent.values[[s.attributes["hw.id"] for s in recent.series].index("G1")]
    held = recent.times >= clock.now - 2 * HOUR + STEP  # what the recent ring covers now
    kept = held & (recent.times <= snapshot_at)
    gap = (recent.times > snapshot_at) & (recent.times < snapshot_at + 90 * 60)
    assert kept.any()
    assert np.all(row[kept] == np.float32(0.5))  # the snapshot's slots still in the window
    assert np.isnan(row[~held]).all()  # older than the recent window: dropped
    assert np.isnan(row[gap]).all()  # the downtime: missing, never interpolated
    assert np.all(row[-6:] == np.float32(0.5))  # new points land after the gap
    longs = b.matrix("hw.gpu.utilization", start=T0, end=clock.now, resolution="long")
    assert np.isfinite(longs.values).any(axis=1).all()  # the long ring keeps all of it
    assert b.held_since() == T0
    # the counter's first point after the restart covers the whole gap: an increase, no rate
    assert b.increase(ENERGY, snapshot_at + STEP, clock.now + STEP) == pytest.approx(
        500.0 * (clock.now - snapshot_at)
    )


def test_a_snapshot_older_than_every_window_restores_no_data(tmp_path):
    clock = Clock(T0)
    a = new_store(clock)
    feed(a, clock, T0, T0 + 600)
    a.write_snapshot(tmp_path / "w.npz")
    clock.now += 7 * HOUR  # past the long window (6 h) too
    b = new_store(clock)
    restored = b.read_snapshot(tmp_path / "w.npz")
    assert restored is not None
    longs = b.matrix("hw.gpu.utilization", start=T0, end=clock.now, resolution="long")
    assert np.isnan(longs.values).all()
    held_since = b.held_since()
    assert held_since is not None
    assert held_since > T0 + 600


@pytest.mark.parametrize(
    ("shape", "why"),
    [({"recent_seconds": HOUR}, "another store shape"), ({"long_seconds": 12 * HOUR}, "shape")],
)
def test_a_snapshot_of_another_shape_is_logged_and_ignored(tmp_path, caplog, shape, why):
    clock = Clock(T0)
    a = new_store(clock)
    feed(a, clock, T0, T0 + 600)
    a.write_snapshot(tmp_path / "w.npz")
    b = new_store(clock, **shape)
    with caplog.at_level(logging.WARNING):
        assert b.read_snapshot(tmp_path / "w.npz") is None
    assert why in caplog.text
    assert b.series_count() == 0


@pytest.mark.parametrize("damage", ["truncate", "garbage", "member"])
def test_a_broken_snapshot_is_logged_and_ignored_and_the_store_stays_empty(
    tmp_path, caplog, damage
):
    clock = Clock(T0)
    a = new_store(clock)
    feed(a, clock, T0, T0 + 600)
    path = tmp_path / "w.npz"
    a.write_snapshot(path)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) * 2 // 3])
    elif damage == "garbage":
        path.write_bytes(b"not a zip at all" * 100)
    else:  # a valid zip whose ring array lost rows
        with zipfile.ZipFile(path) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        header_end = members["recent.npy"].index(b"\n") + 1
        members["recent.npy"] = members["recent.npy"][: header_end + 100]
        with zipfile.ZipFile(path, "w") as archive:
            for name, body in members.items():
                archive.writestr(name, body)
    b = new_store(clock)
    with caplog.at_level(logging.WARNING):
        assert b.read_snapshot(path) is None
    assert "ignored" in caplog.text
    assert b.series_count() == 0
    assert b.held_since() is None
    feed(b, clock, clock.now, clock.now + 30)  # and it works as a fresh store
    assert b.series_count() == 4


def test_a_temporary_left_by_a_crash_mid_write_is_overwritten(tmp_path):
    clock = Clock(T0)
    a = new_store(clock)
    feed(a, clock, T0, T0 + 60)
    (tmp_path / ".w.npz.tmp").write_bytes(b"half a snapshot" * 1000)
    (tmp_path / ".w.npz.tmp").chmod(0o644)
    a.write_snapshot(tmp_path / "w.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]
    assert (tmp_path / "w.npz").stat().st_mode & 0o077 == 0
    restored = new_store(clock).read_snapshot(tmp_path / "w.npz")
    assert restored is not None
    assert restored.series == 3


def test_a_store_that_already_holds_series_is_not_overwritten(tmp_path, caplog):
    clock = Clock(T0)
    a = new_store(clock)
    feed(a, clock, T0, T0 + 60)
    a.write_snapshot(tmp_path / "w.npz")
    with caplog.at_level(logging.WARNING):
        assert a.read_snapshot(tmp_path / "w.npz") is None
    assert "already holds" in caplog.text


def test_no_snapshot_file_is_a_cold_start(tmp_path):
    assert new_store(Clock(T0)).read_snapshot(tmp_path / "none.npz") is None


def test_an_empty_store_round_trips(tmp_path):
    clock = Clock(T0)
    new_store(clock).write_snapshot(tmp_path / "w.npz")
    b = new_store(clock)
    restored = b.read_snapshot(tmp_path / "w.npz")
    assert restored is not None
    assert restored.series == 0
    assert math.isclose(restored.written_at, T0)
    assert b.held_since() is None
