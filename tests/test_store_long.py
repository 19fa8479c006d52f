"""The long ring per metric (``long_metrics``): only the series of the metrics read at long
resolution keep one, and reads, eviction, snapshots, warm start and a later ``keep_long`` give
the same long values as a store that keeps every metric long.

Real stores side by side: one keeping every metric long (the reference), one keeping some.
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
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.agent.config import ConfigError
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig, load_collector_config
from gpuwarden.collector.detect.catalog import DETECTORS, LONG_READS, load_rules, long_metrics
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import Rule, RuleSet, Selector
from gpuwarden.collector.store.types import NoLongRingError, SeriesBlock
from gpuwarden.collector.store.window import WindowStore

T0 = 1_767_225_600.0
STEP = 10
HOUR = 3600
UTIL, POWER, ENERGY = "hw.gpu.utilization", "hw.power", "hw.energy"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def new_store(clock: Clock, long_metrics: Collection[str] | None) -> WindowStore:
    return WindowStore(
        step_seconds=STEP,
        recent_seconds=2 * HOUR,
        long_seconds=6 * HOUR,
        long_metrics=long_metrics,
        clock=clock,
    )


def point(metric: str, t: float, value: float, gpu: str, *, counter: bool = False) -> NumberPoint:
    return NumberPoint(
        {"host.name": "n1"},
        metric,
        "J" if counter else "1",
        "sum" if counter else "gauge",
        counter,
        {"hw.id": gpu},
        int(t * 1e9),
        value,
    )


def feed(stores: list[WindowStore], clock: Clock, start: float, end: float, gpus: int = 3) -> None:
    """Per GPU: utilisation (a ramp), power (a sine) and an energy counter, interleaved, so
    long and recent-only series alternate in the rows."""
    t = start
    while t < end:
        clock.now = t
        k = (t - T0) / STEP
        points = []
        for g in range(gpus):
            points += [
                point(POWER, t, 300 + 50 * math.sin(k / 7 + g), f"G{g}"),
                point(UTIL, t, ((k + 13 * g) % 100) / 100, f"G{g}"),
                point(ENERGY, t, 400.0 * (t - T0) * (g + 1), f"G{g}", counter=True),
            ]
        for store in stores:
            store.ingest(points)
        t += STEP


def long_of(store: WindowStore, metric: str, end: float) -> np.ndarray:
    got = store.matrix(metric, start=end - 6 * HOUR, end=end, resolution="long")
    order = np.argsort([repr(s.key) for s in got.series])
    return got.values[order]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


def test_only_listed_metrics_keep_a_long_ring_and_read_the_same() -> None:
    clock = Clock(T0)
    every, some = new_store(clock, None), new_store(clock, {UTIL, ENERGY})
    feed([every, some], clock, T0, T0 + 3 * HOUR)
    end = clock.now
    for metric in (UTIL, ENERGY):
        values = long_of(some, metric, end)
        assert np.isfinite(values).sum() > 3 * 100  # three series, 3 h of minutes
        assert same(values, long_of(every, metric, end))
    with pytest.raises(NoLongRingError, match=r"hw\.power: read at long resolution"):
        some.matrix(POWER, start=end - HOUR, end=end, resolution="long")
    assert some.matrix(POWER, start=end - HOUR, end=end).values.shape == (3, HOUR // STEP)
    # six long rows (3 GPUs x 2 metrics), not nine
    assert some._table.next_long_row == 6
    assert every._table.next_long_row == 9
    assert some.memory_bytes() < every.memory_bytes()


def test_an_empty_set_keeps_no_long_rows_and_the_head_still_moves() -> None:
    clock = Clock(T0)
    store = new_store(clock, ())
    feed([store], clock, T0, T0 + 3 * HOUR)
    assert store._table.next_long_row == 0
    assert store.held_since() == T0  # readiness' coverage: unchanged


def test_eviction_frees_long_rows_and_a_new_series_starts_empty() -> None:
    clock = Clock(T0)
    every, some = new_store(clock, None), new_store(clock, {UTIL})
    feed([every, some], clock, T0, T0 + HOUR, gpus=3)
    # G0..G2 stop; G5..G7 start 3 h later, after the recent window: the old ones are evicted
    start = T0 + 3 * HOUR
    clock.now = start
    assert some.evict_stale() == every.evict_stale() == 9
    assert some._table.free_long_rows
    assert some._table.next_long_row == 3
    t = start
    while t < start + HOUR:
        clock.now = t
        points = [point(UTIL, t, 0.25 * g, f"G{g}") for g in (5, 6, 7)]
        points += [point(POWER, t, 100.0, f"G{g}") for g in (5, 6, 7)]
        for store in (every, some):
            store.ingest(points)
        t += STEP
    assert some._table.next_long_row == 3  # the freed long rows were reused
    values = long_of(some, UTIL, clock.now)
    assert same(values, long_of(every, UTIL, clock.now))
    assert np.isnan(values[:, :-70]).all()  # nothing of the evicted series shows through
    assert np.nanmax(values) == pytest.approx(1.75)


def test_snapshot_round_trip_keeps_the_long_rows(tmp_path: Path) -> None:
    clock = Clock(T0)
    every, some = new_store(clock, None), new_store(clock, {UTIL})
    feed([every, some], clock, T0, T0 + 4 * HOUR)
    end = clock.now
    path = tmp_path / "w.npz"
    some.write_snapshot(path)
    for kept in ({UTIL}, None):
        back = new_store(clock, kept)
        restored = back.read_snapshot(path)
        assert restored is not None
        assert restored.series == 9
        assert same(long_of(back, UTIL, end), long_of(every, UTIL, end))
    # a metric this store keeps long but the snapshot did not: only what the recent ring gives
    back = new_store(clock, {UTIL, POWER})
    assert back.read_snapshot(path) is not None
    power = long_of(back, POWER, end)
    assert np.isnan(power[:, : 2 * 60]).all()  # the 4 h - 2 h older than the recent window
    # a store that keeps UTIL no more drops its long rows without complaint
    back = new_store(clock, {POWER})
    assert back.read_snapshot(path) is not None
    assert back._table.next_long_row == 3


def test_a_snapshot_from_before_long_metrics_is_read(tmp_path: Path) -> None:
    """Written by a store that kept every series long and had no ``long_series`` member."""
    clock = Clock(T0)
    every = new_store(clock, None)
    feed([every], clock, T0, T0 + 4 * HOUR)
    end = clock.now
    path = tmp_path / "w.npz"
    every.write_snapshot(path)
    old = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for name in src.namelist():
            if name != "long_series.npy":
                dst.writestr(name, src.read(name))
    path.write_bytes(old.getvalue())
    back = new_store(clock, {ENERGY})
    assert back.read_snapshot(path) is not None
    assert same(long_of(back, ENERGY, end), long_of(every, ENERGY, end))
    assert back._table.next_long_row == 3


def test_fill_long_skips_metrics_without_a_long_ring() -> None:
    clock = Clock(T0 + 5 * HOUR)
    store = new_store(clock, {UTIL})
    minutes = np.arange(T0 + HOUR, T0 + 2 * HOUR, 60, dtype=np.float64)

    def block(metric: str) -> SeriesBlock:
        return SeriesBlock(
            metric=metric,
            host="n1",
            attributes={"hw.id": "G0"},
            unit="1",
            counter=False,
            times_ns=(minutes * 1e9).astype(np.int64),
            values=np.linspace(0.0, 1.0, minutes.size),
        )

    assert store.fill_long([block(POWER)]) == 0
    assert store.fill_long([block(UTIL)]) == 60
    got = long_of(store, UTIL, clock.now)
    assert np.nansum(got) == pytest.approx(np.linspace(0.0, 1.0, 60).sum(), rel=1e-6)


def test_keep_long_later_starts_from_the_recent_window() -> None:
    clock = Clock(T0)
    every, some = new_store(clock, None), new_store(clock, {UTIL})
    feed([every, some], clock, T0, T0 + 3 * HOUR)
    assert some.keep_long([POWER, ENERGY]) == 6
    assert some.keep_long([POWER]) == 0
    feed([every, some], clock, clock.now + STEP, clock.now + HOUR)
    end = clock.now
    for metric in (POWER, ENERGY):
        got, want = long_of(some, metric, end), long_of(every, metric, end)
        recent = 2 * 60  # the recent window's minutes, from the recent ring: the same
        assert same(got[:, -recent + 1 :], want[:, -recent + 1 :])
        assert np.isnan(got[:, : -recent - 60]).all()
        assert np.isfinite(want[:, : -recent - 60]).any()
    # a store that keeps every metric long already: nothing to do
    assert every.keep_long([POWER]) == 0


def test_the_default_rules_declare_what_they_read_long() -> None:
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    declared = long_metrics(rules.enabled(), recent_seconds=6 * HOUR)
    assert {UTIL, "gpuwarden.model.requests", "gpuwarden.model.queue.size"} <= declared
    assert POWER not in declared
    assert ENERGY not in declared
    assert set(LONG_READS) <= set(DETECTORS)


@pytest.mark.parametrize(
    "rule",
    load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir()).enabled(),
    ids=lambda rule: rule.id,
)
def test_each_default_rule_runs_on_its_own_long_rings(rule: Rule, tmp_path: Path) -> None:
    """Each default rule alone, on a collector whose store keeps only the long rings that rule
    declares: a detector reading long a metric it does not declare fails (``NoLongRingError``)
    instead of running. The data reach past the recent window, so the long reads happen."""
    end = T0 + 8 * HOUR
    clock = Clock(end)
    alone = RuleSet((rule,))
    service = build_service(CollectorConfig(database=tmp_path / "c.db"), clock=clock, rules=alone)
    store = service.store
    declared = long_metrics((rule,), recent_seconds=6 * HOUR)
    assert store.long_metrics == declared
    feed([store], clock, end - 7 * HOUR, end, gpus=1)
    engine = DetectionEngine(service.detection_view, alone, storage=service.storage, clock=clock)
    assert store.long_metrics == declared  # the engine needed nothing more
    try:
        assert engine.run_cycle(end).failed_rules == ()
    finally:
        service.storage.close()


def test_rules_loaded_later_get_their_long_rings(tmp_path: Path) -> None:
    """A reload (``DetectionEngine.replace_rules``) with a rule that reads a new metric long:
    the store keeps it long from then on, with the recent window's minutes, and the rule runs."""
    end = T0 + 8 * HOUR
    clock = Clock(end)
    service = build_service(CollectorConfig(database=tmp_path / "c.db"), clock=clock)
    store = service.store
    feed([store], clock, end - 7 * HOUR, end, gpus=1)
    assert not store.keeps_long(POWER)
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    engine = DetectionEngine(service.detection_view, rules, storage=service.storage, clock=clock)
    anomaly = next(r for r in rules.enabled() if r.detector == "metric_anomaly")
    watch_power = dataclasses.replace(anomaly, id="power-anomaly", selector=Selector((POWER,)))
    engine.replace_rules(RuleSet((*rules.rules, watch_power)))
    assert store.keeps_long(POWER)
    power = store.matrix(POWER, start=end - 14 * 86400, end=end, resolution="long")
    known = np.isfinite(power.values[0])
    assert known[-6 * 60 :].all()  # the recent window's minutes (6 h)
    assert not known[: -6 * 60].any()  # nothing older: it was never kept
    try:
        result = engine.run_cycle(end)
        assert result.failed_rules == ()
        assert "power-anomaly" in result.rule_seconds
    finally:
        service.storage.close()


