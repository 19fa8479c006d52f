"""WindowStore: rings, gauges, counters, long window, histograms, eviction, limits, threads."""

from __future__ import annotations

import dataclasses
import math
import threading

import numpy as np
import pytest

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.store.types import AttrValue, IngestCounts, Kind, series_key
from gpuwarden.collector.store.window import WindowStore

NS = 1_000_000_000
T0 = 1_000_000_000  # a multiple of every step below
NAN = math.nan


def make_store(**overrides: object) -> WindowStore:
    """6 recent slots of 10 s, long slots of 20 s (2 recent slots), 6 long slots.

    The clock runs a day ahead of the points, so nothing here is stale by age (freshness has
    its own tests, ``test_freshness``).
    """
    config: dict[str, object] = {
        "step_seconds": 10,
        "recent_seconds": 60,
        "long_step_seconds": 20,
        "long_seconds": 120,
        "staleness_seconds": 1e6,
        "clock": lambda: float(T0 + 100_000),
    }
    config.update(overrides)
    return WindowStore(**config)  # type: ignore[arg-type]


def point(
    dt: float,
    value: float,
    *,
    metric: str = "g",
    kind: str = "gauge",
    host: str = "h1",
    **attrs: AttrValue,
) -> NumberPoint:
    return make_point(dt, value, metric, kind, host, attrs)


def counter(dt: float, value: float, **attrs: AttrValue) -> NumberPoint:
    return make_point(dt, value, "c", "sum", "h1", attrs)


def make_point(
    dt: float, value: float, metric: str, kind: str, host: str, attrs: dict[str, AttrValue]
) -> NumberPoint:
    return NumberPoint(
        resource={"host.name": host, "service.name": "agent"},
        metric=metric,
        unit="1",
        kind=kind,
        monotonic=kind == "sum",
        attributes=attrs or {"gpu": "0"},
        time_unix_nano=round((T0 + dt) * NS),
        value=value,
    )


def row(store: WindowStore, metric: str = "g", start: float = 0, end: float = 60) -> list[float]:
    m = store.matrix(metric, start=T0 + start, end=T0 + end)
    assert m.values.shape == (1, len(m.times))
    return [float(v) for v in m.values[0]]


def left_sum(values: list[float]) -> float:
    """Float64 addition left to right, as the store adds its slots (not Python's fsum-like sum)."""
    total = 0.0
    for v in values:
        total += v
    return total


def assert_same(actual: list[float], expected: list[float]) -> None:
    np.testing.assert_array_equal(np.array(actual), np.array(expected))


KEY_G = series_key("g", {"gpu": "0", "host.name": "h1"})
KEY_C = series_key("c", {"gpu": "0", "host.name": "h1"})


# --- gauges ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batches", "expected", "accepted"),
    [
        pytest.param([[(0, 1.0), (20, 3.0)]], [1, NAN, 3, NAN, NAN, NAN], 2, id="gap-is-nan"),
        pytest.param([[(10, 1.0), (10, 2.0)]], [NAN, 2, NAN, NAN, NAN, NAN], 2, id="dup-last"),
        pytest.param([[(10, 1.0)], [(10, 5.0)]], [NAN, 5, NAN, NAN, NAN, NAN], 2, id="dup-later"),
        pytest.param([[(11, 1.0), (17, 2.0)]], [NAN, 2, NAN, NAN, NAN, NAN], 2, id="same-slot"),
        pytest.param([[(17, 2.0), (11, 1.0)]], [NAN, 1, NAN, NAN, NAN, NAN], 2, id="arrival-wins"),
        pytest.param([[(30, 3.0), (10, 1.0)]], [NAN, 1, NAN, 3, NAN, NAN], 2, id="out-of-order"),
        pytest.param(
            [[(50, 5.0)], [(0, 0.5)]], [0.5, NAN, NAN, NAN, NAN, 5], 2, id="late-in-window"
        ),
        pytest.param([[(0, 0.0), (50, -2.5)]], [0, NAN, NAN, NAN, NAN, -2.5], 2, id="zero-kept"),
    ],
)
def test_gauges(batches: list[list[tuple[float, float]]], expected: list[float], accepted: int):
    store = make_store()
    total = sum(store.ingest([point(t, v) for t, v in batch]).accepted for batch in batches)
    assert total == accepted
    assert_same(row(store), expected)


