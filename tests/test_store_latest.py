"""The latest-only tier (``recent_metrics``): a metric nothing reads over a time range keeps its
newest value per series, no recent ring; ``latest`` reads the same as on a store that keeps
every ring, a range read fails loudly, and snapshots, eviction, a later ``keep_recent`` and
readiness's coverage keep working.

Real stores side by side: one keeping every metric's recent ring (the reference), one keeping
some.
"""

from __future__ import annotations

import dataclasses
import io
import math
import zipfile
from collections.abc import Collection
from pathlib import Path

import numpy as np
import pytest

from gpuwarden.agent.config import ConfigError
from gpuwarden.collector.build import SERVICE_RANGE_READS, build_service
from gpuwarden.collector.config import CollectorConfig, load_collector_config
from gpuwarden.collector.detect.catalog import (
    CONTEXT_READS,
    DETECTORS,
    RECENT_READS,
    load_rules,
    long_metrics,
    recent_metrics,
)
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import RuleSet, Selector
from gpuwarden.collector.store.types import LatestOnlyError
from gpuwarden.collector.store.window import WindowStore

T0 = 1_767_225_600.0
STEP = 10
HOUR = 3600
UTIL, TEMP, NVLINK = "hw.gpu.utilization", "hw.temperature", "gpuwarden.gpu.nvlink.io"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def new_store(clock: Clock, recent: Collection[str] | None) -> WindowStore:
    return WindowStore(
        step_seconds=STEP,
        recent_seconds=2 * HOUR,
        long_seconds=6 * HOUR,
        long_metrics=(),
        recent_metrics=recent,
        clock=clock,
    )


def point(metric: str, t: float, value: float, gpu: str, *, counter: bool = False) -> NumberPoint:
    return NumberPoint(
        {"host.name": "n1"},
        metric,
        "By" if counter else "1",
        "sum" if counter else "gauge",
        counter,
        {"hw.id": gpu},
        int(t * 1e9),
        value,
    )


def round_points(t: float, gpus: int = 3) -> list[NumberPoint]:
    """Per GPU: utilisation (kept), temperature (a gauge) and NVLink bytes (a counter that
    resets once), interleaved so ring and latest-only rows alternate."""
    k = (t - T0) / STEP
    points = []
    for g in range(gpus):
        total = 1e6 * (g + 1) * (k if k < 500 else k - 500)  # a reset at k = 500
        points += [
            point(TEMP, t, 40 + 10 * math.sin(k / 9 + g), f"G{g}"),
            point(UTIL, t, ((k + 13 * g) % 100) / 100, f"G{g}"),
            point(NVLINK, t, total, f"G{g}", counter=True),
        ]
    return points


def feed(stores: list[WindowStore], clock: Clock, start: float, end: float, gpus: int = 3) -> None:
    t = start
    while t < end:
        clock.now = t
        for store in stores:
            store.ingest(round_points(t, gpus))
        t += STEP


def latest_of(store: WindowStore, metric: str) -> tuple[np.ndarray, np.ndarray]:
    got = store.latest(metric, max_age_seconds=math.inf)
    order = np.argsort([repr(s.key) for s in got.series])
    return got.times[order], got.values[order]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def assert_same_latest(got: WindowStore, want: WindowStore, metrics: Collection[str]) -> None:
    for metric in metrics:
        for a, b in zip(latest_of(got, metric), latest_of(want, metric), strict=True):
            assert same(a, b), metric


