"""Remote-written samples stored as columns: each label set checked once, each request mapped as
arrays, each of our series' store row remembered.

The receiver's fast path for a request the decoder read flat (``remote_write.wire_flat``: one
sample a series, each series a label-set index). :class:`LabelSetCache` keeps, for each label
set of the decoder's table, what the label checks said (``prom_write.LabelVerdicts``); the
request's samples then go to a :class:`ColumnMapper`, which turns them into our points as
columns (each point an index into a :class:`SpecTable` of our series, a time, a value), and the
store gets those columns (``WindowStore.ingest_rows``), each series' row remembered in the
table, with no ``Series`` or ``NumberPoint`` per sample.

Two mappers: :class:`PerSeries` adapts a translator that maps each series on its own
(:class:`SeriesMapper`: a label set is one of our series, its values times a scale);
``prom_map_columns.PromTranslator`` is the production mapping (dcgm-exporter and the model
servers), which also derives points across series.

The answers and counts are ``prom_write.screen`` + translate + ``CollectorService.accept``'s:
a request over ``max_points_per_request`` is refused whole (:class:`RequestTooLargeError`), one
with a malformed series too (:class:`MalformedRequestError`); series over the label limits,
non-finite samples and series without a mapping are counted and dropped; stale markers end
the series the same samples would have written (``end_series``) after the values are stored; a
node the caller may not write refuses the whole request (:class:`NodeRefusedError`) before
anything is stored. A mapper may decline a request (None): the caller parses it series by
series instead.

:func:`store_many` does the same for several requests of one sender at once (those a receiver
thread finds waiting): each is mapped as if alone, in one mapping, and their points are stored
with one write, so the fixed cost of a request (about 0.4 ms of numpy calls and the store's
bookkeeping) is paid once; each request keeps its own answer.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.prom_write import (
    OK,
    OVER,
    STALE_NAN_BITS,
    LabelVerdicts,
    MalformedRequestError,
    RequestTooLargeError,
)
from gpuwarden.collector.store.types import HOST_NAME, AttrValue
from gpuwarden.collector.store.window_rows import RowBatch, RowsIngested, RowSpec

Labels = tuple[tuple[str, str], ...]
Attrs = dict[str, AttrValue]
_UNKNOWN, _OK, _OVER, _MALFORMED = -1, 0, 1, 2


@dataclass(frozen=True, slots=True)
class SeriesMapping:
    """What one remote-written series is in our metrics: a point per sample, value x ``scale``."""

    resource: Attrs
    metric: str
    unit: str
    counter: bool
    """A monotonic sum (stored as increases)."""
    attributes: Attrs
    scale: float = 1.0


@runtime_checkable
class SeriesMapper(Protocol):
    """A translator that maps each series on its own (None: no mapping, the series is skipped)."""

    def map_series(self, labels: Labels, /) -> SeriesMapping | None: ...


class SpecTable:
    """Our series that mapped samples land on: each one's store identity (``RowSpec``), a point
    naming it (for stale markers), its resource, and the store row it got (-1: not known yet;
    valid for ``store_generation`` of the store's rows). Only ever added to; replaced whole
    when the decoder's table changes generation."""

    def __init__(self) -> None:
        self.specs: list[RowSpec | None] = []
        self.templates: list[NumberPoint] = []
        self.resources: list[Attrs] = []
        self.resource_of = np.empty(0, dtype=np.int64)
        self.rows = np.empty(0, dtype=np.int64)
        self.store_generation = -1
        self._index: dict[tuple[object, ...], int] = {}
        self._resource_index: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.specs)

    def add(
        self, resource: Attrs, metric: str, unit: str, kind: str, monotonic: bool, attrs: Attrs
    ) -> int:
        """The index of the series points of these fields are stored in (added when new)."""
        items = tuple(attrs.items())
        key = (id(resource), metric, unit, kind, monotonic, items)
        found = self._index.get(key)
        if found is not None:
            return found
        at = self._resource_index.get(id(resource))
        if at is None:  # ``resources`` keeps the dict alive, so its id names it
            at = self._resource_index[id(resource)] = len(self.resources)
            self.resources.append(resource)
        host = resource.get(HOST_NAME)
        counter = kind == "sum" and monotonic
        self.specs.append(RowSpec((metric, host, items), unit, counter))
        self.templates.append(
            NumberPoint(resource, metric, unit, kind, monotonic, dict(attrs), 0, 0.0)
        )
        index = self._index[key] = len(self.specs) - 1
        if index >= self.rows.size:
            grow = max(1024, self.rows.size)
            self.rows = np.concatenate([self.rows, np.full(grow, -1, np.int64)])
            self.resource_of = np.concatenate([self.resource_of, np.full(grow, -1, np.int64)])
        self.resource_of[index] = at
        return index


