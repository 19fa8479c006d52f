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
    ``label_sets``, the decoder's table), time (Unix ms) and value."""

    ids: npt.NDArray[np.int64]
    timestamps_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    label_sets: Sequence[Labels]


@dataclass(frozen=True, slots=True)
class Mapped:
    """What samples became: our points as columns (each one's series, an index into the
    :class:`SpecTable`), and how many samples (series: one sample each) had no mapping."""

    specs: npt.NDArray[np.int64]
    timestamps_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    skipped: int


@runtime_checkable
class ColumnMapper(Protocol):
    """Maps a request's samples (finite, of label sets within the limits) into our points as
    columns, adding the series it needs to ``specs``; None: it declines this request (the
    caller parses it series by series). Called under the cache's lock; ``specs`` changes
    (a new table) when the label-set indexes do, so what a mapper keeps by label-set index it
    keeps for one ``specs``."""

    def map_columns(self, samples: Samples, specs: SpecTable, /) -> Mapped | None: ...


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
        if keep.all():
            return Mapped(spec, samples.timestamps_ms, values, 0)
        skipped = int(np.count_nonzero(~keep))
        return Mapped(spec[keep], samples.timestamps_ms[keep], values[keep], skipped)

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


def _plan(request: LabelSetColumns, cache: LabelSetCache) -> _Plan | None:
    """Check each sample's label set (raises :class:`MalformedRequestError`) and map the
    request; None when the cache follows a newer decoder table or the mapper declines."""
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
        stale = ~over & (values.view(np.uint64) == np.uint64(STALE_NAN_BITS))
        kept = ~over & finite
        specs = cache.specs
        try:
            mapped = cache.mapper.map_columns(_samples(request, kept), specs)
            ended = None
            if mapped is not None and stale.any():  # what the markers' series would write
                ended = cache.mapper.map_columns(_samples(request, stale, zero=True), specs)
                if ended is None:
                    return None
        except Exception as exc:  # the caller answers, never a 5xx: see ``MappingError``
            raise MappingError("the mapper failed on a request") from exc
        if mapped is None:
            return None
        rows = specs.rows[mapped.specs]
        return _Plan(over, stale, kept, mapped, ended, specs, rows, specs.store_generation)


def _samples(request: LabelSetColumns, which: npt.NDArray[np.bool_], zero: bool = False) -> Samples:
    if which.all() and not zero:
        return Samples(request.ids, request.timestamps_ms, request.values, request.label_sets)
    ids = request.ids[which]
    values = np.zeros(ids.size) if zero else request.values[which]
    return Samples(ids, request.timestamps_ms[which], values, request.label_sets)


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
    hosts = {str(resource.get(HOST_NAME, "")) for resource in resources}
    unbound = sorted(host for host in hosts if not may_write(host))
    if unbound:  # named as the series path names it: the first in order
        raise NodeRefusedError(unbound[0])
    points = int(mapped.specs.size)
    refused = 0
    if points:
        seen = np.zeros(len(specs), bool)
        seen[mapped.specs] = True
        distinct = int(np.count_nonzero(seen))
        batch = RowBatch(
            specs=specs.specs,
            spec_of_point=mapped.specs,
            rows=plan.rows,
            generation=plan.store_generation,
            times_ns=mapped.timestamps_ms * 1_000_000,
            values=mapped.values,
            unique=distinct == points,
        )
        done = sink.accept_rows(batch, resources, source)
        cache.keep_rows(specs, mapped.specs, done)
        refused = done.counts.rejected
    if ended is not None and ended.specs.size:  # after the values: a marker ends what came before
        sink.end_series(_markers(ended, specs))
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
