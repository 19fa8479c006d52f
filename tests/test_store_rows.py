"""``WindowStore.ingest_rows``: points as columns with the rows the caller kept, stored as
``ingest`` stores the same points (series, values, counts, budget), and rows found again after
an eviction freed them.
"""

from __future__ import annotations

import numpy as np

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.store.types import IngestCounts
from gpuwarden.collector.store.window import WindowStore
from gpuwarden.collector.store.window_rows import RowBatch, RowSpec
from tests.test_store import NS, T0, make_point, make_store

SPECS = [
    RowSpec(("g", "h1", (("gpu", "0"),)), "1", False),
    RowSpec(("g", "h1", (("gpu", "1"),)), "1", False),
    RowSpec(("c", "h1", (("gpu", "0"),)), "1", True),
    RowSpec(("g", "h2", (("gpu", "0"),)), "1", False),
]


def as_points(specs: list[int], dts: list[float], values: list[float]) -> list[NumberPoint]:
    out = []
    for i, dt, v in zip(specs, dts, values, strict=True):
        metric, host, items = SPECS[i].alias
        kind = "sum" if SPECS[i].counter else "gauge"
        out.append(make_point(dt, v, metric, kind, str(host), dict(items)))  # type: ignore[arg-type]
    return out


def batch(
    specs: list[int], dts: list[float], values: list[float], rows: list[int], generation: int
) -> RowBatch:
    return RowBatch(
        specs=SPECS,
        spec_of_point=np.array(specs, dtype=np.int64),
        rows=np.array(rows, dtype=np.int64),
        generation=generation,
        times_ns=np.array([round((T0 + dt) * NS) for dt in dts], dtype=np.int64),
        values=np.array(values, dtype=np.float64),
        unique=len(set(specs)) == len(specs),
    )


def state(store: WindowStore) -> dict[str, object]:
    out: dict[str, object] = {"series": store.series_count()}
    for metric in ("g", "c"):
        m = store.matrix(metric, start=T0, end=T0 + 60)
        order = np.argsort([str(s.key) for s in m.series])
        out[metric] = (
            [str(m.series[i].key) for i in order],
            np.nan_to_num(m.values[order], nan=-1.0).tolist(),
        )
    return out


REQUESTS = [  # (spec of each point, seconds after T0, values)
    ([0, 1, 2], [0.0, 0.0, 0.0], [1.0, 2.0, 100.0]),
    ([0, 1, 2, 3], [10.0, 10.0, 10.0, 10.0], [3.0, 4.0, 150.0, 9.0]),
    ([0, 0, 2], [20.0, 21.0, 20.0], [5.0, 6.0, 170.0]),  # one series twice
    ([1, 3], [30.0, 1e6], [7.0, 8.0]),  # the second far in the future
]


def test_rows_kept_by_the_caller_store_what_ingest_stores():
    by_points, by_rows = make_store(), make_store()
    kept = np.full(len(SPECS), -1, dtype=np.int64)
    generation = -1
    for specs, dts, values in REQUESTS:
        expected = by_points.ingest(as_points(specs, dts, values))
        done = by_rows.ingest_rows(batch(specs, dts, values, kept[specs].tolist(), generation))
        assert done.counts == expected
        assert state(by_points) == state(by_rows)
        kept[specs] = done.rows
        generation = done.generation
    assert (kept >= 0).all()
    assert done.counts.rejected_future == 1


def test_the_budget_refuses_new_series_in_point_order_and_known_ones_pass():
    store = make_store()
    first = store.ingest_rows(batch([0], [0.0], [1.0], [-1], -1))
    done = store.ingest_rows(batch([1, 3, 0], [10.0] * 3, [1.0, 2.0, 3.0], [-1, -1, -1], -1), 1)
    assert done.counts == IngestCounts(accepted=2, rejected_limit=1, new_series=1)
    assert done.rows.tolist()[2] == first.rows[0]
    assert done.rows[1] == -1
    assert store.series_count() == 2


def test_rows_freed_by_an_eviction_are_found_again():
    store = make_store(stale_after_seconds=15, clock=lambda: float(T0 + 30))
    first = store.ingest_rows(batch([0, 1], [0.0, 20.0], [1.0, 2.0], [-1, -1], -1))
    assert store.evict_stale() == 1  # gpu 0: its row is free
    assert first.generation != store.ingest_rows(batch([1], [25.0], [3.0], [-1], -1)).generation
    again = store.ingest_rows(
        batch([3, 1], [28.0, 28.0], [4.0, 5.0], first.rows.tolist()[::-1], first.generation)
    )
    keys = {str(s.key) for s in store.matrix("g", start=T0, end=T0 + 60).series}
    assert keys == {
        str(("g", (("gpu", "1"), ("host.name", "h1")))),
        str(("g", (("gpu", "0"), ("host.name", "h2")))),
    }
    assert again.counts.accepted == 2
    latest = store.latest("g", {"host.name": "h2"}, max_age_seconds=1e9)
    assert latest.values.tolist() == [4.0]
