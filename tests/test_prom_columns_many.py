"""Several requests of one sender stored at once (``prom_columns.store_many``) leave the store
as the same requests stored one by one in order (``store_columns``), and give each request the
answer it gets alone: a refused node, a malformed series, an oversized request refuse only
their own request; stale markers, NaN and Inf, series over the label limits, unmapped series,
a GPU's series split over requests, two scrapes in one request."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.prom_columns import (
    Answer,
    Attrs,
    Labels,
    LabelSetCache,
    LabelSetColumns,
    MappingError,
    NodeRefusedError,
    Stored,
    store_columns,
    store_many,
)
from gpuwarden.collector.ingest.prom_map_columns import PromTranslator
from gpuwarden.collector.ingest.prom_write import (
    LabelVerdicts,
    MalformedRequestError,
    RequestTooLargeError,
)
from gpuwarden.collector.remote_write.wire import Series
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.store.window_rows import RowBatch, RowsIngested
from tests.test_prom_map_columns import (
    STALE,
    labelled,
    scrape,
    scripted,
    services,  # noqa: F401 - the fixture
    store_state,
)

MAX_POINTS = 5_000
REFUSALS = (RequestTooLargeError, MalformedRequestError, NodeRefusedError, MappingError)


def allowed(host: str) -> bool:
    return host != "node-c"  # the sender may not write node-c (the extras' MIG and pods)


class Sender:
    """A decoder's label-set table: each label set's index, as a request read flat names it."""

    def __init__(self) -> None:
        self.table: list[Labels] = []
        self.index: dict[Labels, int] = {}

    def request(self, series: list[Series]) -> LabelSetColumns:
        ids, times, values = [], [], []
        for s in series:
            at = self.index.get(s.labels)
            if at is None:
                at = self.index[s.labels] = len(self.table)
                self.table.append(s.labels)
            for t, v in zip(s.timestamps_ms, s.values, strict=True):
                ids.append(at)
                times.append(t)
                values.append(v)
        return LabelSetColumns(
            np.array(ids, np.int64),
            np.array(times, np.int64),
            np.array(values, np.float64),
            self.table,
            0,
        )


def cache() -> LabelSetCache:
    return LabelSetCache(LabelVerdicts(CollectorConfig().ingest_limits, 100_000), PromTranslator())


class Writes:
    """A service, counting its writes."""

    def __init__(self, service: CollectorService) -> None:
        self.service = service
        self.writes = 0

    def accept_rows(self, batch: RowBatch, resources: Sequence[Attrs], source: str) -> RowsIngested:
        self.writes += 1
        return self.service.accept_rows(batch, resources, source)

    def end_series(self, points: Sequence[NumberPoint]) -> int:
        return self.service.end_series(points)


def one_by_one(requests, cache_, service) -> list[Answer]:
    out: list[Answer] = []
    for request in requests:
        try:
            out.append(store_columns(request, cache_, service, allowed, MAX_POINTS, "prometheus"))
        except REFUSALS as exc:
            out.append(exc)
    return out


def same_answers(alone: list[Answer], together: list[Answer]) -> None:
    """Each request's answer the same (an error by kind and text); the stored, rejected and
    outcome counts the same in total (a shared write counts some on its first requests)."""
    assert len(alone) == len(together)
    totals: list[tuple[int, int, Counter[str]]] = []
    for answers in (alone, together):
        stored, rejected, outcomes = 0, 0, Counter[str]()
        for a in answers:
            if isinstance(a, Stored):
                stored, rejected = stored + a.stored, rejected + a.rejected
                outcomes.update(a.outcomes)
        totals.append((stored, rejected, outcomes))
    kinds = [[type(a).__name__, str(a) if isinstance(a, Exception) else ""] for a in alone]
    assert kinds == [[type(a).__name__, str(a) if isinstance(a, Exception) else ""]
                     for a in together]  # fmt: skip
    assert totals[0] == totals[1]


USED, UTIL = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"
GPU_D = {"Hostname": "node-d", "UUID": "GPU-node-d-0", "gpu": "0", "modelName": "H100"}
POD = {"namespace": "ml", "pod": "p", "container": "c"}


def by_node(series: list[Series], node: str) -> list[Series]:
    return [s for s in series if dict(s.labels).get("Hostname") == node]


def others(series: list[Series]) -> list[Series]:
    return [s for s in series if dict(s.labels).get("Hostname") not in ("node-a", "node-b")]


def test_requests_stored_at_once_leave_the_store_as_one_by_one(services):  # noqa: F811
    alone_service, together_service = services
    caches = (cache(), cache())
    sender = Sender()
    fleet = scripted()
    t = int(time.time() * 1000) - 600_000
    everything = [scrape(fleet, t + r * 15_000, r) for r in range(8)]
    rounds = [[s for s in r if dict(s.labels).get("Hostname") != "node-c"] for r in everything]
    over = tuple(sorted((dict(rounds[0][0].labels) | {"pod": "x" * 5000}).items()))
    bad = (("UUID", "GPU-1"), ("gpu", "1"))  # no metric name
    groups: list[list[list[Series]]] = [
        [rounds[0]],  # every label set learned, alone
        # one scrape split three ways: a GPU's series in two requests (info, limit in both)
        [rounds[1][:100], rounds[1][100:230], rounds[1][230:]],
        # by node; node-c's (and the models') refused, alone
        [by_node(rounds[2], "node-a"), others(everything[2]), by_node(rounds[2], "node-b")],
        # NaN, Inf, a label set over the limits; two scrapes in one request
        [
            [*rounds[3][:50], Series(rounds[3][50].labels, (t,), (math.nan,))],
            [
                *rounds[3][51:],
                Series(over, (t,), (1.0,)),
                Series(rounds[4][3].labels, (t,), (math.inf,)),
            ],
            [*rounds[4], *rounds[5]],
        ],
        # a malformed series: every request one by one, only that one refused
        [rounds[6][:80], [*rounds[6][80:160], Series(bad, (t,), (1.0,))], rounds[6][160:]],
        # stale markers (stored alone, after), too large a request, the same again reversed
        [
            rounds[7][:120],
            [Series(s.labels, s.timestamps_ms, (STALE,)) for s in rounds[7][:5]],
            rounds[7] * 30,
            rounds[7][::-1],
        ],
        # a pod's memory: its share of the device's in one request, its own in the next (the
        # same series and time: the later request's value stays)
        [
            [labelled(USED, 3000.0, t, **GPU_D), labelled(UTIL, 30.0, t, **GPU_D, **POD)],
            [labelled(USED, 3000.0, t, **GPU_D), labelled(USED, 1000.0, t, **GPU_D, **POD)],
        ],
    ]
    end_s = (t + 8 * 15_000) / 1000
    writes = Writes(together_service)
    answers, per_group = [], []
    for group in groups:
        requests = [sender.request(series) for series in group]
        alone = one_by_one(requests, caches[0], alone_service)
        before = writes.writes
        together = store_many(requests, caches[1], writes, allowed, MAX_POINTS, "prometheus")
        per_group.append(writes.writes - before)
        same_answers(alone, together)
        assert store_state(alone_service, end_s) == store_state(together_service, end_s)
        answers += together
    # one write for the requests stored together; one each after a malformed series (a
    # request with only stale markers writes no value)
    assert per_group == [1, 1, 1, 1, 2, 1, 1]
    assert {type(a) for a in answers} == {Stored, *REFUSALS} - {MappingError}
