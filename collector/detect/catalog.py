"""Every detector, by name: the vocabulary the rule loader validates rules against, and the
metrics each one reads at the store's long resolution (``LONG_READS``).

The long ring (14 days of 1-minute means, 80 KB a series) is kept only for the metrics a loaded
rule reads at long resolution (:func:`long_metrics`; the collector's ``long_metrics`` key adds
extras): with the default rules, 1 of a GPU's 43 series has one, the others keep their recent
window only. A detector that reads long a metric no rule declared gets
``store.types.NoLongRingError`` naming it, so a missing declaration fails loudly (its rule
fails; a test runs every default rule on a store that keeps only what that rule declares).

The recent ring (6 h at 10 s, 8.4 KB a series) is likewise kept only for the metrics something
reads over a time range (:func:`recent_metrics`): each detector's signals and its rule's selected
metrics (``RECENT_READS`` where a detector reads otherwise), what every detector's context reads
(the fleet's timelines: ``accounting.fleet.RANGE_READS``) and what it reads long; the collector
adds the status page's and /metrics' reads and the ``recent_metrics`` key. Every other series
keeps its latest value only, and a read over a time range of one raises
``store.types.LatestOnlyError`` naming it (a test runs every default rule on a store that keeps
only what that rule declares).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpuwarden.collector.accounting.fleet import RANGE_READS as FLEET_READS
from gpuwarden.collector.detect import (
    alertmanager,
    budget_burn,
    deploy,
    distribution,
    drift,
    fairness,
    faults,
    forecast,
    forgotten,
    idle_gpu,
    input_bound,
    level_shift,
    level_shift_jobs,
    metric_anomaly,
    node_silent,
    orphaned,
    overprovisioned,
    policy_breach,
    preemption,
    slo,
    straggler,
)
from gpuwarden.collector.detect.contract import Detector
from gpuwarden.collector.rules.loader import load_rule_files
from gpuwarden.collector.rules.model import DetectorSpec, Rule, RuleSet
from gpuwarden.collector.store.window import WindowStore

DETECTORS: Mapping[str, Detector[Any]] = MappingProxyType(
    {
        d.spec.name: d
        for d in (
            idle_gpu.DETECTOR,
            orphaned.DETECTOR,
            forgotten.DETECTOR,
            input_bound.DETECTOR,
            overprovisioned.DETECTOR,
            straggler.DETECTOR,
            drift.DETECTOR,
            deploy.DETECTOR,
            distribution.DETECTOR,
            slo.DETECTOR,
            forecast.DETECTOR,
            faults.DETECTOR,
            node_silent.DETECTOR,
            preemption.DETECTOR,
            metric_anomaly.DETECTOR,
            level_shift.DETECTOR,
            alertmanager.DETECTOR,
            policy_breach.DETECTOR,
            budget_burn.DETECTOR,
            fairness.STARVED,
            fairness.HOGGING,
        )
    }
)
SPECS: Mapping[str, DetectorSpec] = MappingProxyType({n: d.spec for n, d in DETECTORS.items()})


def load_rules(
    paths: Sequence[Path], *, runbooks_dir: Path | None, skip_bad: bool = False
) -> RuleSet:
    """Load rule files against this catalog (see
    :func:`~gpuwarden.collector.rules.loader.load_rule_files`)."""
    return load_rule_files(paths, detectors=SPECS, runbooks_dir=runbooks_dir, skip_bad=skip_bad)


LongReads = Callable[[Rule, Any, float], Collection[str]]
"""(rule, its typed parameters, the store's recent window in seconds) → metrics read long."""

GPU_UTILIZATION = "hw.gpu.utilization"


def _past_recent(*metrics: str) -> LongReads:
    """``waste.read_window``'s readers: long slots only for a window the recent ring does not
    cover (then these metrics)."""

    def reads(_rule: Rule, params: Any, recent_seconds: float) -> Collection[str]:
        return metrics if float(params.window_seconds) > recent_seconds else ()

    return reads


def _always(*metrics: str) -> LongReads:
    def reads(_rule: Rule, _params: Any, _recent_seconds: float) -> Collection[str]:
        return metrics

    return reads


def _selected(rule: Rule, _params: Any, _recent_seconds: float) -> Collection[str]:
    return rule.selector.metrics


LONG_READS: Mapping[str, LongReads] = MappingProxyType(
    {
        forgotten.DETECTOR.spec.name: _past_recent(GPU_UTILIZATION),
        overprovisioned.DETECTOR.spec.name: _past_recent(GPU_UTILIZATION),
        input_bound.DETECTOR.spec.name: _past_recent(
            GPU_UTILIZATION, "system.cpu.time", input_bound.QUEUE
        ),
        # the budget is judged over the whole SLO period (30 d): always long
        slo.DETECTOR.spec.name: _always(slo.REQUESTS),
        forecast.DETECTOR.spec.name: _always(slo.REQUESTS, forecast.QUEUE),
        metric_anomaly.DETECTOR.spec.name: _selected,
    }
)
"""Detectors that read ``resolution="long"``, by name; every other one reads recent only."""


def long_metrics(
    rules: Iterable[Rule], *, recent_seconds: float, extra: Iterable[str] = ()
) -> frozenset[str]:
    """The metrics the enabled ``rules`` read at long resolution, plus ``extra``."""
    names = set(extra)
    for rule in rules:
        reads = LONG_READS.get(rule.detector)
        detector = DETECTORS.get(rule.detector)
        if reads is None or detector is None or not rule.enabled:
            continue
        names.update(reads(rule, detector.bind(rule), recent_seconds))
    return frozenset(names)


def keep_long_reads(store: WindowStore, rules: Iterable[Rule]) -> int:
    """Give ``store`` the recent and long rings ``rules`` read (what the engine does with the
    rules it is handed, at start and on a reload); return how many held series got a long
    row."""
    rules = list(rules)
    store.keep_recent(recent_metrics(rules, recent_seconds=store.recent_seconds))
    return store.keep_long(long_metrics(rules, recent_seconds=store.recent_seconds))


RecentReads = Callable[[Rule], Collection[str]]
"""(rule) → the metrics its detector reads over a time range at recent resolution."""


def _signals_and_selected(rule: Rule) -> Collection[str]:
    """What most detectors read: their declared signals and the rule's selected metrics."""
    return (*SPECS[rule.detector].signals, *rule.selector.metrics)


RECENT_READS: Mapping[str, RecentReads] = MappingProxyType(
    {
        # its signals are a menu of what a rule may select: it reads what the rule selects,
        # and the model requests of the serving jobs that hold a candidate (traffic check)
        level_shift.DETECTOR.spec.name: lambda rule: (
            *rule.selector.metrics,
            level_shift_jobs.REQUESTS_METRIC,
        ),
        # its fresh-GPU check reads utilisation besides its signals
        orphaned.DETECTOR.spec.name: lambda rule: (
            *_signals_and_selected(rule),
            GPU_UTILIZATION,
        ),
    }
)
"""Detectors that read over time other than their signals and their rule's selected metrics
(``_signals_and_selected``, the default), by name."""

CONTEXT_READS = FLEET_READS
"""What any detector reads through its context (the fleet's timelines), kept for every rule."""


def recent_metrics(
    rules: Iterable[Rule], *, recent_seconds: float, extra: Iterable[str] = ()
) -> frozenset[str]:
    """The metrics the enabled ``rules`` read over a time range (their long reads included:
    the long ring is made from the recent one), what every detector's context reads, plus
    ``extra``."""
    rules = [rule for rule in rules if rule.enabled and rule.detector in DETECTORS]
    names = set(extra) | CONTEXT_READS | long_metrics(rules, recent_seconds=recent_seconds)
    for rule in rules:
        names.update(RECENT_READS.get(rule.detector, _signals_and_selected)(rule))
    return frozenset(names)