def test_the_long_metrics_key_adds_extras(tmp_path: Path) -> None:
    config_file = tmp_path / "collector.yaml"
    config_file.write_text(
        f"database: {tmp_path / 'c.db'}\nlong_metrics: [hw.power, hw.temperature]\n",
        encoding="utf-8",
    )
    config = load_collector_config(config_file)
    assert config.long_metrics == (POWER, "hw.temperature")
    service = build_service(config, rules=RuleSet(()))
    try:
        assert service.store.long_metrics == frozenset({POWER, "hw.temperature"})
    finally:
        service.storage.close()
    bad = tmp_path / "bad.yaml"
    bad.write_text("long_metrics: hw.power\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="long_metrics"):
        load_collector_config(bad)


def test_the_changes_at_shutdown_complete_the_long_rows(tmp_path: Path) -> None:
    clock = Clock(T0)
    every, some = new_store(clock, None), new_store(clock, {UTIL})
    feed([every, some], clock, T0, T0 + 3 * HOUR)
    path = tmp_path / "w.npz"
    some.write_snapshot(path)
    feed([every, some], clock, clock.now + STEP, clock.now + HOUR)
    stats = some.write_snapshot(path, changes_only=True)
    assert stats.changes_only
    back = new_store(clock, {UTIL})
    assert back.read_snapshot(path) is not None
    end = clock.now
    assert same(long_of(back, UTIL, end), long_of(every, UTIL, end))
    assert np.isfinite(long_of(back, UTIL, end)[:, -30:]).all()  # the changes' minutes are in


# --- the queued long-ring updates wait within a long slot -------------------------------------

LATE_OR_JUMP = st.lists(
    st.tuples(
        st.integers(-13, 3),  # slots from the newest: late (up to past the window), ahead
        st.booleans(),  # a counter's point, else a gauge's
        st.integers(0, 2),  # the GPU
        st.floats(0, 1e6),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(LATE_OR_JUMP, st.lists(st.integers(0, 59), max_size=8), st.sampled_from([0, 30, 700]))
def test_long_slots_are_the_same_however_late_they_are_recomputed(steps, reads, jump):
    """Updates queued within a long slot (applied when the head starts the next one) give the
    long ring of a store that applies them after every write (a long read applies them): late
    points, repeats, a jump past the recent window (``jump`` recent slots ahead at the middle)
    and counters included."""
    clock = Clock(T0 + 100 * HOUR)
    config = {"step_seconds": 10, "recent_seconds": 120, "long_step_seconds": 60,
              "long_seconds": 1200, "staleness_seconds": 1e9}  # fmt: skip
    lazy, eager = (WindowStore(**config, clock=clock) for _ in range(2))  # type: ignore[arg-type]
    newest = 0
    counters = [0.0, 0.0, 0.0]
    for k, (ahead, counter, gpu, value) in enumerate(steps):
        if k == len(steps) // 2:
            newest += jump
        slot = max(0, newest + ahead)
        newest = max(newest, slot)
        t = T0 + slot * 10
        if counter:
            counters[gpu] += value
            points = [point(ENERGY, t, counters[gpu], f"G{gpu}", counter=True)]
        else:
            points = [point(UTIL, t, value, f"G{gpu}")]
        lazy.ingest(points)
        eager.ingest(points)
        for metric in (UTIL, ENERGY):
            eager.matrix(metric, start=t - 1200, end=t + 60, resolution="long")
        if k in reads:  # the lazy store is read now and then too
            lazy.matrix(UTIL, start=t - 1200, end=t + 60, resolution="long")
    end = T0 + (newest + 1) * 10
    for metric in (UTIL, ENERGY):
        got = lazy.matrix(metric, start=end - 1200, end=end + 60, resolution="long")
        want = eager.matrix(metric, start=end - 1200, end=end + 60, resolution="long")
        assert [s.key for s in got.series] == [s.key for s in want.series]
        assert same(got.values, want.values), metric
