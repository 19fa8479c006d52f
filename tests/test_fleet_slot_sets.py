"""``fleet.slot_sets``: per slot, the jobs whose processes were seen, one frozenset per set."""

from __future__ import annotations

import numpy as np
import pytest

from gpuwarden.collector.accounting.fleet import slot_sets


def naive(masks: dict[str, np.ndarray], n: int) -> tuple[frozenset[str], ...]:
    return tuple(frozenset(k for k, m in masks.items() if m[slot]) for slot in range(n))


@pytest.mark.parametrize(
    "masks",
    [
        {"a": np.array([True, True, False, True])},
        {"a": np.array([False, False, False, False])},
        {"a": np.array([True, False, True, False]), "b": np.array([True, True, False, False])},
        {f"j{i}": np.arange(4) % (i + 1) == 0 for i in range(5)},
    ],
)
def test_slot_sets_match_a_set_per_slot(masks):
    got = slot_sets(masks, 4)
    assert got == naive(masks, 4)
    assert len({id(s) for s in got}) == len(set(got))  # one object per distinct set


def test_many_jobs_on_one_gpu_fall_back_to_a_set_per_slot():
    rng = np.random.default_rng(0)
    masks = {f"job-{i}": rng.random(6) < 0.5 for i in range(70)}
    assert slot_sets(masks, 6) == naive(masks, 6)