def test_latest_only_metrics_read_the_same_latest_and_refuse_ranges() -> None:
    clock = Clock(T0)
    every, some = new_store(clock, None), new_store(clock, {UTIL})
    feed([every, some], clock, T0, T0 + 3 * HOUR)
    # late, duplicate and out-of-order points of the newest round: the newest by time wins
    late = [p for p in round_points(clock.now - 2 * STEP) if p.metric != UTIL]
    for store in (every, some):
        store.ingest(late)
        store.ingest(round_points(clock.now))
    assert_same_latest(some, every, (UTIL, TEMP, NVLINK))
    _, nvlink = latest_of(some, NVLINK)
    assert np.all(nvlink > 0)  # the counter's rate, not NaN, after its reset
    end = clock.now
    assert same(
        some.matrix(UTIL, start=end - HOUR, end=end).values,
        every.matrix(UTIL, start=end - HOUR, end=end).values,
    )
    for read in (
        lambda: some.matrix(TEMP, start=end - HOUR, end=end),
        lambda: some.matrix(TEMP, start=end - HOUR, end=end, resolution="long"),
        lambda: some.increase_matrix(NVLINK, start=end - HOUR, end=end),
        lambda: some.increase(some.latest(NVLINK).series[0].key, end - HOUR, end),
        lambda: some.matrix("never.seen", start=end - HOUR, end=end),
    ):
        with pytest.raises(LatestOnlyError, match="read over a time range"):
            read()
    table = some._table
    assert table.next_recent_row == 3  # UTIL's three series; six latest-only series
    assert table.next_row == 9
    assert table.dts.shape[0] == every._table.dts.shape[0]  # only the reference's counters grew
    assert table.next_counter_row == 0
    assert some.memory_bytes() < every.memory_bytes()
    assert some.held_since() == every.held_since() == T0  # readiness' coverage: unchanged


def test_a_stale_latest_only_series_reads_unknown_and_a_stale_marker_ends_it() -> None:
    clock = Clock(T0)
    some = new_store(clock, {UTIL})
    feed([some], clock, T0, T0 + HOUR)
    clock.now += 120  # past the default staleness (60 s)
    assert np.isnan(some.latest(TEMP).values).all()
    assert np.isfinite(some.latest(TEMP, max_age_seconds=math.inf).values).all()
    clock.now = T0 + HOUR
    assert some.end_series([point(TEMP, clock.now, 0.0, "G0")]) == 1
    assert np.isnan(some.latest(TEMP).values).sum() == 1