@dataclass(frozen=True, slots=True)
class Samples:
    """Samples of one request for a mapper: each one's label set (an index into
    ``label_sets``, the decoder's table), time (Unix ms) and value; or of several requests
    mapped at once, each sample's request (``requests``: 0, 1, ..., non-decreasing)."""

    ids: npt.NDArray[np.int64]
    timestamps_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    label_sets: Sequence[Labels]
    requests: npt.NDArray[np.int64] | None = None


@dataclass(frozen=True, slots=True)
class Mapped:
    """What samples became: our points as columns (each one's series, an index into the
    :class:`SpecTable`), and how many samples (series: one sample each) had no mapping; of
    several requests, each point's request (``requests``) and how many of each request's
    samples had no mapping (``skipped_each``; ``skipped``: their sum)."""

    specs: npt.NDArray[np.int64]
    timestamps_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    skipped: int
    requests: npt.NDArray[np.int64] | None = None
    skipped_each: npt.NDArray[np.int64] | None = None


@runtime_checkable
class ColumnMapper(Protocol):
    """Maps a request's samples (finite, of label sets within the limits) into our points as
    columns, adding the series it needs to ``specs``; None: it declines this request (the
    caller parses it series by series). Called under the cache's lock; ``specs`` changes
    (a new table) when the label-set indexes do, so what a mapper keeps by label-set index it
    keeps for one ``specs``.

    Samples of several requests (``Samples.requests``) are mapped each request as if alone
    (the same points :func:`store_columns` would store of it alone), each point with its
    request (``Mapped.requests``, ``Mapped.skipped_each``)."""

    def map_columns(self, samples: Samples, specs: SpecTable, /) -> Mapped | None: ...


def count_each(
    requests: npt.NDArray[np.int64], which: npt.NDArray[np.bool_]
) -> npt.NDArray[np.int64]:
    """How many samples of ``which`` each request holds (``requests``: each sample's; the
    requests after the last one seen hold none)."""
    return np.bincount(requests[which]).astype(np.int64)


class PerSeries:
    """A :class:`SeriesMapper` as a :class:`ColumnMapper`: each label set mapped once, then a
    series index and a scale per label set."""

    def __init__(self, mapper: SeriesMapper) -> None:
        self.mapper = mapper
        self._table: SpecTable | None = None
        self._spec = np.empty(0, dtype=np.int64)  # -2: not mapped yet, -1: no mapping
        self._scale = np.empty(0, dtype=np.float64)

    def map_columns(self, samples: Samples, specs: SpecTable, /) -> Mapped:
        """Each sample onto its label set's series, its value times the scale."""
        if specs is not self._table:
            self._table = specs
            self._spec = np.empty(0, dtype=np.int64)
            self._scale = np.empty(0, dtype=np.float64)
        extra = len(samples.label_sets) - self._spec.size
        if extra > 0:
            self._spec = np.concatenate([self._spec, np.full(extra, -2, np.int64)])
            self._scale = np.concatenate([self._scale, np.ones(extra)])
        ids = samples.ids
        spec = self._spec[ids]
        if (spec == -2).any():
            for index in np.unique(ids[spec == -2]).tolist():
                self._learn(index, samples.label_sets[index], specs)
            spec = self._spec[ids]
        keep = spec >= 0
        values = samples.values * self._scale[ids]
        requests = samples.requests
        each = None if requests is None else count_each(requests, ~keep)
        if keep.all():
            return Mapped(spec, samples.timestamps_ms, values, 0, requests, each)
        skipped = int(np.count_nonzero(~keep))
        return Mapped(
            spec[keep],
            samples.timestamps_ms[keep],
            values[keep],
            skipped,
            None if requests is None else requests[keep],
            each,
        )

    def _learn(self, index: int, labels: Labels, specs: SpecTable) -> None:
        mapping = self.mapper.map_series(labels)
        if mapping is None:
            self._spec[index] = -1
            return
        kind = "sum" if mapping.counter else "gauge"
        self._spec[index] = specs.add(
            mapping.resource, mapping.metric, mapping.unit, kind, mapping.counter,
            mapping.attributes,
        )  # fmt: skip
        self._scale[index] = mapping.scale


