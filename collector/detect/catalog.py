"""Every detector, by name: the vocabulary the rule loader validates rules against."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpuwarden.collector.detect import (
    alertmanager,
    deploy,
    distribution,
    drift,
    faults,
    forecast,
    forgotten,
    idle_gpu,
    input_bound,
    level_shift,
    metric_anomaly,
    node_silent,
    orphaned,
    overprovisioned,
    preemption,
    slo,
    straggler,
)
from gpuwarden.collector.detect.contract import Detector
from gpuwarden.collector.rules.loader import load_rule_files
from gpuwarden.collector.rules.model import DetectorSpec, RuleSet

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