def test_eviction_frees_recent_rows_and_latest_values() -> None:
    clock = Clock(T0)
    every, some = new_store(clock, None), new_store(clock, {UTIL})
    feed([every, some], clock, T0, T0 + HOUR, gpus=3)
    start = T0 + 3 * HOUR  # past the recent window: G0..G2 go
    clock.now = start
    assert some.evict_stale() == every.evict_stale() == 9
    assert len(some._table.free_recent_rows) == 3
    assert not some._table.latest_bits.any()
    t = start
    while t < start + HOUR:
        clock.now = t
        points = [p for p in round_points(t, gpus=6) if p.attributes["hw.id"] in {"G4", "G5"}]
        for store in (every, some):
            store.ingest(points)
        t += STEP
    assert some._table.next_recent_row == 3  # the freed recent rows were reused
    assert_same_latest(some, every, (UTIL, TEMP, NVLINK))
    end = clock.now
    got = some.matrix(UTIL, start=end - 2 * HOUR, end=end).values
    assert same(got, every.matrix(UTIL, start=end - 2 * HOUR, end=end).values)
    assert np.isnan(got[:, : -HOUR // STEP]).all()  # nothing of the evicted series shows


def test_snapshot_round_trip_keeps_latest_values_and_changes_of_tier(tmp_path: Path) -> None:
    clock = Clock(T0)
    every, some = new_store(clock, None), new_store(clock, {UTIL})
    feed([every, some], clock, T0, T0 + 3 * HOUR)
    end = clock.now
    path = tmp_path / "w.npz"
    some.write_snapshot(path)
    back = new_store(clock, {UTIL})
    restored = back.read_snapshot(path)
    assert restored is not None
    assert restored.series == 9
    assert_same_latest(back, every, (UTIL, TEMP, NVLINK))
    window = (end - HOUR, end)
    assert same(
        back.matrix(UTIL, start=window[0], end=window[1]).values,
        every.matrix(UTIL, start=window[0], end=window[1]).values,
    )
    # the next round after the restart: the counters go on from their raw state
    feed([every, back], clock, end + STEP, end + 2 * STEP)
    assert_same_latest(back, every, (UTIL, TEMP, NVLINK))
    # a store that keeps TEMP's ring now: its ring starts empty, no error
    wider = new_store(clock, {UTIL, TEMP})
    assert wider.read_snapshot(path) is not None
    assert np.isnan(wider.matrix(TEMP, start=window[0], end=window[1]).values).all()
    # a store that keeps UTIL's latest value only: the ring is dropped, the rest reads
    narrow = new_store(clock, {TEMP})
    assert narrow.read_snapshot(path) is not None
    assert narrow._table.next_recent_row == 3  # TEMP's series only
    with pytest.raises(LatestOnlyError):
        narrow.matrix(UTIL, start=window[0], end=window[1])
    # a snapshot of every ring read into a tiered store, and back
    full = tmp_path / "full.npz"
    every.write_snapshot(full)
    tiered = new_store(clock, {UTIL})
    assert tiered.read_snapshot(full) is not None
    assert tiered._table.next_recent_row == 3
    assert tiered._table.next_counter_row == 0


def test_a_snapshot_from_before_recent_metrics_is_read(tmp_path: Path) -> None:
    """Written by a store with a recent row for every series and no tier members."""
    clock = Clock(T0)
    every = new_store(clock, None)
    feed([every], clock, T0, T0 + 3 * HOUR)
    end = clock.now
    path = tmp_path / "w.npz"
    every.write_snapshot(path)
    old = io.BytesIO()
    tier_members = {"recent_series.npy", "latest_series.npy", "latest_value.npy"}
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for name in src.namelist():
            if name not in tier_members:
                dst.writestr(name, src.read(name))
    path.write_bytes(old.getvalue())
    back = new_store(clock, {UTIL, NVLINK})
    assert back.read_snapshot(path) is not None
    window = (end - HOUR, end)
    for metric in (UTIL,):
        assert same(
            back.matrix(metric, start=window[0], end=window[1]).values,
            every.matrix(metric, start=window[0], end=window[1]).values,
        )
    got = back.increase_matrix(NVLINK, start=window[0], end=window[1]).values
    assert same(got, every.increase_matrix(NVLINK, start=window[0], end=window[1]).values)
    assert back._table.next_recent_row == 6
    _, temp = latest_of(back, TEMP)
    assert np.isnan(temp).all()  # no latest value in that file: unknown until the next point


def test_keep_recent_later_starts_from_the_latest_value() -> None:
    clock = Clock(T0)
    every, some = new_store(clock, None), new_store(clock, {UTIL})
    feed([every, some], clock, T0, T0 + HOUR)
    kept_from = clock.now  # the newest round when the ring is given
    assert some.keep_recent([TEMP, NVLINK]) == 6
    assert some.keep_recent([TEMP]) == 0
    assert every.keep_recent([TEMP]) == 0
    assert_same_latest(some, every, (UTIL, TEMP))  # the gauge's latest value is in its slot
    feed([every, some], clock, clock.now + STEP, clock.now + HOUR)
    end = clock.now
    window = (end - 2 * HOUR, end)
    got = some.matrix(TEMP, start=window[0], end=window[1])
    temp, want = got.values, every.matrix(TEMP, start=window[0], end=window[1]).values
    kept = got.times >= kept_from
    assert got.times[kept][0] == kept_from  # the slot the latest value went to
    assert same(temp[:, kept], want[:, kept])
    assert np.isnan(temp[:, ~kept]).all()  # nothing before: it was never kept
    after = got.times > kept_from  # a counter's first increase in the ring: the next point
    nvlink = some.increase_matrix(NVLINK, start=window[0], end=window[1]).values
    assert same(
        nvlink[:, after],
        every.increase_matrix(NVLINK, start=window[0], end=window[1]).values[:, after],
    )
    assert np.isnan(nvlink[:, ~after]).all()
    assert_same_latest(some, every, (UTIL, TEMP, NVLINK))


def test_the_default_rules_and_readers_declare_what_they_read_over_time(tmp_path: Path) -> None:
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    declared = recent_metrics(rules.enabled(), recent_seconds=6 * HOUR)
    assert declared >= CONTEXT_READS
    assert long_metrics(rules.enabled(), recent_seconds=6 * HOUR) <= declared
    assert {"hw.status", "hw.errors", "system.cpu.time"} <= declared
    latest_only = {
        "gpuwarden.gpu.clock_event.active",
        TEMP,
        NVLINK,
        "gpuwarden.gpu.pcie.link.width",
    }
    assert not latest_only & declared
    assert set(RECENT_READS) <= set(DETECTORS)
    service = build_service(CollectorConfig(database=tmp_path / "c.db"), rules=rules)
    try:
        assert service.store.recent_metrics == declared | SERVICE_RANGE_READS
    finally:
        service.storage.close()


def test_the_recent_metrics_key_adds_extras_or_keeps_every_ring(tmp_path: Path) -> None:
    config_file = tmp_path / "collector.yaml"
    config_file.write_text(
        f"database: {tmp_path / 'c.db'}\nrecent_metrics: [hw.temperature]\n", encoding="utf-8"
    )
    config = load_collector_config(config_file)
    assert config.recent_metrics == (TEMP,)
    service = build_service(config, rules=RuleSet(()))
    try:
        kept = service.store.recent_metrics
        assert kept is not None
        assert TEMP in kept
        assert NVLINK not in kept
    finally:
        service.storage.close()
    every = build_service(
        CollectorConfig(database=tmp_path / "e.db", recent_metrics=("*",)), rules=RuleSet(())
    )
    try:
        assert every.store.recent_metrics is None
    finally:
        every.storage.close()
    bad = tmp_path / "bad.yaml"
    bad.write_text("recent_metrics: hw.temperature\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="recent_metrics"):
        load_collector_config(bad)


def test_the_changes_at_shutdown_carry_the_newest_latest_values(tmp_path: Path) -> None:
    clock = Clock(T0)
    every, some = new_store(clock, None), new_store(clock, {UTIL})
    feed([every, some], clock, T0, T0 + HOUR)
    path = tmp_path / "w.npz"
    some.write_snapshot(path)
    feed([every, some], clock, clock.now + STEP, clock.now + 10 * STEP)
    assert some.write_snapshot(path, changes_only=True).changes_only
    back = new_store(clock, {UTIL})
    assert back.read_snapshot(path) is not None
    assert_same_latest(back, every, (UTIL, TEMP, NVLINK))  # the changes' round, not the base's


def test_a_rule_loaded_later_gets_its_recent_ring_and_runs(tmp_path: Path) -> None:
    """A reload (``DetectionEngine.replace_rules``) with a rule that reads a latest-only metric:
    the store keeps its ring from then on (its latest value the first slot) and the rule runs."""
    end = T0 + 3 * HOUR
    clock = Clock(end)
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    service = build_service(CollectorConfig(database=tmp_path / "c.db"), clock=clock, rules=rules)
    store = service.store
    try:
        feed([store], clock, end - 2 * HOUR, end, gpus=1)
        assert not store.keeps_recent(TEMP)
        engine = DetectionEngine(
            service.detection_view, rules, storage=service.storage, clock=clock
        )
        shift = next(r for r in rules.enabled() if r.detector == "level_shift")
        watch = dataclasses.replace(shift, id="temperature-shift", selector=Selector((TEMP,)))
        engine.replace_rules(RuleSet((*rules.rules, watch)))
        assert store.keeps_recent(TEMP)
        got = store.matrix(TEMP, start=clock.now - HOUR, end=clock.now + STEP)
        assert np.isfinite(got.values[0, -1])  # the latest value, in its slot
        assert np.isnan(got.values[0, :-1]).all()  # nothing older was kept
        result = engine.run_cycle(clock.now)
        assert result.failed_rules == ()
        assert "temperature-shift" in result.rule_seconds
    finally:
        service.storage.close()


def test_a_stale_marker_leaves_a_latest_only_counter_alone() -> None:
    clock = Clock(T0)
    every, some = new_store(clock, None), new_store(clock, {UTIL})
    feed([every, some], clock, T0, T0 + HOUR)
    marker = [point(NVLINK, clock.now + 1, 0.0, "G0", counter=True)]
    assert some.end_series(marker) == every.end_series(marker) == 0
    feed([every, some], clock, clock.now + STEP, clock.now + 2 * STEP)
    assert_same_latest(some, every, (NVLINK,))
    assert np.isfinite(latest_of(some, NVLINK)[1]).all()
