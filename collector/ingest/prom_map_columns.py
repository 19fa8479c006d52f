"""The production mapping (:mod:`.prom_map`) as columns: each label set read once, each request
mapped with numpy.

:class:`PromTranslator` is the collector's remote-write translator. Called with series it is
:func:`prom_map.translate` (the receiver's series path); as a ``prom_columns.ColumnMapper`` it
gives the same points for a request read flat, without a Python object per sample:

- each label set is read once (its first request) into numbers: what it is (a dcgm-exporter
  field, a model-server series, nothing we map), its GPU, field and job, and the indexes of the
  series its points land on (``prom_columns.SpecTable``): the field's own, the pod's
  per-process one, the pod's share of memory;
- a request is then array work: the value kept once per (GPU, field, time), a device-level
  series before the pods' copies, first in request order (time-slicing); one
  ``gpuwarden.gpu.info`` per GPU (and MIG parent) and time; ``hw.gpu.memory.limit`` = used +
  free + reserved where no total is sent; the pods' per-process points and their even share
  of the used memory; the model servers' points (a series skipped when the request carries its
  newer family).

Several requests mapped at once (``Samples.requests``) are grouped by *occasion* (a request's
scrape time, ``prom_map_sets.occasions``) where one request is grouped by time, so each gets
the points it gets alone (``tests/test_prom_map_many.py``).

dcgm-exporter's samples are grouped without a sort where the request allows
(:mod:`.prom_map_dense`: no MIG device, small tables), by sorting otherwise.

The points are :func:`prom_map.translate`'s, value for value (``tests/test_prom_map_columns.py``
compares the store after both paths); only their order in the batch differs, which matters to
nothing but which new series a sender's exhausted series budget still admits. Stale markers
are mapped as the series path maps them (their samples as zeros): the series they name end.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.ingest.prom_catalog import MIB
from gpuwarden.collector.ingest.prom_columns import (
    Labels,
    Mapped,
    Samples,
    SpecTable,
    count_each,
)
from gpuwarden.collector.ingest.prom_map import (
    DCGM_BY_SERIES,
    INFO,
    PROCESS_MEMORY,
    Attrs,
    GpuIdentity,
    Series,
    Translated,
    gpu_identity,
    translate,
)
from gpuwarden.collector.ingest.prom_map_dense import dense_dcgm
from gpuwarden.collector.ingest.prom_map_sets import (
    DCGM,
    FIELDS,
    FREE,
    MODEL,
    NEW,
    RESERVED,
    SKIP,
    SOURCE,
    TOTAL,
    USED,
    Floats,
    GpuTable,
    Ints,
    LabelSets,
    Part,
    occasions,
    requests_of,
)
from gpuwarden.collector.ingest.prom_models import MODEL_BY_SERIES, model_attributes
from gpuwarden.collector.ingest.scrape import INSTANCE


def _find(keys: Ints, wanted: Ints) -> tuple[Ints, npt.NDArray[np.bool_]]:
    """Where each of ``wanted`` is in the sorted ``keys``, and whether it is there."""
    at = np.searchsorted(keys, wanted)
    at[at >= keys.size] = 0
    return at, keys[at] == wanted if keys.size else np.zeros(wanted.size, bool)


class PromTranslator:
    """:func:`prom_map.translate`, and the same mapping as a ``prom_columns.ColumnMapper``
    (module docstring). What it learns is kept for one ``SpecTable`` (the decoder's table)."""

    def __init__(self, *, dense: bool = True) -> None:
        """``dense``: map dcgm-exporter's samples through :mod:`.prom_map_dense` where it
        takes the request (the same points, faster); False: always by sorting."""
        self._dense = dense
        self._table: SpecTable | None = None
        self._reset()

    def __call__(self, series: Sequence[Series], /) -> Translated:
        """The series path: :func:`prom_map.translate`."""
        return translate(series)

    def _reset(self) -> None:
        self.sets = LabelSets()
        self.gpus = GpuTable()
        self.jobs: dict[tuple[tuple[str, str], ...], int] = {}
        self.names: dict[str, int] = {}
        self.resources: dict[str, Attrs] = {}
        self.instances: dict[str, Attrs] = {}

    def map_columns(self, samples: Samples, specs: SpecTable, /) -> Mapped:
        """The points of ``samples`` as columns (module docstring)."""
        if specs is not self._table:
            self._table = specs
            self._reset()
        sets = self.sets
        sets.grow(len(samples.label_sets))
        ids = samples.ids
        kind = sets.kind[ids]
        if (kind == NEW).any():
            for index in np.unique(ids[kind == NEW]).tolist():
                self._learn(index, samples.label_sets[index], specs)
            kind = sets.kind[ids]
        unmapped = kind == SKIP
        parts: list[Part] = []
        model = kind == MODEL
        if model.any():
            part, superseded = self._models(samples, model)
            parts.append(part)
            if superseded is not None:
                unmapped[np.flatnonzero(model)[superseded]] = True
        skipped = int(np.count_nonzero(unmapped))
        dcgm = kind == DCGM
        if dcgm.any():
            parts += self._dcgm(samples, dcgm)
        requests = samples.requests
        each = None if requests is None else count_each(requests, unmapped)
        if not parts:
            empty = np.zeros(0, np.int64)
            of = None if requests is None else empty
            return Mapped(empty, empty, np.zeros(0), skipped, of, each)
        return Mapped(
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
            skipped,
            None if requests is None else np.concatenate([p[3] for p in parts if p[3] is not None]),
            each,
        )

    # --- learning a label set ----------------------------------------------------------------

    def _name(self, name: str) -> int:
        return self.names.setdefault(name, len(self.names))

    def _learn(self, index: int, labels: Labels, specs: SpecTable) -> None:
        sets = self.sets
        found = dict(labels)
        name = found.get("__name__", "")
        sets.name[index] = self._name(name)
        sets.kind[index] = SKIP
        row = DCGM_BY_SERIES.get(name)
        if row is not None:
            placed = gpu_identity(found)
            if isinstance(placed, str):
                return
            gpu, job = placed
            resource = self.resources.setdefault(gpu.host, {"host.name": gpu.host})
            sets.gpu[index] = self.gpus.add(gpu, resource, specs)
            sets.info[index] = self._info(gpu, resource, specs)
            if gpu.parent is not None:
                sets.parent_info[index] = self._info(gpu.parent, resource, specs)
            sets.source[index] = SOURCE[row.source]
            attrs: Attrs = {"hw.id": gpu.hw_id, **row.attributes}
            sets.main[index] = specs.add(
                resource, row.name, row.unit, row.kind, row.monotonic, attrs
            )
            sets.scale[index] = row.scale
            if job:
                sets.job[index] = self.jobs.setdefault(job[:2], len(self.jobs))
                pod_attrs: Attrs = {"hw.id": gpu.hw_id, **dict(job)}
                sets.memory[index] = specs.add(
                    resource, PROCESS_MEMORY, "By", "sum", False, pod_attrs
                )
                if row.pod_metric is not None:
                    is_memory = row.pod_metric == PROCESS_MEMORY
                    kind = "sum" if is_memory else "gauge"
                    sets.pod[index] = specs.add(
                        resource, row.pod_metric, row.unit, kind, False, pod_attrs
                    )
                    sets.pod_is_memory[index] = is_memory
            sets.kind[index] = DCGM
            return
        spec = MODEL_BY_SERIES.get(name)
        if spec is not None:
            instance = found.get("instance", "")
            resource = self.instances.setdefault(instance, {INSTANCE: instance})
            counter = spec.source_type == "counter"
            kind = "sum" if counter else "gauge"
            model = model_attributes(spec, found)
            sets.main[index] = specs.add(resource, spec.name, spec.unit, kind, counter, model)
            sets.divisor[index] = spec.divisor
            if spec.superseded_by is not None:
                newer = spec.superseded_by
                sets.newer[index] = (self._name(newer), self._name(newer + "_total"))
            sets.kind[index] = MODEL

    @staticmethod
    def _info(gpu: GpuIdentity, resource: Attrs, specs: SpecTable) -> int:
        attrs: Attrs = {"hw.id": gpu.hw_id, **dict(gpu.info)}
        return specs.add(resource, INFO, "1", "gauge", False, attrs)

    # --- a request ---------------------------------------------------------------------------

    def _models(
        self, samples: Samples, model: npt.NDArray[np.bool_]
    ) -> tuple[Part, npt.NDArray[np.bool_] | None]:
        """The model servers' points, and which of their series a newer family skipped (None:
        none)."""
        sets, ids = self.sets, samples.ids[model]
        times, values = samples.timestamps_ms[model], samples.values[model]
        requests = samples.requests
        request = None if requests is None else requests[model]
        newer = sets.newer[ids]
        has_newer = newer[:, 0] >= 0
        if not has_newer.any():
            return (sets.main[ids], times, values / sets.divisor[ids], request), None
        # the names each request holds (one request: request 0)
        n_names = len(self.names)
        name = sets.name[samples.ids]
        base: Ints | int = 0
        if requests is not None and request is not None:
            name = name + requests * n_names
            base = request * n_names
        present = np.zeros(int(name.max()) + 1 + n_names, bool)
        present[name] = True
        gone = has_newer & (present[base + newer[:, 0]] | present[base + newer[:, 1]])
        keep = ~gone
        ids = ids[keep]
        part = (
            sets.main[ids],
            times[keep],
            values[keep] / sets.divisor[ids],
            None if request is None else request[keep],
        )
        return part, gone

    def _dcgm(self, samples: Samples, dcgm: npt.NDArray[np.bool_]) -> list[Part]:
        """dcgm-exporter's points: info, values, memory limits, the pods' (module docstring)."""
        sets = self.sets
        ids = samples.ids[dcgm]
        times, values = samples.timestamps_ms[dcgm], samples.values[dcgm]
        request = None if samples.requests is None else samples.requests[dcgm]
        if self._dense:
            dense = dense_dcgm(sets, self.gpus, len(self.jobs), ids, times, values, request)
            if dense is not None:
                return dense
        gpu, source, job = sets.gpu[ids], sets.source[ids], sets.job[ids]
        device = job < 0
        distinct_t, slot, of = occasions(times, request)
        n_t = distinct_t.size
        gpu_slot = gpu * n_t + slot
        # one value per (GPU, field, time): a device-level series first, then request order
        key = (gpu * FIELDS + source) * n_t + slot
        order = np.lexsort((np.arange(ids.size), ~device, key))
        ordered = key[order]
        first = np.ones(ordered.size, bool)
        first[1:] = ordered[1:] != ordered[:-1]
        chosen = order[first]
        keys = ordered[first]
        raw = values[chosen]
        group = np.empty(ids.size, np.int64)
        group[order] = np.cumsum(first) - 1
        out = [self._infos(ids, gpu, slot, (distinct_t, of), request)]
        out.append(
            (
                sets.main[ids[chosen]],
                times[chosen],
                raw * sets.scale[ids[chosen]],
                requests_of(request, chosen),
            )
        )
        limits = self._limits(keys, raw, distinct_t, of)
        if limits is not None:
            out.append(limits)
        # the pods' own values where a device-level value stands beside them
        has_device = device[chosen][group]
        pods = ~device & has_device & (sets.pod[ids] >= 0)
        own: Ints = np.zeros(0, np.int64)
        if pods.any():
            at = ids[pods]
            out.append(
                (
                    sets.pod[at],
                    times[pods],
                    values[pods] * sets.scale[at],
                    requests_of(request, pods),
                )
            )
            mine = pods & sets.pod_is_memory[ids]
            own = gpu_slot[mine] * (len(self.jobs) + 1) + job[mine]

        kept = (keys, raw)
        shares = self._shares(ids, gpu_slot, job, times, own, kept, n_t, request)
        if shares is not None:
            out.append(shares)
        return out

    def _infos(
        self,
        ids: Ints,
        gpu: Ints,
        slot: Ints,
        slots: tuple[Ints, Ints | None],
        request: Ints | None,
    ) -> Part:
        """One ``gpuwarden.gpu.info`` per GPU (and MIG parent) and occasion, as the GPU's
        first series in its request describes it (its parent: the MIG device's first series,
        unless a series of the parent itself comes before). ``slots``: each occasion's time
        and request (``occasions``)."""
        sets = self.sets
        distinct_t, of = slots
        n_t = distinct_t.size
        parent = self.gpus.parent[gpu]
        mig = np.flatnonzero(parent >= 0)
        position = np.arange(gpu.size)
        whose = np.concatenate([gpu, parent[mig]])
        when = np.concatenate([slot, slot[mig]])
        spec = np.concatenate([sets.info[ids], sets.parent_info[ids[mig]]])
        first_seen = np.concatenate([position, mig])
        n_gpus = len(self.gpus.index)
        # described per (request, GPU)
        told = (
            whose if request is None else np.concatenate([request, request[mig]]) * n_gpus + whose
        )
        order = np.lexsort((first_seen, told))
        ordered = told[order]
        first = np.ones(ordered.size, bool)
        first[1:] = ordered[1:] != ordered[:-1]
        gpus, described = ordered[first], spec[order[first]]
        info_gpu, info_slot = np.divmod(np.unique(whose * n_t + when), n_t)
        asked = info_gpu if of is None else of[info_slot] * n_gpus + info_gpu
        at = np.searchsorted(gpus, asked)
        return (
            described[at],
            distinct_t[info_slot],
            np.ones(info_slot.size),
            None if of is None else of[info_slot],
        )

    def _limits(self, keys: Ints, raw: Floats, distinct_t: Ints, of: Ints | None) -> Part | None:
        """``hw.gpu.memory.limit`` = used + free + reserved where no total is sent, from the
        kept values (``keys``: (GPU, field, occasion) sorted, ``raw``: their values;
        ``distinct_t``, ``of``: each occasion's time and request)."""
        n_t = distinct_t.size
        gpu, rest = np.divmod(keys, FIELDS * n_t)
        source, slot = np.divmod(rest, n_t)
        used = np.flatnonzero(source == USED)
        u_gpu, u_slot = gpu[used], slot[used]

        def at(field: int) -> tuple[Ints, npt.NDArray[np.bool_]]:
            return _find(keys, (u_gpu * FIELDS + field) * n_t + u_slot)

        free_at, has_free = at(FREE)
        _, has_total = at(TOTAL)
        reserved_at, has_reserved = at(RESERVED)
        need = has_free & ~has_total
        if not need.any():
            return None
        reserved = np.where(has_reserved, raw[reserved_at], 0.0)[need]
        limit = (raw[used[need]] + raw[free_at[need]] + reserved) * MIB
        slots = u_slot[need]
        return self.gpus.limit[u_gpu[need]], distinct_t[slots], limit, requests_of(of, slots)

    def _shares(
        self,
        ids: Ints,
        gpu_slot: Ints,
        job: Ints,
        times: Ints,
        own: Ints,
        kept: tuple[Ints, Floats],
        n_t: int,
        request: Ints | None,
    ) -> Part | None:
        """Each pod seen on a GPU at an occasion (first seen: its attributes) without its own
        memory value there (``own``): the GPU's used memory then, split evenly among the pods
        seen on it (0 without one). ``kept``: the sorted (GPU, field, occasion) keys of the
        values kept and their values."""
        pod = np.flatnonzero(job >= 0)
        if not pod.size:
            return None
        per_job = len(self.jobs) + 1
        key = gpu_slot[pod] * per_job + job[pod]
        order = np.argsort(key, kind="stable")  # request order within a key
        ordered = key[order]
        first = np.ones(ordered.size, bool)
        first[1:] = ordered[1:] != ordered[:-1]
        seen = pod[order[first]]
        distinct = ordered[first]
        on_gpu = distinct // per_job
        _, which, count = np.unique(on_gpu, return_inverse=True, return_counts=True)
        gpu, slot = np.divmod(on_gpu, n_t)
        keys, raw = kept
        used_at, has_used = _find(keys, (gpu * FIELDS + USED) * n_t + slot)
        share = np.where(has_used, raw[used_at] * MIB / count[which], 0.0)
        keep = ~np.isin(distinct, own) if own.size else np.ones(distinct.size, bool)
        seen = seen[keep]
        return self.sets.memory[ids[seen]], times[seen], share[keep], requests_of(request, seen)