@pytest.mark.parametrize(
    ("late_dt", "counts"),
    [
        pytest.param(40, IngestCounts(rejected_old=1), id="one-slot-too-old"),
        pytest.param(50, IngestCounts(accepted=1), id="oldest-slot-kept"),
    ],
)
def test_point_older_than_window_is_dropped_and_counted(late_dt: int, counts: IngestCounts):
    store = make_store()
    store.ingest([point(100, 1.0)])  # head slot 100 s: the window is [50, 110)
    assert store.ingest([point(late_dt, 2.0)]) == counts
    assert_same(row(store, start=50, end=110), [2.0 if late_dt == 50 else NAN, *[NAN] * 4, 1.0])


def test_non_finite_and_future_points_are_rejected_without_series():
    store = make_store(clock=lambda: float(T0), max_future_seconds=300)
    counts = store.ingest(
        [point(0, NAN), point(0, math.inf), point(0, -math.inf), point(301, 1.0), point(300, 2.0)]
    )
    assert counts == IngestCounts(accepted=1, rejected_nonfinite=3, rejected_future=1, new_series=1)
    assert counts.rejected == 4
    assert store.series_count() == 1


# --- counters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "rates", "resets"),
    [
        pytest.param([(0, 100.0)], [NAN] * 6, 0, id="first-point-no-rate"),
        pytest.param([(0, 100), (10, 200), (20, 250)], [NAN, 10, 5, NAN, NAN, NAN], 0, id="rate"),
        pytest.param([(0, 100), (10, 200), (20, 50)], [NAN, 10, 5, NAN, NAN, NAN], 1, id="reset"),
        pytest.param([(0, 100), (30, 400)], [NAN, NAN, NAN, 10, NAN, NAN], 0, id="gap"),
        pytest.param([(0, 0), (10, 0)], [NAN, 0, NAN, NAN, NAN, NAN], 0, id="idle-is-zero"),
    ],
)
def test_counter_rates(raw: list[tuple[float, float]], rates: list[float], resets: int):
    store = make_store()
    counts = store.ingest([counter(t, v) for t, v in raw])
    assert counts.accepted == len(raw)
    assert counts.counter_resets == resets
    assert_same(row(store, "c"), rates)
    (info,) = store.matrix("c", start=T0, end=T0 + 60).series
    assert info.kind is Kind.COUNTER


def test_counter_increase_is_exact_across_a_reset():
    store = make_store()
    raw = [(0, 1000.1), (10, 1700.25), (20, 30.7), (30, 95.3), (40, 2.2), (50, 7.9)]
    store.ingest([counter(t, v) for t, v in raw])
    # Delta if it did not go down, else the new value (restarted from 0), in slot order.
    deltas = [1700.25 - 1000.1, 30.7, 95.3 - 30.7, 2.2, 7.9 - 2.2]
    # Slots are float32 with their rounding carried forward: a range from the series' start to
    # its newest slot is exact (float64), any other is within one slot's float32 rounding.
    total = left_sum(deltas)
    assert store.increase(KEY_C, T0, T0 + 60) == pytest.approx(total, rel=1e-15)
    assert store.increase(KEY_C, T0 + 10, T0 + 30) == pytest.approx(deltas[0] + deltas[1], rel=1e-6)
    assert store.increase(KEY_C, T0, T0 + 10) is None  # the first point has no delta
    assert store.increase(KEY_C, T0, T0 + 10**9) == pytest.approx(total, rel=1e-15)  # no big array
    # Unaligned bounds take the slots whose start lies in [start, end): partitions add up.
    first, second = store.increase(KEY_C, T0, T0 + 25.5), store.increase(KEY_C, T0 + 25.5, T0 + 60)
    assert first == pytest.approx(deltas[0] + deltas[1], rel=1e-6)
    assert second == pytest.approx(deltas[2] + deltas[3] + deltas[4], rel=1e-6)
    assert first is not None
    assert second is not None
    assert first + second == pytest.approx(total, rel=1e-15)
    inc = store.increase_matrix("c", start=T0, end=T0 + 60)
    assert inc.values.dtype == np.float64
    assert math.isnan(inc.values[0, 0])
    np.testing.assert_allclose(inc.values[0, 1:], deltas, rtol=1e-6)  # float32 + carried debt
    assert np.nansum(inc.values[0]) == pytest.approx(total, rel=1e-15)


