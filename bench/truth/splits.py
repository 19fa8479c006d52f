"""Which seeds are for tuning and which are held out, and the fleets each family draws.

Split rule: seeds 1-50 are the **tune** split, seeds 101-150 the **held-out** split. Constants of
the generators and of the scorer (``score.GRACE_SECONDS``) were set by construction, looking
only at tune seeds 1-3 while writing the generators (to check that an episode is visible at
all); no held-out seed was looked at before the table in docs/evaluation.md was produced. A
constant of a detector that anyone tunes on this harness must be tuned on ``--split tune`` and
reported on ``--split heldout``, and its docstring must say so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.truth import model_fleets, waste_fleets
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
    Family("idle", waste_fleets.idle_fleet, ("idle_gpu",), quick=True),
    Family("busy-checkpoint", waste_fleets.checkpoint_fleet, ()),
    Family("busy-boundaries", waste_fleets.boundaries_fleet, ()),
    Family("deploy-rollback", model_fleets.deploy_rollback_fleet, ("deploy_regression",)),
    Family("slo-burn", model_fleets.slo_burn_fleet, ("slo_burn",)),
    Family("demand-growth", model_fleets.demand_growth_fleet, ("demand_forecast",)),
    Family(
        "latency-drift", model_fleets.latency_drift_fleet, ("model_drift", "distribution_drift")
    ),
    Family("busy-deploy", model_fleets.busy_deploy_fleet, ()),
    Family("busy-slo-blips", model_fleets.busy_slo_blips_fleet, ()),
    Family("busy-model-diurnal", model_fleets.busy_model_diurnal_fleet, ()),
)


def seeds(split: str, count: int) -> list[int]:
    """The first ``count`` seeds of ``split``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: one of {', '.join(SPLITS)}")
    if not 1 <= count <= 50:
        raise ValueError("the seed count is 1-50")
    return [SPLITS[split] + i for i in range(count)]


def fleets(
    split: str, count: int, detectors: Sequence[str] = (), *, quick: bool = False
) -> list[Fleet]:
    """The fleets of ``split``: every busy family and the families of ``detectors`` (all when
    empty), ``count`` seeds each; ``quick`` keeps the quick families and one seed."""
    chosen = [
        f
        for f in FAMILIES
        if (not f.detectors or not detectors or set(f.detectors) & set(detectors))
        and (f.quick or not quick)
    ]
    return [f.build(seed) for f in chosen for seed in seeds(split, 1 if quick else count)]
