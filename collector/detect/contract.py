"""The one detector contract: what a detector may read, what it declares, what it returns.

A detector is a :class:`Detector`: its :class:`~gpuwarden.collector.rules.model.DetectorSpec`
(name, subjects, the selector fields it honours, its parameter table) plus a typed parameters
dataclass and a run function ``run(ctx, rule, params, now) -> list[Finding]``. The engine builds
one :class:`DetectionContext` (a narrow read view of the collector's data) and hands it to every
detector; detectors never see the service, its ingest path, storage writes or the web layer.

How the selector fields are honoured:

- ``teams``, ``jobs``, ``nodes``, ``models``: by the engine, on each finding's subject facts
  (:attr:`Finding.facts`), for the fields the detector declares;
- ``metrics`` and ``labels``: by the detector itself, when it reads series (it declares them only
  if it does).

A rule that sets a field its detector does not declare is refused when the rules load.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from gpuwarden.collector.accounting.gpu_time import GpuRef, GpuTimeline
from gpuwarden.collector.budgets.config import Budgets
from gpuwarden.collector.budgets.spend import WindowSpend
from gpuwarden.collector.detect.findings import Finding
from gpuwarden.collector.jobs.kueue_workloads import KueueWorkload
from gpuwarden.collector.jobs.model import Job
from gpuwarden.collector.rules.model import (
    SELECTOR_FIELDS,
    DetectorSpec,
    ParamValue,
    Rule,
    Subject,
)
from gpuwarden.collector.rules.params import build_params, param_table
from gpuwarden.collector.storage.records import Event, EventKind, ModelDeployment
from gpuwarden.collector.store.window import WindowStore

P = TypeVar("P")
C = TypeVar("C")


class DetectionContext(Protocol):
    """What a detector reads. Everything is read-only; nothing here writes to storage."""

    @property
    def store(self) -> WindowStore:
        """The time series (read with ``matrix``, ``increase_matrix``, ``bucket_counts``...).

        A series without a point for the store's ``staleness_seconds`` reads as NaN (or no
        data) in reads that end now: unknown, never fine or busy (``store.fresh.FreshReads``).
        """
        ...

    def now(self) -> float:
        """Unix seconds (the collector's clock)."""
        ...

    def gpus(self) -> list[GpuRef]:
        """Every GPU (and MIG device) the agents described."""
        ...

    def timelines(self, start: float, end: float) -> tuple[np.ndarray, list[GpuTimeline]]:
        """Each physical GPU's utilisation, energy and seen jobs on the store's slot grid
        (a GPU silent past the staleness bound: NaN, no jobs seen)."""
        ...

    def jobs(self) -> list[Job]:
        """Every job known (current and remembered)."""
        ...

    def job(self, key: str) -> Job | None:
        """One job by key."""
        ...

    def kueue_workloads(self) -> list[KueueWorkload]:
        """Kueue's Workloads as last listed (empty: no Kubernetes source, or no Kueue)."""
        ...

    def resolve_job(self, scheduler: str, ident: str, node: str) -> str:
        """The job key for a process's scheduler attributes."""
        ...

    def deployments(self) -> list[ModelDeployment]:
        """The model deployments known."""
        ...

    def events(self, *, since: float, kinds: Collection[EventKind]) -> list[Event]:
        """Events of some kinds at or after ``since``, oldest first."""
        ...

    def price(self, gpu_model: str, tier: str, cluster: str | None = None) -> float:
        """Price per GPU-hour of a GPU model at a price tier, on a node of ``cluster`` when
        known (``GpuRef.cluster``, ``GpuTimeline.cluster``), in the price table's currency."""
        ...

    @property
    def default_price_tier(self) -> str:
        """The tier of GPUs and jobs that name none."""
        ...

    def budgets(self) -> Budgets:
        """The teams' and projects' monthly budgets (the config's ``budgets:``)."""
        ...

    def spend(self, *, since: float, until: float) -> WindowSpend:
        """Spend per budget scope (team, project) over ``[since, until)`` from the accounting
        (a storage read: a forked cycle gets what :class:`ReadsSpend` rules asked for)."""
        ...

    @property
    def fairness_targets(self) -> Mapping[str, float]:
        """Each team's entitled share of the GPUs (``fairness.targets``; empty: none set)."""
        ...

    def cache(self, kind: Callable[[], C]) -> C:
        """The detector state of this kind (fit caches, trackers), made on first use.

        It lives as long as the context: one per engine, so two collectors in one process (tests,
        backtests) never share fits.
        """
        ...


@runtime_checkable
class ReadsSpend(Protocol):
    """Parameters of a rule that reads spend windows ending at the cycle's time: a forked
    cycle reads them in the parent first (``detect.fork.ForkContext.prefetch``)."""

    def spend_windows_seconds(self) -> tuple[float, ...]:
        """The window lengths read, each ending at the cycle's ``now``."""
        ...


Run = Callable[[DetectionContext, Rule, P, float], list[Finding]]


@dataclass(frozen=True, slots=True)
class Detector(Generic[P]):
    """A detector: its spec, its typed parameters and its run function."""

    spec: DetectorSpec
    params: type[P]
    run: Run[P] | None
    """``None`` for detectors whose findings are pushed (Alertmanager), never computed."""

    def __post_init__(self) -> None:
        if dict(param_table(self.params)) != dict(self.spec.parameters):
            raise TypeError(f"detector {self.spec.name}: spec and parameters dataclass differ")

    def bind(self, rule: Rule) -> P:
        """The typed parameters of a rule of this detector."""
        return build_params(self.params, rule.parameters)

    def detect(self, ctx: DetectionContext, rule: Rule, now: float) -> list[Finding]:
        """Run the rule once (parameters bound on each call; the engine binds once instead)."""
        if self.run is None:
            return []
        return self.run(ctx, rule, self.bind(rule), now)


def spec_of(
    name: str,
    description: str,
    *,
    subjects: Sequence[Subject],
    signals: Sequence[str],
    params: type[P],
    selector: Collection[str],
    requires: Sequence[str] = (),
    check: Callable[[P], tuple[str, str] | None] | None = None,
) -> DetectorSpec:
    """A :class:`DetectorSpec` whose parameter table is read from ``params``.

    ``check`` judges the typed parameters together (``(parameter, what is wrong)`` or ``None``);
    the rule loader runs it on every rule of this detector.

    Raises:
        ValueError: ``selector`` names an unknown field, or ``requires`` one it does not honour.
    """
    fields = frozenset(selector)
    if unknown := sorted(fields - set(SELECTOR_FIELDS)):
        raise ValueError(f"detector {name}: unknown selector fields {unknown}")
    if missing := sorted(set(requires) - fields):
        raise ValueError(f"detector {name}: requires selector fields it does not honour {missing}")

    def cross(values: Mapping[str, ParamValue]) -> tuple[str, str] | None:
        return None if check is None else check(build_params(params, values))

    return DetectorSpec(
        name,
        description,
        tuple(subjects),
        tuple(signals),
        param_table(params),
        requires=tuple(requires),
        check=cross if check is not None else None,
        selector=fields,
    )
