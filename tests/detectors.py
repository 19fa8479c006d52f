"""Running one rule through its detector against a real service, as the engine does."""

from __future__ import annotations

from gpuwarden.collector.detect.catalog import DETECTORS, keep_long_reads
from gpuwarden.collector.detect.findings import Finding
from gpuwarden.collector.rules.model import ParamValue, Rule, Selector, Severity
from gpuwarden.collector.service import CollectorService


def run_rule(service: CollectorService, rule: Rule, now: float) -> list[Finding]:
    """The rule's findings at ``now`` (the engine's selection by teams/jobs/models/nodes is not
    applied: that is the engine's job, tested in test_detection_contract); the store keeps the
    long rings the rule reads, as the engine has it do."""
    keep_long_reads(service.store, (rule,))
    return DETECTORS[rule.detector].detect(service.detection_view, rule, now)


def make_rule(
    detector: str,
    rule_id: str = "r",
    severity: str = "warning",
    *,
    selector: Selector | None = None,
    **parameters: ParamValue,
) -> Rule:
    """A rule of ``detector`` with its default parameters, overridden by ``parameters``."""
    spec = DETECTORS[detector].spec
    unknown = set(parameters) - set(spec.parameters)
    if unknown:
        raise KeyError(f"{detector} has no parameters {sorted(unknown)}")
    values: dict[str, ParamValue] = {}
    for name, param in spec.parameters.items():
        value = parameters.get(name, param.default)
        if value is None:
            raise KeyError(f"{detector}.{name} has no default")
        values[name] = value
    return Rule(
        id=rule_id,
        detector=detector,
        selector=selector or Selector(),
        parameters=values,
        severity=Severity(severity),
        owner="test",
        runbook="test.md",
    )
