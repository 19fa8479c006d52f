"""Remote-written samples stored as columns: each label set checked, mapped and given its store row
once, then remembered.

The receiver's fast path for a request the decoder read flat (``remote_write.wire_flat``: one
sample a series, each series a label-set index) and a translator that maps each series on its
own (:class:`SeriesMapper`: a label set is one of our series, its values times a scale). For
each label set of the decoder's table, :class:`LabelSetCache` keeps what the label checks said
(``prom_write.LabelVerdicts``), its mapping, and the row the store gave it, so a known series
costs array lookups and the store gets numpy columns (``WindowStore.ingest_rows``), with no
``Series`` or ``NumberPoint`` per sample.

The answers and counts are ``prom_write.screen`` + translate + ``CollectorService.accept``'s:
a request over ``max_points_per_request`` is refused whole (:class:`RequestTooLargeError`), one
with a malformed series too (:class:`MalformedRequestError`); series over the label limits,
non-finite samples and series without a mapping are counted and dropped; stale markers end
their series (``end_series``) after the values are stored; a node the caller may not write
refuses the whole request (:class:`NodeRefusedError`) before anything is stored.
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


class RowSink(Protocol):
    """Where the columns go (``CollectorService``)."""

    def accept_rows(
        self, batch: RowBatch, resources: Sequence[Attrs], source: str
    ) -> RowsIngested: ...

    def end_series(self, points: Sequence[NumberPoint]) -> int: ...


class MappingError(Exception):
    """The mapper failed on a label set (a mapping bug: its cause is the mapper's exception)."""


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
    """Per label set of the decoder's table: its verdict, mapping and store row (module).

    Forgets everything when the decoder's table changes generation; its rows are valid for
    ``store_generation`` of the store's rows (they are found again after an eviction).
    """

    def __init__(self, verdicts: LabelVerdicts, mapper: SeriesMapper) -> None:
        self.verdicts = verdicts
        self.mapper = mapper
        self.lock = threading.Lock()
        self.generation = -1
        self.verdict = np.empty(0, dtype=np.int8)
        self.why: dict[int, str] = {}
        self.mapped = np.empty(0, dtype=bool)
        self.scale = np.empty(0, dtype=np.float64)
        self.mappings: list[SeriesMapping | None] = []
        self.specs: list[RowSpec | None] = []
        self.rows = np.empty(0, dtype=np.int64)
        self.resource_of = np.empty(0, dtype=np.int64)
        """Each label set's resource, an index into ``resources`` (-1: none)."""
        self.resources: list[Attrs] = []
        self._resource_index: dict[int, int] = {}
        self.store_generation = -1

    def sync(self, generation: int, size: int) -> bool:
        """Follow the decoder's table (False: the request is of an older table than this)."""
        if generation < self.generation:
            return False
        if generation > self.generation:
            self.generation = generation
            self.verdict = np.empty(0, dtype=np.int8)
            self.why.clear()
            self.mapped = np.empty(0, dtype=bool)
            self.scale = np.empty(0, dtype=np.float64)
            self.mappings, self.specs = [], []
            self.rows = np.empty(0, dtype=np.int64)
            self.resource_of = np.empty(0, dtype=np.int64)
            self.resources, self._resource_index = [], {}
        extra = size - self.verdict.size
        if extra > 0:
            self.verdict = np.concatenate([self.verdict, np.full(extra, _UNKNOWN, np.int8)])
            self.mapped = np.concatenate([self.mapped, np.zeros(extra, bool)])
            self.scale = np.concatenate([self.scale, np.ones(extra)])
            self.rows = np.concatenate([self.rows, np.full(extra, -1, np.int64)])
            self.resource_of = np.concatenate([self.resource_of, np.full(extra, -1, np.int64)])
            self.mappings.extend([None] * extra)
            self.specs.extend([None] * extra)
        return True

    def learn(self, index: int, labels: Labels) -> None:
        """Check and map one label set."""
        verdict = self.verdicts(labels)
        if verdict == OK:
            self.verdict[index] = _OK
        elif verdict == OVER:
            self.verdict[index] = _OVER
            return
        else:
            self.verdict[index] = _MALFORMED
            self.why[index] = verdict
            return
        try:
            mapping = self.mapper.map_series(labels)
        except Exception as exc:  # the caller answers, never a 5xx: see ``MappingError``
            raise MappingError(f"the mapper failed on {labels!r}") from exc
        if mapping is None:
            return
        host = mapping.resource.get(HOST_NAME)
        alias = (mapping.metric, host, tuple(mapping.attributes.items()))
        self.mappings[index] = mapping
        self.specs[index] = RowSpec(alias, mapping.unit, mapping.counter)
        self.mapped[index] = True
        self.scale[index] = mapping.scale
        found = self._resource_index.get(id(mapping.resource))
        if found is None:  # the list keeps the dict alive, so its id names it
            found = self._resource_index[id(mapping.resource)] = len(self.resources)
            self.resources.append(mapping.resource)
        self.resource_of[index] = found

    def keep_rows(
        self, generation: int, indexes: npt.NDArray[np.int64], done: RowsIngested
    ) -> None:
        """Remember the rows the store gave ``indexes`` of the decoder's table ``generation``
        (valid for ``done.generation`` of the store's rows)."""
        with self.lock:
            if generation != self.generation:
                return
            if done.generation != self.store_generation:
                self.rows.fill(-1)
                self.store_generation = done.generation
            if indexes.size and int(indexes.max()) < self.rows.size:
                self.rows[indexes] = done.rows


@dataclass(frozen=True, slots=True)
class _Known:
    """What the cache says of each sample's label set."""

    over: npt.NDArray[np.bool_]
    mapped: npt.NDArray[np.bool_]
    scale: npt.NDArray[np.float64]
    rows: npt.NDArray[np.int64]
    resource_of: npt.NDArray[np.int64]
    store_generation: int
    mappings: list[SeriesMapping | None]
    specs: list[RowSpec | None]
    resources: list[Attrs]


def _look_up(request: LabelSetColumns, cache: LabelSetCache) -> _Known | None:
    """Each sample's label set's verdict, mapping and row, learnt when new (raises
    :class:`MalformedRequestError`); None when the cache follows a newer decoder table."""
    ids = request.ids
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
        return _Known(
            verdict == _OVER,
            cache.mapped[ids],
            cache.scale[ids],
            cache.rows[ids],
            cache.resource_of[ids],
            cache.store_generation,
            cache.mappings,
            cache.specs,
            cache.resources,
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
    a newer table of the decoder than the request's (the caller takes the other path).

    Raises :class:`RequestTooLargeError`, :class:`MalformedRequestError`,
    :class:`NodeRefusedError`, :class:`MappingError`.
    """
    values = request.values
    if values.size > max_points:
        raise RequestTooLargeError(f"request holds more than {max_points} series")
    known = _look_up(request, cache)
    if known is None:
        return None
    over, mapped = known.over, known.mapped
    finite = np.isfinite(values)
    stale = values.view(np.uint64) == np.uint64(STALE_NAN_BITS)
    kept = ~over & finite
    ended = ~over & stale & mapped
    store = kept & mapped
    outcomes: Counter[str] = Counter()
    outcomes["over_label_limits"] = int(np.count_nonzero(over))
    outcomes["nonfinite"] = int(np.count_nonzero(~over & ~finite & ~stale))
    outcomes["stale_markers"] = int(np.count_nonzero(~over & stale))
    outcomes["unmapped_series"] = int(np.count_nonzero(kept & ~mapped))
    # the resources of what is stored or ended: their nodes must be the caller's
    used = np.unique(known.resource_of[store | ended]).tolist()
    resources = [known.resources[i] for i in used]
    for resource in resources:
        host = str(resource.get(HOST_NAME, ""))
        if not may_write(host):
            raise NodeRefusedError(host)
    points = int(np.count_nonzero(store))
    refused = 0
    if points:
        at = np.flatnonzero(store)
        ids = request.ids[at]
        distinct = len(set(ids.tolist()))
        batch = RowBatch(
            specs=known.specs,
            spec_of_point=ids,
            rows=known.rows[at],
            generation=known.store_generation,
            times_ns=request.timestamps_ms[at] * 1_000_000,
            values=values[at] * known.scale[at],
            unique=distinct == at.size,
        )
        done = sink.accept_rows(batch, resources, source)
        cache.keep_rows(request.generation, ids, done)
        refused = done.counts.rejected
    if ended.any():  # after the values: a marker ends what came before it
        sink.end_series(_markers(request, ended, known.mappings))
    outcomes["stored"] = points - refused
    outcomes["refused_by_store"] = refused
    rejected = outcomes["over_label_limits"] + outcomes["nonfinite"] + refused
    return Stored(points - refused, rejected, +outcomes)


def _markers(
    request: LabelSetColumns, ended: npt.NDArray[np.bool_], mappings: list[SeriesMapping | None]
) -> list[NumberPoint]:
    """The stale markers as points naming their series (``end_series`` reads no value)."""
    out = []
    for i in np.flatnonzero(ended).tolist():
        m = mappings[int(request.ids[i])]
        if m is not None:
            kind = "sum" if m.counter else "gauge"
            t_ns = int(request.timestamps_ms[i]) * 1_000_000
            out.append(
                NumberPoint(m.resource, m.metric, m.unit, kind, m.counter, m.attributes, t_ns, 0.0)
            )
    return out
