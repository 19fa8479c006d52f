"""``WindowStore.bucket_bins``: one read of many bins, the same answer as one
``bucket_counts`` call per bin (aligned and unaligned bins, bins outside the ring, gaps), and
the fresh view hides the bins a stale series could not have filled."""

from __future__ import annotations

import numpy as np
import pytest

from gpuwarden.collector.store.fresh import FreshReads
from gpuwarden.collector.store.types import SeriesKey
from gpuwarden.collector.store.window import WindowStore

NS = 1_000_000_000
T0 = 1_700_000_000.0  # a multiple of 10 s
BOUNDS = (0.1, 0.5, 1.0)


def filled(now: float, *, stop: float | None = None) -> tuple[WindowStore, SeriesKey]:
    """A store whose one histogram got a point every 10 s from T0 (with a 5-minute gap)."""
    store = WindowStore(step_seconds=10, recent_seconds=3600, clock=lambda: now)
    rng = np.random.default_rng(5)
    counts, total = np.zeros(len(BOUNDS) + 1), 0.0
    t = T0
    while t <= (stop if stop is not None else now):
        if not T0 + 1200 <= t < T0 + 1500:  # the gap
            new = rng.integers(0, 5, len(BOUNDS) + 1)
            counts, total = counts + new, total + float(new.sum()) * 0.3
            store.ingest_histogram(
                "lat", {"model": "m"}, time_unix_nano=int(t * NS), bounds=BOUNDS,
                bucket_counts=counts.tolist(), sum_value=total,
            )  # fmt: skip
        t += 10
    (info,) = store.histogram_series("lat")
    return store, info.key


def one_by_one(store: WindowStore, key: SeriesKey, start: float, width: float, bins: int):
    out = np.full((bins, len(BOUNDS) + 2), np.nan)
    for i in range(bins):
        got = store.bucket_counts(key, start + i * width, start + (i + 1) * width)
        if got is not None:
            out[i, :-1], out[i, -1] = got.counts, got.sum_value
    return out


@pytest.mark.parametrize(
    ("start", "width", "bins"),
    [
        (T0 - 7200, 60.0, 200),  # starts two hours before the ring: leading bins are NaN
        (T0, 10.0, 400),  # one slot per bin
        (T0 + 30, 120.0, 40),  # aligned on slots, not on bins
        (T0 + 5, 60.0, 50),  # not on slots: the per-bin fallback
        (T0 + 3000, 60.0, 30),  # runs past the newest slot
    ],
)
def test_bins_equal_one_call_per_bin(start, width, bins):
    store, key = filled(T0 + 3590)
    got = store.bucket_bins(key, start, width, bins)
    want = one_by_one(store, key, start, width, bins)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)])
    assert np.isfinite(got).any()  # data in the span
    assert np.isnan(got).any()  # and gaps


def test_the_fresh_view_hides_bins_after_the_series_went_stale():
    # points stop at T0 + 1800; judged at T0 + 3000 with the default staleness
    store, key = filled(T0 + 3000, stop=T0 + 1800)
    view = FreshReads(store)
    got = view.bucket_bins(key, T0, 60.0, 50)
    want = one_by_one(view, key, T0, 60.0, 50)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isfinite(got[:10]).all()  # well before the stop: known
    assert np.isnan(got[-5:]).all()  # after it: stale
