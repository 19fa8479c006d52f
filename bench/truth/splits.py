"""Which seeds are for tuning and which are held out, and the fleets each family draws.

Split rule: seeds 1-50 are the **tune** split, seeds 101-150 the **held-out** split. Constants of
the generators and of the scorer (``score.GRACE_SECONDS``) were set by construction, looking
only at tune seed 1 while writing the generators (to check that an episode is visible at all);
none was changed after the first held-out run (seeds 101-102, the table in docs/evaluation.md).
The detectors' own constants were not tuned here. A
constant of a detector that anyone tunes on this harness must be tuned on ``--split tune`` and
reported on ``--split heldout``, and its docstring must say so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.truth import fault_fleets, serving_fleets, training_fleets, waste_fleets
from bench.truth.model import Fleet

SPLITS = {"tune": 1, "heldout": 101}
"""Split → its first seed (50 seeds each)."""


@dataclass(frozen=True, slots=True)
class Family:
    """A kind of fleet: which detectors' episodes it plants (empty: a busy fleet)."""

    name: str
    build: Callable[[int], Fleet]
    detectors: tuple[str, ...]
    quick: bool = False
    """Whether ``--quick`` runs it."""


FAMILIES: tuple[Family, ...] = (
    Family("idle", waste_fleets.idle_fleet, ("idle_gpu", "level_shift"), quick=True),
    Family("forgotten", waste_fleets.forgotten_fleet, ("forgotten_gpu",)),
    Family("straggler", training_fleets.straggler_fleet, ("straggler", "level_shift")),
    Family("level-drop", training_fleets.level_drop_fleet, ("level_shift",)),
    Family("input-bound", training_fleets.input_bound_fleet, ("input_bound", "level_shift")),
    Family("hardware-fault", fault_fleets.hardware_fault_fleet, ("hardware_fault",)),
    Family("preemption", fault_fleets.preemption_fleet, ("preemption",)),
    Family("orphaned", fault_fleets.orphaned_fleet, ("orphaned_memory",)),
    Family("node-silent", fault_fleets.node_silent_fleet, ("node_silent",)),
    Family("overprovisioned", serving_fleets.overprovisioned_fleet, ("overprovisioned_inference",)),
    Family("traffic", serving_fleets.traffic_fleet, ("metric_anomaly",)),
    Family("busy-checkpoint", waste_fleets.checkpoint_fleet, ()),
    Family("busy-boundaries", waste_fleets.boundaries_fleet, ()),
    Family("busy-diurnal", serving_fleets.diurnal_fleet, ()),
)


def seeds(split: str, count: int) -> list[int]:
    """The first ``count`` seeds of ``split``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: one of {', '.join(SPLITS)}")
    if not 1 <= count <= 50:
        raise ValueError("the seed count is 1-50")
    return [SPLITS[split] + i for i in range(count)]


def chosen_families(detectors: Sequence[str] = (), *, quick: bool = False) -> list[Family]:
    """Every busy family and the families of ``detectors`` (all when empty); ``quick`` keeps
    the quick ones."""
    return [
        f
        for f in FAMILIES
        if (not f.detectors or not detectors or set(f.detectors) & set(detectors))
        and (f.quick or not quick)
    ]


def fleets(
    split: str, count: int, detectors: Sequence[str] = (), *, quick: bool = False
) -> list[Fleet]:
    """The fleets of ``split`` for ``detectors``: ``count`` seeds of each chosen family."""
    chosen = chosen_families(detectors, quick=quick)
    return [f.build(seed) for f in chosen for seed in seeds(split, 1 if quick else count)]
