"""dcgm-exporter's samples mapped without a sort (``ingest.prom_map_dense``) give the points the
sorting mapping gives (``PromTranslator(dense=False)``), value for value, on random requests:
whole and time-sliced GPUs, device-level series beside the pods' copies, memory fields with
and without a total, several scrape times in one request, repeats, any order."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.collector.ingest.prom_columns import Labels, Mapped, Samples, SpecTable
from gpuwarden.collector.ingest.prom_map_columns import PromTranslator
from gpuwarden.collector.ingest.prom_map_dense import dense_dcgm

FIELDS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_TOTAL",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_POWER_USAGE",
)
PODS: tuple[dict[str, str], ...] = ({}, {"namespace": "ml", "pod": "a", "container": "c"},
        {"namespace": "ml", "pod": "b", "container": "c"},
        {"namespace": "cv", "pod": "c", "container": "x"})  # fmt: skip


def label_sets() -> list[Labels]:
    """Every (host, GPU, field, pod) a request below may hold; the model name differs by GPU."""
    out = []
    for host in ("node-a", "node-b"):
        for gpu in range(3):
            for field in FIELDS:
                for pod in PODS:
                    uuid = f"GPU-{host}-{gpu}"
                    labels = {"__name__": field, "Hostname": host, "gpu": str(gpu),
                              "UUID": uuid, "modelName": f"A{gpu}", **pod}  # fmt: skip
                    out.append(tuple(sorted(labels.items())))
    # a MIG device (its request takes the sorting path) and a series no mapping places
    mig = {"__name__": FIELDS[0], "Hostname": "node-a", "gpu": "0", "UUID": "GPU-node-a-0",
           "GPU_I_ID": "3", "GPU_I_PROFILE": "1g.10gb", "modelName": "A0"}  # fmt: skip
    out.append(tuple(sorted(mig.items())))
    out.append((("UUID", "GPU-x"), ("__name__", "DCGM_FI_DEV_GPU_UTIL")))
    return out


SETS = label_sets()
T0 = 1_700_000_000_000
VALUES = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 5e-324, 1e300, 81559.0]),
    # finite, and finite in MiB -> bytes too (both paths warn alike on an overflow)
    st.floats(min_value=-1e300, max_value=1e300),
)
REQUESTS = st.lists(
    st.tuples(st.integers(0, len(SETS) - 1), st.integers(0, 2), VALUES), min_size=1, max_size=80
)


def points(mapped: Mapped, specs: SpecTable) -> list[tuple[str, int, bytes]]:
    """The points as a sorted list: their series, time and value (by its bits: -0.0 is not
    0.0)."""
    return sorted(
        (repr(specs.specs[s]), int(t), struct.pack("<d", v))
        for s, t, v in zip(
            mapped.specs.tolist(),
            mapped.timestamps_ms.tolist(),
            mapped.values.tolist(),
            strict=True,
        )
    )


def map_both(request: list[tuple[int, int, float]]) -> tuple[list[object], list[object]]:
    """The points of ``request`` ((label set, scrape, value) each) mapped both ways."""
    ids = np.array([i for i, _, _ in request], np.int64)
    times = np.array([T0 + 15_000 * k for _, k, _ in request], np.int64)
    values = np.array([v for _, _, v in request], np.float64)
    samples = Samples(ids, times, values, SETS)
    got = []
    for translator in (PromTranslator(), PromTranslator(dense=False)):
        specs = SpecTable()
        mapped = translator.map_columns(samples, specs)
        got.append([mapped.skipped, *points(mapped, specs)])
    return got[0], got[1]


@settings(max_examples=400, deadline=None)
@given(REQUESTS)
def test_the_dense_mapping_gives_the_sorting_mappings_points(request):
    dense, sorting = map_both(request)
    assert dense == sorting


def test_a_time_sliced_gpu_keeps_the_device_value_and_shares_the_memory():
    used = SETS.index(next(s for s in SETS if dict(s).get("__name__") == FIELDS[1]))
    # the device's used memory, then two pods' copies (time-slicing), then the free memory
    request = [(used, 0, 3000.0), (used + 1, 0, 1000.0), (used + 2, 0, 2000.0),
               (used + 5, 0, 7000.0)]  # fmt: skip
    dense, sorting = map_both(request)
    assert dense == sorting
    assert len(dense) - 1 > len(request)  # info, limit, the pods' own values and shares


def gpu_util(gpu: int, **pod: str) -> Labels:
    labels = {"__name__": FIELDS[0], "Hostname": "h", "gpu": str(gpu), "UUID": f"GPU-h-{gpu}"}
    return tuple(sorted({**labels, **pod}.items()))


def test_it_declines_many_gpus_seen_times_many_scrape_times():
    """The mark array numbering (GPU, time) pairs is every GPU seen times the request's times:
    300 GPUs seen, one GPU's series at k times, against 16 k + 4,096 entries."""
    labels = [gpu_util(g) for g in range(300)]
    translator = PromTranslator()
    everything = np.arange(300, dtype=np.int64)
    learn = Samples(everything, np.full(300, T0, np.int64), np.ones(300), labels)
    translator.map_columns(learn, SpecTable())
    for k, taken in ((10, True), (100, False)):
        at = np.arange(k, dtype=np.int64) + T0
        got = dense_dcgm(translator.sets, translator.gpus, 0, np.zeros(k, np.int64), at, np.ones(k))
        assert (got is not None) is taken, k


def test_it_declines_many_pods_on_many_pairs():
    """n pods each at its own time on one GPU: n pairs x n pods entries, against 16 n + 4,096."""
    labels = [gpu_util(0, namespace="ns", pod=f"p{k}") for k in range(80)]
    for n, taken in ((70, True), (80, False)):
        translator = PromTranslator()
        ids = np.arange(n, dtype=np.int64)
        times = ids + T0
        translator.map_columns(Samples(ids, times, np.ones(n), labels), SpecTable())
        jobs = len(translator.jobs)
        got = dense_dcgm(translator.sets, translator.gpus, jobs, ids, times, np.ones(n))
        assert (got is not None) is taken, n


def test_a_request_with_a_mig_device_takes_the_sorting_path():
    translator = PromTranslator()
    mig = len(SETS) - 2
    ids = np.array([0, mig], np.int64)
    samples = Samples(ids, np.full(2, T0, np.int64), np.ones(2), SETS)
    translator.map_columns(samples, SpecTable())  # learns both label sets
    sets, gpus = translator.sets, translator.gpus
    assert dense_dcgm(sets, gpus, 0, ids, np.full(2, T0), np.ones(2)) is None
    assert dense_dcgm(sets, gpus, 0, ids[:1], np.full(1, T0), np.ones(1)) is not None