def test_counter_increases_stay_exact_over_many_float32_slots():
    # Values whose deltas float32 cannot hold: the rounding is carried, not accumulated.
    store = make_store(recent_seconds=3600, long_seconds=3600)
    raw = [(10.0 * i, 5e9 + 1234.567 * i * i + 0.001 * i) for i in range(300)]
    for t, v in raw:
        store.ingest([counter(t, v)])
    exact = raw[-1][1] - raw[0][1]
    assert store.increase(KEY_C, T0, T0 + 3000) == pytest.approx(exact, rel=1e-15)
    for a, b in [(10, 1500), (700, 2990), (1230, 1240)]:
        want = raw[b // 10][1] - raw[a // 10 - 1][1]
        got = store.increase(KEY_C, T0 + a, T0 + b + 10)
        # off by at most one float32 rounding of one slot (~740,000 here), whatever the length
        assert got == pytest.approx(want, abs=1e-7 * 740_000 * 2)
    one = store.increase_matrix("c", start=T0 + 2990, end=T0 + 3000).values
    assert float(one[0, 0]) == pytest.approx(raw[-1][1] - raw[-2][1], rel=1e-7)


def test_counter_increase_errors():
    store = make_store()
    store.ingest([counter(100, 1.0), point(100, 1.0)])
    with pytest.raises(KeyError):
        store.increase(series_key("c", {"gpu": "9", "host.name": "h1"}), T0, T0 + 60)
    with pytest.raises(ValueError, match="not a counter"):
        store.increase(KEY_G, T0 + 60, T0 + 110)
    with pytest.raises(ValueError, match="before the recent window"):
        store.increase(KEY_C, T0 + 40, T0 + 110)
    assert store.increase(KEY_C, T0 + 50, T0 + 110) is None


def test_a_counter_slot_with_several_points_reads_as_their_mean_rate():
    store = make_store()
    store.ingest([counter(0, 100.0), counter(10, 200.0)])
    store.ingest([counter(12, 400.0)])  # same slot, later request: 300 over the 12 s since 0
    assert_same(row(store, "c"), [NAN, 25, NAN, NAN, NAN, NAN])
    assert store.increase(KEY_C, T0 + 10, T0 + 20) == 300.0


def test_a_counter_rate_over_a_long_gap():
    store = make_store(recent_seconds=7200, long_step_seconds=60, long_seconds=7200)
    store.ingest([counter(0, 0.0), counter(3000, 3000.5)])  # 50 min: 100 ms resolution
    (rate,) = store.latest("c").values
    assert rate == pytest.approx(3000.5 / 3000, rel=1e-4)
    store.ingest([counter(6400, 9000.0)])  # 56.7 min: no rate, the increase is kept
    assert math.isnan(store.latest("c").values[0])
    assert store.increase(KEY_C, T0, T0 + 7200) == 9000.0


def test_values_beyond_float32_are_stored_as_infinite_without_a_warning():
    store = make_store()
    store.ingest([point(0, 1e300), point(20, -1e300), counter(0, 0.0), counter(10, 1e300)])
    assert_same(row(store, end=30), [math.inf, NAN, -math.inf])
    assert_same(row(store, "c", end=20), [NAN, math.inf])
    long = store.matrix("g", start=T0, end=T0 + 40, resolution="long")
    assert_same(list(long.values[0]), [math.inf, -math.inf])


@pytest.mark.parametrize(
    ("second_batch", "out_of_order", "rates"),
    [
        pytest.param([(20, 300.0)], 1, [NAN, NAN, 10, NAN, NAN, NAN], id="replayed-duplicate"),
        pytest.param([(10, 150.0)], 1, [NAN, NAN, 10, NAN, NAN, NAN], id="late-point-ignored"),
        pytest.param([(30, 310.0), (30, 310.0)], 1, [NAN, NAN, 10, 1, NAN, NAN], id="dup-in-batch"),
    ],
)
def test_counter_out_of_order_points_are_ignored(
    second_batch: list[tuple[float, float]], out_of_order: int, rates: list[float]
):
    store = make_store()
    store.ingest([counter(0, 100.0), counter(20, 300.0)])
    counts = store.ingest([counter(t, v) for t, v in second_batch])
    assert counts.counter_out_of_order == out_of_order
    assert counts.rejected == 0
    assert_same(row(store, "c"), rates)
    assert store.increase(KEY_C, T0, T0 + 60) == 200.0 + (10.0 if len(second_batch) == 2 else 0.0)


def test_counter_point_too_old_to_store_still_moves_the_raw_state():
    store = make_store()
    store.ingest([point(200, 1.0)])  # head at 200 s: the window is [150, 210)
    assert store.ingest([counter(90, 1000.0)]).rejected_old == 1
    assert store.ingest([counter(160, 1700.0)]).accepted == 1
    assert store.increase(KEY_C, T0 + 150, T0 + 210) == 700.0
    assert_same(row(store, "c", 150, 210), [NAN, 700 / 70, NAN, NAN, NAN, NAN])


# --- the ring -------------------------------------------------------------------------------


def test_ring_wraps_around_keeping_only_the_recent_window_with_correct_times():
    store = make_store()
    for t in range(0, 200, 10):  # 20 slots through a 6-slot ring
        store.ingest([point(t, float(t))])
    m = store.matrix("g", start=T0, end=T0 + 200)  # clamped to the latest ring length
    assert list(m.times) == [float(T0 + t) for t in range(140, 200, 10)]
    assert_same(list(m.values[0]), [140, 150, 160, 170, 180, 190])
    assert_same(row(store, start=0, end=60), [NAN] * 6)  # rolled out, never an old lap
    assert_same(row(store, start=170, end=230), [170, 180, 190, NAN, NAN, NAN])
    store.ingest([point(1000, 1.0)])  # jump by more than the ring: all of it rolls over
    assert_same(row(store, start=140, end=200), [NAN] * 6)
    assert_same(row(store, start=950, end=1010), [NAN] * 5 + [1.0])


def test_long_window_keeps_means_and_outlives_the_recent_window():
    store = make_store()
    store.ingest([point(t, v) for t, v in [(0, 1), (10, 3), (20, 5), (40, 7), (50, 9)]])
    long = store.matrix("g", start=T0, end=T0 + 60, resolution="long")
    assert list(long.times) == [float(T0), float(T0 + 20), float(T0 + 40)]
    assert long.step_seconds == 20
    assert_same(list(long.values[0]), [2, 5, 8])  # the gap at 30 s does not count as 0
    store.ingest([point(30, 7), point(0, 3)])  # a late point and a duplicate: recomputed
    assert_same(
        list(store.matrix("g", start=T0, end=T0 + 60, resolution="long").values[0]), [3, 6, 8]
    )
    store.ingest([point(150, 1.0)])  # recent window now [100, 160); long window [40, 160)
    assert_same(row(store, start=40, end=100), [NAN] * 6)
    long = store.matrix("g", start=T0, end=T0 + 160, resolution="long")
    assert_same(list(long.values[0]), [8, NAN, NAN, NAN, NAN, 1])
    assert list(long.times) == [float(T0 + t) for t in range(40, 160, 20)]


def test_long_window_of_a_counter_is_its_mean_rate():
    store = make_store()
    store.ingest([counter(t, v) for t, v in [(0, 0), (10, 100), (20, 300), (30, 400)]])
    long = store.matrix("c", start=T0, end=T0 + 40, resolution="long")
    assert_same(list(long.values[0]), [10, 15])


# --- matrix, selectors, latest --------------------------------------------------------------


def test_matrix_selects_series_in_creation_order_and_ignores_attribute_order():
    store = make_store()
    batch = [
        point(0, 10 * h + g, host=f"h{h}", gpu=g, ok=g == 1) for h in (1, 2) for g in (0, 1, 2)
    ]
    counts = store.ingest(batch)
    assert counts.new_series == 6
    reordered = NumberPoint(
        resource={"host.name": "h2"},
        metric="g",
        unit="1",
        kind="gauge",
        monotonic=False,
        attributes={"ok": False, "gpu": 2},
        time_unix_nano=(T0 + 10) * NS,
        value=99.0,
    )
    assert store.ingest([reordered]).new_series == 0

    cases: list[tuple[dict[str, str] | None, list[float]]] = [
        (None, [10, 11, 12, 20, 21, 22]),
        ({"host.name": "h2"}, [20, 21, 22]),
        ({"gpu": "1"}, [11, 21]),
        ({"ok": "true", "host.name": "h1"}, [11]),
        ({"gpu": "7"}, []),
        ({"missing": "x"}, []),
    ]
    for selector, first_column in cases:
        m = store.matrix("g", selector=selector, start=T0, end=T0 + 30)
        assert m.values.shape == (len(first_column), 3)
        assert_same(list(m.values[:, 0]), first_column)
        assert [i.attributes["gpu"] for i in m.series] == [int(v) % 10 for v in first_column]
    m = store.matrix("g", selector={"host.name": "h2", "gpu": "2"}, start=T0, end=T0 + 30)
    assert_same(list(m.values[0]), [22, 99, NAN])
    assert dict(m.series[0].attributes) == {"gpu": 2, "host.name": "h2", "ok": False}
    assert m.series[0].metric == "g"


def test_matrix_of_unknown_metric_and_empty_range():
    store = make_store()
    store.ingest([point(0, 1.0)])
    m = store.matrix("nope", start=T0, end=T0 + 30)
    assert m.values.shape == (0, 3)
    assert list(m.times) == [float(T0), float(T0 + 10), float(T0 + 20)]
    assert store.matrix("g", start=T0 + 30, end=T0).values.shape == (1, 0)


def test_matrix_refuses_an_unknown_resolution():
    with pytest.raises(ValueError, match="resolution"):
        make_store().matrix("g", start=T0, end=T0 + 10, resolution="hourly")  # type: ignore[arg-type]


def test_series_info_is_equal_by_key():
    store = make_store()
    store.ingest([point(0, 1.0)])
    (info,) = store.matrix("g", start=T0, end=T0 + 10).series
    assert info.key == KEY_G
    assert info == dataclasses.replace(info, unit="other")
    assert {info: 1}[dataclasses.replace(info)] == 1


def test_matrix_values_are_a_copy():
    store = make_store()
    store.ingest([point(0, 1.0)])
    store.matrix("g", start=T0, end=T0 + 10).values[0, 0] = 42.0
    assert row(store, end=10) == [1.0]


def test_latest():
    store = make_store()
    store.ingest([point(0, 1.0, gpu="0"), point(20, 2.0, gpu="0"), point(10, 5.0, gpu="1")])
    store.ingest([counter(20, 100.0)])
    latest = store.latest("g")
    assert [dict(s.attributes)["gpu"] for s in latest.series] == ["0", "1"]
    assert list(latest.times) == [float(T0 + 20), float(T0 + 10)]
    assert_same(list(latest.values), [2.0, 5.0])
    assert_same(list(store.latest("c").values), [NAN])  # a counter's first point: no rate yet
    store.ingest([point(200, 3.0, gpu="0")])
    latest = store.latest("g", {"gpu": "1"})
    assert_same(list(latest.values), [NAN])
    assert_same(list(latest.times), [NAN])


# --- histograms -----------------------------------------------------------------------------

BOUNDS = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
KEY_H = series_key("latency", {"route": "/v1", "host.name": "h1"})


def ingest_histogram(
    store: WindowStore, dt: int, counts: list[float], total: float
) -> IngestCounts:
    return store.ingest_histogram(
        "latency",
        {"route": "/v1", "host.name": "h1"},
        time_unix_nano=(T0 + dt) * NS,
        bounds=BOUNDS,
        bucket_counts=counts,
        sum_value=total,
        unit="s",
    )


def test_histogram_quantiles_of_a_uniform_distribution():
    store = make_store()
    observations = (np.arange(800) + 0.5) / 100  # uniform on [0, 8)
    counts = np.histogram(observations, bins=[0, *BOUNDS, math.inf])[0].tolist()
    assert counts == [100] * 8 + [0]
    assert ingest_histogram(store, 0, [0] * 9, 0.0) == IngestCounts(accepted=1, new_series=1)
    assert ingest_histogram(store, 10, counts, float(observations.sum())).accepted == 1
    # Prometheus interpolation inside buckets: the uniform distribution's quantile is 8q.
    for q in (0.0, 0.125, 0.25, 0.3125, 0.5, 0.6875, 1.0):
        assert store.quantile(KEY_H, q, T0, T0 + 60) == 8 * q
    bucket = store.bucket_counts(KEY_H, T0, T0 + 60)
    assert bucket is not None
    assert bucket.bounds == tuple(BOUNDS)
    assert bucket.counts.tolist() == counts
    assert bucket.count == 800
    assert bucket.sum_value == pytest.approx(3200.0, rel=1e-6)  # float32 storage


def test_histogram_increases_resets_and_the_inf_bucket():
    store = make_store()
    ingest_histogram(store, 0, [5, 0, 0, 0, 0, 0, 0, 0, 0], 2.5)
    ingest_histogram(store, 10, [5, 10, 0, 0, 0, 0, 0, 0, 0], 17.5)  # +10 in (1, 2]
    assert ingest_histogram(store, 20, [0, 0, 0, 0, 0, 0, 0, 0, 4], 40.0).counter_resets == 1
    assert ingest_histogram(store, 20, [0, 0, 0, 0, 0, 0, 0, 0, 4], 40.0).counter_out_of_order == 1
    assert store.quantile(KEY_H, 0.5, T0 + 10, T0 + 20) == 1.5
    assert store.quantile(KEY_H, 0.5, T0 + 20, T0 + 30) == 8.0  # +Inf: the highest bound
    both = store.bucket_counts(KEY_H, T0, T0 + 60)
    assert both is not None
    assert both.counts.tolist() == [0, 10, 0, 0, 0, 0, 0, 0, 4]
    assert both.sum_value == 15.0 + 40.0
    assert store.bucket_counts(KEY_H, T0 + 30, T0 + 60) is None
    assert math.isnan(store.quantile(KEY_H, 0.5, T0, T0 + 10))


def test_histogram_errors():
    store = make_store()
    with pytest.raises(ValueError, match="bucket counts"):
        ingest_histogram(store, 0, [1.0], 1.0)
    assert ingest_histogram(store, 0, [NAN] * 9, 1.0) == IngestCounts(rejected_nonfinite=1)
    ingest_histogram(store, 0, [0] * 9, 0.0)
    with pytest.raises(ValueError, match="outside"):
        store.quantile(KEY_H, 1.5, T0, T0 + 10)
    with pytest.raises(KeyError):
        store.quantile(series_key("other", {}), 0.5, T0, T0 + 10)


# --- eviction and limits --------------------------------------------------------------------


def test_stale_series_are_evicted_and_their_rows_reused():
    store = make_store(stale_after_seconds=30, initial_capacity=2)
    store.ingest([point(0, 1.0, gpu="a"), counter(0, 5.0, gpu="a"), point(50, 2.0, gpu="b")])
    store.ingest([counter(10, 15.0, gpu="a")])
    rows = store._table.recent.rows
    assert store.evict_stale(now=T0 + 60) == 2  # last seen at 0 and 10 s, before 30 s
    assert store.series_count() == 1
    assert [dict(s.attributes)["gpu"] for s in store.matrix("g", start=T0, end=T0 + 60).series] == [
        "b"
    ]
    counts = store.ingest([point(40, 4.0, gpu="c"), counter(40, 50.0, gpu="c")])
    assert counts.new_series == 2
    assert store._table.recent.rows == rows  # freed rows reused, nothing grew
    m = store.matrix("g", selector={"gpu": "c"}, start=T0, end=T0 + 60)
    assert_same(list(m.values[0]), [NAN, NAN, NAN, NAN, 4, NAN])  # no trace of series a
    assert store.increase(series_key("c", {"gpu": "c", "host.name": "h1"}), T0, T0 + 60) is None
    # The evicted series comes back as new, its counter starting over (no rate on first point).
    again = store.ingest([counter(50, 1000.0, gpu="a")])
    assert again.new_series == 1
    assert_same(list(store.latest("c", {"gpu": "a"}).values), [NAN])
    assert store.evict_stale(now=T0 + 60) == 0


def test_stale_histograms_are_evicted():
    store = make_store(stale_after_seconds=30)
    ingest_histogram(store, 0, [0] * 9, 0.0)
    assert store.series_count() == 1
    assert store.evict_stale(now=T0 + 100) == 1
    assert store.series_count() == 0


def test_max_series_limit_is_counted():
    store = make_store(max_series=2)
    counts = store.ingest([point(0, 1.0, gpu=str(g)) for g in range(3)])
    assert counts == IngestCounts(accepted=2, rejected_limit=1, new_series=2)
    assert store.ingest([point(10, 1.0, gpu="0"), point(10, 1.0, gpu="9")]) == IngestCounts(
        accepted=1, rejected_limit=1
    )
    assert ingest_histogram(store, 0, [0] * 9, 0.0) == IngestCounts(rejected_limit=1)
    assert store.series_count() == 2


def test_rows_grow_by_doubling_and_memory_is_reported():
    store = make_store(initial_capacity=2)
    empty = store.memory_bytes()
    store.ingest([point(0, float(g), gpu=str(g)) for g in range(5)])
    assert store._table.recent.rows == 8
    assert_same(list(store.matrix("g", start=T0, end=T0 + 10).values[:, 0]), [0, 1, 2, 3, 4])
    per_row = 6 * 4 + 6 * 4 + 40  # recent and long float32 slots, per-row state
    grown = store.memory_bytes() - empty
    assert 6 * per_row <= grown <= 6 * per_row + 5 * 2000  # plus each series' Python objects


@pytest.mark.parametrize(
    "overrides",
    [
        {"step_seconds": 0},
        {"long_step_seconds": 25},
        {"recent_seconds": 50},
        {"long_seconds": 40},
        {"long_seconds": 130},
        {"max_series": 0},
    ],
)
def test_invalid_configuration_is_refused(overrides: dict[str, object]):
    with pytest.raises(ValueError):
        make_store(**overrides)


# --- threads --------------------------------------------------------------------------------


def test_one_writer_and_one_reader_thread():
    store = make_store(recent_seconds=3600, long_seconds=3600, step_seconds=10)
    rounds, gpus = 200, 50
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for r in range(rounds):
                store.ingest([point(10 * r, float(r), gpu=str(g)) for g in range(gpus)])
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)
        finally:
            done.set()

    def read() -> None:
        try:
            while not done.is_set():
                m = store.matrix("g", start=T0, end=T0 + 10 * rounds)
                assert m.values.shape == (len(m.series), rounds)
                seen = m.values[:, ~np.isnan(m.values).all(axis=0)]
                assert (seen == np.arange(seen.shape[1])).all()  # whole rounds, in order
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    final = store.matrix("g", start=T0, end=T0 + 10 * rounds).values
    assert final.shape == (gpus, rounds)
    assert (final == np.arange(rounds, dtype=np.float32)).all()


def test_histogram_keys_list_a_metrics_histograms_by_selector():
    store = WindowStore(step_seconds=10, recent_seconds=3600, clock=lambda: 1_000_000.0)
    for model in ("llama", "mistral"):
        store.ingest_histogram(
            "gpuwarden.model.request.latency",
            {"model": model, "host.name": "n1"},
            time_unix_nano=999_990 * 10**9,
            bounds=(0.1, 1.0),
            bucket_counts=(1, 2, 0),
            sum_value=1.5,
        )
    keys = store.histogram_keys("gpuwarden.model.request.latency")
    assert [dict(k[1])["model"] for k in keys] == ["llama", "mistral"]
    assert store.histogram_keys("gpuwarden.model.request.latency", {"model": "mistral"}) == [
        keys[1]
    ]
    assert store.histogram_keys("gpuwarden.model.request.latency", {"model": "x"}) == []
    assert store.histogram_keys("other") == []
    infos = store.histogram_series("gpuwarden.model.request.latency", {"model": "llama"})
    assert [info.key for info in infos] == [keys[0]]
    assert store.recent_seconds == 3600
