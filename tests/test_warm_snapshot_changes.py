"""The snapshot at shutdown holds only what changed since the last full one.

A real store takes points, is snapshotted whole, then takes more: new slots, a late point
into an old slot (an agent's spool), a new series, counter steps and a histogram. The snapshot
of the changes is small, and a new store that reads the full snapshot and the changes holds
exactly what the first one held (both rings, counters' increases and raw state, histograms).
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.store.snapshot import changes_path
from gpuwarden.collector.store.types import AttrValue
from gpuwarden.collector.store.window import WindowStore

STEP = 10
T0 = 1_767_225_600.0
HOSTS = [f"n{i}" for i in range(20)]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def store_on(clock: Clock) -> WindowStore:
    return WindowStore(step_seconds=STEP, recent_seconds=3600, long_seconds=2 * 86400, clock=clock)


def points(t: float, hosts: list[str], energy: float) -> list[NumberPoint]:
    out = []
    for i, host in enumerate(hosts):
        resource: dict[str, AttrValue] = {"host.name": host}
        attrs: dict[str, AttrValue] = {"hw.id": f"GPU-{i}"}
        ns = int(t * 1e9)
        util = ((t // STEP) * 7 + i) % 10 / 10
        out.append(
            NumberPoint(resource, "hw.gpu.utilization", "1", "gauge", False, attrs, ns, util)
        )
        out.append(
            NumberPoint(resource, "hw.energy", "J", "sum", True, attrs, ns, energy * (i + 1))
        )
    return out


def feed(store: WindowStore, clock: Clock, start: float, end: float, hosts: list[str]) -> None:
    t = start
    while t <= end:
        clock.now = t
        store.ingest(points(t, hosts, energy=t - T0))
        store.ingest_histogram(
            "gpuwarden.model.request.latency",
            {"host.name": "n0", "model": "m"},
            time_unix_nano=int(t * 1e9),
            bounds=(0.1, 1.0),
            bucket_counts=(t - T0, 2 * (t - T0), 1.0),
            sum_value=3 * (t - T0),
        )
        t += STEP


def picture(store: WindowStore, now: float) -> dict[str, object]:
    """Everything a detector can read, over the whole long window."""
    out: dict[str, object] = {}
    start = now - 2 * 86400
    for metric in ("hw.gpu.utilization", "hw.energy"):
        for resolution in ("recent", "long"):
            m = store.matrix(metric, start=start, end=now + STEP, resolution=resolution)
            out[f"{metric}/{resolution}"] = {
                info.key: np.round(row.astype(np.float64), 6).tolist()
                for info, row in zip(m.series, m.values, strict=True)
            }
    inc = store.increase_matrix("hw.energy", start=now - 3600, end=now + STEP)
    out["increases"] = {
        i.key: np.round(r, 6).tolist() for i, r in zip(inc.series, inc.values, strict=True)
    }
    (key,) = store.histogram_keys("gpuwarden.model.request.latency")
    counts = store.bucket_counts(key, now - 3600, now + STEP)
    assert counts is not None
    out["histogram"] = counts.counts.tolist()
    out["held_since"] = store.held_since()
    return out


def ring_shape(path: Path, ring: str) -> tuple[int, int]:
    """(series, slots) of a ring in a snapshot file (its ``.npy`` member's header)."""
    with zipfile.ZipFile(path) as archive, archive.open(f"{ring}.npy") as member:
        version = np.lib.format.read_magic(member)
        assert version == (2, 0)
        shape, _, _ = np.lib.format.read_array_header_2_0(member)
    return (int(shape[0]), int(shape[1]))


def same(a: dict[str, object], b: dict[str, object]) -> bool:
    return repr(a).replace("nan", "N") == repr(b).replace("nan", "N")


def test_the_full_snapshot_and_its_changes_give_back_the_store(tmp_path: Path) -> None:
    clock = Clock(T0)
    store = store_on(clock)
    path = tmp_path / "window.npz"
    feed(store, clock, T0, T0 + 30 * 60, HOSTS[:10])
    full = store.write_snapshot(path)
    assert not full.changes_only
    # then: 5 more minutes, ten new series
    feed(store, clock, T0 + 30 * 60 + STEP, T0 + 35 * 60, HOSTS)
    changes = store.write_snapshot(path, changes_only=True)
    assert changes.changes_only
    assert changes.path == changes_path(path)
    # the rings' slots since the full snapshot (its head slot again, then 5 minutes), not 35 min
    assert ring_shape(path, "recent") == (20, 181)
    assert ring_shape(changes.path, "recent") == (40, 31)
    assert ring_shape(changes.path, "long") == (40, 6)
    # and a late point into an old slot (an agent's spool): the changes reach back to it
    late = T0 + 20 * 60 + 5
    attrs: dict[str, AttrValue] = {"hw.id": "GPU-late"}
    late_point = NumberPoint(
        {"host.name": "n0"}, "hw.gpu.utilization", "1", "gauge", False, attrs, int(late * 1e9), 0.5
    )
    assert store.ingest([late_point]).accepted == 1
    assert store.write_snapshot(path, changes_only=True).changes_only
    want = picture(store, clock.now)

    fresh = store_on(clock)
    restored = fresh.read_snapshot(path)
    assert restored is not None
    assert restored.series == 2 * len(HOSTS) + 1
    assert math.isclose(restored.written_at, clock.now)
    assert same(picture(fresh, clock.now), want)
    # the counters' raw state came back too: the next point's increase is what it would be
    feed(store, clock, clock.now + STEP, clock.now + STEP, HOSTS)
    feed(fresh, clock, clock.now, clock.now, HOSTS)  # the same point, at the same time
    assert same(picture(fresh, clock.now), picture(store, clock.now))


def test_changes_of_another_full_snapshot_are_left_out(tmp_path: Path) -> None:
    clock = Clock(T0)
    store = store_on(clock)
    path = tmp_path / "window.npz"
    feed(store, clock, T0, T0 + 10 * 60, HOSTS[:2])
    store.write_snapshot(path)
    feed(store, clock, T0 + 10 * 60 + STEP, T0 + 12 * 60, HOSTS[:2])
    store.write_snapshot(path, changes_only=True)
    kept = changes_path(path).read_bytes()
    store.write_snapshot(path)  # a new full snapshot: the changes went with the old one
    assert not changes_path(path).exists()
    changes_path(path).write_bytes(kept)  # as if a crash had left them behind
    fresh = store_on(clock)
    restored = fresh.read_snapshot(path)
    assert restored is not None
    assert same(picture(fresh, clock.now), picture(store, clock.now))  # the full one alone


def test_without_a_full_snapshot_the_changes_are_the_whole_store(tmp_path: Path) -> None:
    clock = Clock(T0)
    store = store_on(clock)
    path = tmp_path / "window.npz"
    feed(store, clock, T0, T0 + 5 * 60, HOSTS[:3])
    stats = store.write_snapshot(path, changes_only=True)
    assert not stats.changes_only
    assert stats.path == path
    fresh = store_on(clock)
    assert fresh.read_snapshot(path) is not None
    assert same(picture(fresh, clock.now), picture(store, clock.now))


def test_changes_read_at_start_are_in_the_next_changes(tmp_path: Path) -> None:
    """Two restarts in a row without a full snapshot between them keep a late point."""
    clock = Clock(T0)
    store = store_on(clock)
    path = tmp_path / "window.npz"
    feed(store, clock, T0, T0 + 30 * 60, HOSTS[:2])
    store.write_snapshot(path)
    feed(store, clock, T0 + 30 * 60 + STEP, T0 + 32 * 60, HOSTS[:2])
    late = NumberPoint(
        {"host.name": "n0"},
        "hw.gpu.utilization",
        "1",
        "gauge",
        False,
        {"hw.id": "GPU-late"},
        int((T0 + 10 * 60) * 1e9),
        0.5,
    )
    assert store.ingest([late]).accepted == 1
    store.write_snapshot(path, changes_only=True)
    want = picture(store, clock.now)
    second = store_on(clock)
    assert second.read_snapshot(path) is not None
    second.write_snapshot(path, changes_only=True)  # the second shutdown, nothing new
    third = store_on(clock)
    assert third.read_snapshot(path) is not None
    assert same(picture(third, clock.now), want)