class RowSink(Protocol):
    """Where the columns go (``CollectorService``)."""

    def accept_rows(
        self, batch: RowBatch, resources: Sequence[Attrs], source: str
    ) -> RowsIngested: ...

    def end_series(self, points: Sequence[NumberPoint]) -> int: ...


class MappingError(Exception):
    """The mapper failed on a request (a mapping bug: its cause is the mapper's exception)."""


class NodeRefusedError(ValueError):
    """A series of a node the caller may not write: the whole request is refused (403)."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.host = host


@dataclass(frozen=True, slots=True)
class LabelSetColumns:
    """A request read flat (``wire_flat.FlatRequest``'s fields, which ingest may not import)."""

    ids: npt.NDArray[np.int64]
    timestamps_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    label_sets: Sequence[Labels]
    generation: int


@dataclass(frozen=True, slots=True)
class Stored:
    """What became of a request's samples: stored, rejected, and the receiver's outcome
    counts (``IngestStats.remote_write_samples`` keys)."""

    stored: int
    rejected: int
    outcomes: Counter[str]


class LabelSetCache:
    """Per label set of the decoder's table its verdict; the mapper; our series (module).

    Forgets everything when the decoder's table changes generation (a new :class:`SpecTable`
    too); the series' rows are valid for ``specs.store_generation`` of the store's rows (they
    are found again after an eviction).
    """

    def __init__(self, verdicts: LabelVerdicts, mapper: ColumnMapper | SeriesMapper) -> None:
        self.verdicts = verdicts
        self.mapper: ColumnMapper = (
            mapper if isinstance(mapper, ColumnMapper) else PerSeries(mapper)
        )
        self.lock = threading.Lock()
        self.generation = -1
        self.verdict = np.empty(0, dtype=np.int8)
        self.why: dict[int, str] = {}
        self.specs = SpecTable()

    def sync(self, generation: int, size: int) -> bool:
        """Follow the decoder's table (False: the request is of an older table than this)."""
        if generation < self.generation:
            return False
        if generation > self.generation:
            self.generation = generation
            self.verdict = np.empty(0, dtype=np.int8)
            self.why.clear()
            self.specs = SpecTable()
        extra = size - self.verdict.size
        if extra > 0:
            self.verdict = np.concatenate([self.verdict, np.full(extra, _UNKNOWN, np.int8)])
        return True

    def learn(self, index: int, labels: Labels) -> None:
        """Check one label set."""
        verdict = self.verdicts(labels)
        if verdict == OK:
            self.verdict[index] = _OK
        elif verdict == OVER:
            self.verdict[index] = _OVER
        else:
            self.verdict[index] = _MALFORMED
            self.why[index] = verdict

    def keep_rows(
        self, specs: SpecTable, indexes: npt.NDArray[np.int64], done: RowsIngested
    ) -> None:
        """Remember the rows the store gave the series ``indexes`` of ``specs`` (valid for
        ``done.generation`` of the store's rows)."""
        with self.lock:
            if specs is not self.specs:
                return
            if done.generation != specs.store_generation:
                specs.rows.fill(-1)
                specs.store_generation = done.generation
            specs.rows[indexes] = done.rows


@dataclass(frozen=True, slots=True)
class _Plan:
    """A request as the cache and the mapper see it, before anything is stored."""

    over: npt.NDArray[np.bool_]
    stale: npt.NDArray[np.bool_]
    kept: npt.NDArray[np.bool_]
    mapped: Mapped
    ended: Mapped | None
    specs: SpecTable
    rows: npt.NDArray[np.int64]
    store_generation: int


def _plan(
    request: LabelSetColumns, cache: LabelSetCache, requests: npt.NDArray[np.int64] | None = None
) -> _Plan | None:
    """Check each sample's label set (raises :class:`MalformedRequestError`) and map the
    request (``requests``: several requests', each sample's); None when the cache follows a
    newer decoder table or the mapper declines."""
    ids, values = request.ids, request.values
    with cache.lock:
        if not cache.sync(request.generation, len(request.label_sets)):
            return None
        verdict = cache.verdict[ids]
        unknown = verdict == _UNKNOWN
        if unknown.any():
            for index in np.unique(ids[unknown]).tolist():
                cache.learn(index, request.label_sets[index])
            verdict = cache.verdict[ids]
        malformed = verdict == _MALFORMED
        if malformed.any():
            raise MalformedRequestError(cache.why[int(ids[np.argmax(malformed)])])
        over = verdict == _OVER
        finite = np.isfinite(values)
        stale = ~over & _markers_of(values)
        kept = ~over & finite
        specs = cache.specs
        try:
            mapped = cache.mapper.map_columns(_samples(request, kept, requests), specs)
            ended = None
            if mapped is not None and stale.any():  # what the markers' series would write
                ended = cache.mapper.map_columns(
                    _samples(request, stale, requests, zero=True), specs
                )
                if ended is None:
                    return None
        except Exception as exc:  # the caller answers, never a 5xx: see ``MappingError``
            raise MappingError("the mapper failed on a request") from exc
        if mapped is None:
            return None
        rows = specs.rows[mapped.specs]
        return _Plan(over, stale, kept, mapped, ended, specs, rows, specs.store_generation)


def _samples(
    request: LabelSetColumns,
    which: npt.NDArray[np.bool_],
    requests: npt.NDArray[np.int64] | None,
    zero: bool = False,
) -> Samples:
    if which.all() and not zero:
        return Samples(
            request.ids, request.timestamps_ms, request.values, request.label_sets, requests
        )
    ids = request.ids[which]
    values = np.zeros(ids.size) if zero else request.values[which]
    return Samples(
        ids,
        request.timestamps_ms[which],
        values,
        request.label_sets,
        None if requests is None else requests[which],
    )


def store_columns(
    request: LabelSetColumns,
    cache: LabelSetCache,
    sink: RowSink,
    may_write: Callable[[str], bool],
    max_points: int,
    source: str,
) -> Stored | None:
    """Check, map and store a request read flat (module docstring); None when ``cache`` follows
    a newer table of the decoder than the request's, or its mapper declines the request (the
    caller takes the other path).

    Raises :class:`RequestTooLargeError`, :class:`MalformedRequestError`,
    :class:`NodeRefusedError`, :class:`MappingError`.
    """
    if request.values.size > max_points:
        raise RequestTooLargeError(f"request holds more than {max_points} series")
    plan = _plan(request, cache)
    if plan is None:
        return None
    mapped, ended, specs = plan.mapped, plan.ended, plan.specs
    outcomes: Counter[str] = Counter()
    outcomes["over_label_limits"] = int(np.count_nonzero(plan.over))
    outcomes["nonfinite"] = int(np.count_nonzero(~plan.over & ~plan.kept & ~plan.stale))
    outcomes["stale_markers"] = int(np.count_nonzero(plan.stale))
    outcomes["unmapped_series"] = mapped.skipped
    # the resources of what is stored or ended: their nodes must be the caller's
    named = mapped.specs if ended is None else np.concatenate([mapped.specs, ended.specs])
    used = np.zeros(len(specs.resources), bool)
    used[specs.resource_of[named]] = True
    resources = [specs.resources[i] for i in np.flatnonzero(used).tolist()]
    unbound = _unbound(resources, may_write)
    if unbound:  # named as the series path names it: the first in order
        raise NodeRefusedError(unbound[0])
    points = int(mapped.specs.size)
    refused = 0
    if points:
        refused = _put(plan, None, resources, sink, cache, source)
    if ended is not None and ended.specs.size:  # after the values: a marker ends what came before
        sink.end_series(_markers(ended, specs))
    return _stored(outcomes, points, refused)


Answer = (
    Stored | None | RequestTooLargeError | MalformedRequestError | NodeRefusedError | MappingError
)
"""What :func:`store_many` made of one request: what :func:`store_columns` returns, or the
error it raises."""
MAX_TOGETHER = 256
"""Requests mapped and stored as one at most (the rest one by one); a receiver's in-flight
limits keep it far lower."""
_REFUSALS = (RequestTooLargeError, MalformedRequestError, NodeRefusedError, MappingError)


def store_many(
    requests: Sequence[LabelSetColumns],
    cache: LabelSetCache,
    sink: RowSink,
    may_write: Callable[[str], bool],
    max_points: int,
    source: str,
) -> list[Answer]:
    """:func:`store_columns` for several requests of one sender, each one's answer in its
    place, paying the fixed costs of mapping and storing once: the requests are mapped as one
    (each as if alone: ``ColumnMapper``), those whose nodes the sender may write are stored
    with one write, in request order, and one refused request refuses only itself.

    The write is the requests' one after the other in this order: a cell written twice keeps
    the later request's value, new series are admitted in this order. One exception: a
    counter's point older than its newest in another request of the write is kept in time
    order, as if the requests had come in that order; such requests are in flight at once,
    so no order between them is owed. The store's refusals of the write are counted on its
    first requests, as many on each as it has points (the store counts them for the whole
    write; they only feed totals).

    Stored one by one instead: a request with stale markers (a marker ends what came before
    it: stored after the others), one of another decoder table than the first, and all of
    them when one holds a malformed series or the mapper declines or fails (so each gets its
    own answer).
    """
    answers: list[Answer] = [None] * len(requests)
    together: list[int] = []
    alone: list[int] = []
    for i, request in enumerate(requests):
        if request.values.size > max_points:
            answers[i] = RequestTooLargeError(f"request holds more than {max_points} series")
        elif _has_markers(request) or request.generation != requests[0].generation:
            alone.append(i)
        else:
            together.append(i)
    done = None
    if len(together) > MAX_TOGETHER:
        alone += together[MAX_TOGETHER:]
        together = together[:MAX_TOGETHER]
    if len(together) > 1:
        done = _store_together([requests[i] for i in together], cache, sink, may_write, source)
    if done is None:
        alone += together
    else:
        for i, answer in zip(together, done, strict=True):
            answers[i] = answer
    for i in sorted(alone):
        try:
            answers[i] = store_columns(requests[i], cache, sink, may_write, max_points, source)
        except _REFUSALS as exc:
            answers[i] = exc
    return answers


def _markers_of(values: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """Which values are Prometheus' stale marker (that NaN's bits, not any NaN)."""
    found: npt.NDArray[np.bool_] = values.view(np.uint64) == np.uint64(STALE_NAN_BITS)
    return found


def _has_markers(request: LabelSetColumns) -> bool:
    return bool(_markers_of(request.values).any())


def _store_together(
    requests: Sequence[LabelSetColumns],
    cache: LabelSetCache,
    sink: RowSink,
    may_write: Callable[[str], bool],
    source: str,
) -> list[Answer] | None:
    """``store_many`` of requests of one table without stale markers, mapped as one; None:
    store them one by one (a malformed series, the mapper declined or failed)."""
    n = len(requests)  # at most MAX_TOGETHER
    first = requests[0]
    joined = LabelSetColumns(
        np.concatenate([r.ids for r in requests]),
        np.concatenate([r.timestamps_ms for r in requests]),
        np.concatenate([r.values for r in requests]),
        first.label_sets,
        first.generation,
    )
    of = np.repeat(np.arange(n), [r.ids.size for r in requests])
    try:
        plan = _plan(joined, cache, of)
    except (MalformedRequestError, MappingError):
        return None
    point_of = None if plan is None else plan.mapped.requests
    if plan is None or point_of is None:
        return None
    mapped, specs = plan.mapped, plan.specs
    answers: list[Answer] = [None] * n
    # each request's nodes must be the sender's
    resource_of = specs.resource_of[mapped.specs]
    n_resources = len(specs.resources)
    named = np.zeros((n, n_resources), bool)
    named[point_of, resource_of] = True
    keep: npt.NDArray[np.bool_] | None = None
    for j in range(n):
        resources = [specs.resources[r] for r in np.flatnonzero(named[j]).tolist()]
        unbound = _unbound(resources, may_write)
        if unbound:
            answers[j] = NodeRefusedError(unbound[0])
            keep = (point_of != j) if keep is None else keep & (point_of != j)
    at = np.arange(point_of.size) if keep is None else np.flatnonzero(keep)
    # into request order, each request's points in theirs (a radix sort of small numbers)
    at = at[np.argsort(point_of[at].astype(np.int16), kind="stable")]
    points = np.bincount(point_of[at], minlength=n)
    refused = 0
    if at.size:
        resources = [specs.resources[r] for r in np.unique(resource_of[at]).tolist()]
        refused = _put(plan, at, resources, sink, cache, source)
    over = np.bincount(of[plan.over], minlength=n)
    nonfinite = np.bincount(of[~plan.over & ~plan.kept], minlength=n)
    skipped = np.zeros(n, np.int64)
    if mapped.skipped_each is not None:
        skipped[: mapped.skipped_each.size] = mapped.skipped_each
    for j in range(n):
        if answers[j] is not None:
            continue
        outcomes: Counter[str] = Counter()
        outcomes["over_label_limits"] = int(over[j])
        outcomes["nonfinite"] = int(nonfinite[j])
        outcomes["unmapped_series"] = int(skipped[j])
        mine = min(refused, int(points[j]))
        refused -= mine
        answers[j] = _stored(outcomes, int(points[j]), mine)
    return answers


def _unbound(resources: Sequence[Attrs], may_write: Callable[[str], bool]) -> list[str]:
    """The nodes of ``resources`` the sender may not write, sorted."""
    hosts = {str(resource.get(HOST_NAME, "")) for resource in resources}
    return sorted(host for host in hosts if not may_write(host))


def _put(
    plan: _Plan,
    at: npt.NDArray[np.int64] | None,
    resources: Sequence[Attrs],
    sink: RowSink,
    cache: LabelSetCache,
    source: str,
) -> int:
    """Store the points ``at`` of ``plan`` (None: all) with one write; return how many the
    store refused."""
    mapped, specs = plan.mapped, plan.specs
    spec_of_point, times, values, rows = (
        mapped.specs,
        mapped.timestamps_ms,
        mapped.values,
        plan.rows,
    )
    if at is not None:
        spec_of_point, times, values, rows = spec_of_point[at], times[at], values[at], rows[at]
    seen = np.zeros(len(specs), bool)
    seen[spec_of_point] = True
    distinct = int(np.count_nonzero(seen))
    batch = RowBatch(
        specs=specs.specs,
        spec_of_point=spec_of_point,
        rows=rows,
        generation=plan.store_generation,
        times_ns=times * 1_000_000,
        values=values,
        unique=distinct == spec_of_point.size,
    )
    done = sink.accept_rows(batch, resources, source)
    cache.keep_rows(specs, spec_of_point, done)
    return done.counts.rejected


def _stored(outcomes: Counter[str], points: int, refused: int) -> Stored:
    outcomes["stored"] = points - refused
    outcomes["refused_by_store"] = refused
    rejected = outcomes["over_label_limits"] + outcomes["nonfinite"] + refused
    return Stored(points - refused, rejected, +outcomes)


def _markers(ended: Mapped, specs: SpecTable) -> list[NumberPoint]:
    """The stale markers as points naming their series (``end_series`` reads no value)."""
    templates = specs.templates
    out = []
    for spec, t_ms in zip(ended.specs.tolist(), ended.timestamps_ms.tolist(), strict=True):
        m = templates[spec]
        out.append(
            NumberPoint(
                m.resource, m.metric, m.unit, m.kind, m.monotonic, m.attributes, t_ms * 1_000_000,
                0.0,
            )
        )  # fmt: skip
    return out
