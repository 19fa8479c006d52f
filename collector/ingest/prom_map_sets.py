"""What the column mapping (:mod:`.prom_map_columns`) learns of each label set and GPU, as
arrays indexed by the decoder's label-set index and by GPU number."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.ingest.prom_catalog import DCGM_ROWS
from gpuwarden.collector.ingest.prom_columns import SpecTable
from gpuwarden.collector.ingest.prom_map import LIMIT, Attrs, GpuIdentity

NEW, SKIP, DCGM, MODEL = 0, 1, 2, 3
"""A label set's kind: not read yet, nothing we map, a dcgm-exporter field, a model server's."""
SOURCE = {row.source: i for i, row in enumerate(DCGM_ROWS)}
"""A dcgm-exporter field's number (its row in the catalog)."""
FIELDS = len(DCGM_ROWS)
USED, FREE = SOURCE["DCGM_FI_DEV_FB_USED"], SOURCE["DCGM_FI_DEV_FB_FREE"]
TOTAL, RESERVED = SOURCE["DCGM_FI_DEV_FB_TOTAL"], SOURCE["DCGM_FI_DEV_FB_RESERVED"]

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Part = tuple[Ints, Ints, Floats, Ints | None]
"""Points: their series (``SpecTable`` indexes), times, values, and requests (None: one
request mapped)."""


def distinct_times(times: Ints) -> tuple[Ints, Ints]:
    """``np.unique(times, return_inverse=True)``, without a sort for a request of one scrape
    (one time: what a sender's request holds almost always)."""
    if times.size and times[0] == times.min() == times.max():
        return times[:1].copy(), np.zeros(times.size, np.int64)
    distinct, slot = np.unique(times, return_inverse=True)
    return distinct, slot.reshape(-1).astype(np.int64, copy=False)


def occasions(times: Ints, requests: Ints | None) -> tuple[Ints, Ints, Ints | None]:
    """The samples' occasions: with one request its distinct times; with several
    (``requests``: each sample's, non-decreasing) each request's distinct times, ordered by
    request, then time. Return each occasion's time, each sample's occasion, and each
    occasion's request (None: one request)."""
    distinct, slot = distinct_times(times)
    if requests is None:
        return distinct, slot, None
    n_t = distinct.size
    key = requests * n_t + slot
    if (key[1:] >= key[:-1]).all():  # one scrape a request, in order: no sort
        new = np.ones(key.size, bool)
        new[1:] = key[1:] != key[:-1]
        pairs, at = key[new], np.cumsum(new) - 1
    else:
        pairs, at = np.unique(key, return_inverse=True)
        at = at.reshape(-1)
    which, when = np.divmod(pairs, n_t)
    return distinct[when], at, which


def requests_of(request: Ints | None, which: Ints | npt.NDArray[np.bool_]) -> Ints | None:
    """The requests of the samples (or occasions) ``which`` (None: one request mapped)."""
    return None if request is None else request[which]


def grown(array: npt.NDArray[Any], size: int, fill: float) -> npt.NDArray[Any]:
    """``array`` at least ``size`` long, new slots ``fill`` (grown by doubling)."""
    if array.size >= size:
        return array
    extra = max(size - array.size, array.size, 256)
    return np.concatenate([array, np.full(extra, fill, dtype=array.dtype)])


class LabelSets:
    """Per label set of the decoder's table (index): what the mapping made of it."""

    def __init__(self) -> None:
        self.kind = np.zeros(0, np.int8)
        self.gpu = np.zeros(0, np.int64)
        self.source = np.zeros(0, np.int64)
        self.job = np.zeros(0, np.int64)
        """Its job identity (-1: a device-level series)."""
        self.main = np.zeros(0, np.int64)
        """The series its value lands on."""
        self.pod = np.zeros(0, np.int64)
        """The pod's per-process series of its field (-1: none)."""
        self.pod_is_memory = np.zeros(0, bool)
        self.memory = np.zeros(0, np.int64)
        """The pod's per-process memory series on its GPU (-1: no pod)."""
        self.info = np.zeros(0, np.int64)
        """Its GPU's ``gpuwarden.gpu.info`` series, as its labels describe the GPU."""
        self.parent_info = np.zeros(0, np.int64)
        """A MIG device's parent GPU's (-1: none)."""
        self.scale = np.zeros(0, np.float64)
        self.divisor = np.zeros(0, np.float64)
        self.name = np.zeros(0, np.int64)
        self.newer = np.zeros((0, 2), np.int64)
        """A model series' newer family's names (-1: none), which skip it when present."""

    def grow(self, size: int) -> None:
        for field, fill in (("kind", NEW), ("gpu", -1), ("source", -1), ("job", -1),
                            ("main", -1), ("pod", -1), ("pod_is_memory", 0), ("memory", -1),
                            ("info", -1), ("parent_info", -1), ("scale", 1.0),
                            ("divisor", 1.0), ("name", -1)):  # fmt: skip
            setattr(self, field, grown(getattr(self, field), size, fill))
        if self.newer.shape[0] < size:
            extra = max(size - self.newer.shape[0], self.newer.shape[0], 256)
            self.newer = np.concatenate([self.newer, np.full((extra, 2), -1, np.int64)])


class GpuTable:
    """The GPUs (and MIG devices) seen: each one's memory-limit series, its parent."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, str], int] = {}
        self.limit = np.zeros(0, np.int64)
        self.parent = np.zeros(0, np.int64)

    def add(self, gpu: GpuIdentity, resource: Attrs, specs: SpecTable) -> int:
        key = (gpu.host, gpu.hw_id)
        found = self.index.get(key)
        if found is not None:
            return found
        parent = -1 if gpu.parent is None else self.add(gpu.parent, resource, specs)
        at = self.index[key] = len(self.index)
        self.limit = grown(self.limit, at + 1, -1)
        self.parent = grown(self.parent, at + 1, -1)
        self.limit[at] = specs.add(resource, LIMIT, "By", "sum", False, {"hw.id": gpu.hw_id})
        self.parent[at] = parent
        return at
