"""Several requests mapped at once (``Samples.requests``) give each request the points it gets
mapped alone (a series' points at one time in the same order), on random requests: both
mappings (dense and sorting), GPUs whose series span requests, time-slicing, memory with and
without a total, a request's several scrape times, MIG devices, model servers whose newer
family is in another request."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.collector.ingest.prom_columns import Labels, Mapped, Samples, SpecTable
from gpuwarden.collector.ingest.prom_map_columns import PromTranslator
from gpuwarden.collector.ingest.prom_map_sets import occasions
from tests.test_prom_map_dense import SETS as DCGM_SETS
from tests.test_prom_map_dense import T0, VALUES


def _model(name: str, **labels: str) -> Labels:
    return tuple(sorted({"__name__": name, "instance": "vllm:8000", "model_name": "m",
                         **labels}.items()))  # fmt: skip


MODEL_SETS = [
    _model("vllm:gpu_cache_usage_perc"),  # superseded by the next when a request holds it
    _model("vllm:kv_cache_usage_perc"),
    _model("vllm:num_requests_running"),
    _model("vllm:request_success_total", finished_reason="stop"),
]
# node-a's GPU 0 as another exporter version names its model: its info follows the GPU's first
# series in each request
RENAMED = tuple(sorted({"__name__": "DCGM_FI_DEV_POWER_USAGE", "Hostname": "node-a", "gpu": "0",
                        "UUID": "GPU-node-a-0", "modelName": "A0-SXM"}.items()))  # fmt: skip
SETS = [*DCGM_SETS, *MODEL_SETS, RENAMED]
REQUEST = st.lists(
    st.tuples(st.integers(0, len(SETS) - 1), st.integers(0, 2), VALUES), min_size=1, max_size=60
)


def as_points(mapped: Mapped, specs: SpecTable, which: np.ndarray) -> list[tuple[str, int, bytes]]:
    """The points ``which`` of ``mapped``: series, time, value (by its bits), sorted by series
    and time; points of one series and time stay in their order (the store keeps the last)."""
    return sorted(
        [
            (repr(specs.specs[s]), int(t), struct.pack("<d", v))
            for s, t, v in zip(
                mapped.specs[which].tolist(),
                mapped.timestamps_ms[which].tolist(),
                mapped.values[which].tolist(),
                strict=True,
            )
        ],
        key=lambda point: point[:2],
    )


def columns(request: list[tuple[int, int, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.array([i for i, _, _ in request], np.int64)
    times = np.array([T0 + 15_000 * k for _, k, _ in request], np.int64)
    values = np.array([v for _, _, v in request], np.float64)
    return ids, times, values


def learned(dense: bool) -> tuple[PromTranslator, SpecTable]:
    """A translator that has read every label set once (in one order, so its GPUs and pods
    are numbered alike whatever comes next)."""
    translator, specs = PromTranslator(dense=dense), SpecTable()
    everything = np.arange(len(SETS), dtype=np.int64)
    translator.map_columns(Samples(everything, everything, np.ones(len(SETS)), SETS), specs)
    return translator, specs


def check(requests: list[list[tuple[int, int, float]]], dense: bool) -> None:
    alone_translator, alone_specs = learned(dense)
    alone, skipped = [], 0
    for request in requests:
        mapped = alone_translator.map_columns(Samples(*columns(request), SETS), alone_specs)
        alone.append(as_points(mapped, alone_specs, np.arange(mapped.specs.size)))
        skipped += mapped.skipped
    parts = [columns(r) for r in requests]
    of = np.repeat(np.arange(len(requests)), [len(r) for r in requests])
    ids, times, values = (np.concatenate([p[k] for p in parts]) for k in range(3))
    joined = Samples(ids, times, values, SETS, of)
    translator, specs = learned(dense)
    together = translator.map_columns(joined, specs)
    assert together.requests is not None
    assert together.skipped == skipped
    for j, points in enumerate(alone):
        assert as_points(together, specs, np.flatnonzero(together.requests == j)) == points, j


@settings(max_examples=300, deadline=None)
@given(st.lists(REQUEST, min_size=1, max_size=5), st.booleans())
def test_each_request_gets_the_points_it_gets_alone(requests, dense):
    check(requests, dense)


def test_a_gpu_split_across_requests_gets_its_info_and_limit_in_each():
    used = next(i for i, s in enumerate(SETS) if dict(s).get("__name__") == "DCGM_FI_DEV_FB_USED")
    free = used + 4  # the same GPU's free memory (FIELDS: used, free; one per pod of PODS)
    assert dict(SETS[free])["__name__"] == "DCGM_FI_DEV_FB_FREE"
    requests = [[(used, 0, 3000.0)], [(free, 0, 7000.0), (used + 1, 0, 1000.0)]]
    check(requests, dense=True)
    check(requests, dense=False)


def test_a_newer_model_family_supersedes_only_in_its_own_request():
    old, new = len(DCGM_SETS), len(DCGM_SETS) + 1
    check([[(old, 0, 0.5)], [(new, 0, 0.25)], [(old, 0, 0.5), (new, 0, 0.25)]], dense=True)


@pytest.mark.parametrize(
    ("times", "requests", "expected"),
    [
        # one scrape a request: occasions in order, no sort
        ([5, 5, 7, 7], [0, 0, 1, 1], ([5, 7], [0, 0, 1, 1], [0, 1])),
        # the same time in two requests: two occasions
        ([5, 5, 5], [0, 1, 1], ([5, 5], [0, 1, 1], [0, 1])),
        # a request of two scrapes, out of order
        ([9, 5, 9, 5], [0, 0, 1, 1], ([5, 9, 5, 9], [1, 0, 3, 2], [0, 0, 1, 1])),
    ],
)
def test_occasions_are_a_requests_times(times, requests, expected):
    at, slot, of = occasions(np.array(times, np.int64), np.array(requests, np.int64))
    assert of is not None
    assert (at.tolist(), slot.tolist(), of.tolist()) == expected
