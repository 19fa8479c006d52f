"""dcgm-exporter's points of a request without a sort: :mod:`.prom_map_columns`' ``_dcgm``
over dense per-request tables.

The general mapping groups a request's samples by sorting them (one value per (GPU, field,
time), one info per (GPU, time), the pods seen on each GPU): six sorts of the request, about
half of its mapping's time. Here each group gets a number instead: the request's (GPU, time)
pairs are numbered through a mark array over every (GPU, time) the request could hold, a
(pair, field) or (pair, pod) is then an index into a small table, and "first in request
order" is ``np.minimum.at`` of the samples' positions. The points are the general mapping's,
value for value (``tests/test_prom_map_dense.py`` compares both on random requests); the
values of the dcgm fields come in request order rather than (GPU, field) order.

It declines (None: the caller maps the request the general way) when a GPU of the request is
a MIG device (their parents' info needs the general rules), or when its tables would be
large next to its samples (``TABLE_PER_SAMPLE``): every GPU seen times the request's scrape
times, or its pods times its (GPU, time) pairs.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.ingest.prom_catalog import MIB
from gpuwarden.collector.ingest.prom_map_sets import (
    FIELDS,
    FREE,
    RESERVED,
    TOTAL,
    USED,
    GpuTable,
    Ints,
    LabelSets,
    Part,
    occasions,
    requests_of,
)

TABLE_PER_SAMPLE = 16
"""The mark array (every GPU seen times the request's scrape times) and the (pair, pod) table
are at most this many entries a sample of the request, plus ``TABLE_FLOOR``; beyond (a large
fleet's request of many scrape times, many pods on many GPUs), the general mapping, whose sorts
then cost less."""
TABLE_FLOOR = 4096


def _small(entries: int, samples: int) -> bool:
    """Whether a per-request table of ``entries`` is small next to a request of ``samples``."""
    return entries <= samples * TABLE_PER_SAMPLE + TABLE_FLOOR


def dense_dcgm(
    sets: LabelSets,
    gpus: GpuTable,
    jobs: int,
    ids: Ints,
    times: Ints,
    values: npt.NDArray[np.float64],
    request: Ints | None = None,
) -> list[Part] | None:
    """The points of dcgm-exporter samples (``ids``: their label sets, all of kind DCGM) as the
    general mapping makes them (module docstring); None: declined. ``request``: each sample's
    request when several are mapped at once (``prom_columns.Samples.requests``)."""
    n = ids.size
    gpu = sets.gpu[ids]
    if (gpus.parent[gpu] >= 0).any():
        return None
    distinct_t, slot, of = occasions(times, request)
    n_t = distinct_t.size
    n_gpus = len(gpus.index)
    if not _small(n_gpus * n_t, n):
        return None
    # the (GPU, occasion) pairs, numbered in (GPU, occasion) order
    gpu_time = gpu * n_t + slot
    mark = np.zeros(n_gpus * n_t, bool)
    mark[gpu_time] = True
    pairs = np.flatnonzero(mark)
    number = np.cumsum(mark) - 1
    pair = number[gpu_time]
    n_pairs = pairs.size  # at most n: the (pair, field) table is at most FIELDS a sample
    position = np.arange(n)
    job = sets.job[ids]
    device = job < 0
    # one value per (pair, field): a device-level series first, then request order
    key = pair * FIELDS + sets.source[ids]
    rank = np.where(device, position, position + n)
    best = np.full(n_pairs * FIELDS, 2 * n)
    np.minimum.at(best, key, rank)
    chosen = np.flatnonzero(rank == best[key])
    held = best < 2 * n
    raw = np.zeros(best.size)
    raw[key[chosen]] = values[chosen]
    at = ids[chosen]
    out: list[Part] = [_infos(sets, ids, gpu, pairs, (distinct_t, of), request)]
    out.append(
        (
            sets.main[at],
            times[chosen],
            values[chosen] * sets.scale[at],
            requests_of(request, chosen),
        )
    )
    limits = _limits(gpus, pairs, (distinct_t, of), held, raw)
    if limits is not None:
        out.append(limits)
    # the pods' own values where a device-level value stands beside them
    pods = ~device & (best[key] < n) & (sets.pod[ids] >= 0)
    own: Ints = np.zeros(0, np.int64)
    if pods.any():
        at = ids[pods]
        out.append(
            (sets.pod[at], times[pods], values[pods] * sets.scale[at], requests_of(request, pods))
        )
        mine = pods & sets.pod_is_memory[ids]
        own = pair[mine] * (jobs + 1) + job[mine]
    if (job >= 0).any():
        shares = _shares(sets, ids, times, pair, job, jobs, own, (held, raw), request)
        if shares is None:
            return None
        out.append(shares)
    return out


def _infos(
    sets: LabelSets,
    ids: Ints,
    gpu: Ints,
    pairs: Ints,
    slots: tuple[Ints, Ints | None],
    request: Ints | None,
) -> Part:
    """One ``gpuwarden.gpu.info`` per (GPU, occasion), as the GPU's first series in its request
    describes it (``slots``: each occasion's time and request)."""
    distinct_t, of = slots
    width = int(gpu.max()) + 1
    told = gpu if request is None else request * width + gpu  # described per (request, GPU)
    first = np.full(int(told.max()) + 1, ids.size)
    np.minimum.at(first, told, np.arange(ids.size))
    whose, when = np.divmod(pairs, distinct_t.size)
    asked = whose if of is None else of[when] * width + whose
    return (
        sets.info[ids[first[asked]]],
        distinct_t[when],
        np.ones(pairs.size),
        requests_of(of, when),
    )


def _limits(
    gpus: GpuTable,
    pairs: Ints,
    slots: tuple[Ints, Ints | None],
    held: npt.NDArray[np.bool_],
    raw: npt.NDArray[np.float64],
) -> Part | None:
    """``hw.gpu.memory.limit`` = used + free + reserved where no total is sent (``held``,
    ``raw``: the kept value of each (pair, field); ``slots``: each occasion's time and
    request)."""
    distinct_t, of = slots
    base = np.arange(pairs.size) * FIELDS
    need = held[base + USED] & held[base + FREE] & ~held[base + TOTAL]
    if not need.any():
        return None
    base = base[need]
    reserved = np.where(held[base + RESERVED], raw[base + RESERVED], 0.0)
    limit = (raw[base + USED] + raw[base + FREE] + reserved) * MIB
    whose, when = np.divmod(pairs[need], distinct_t.size)
    return gpus.limit[whose], distinct_t[when], limit, requests_of(of, when)


def _shares(
    sets: LabelSets,
    ids: Ints,
    times: Ints,
    pair: Ints,
    job: Ints,
    jobs: int,
    own: Ints,
    kept: tuple[npt.NDArray[np.bool_], npt.NDArray[np.float64]],
    request: Ints | None,
) -> Part | None:
    """Each pod seen on a GPU at a time (first seen: its attributes) without its own memory
    value there (``own``: pair * (jobs + 1) + job): the GPU's used memory then, split evenly
    among the pods seen on it (0 without one). None: the (pair, pod) table would be large."""
    held, raw = kept
    pod = np.flatnonzero(job >= 0)
    per_job = jobs + 1
    # the request's pods, numbered in job order
    present = np.zeros(per_job, bool)
    present[job[pod]] = True
    number = np.cumsum(present) - 1
    width = int(number[-1]) + 1
    n_pairs = int(pair.max()) + 1
    if not _small(n_pairs * width, ids.size):
        return None
    key = pair[pod] * width + number[job[pod]]
    first = np.full(n_pairs * width, ids.size)
    np.minimum.at(first, key, pod)
    seen_key = np.flatnonzero(first < ids.size)
    seen = first[seen_key]
    on_pair = seen_key // width
    count = np.bincount(on_pair, minlength=n_pairs)[on_pair]
    used = on_pair * FIELDS + USED
    share = np.where(held[used], raw[used] * MIB / count, 0.0)
    if own.size:
        keep = ~np.isin(pair[seen] * per_job + job[seen], own)
        seen, share = seen[keep], share[keep]
    return sets.memory[ids[seen]], times[seen], share, requests_of(request, seen)
