"""The detector contract, table-driven over every computed detector, through ``DetectionEngine``.

For each detector of the catalog whose findings are computed (``run`` is not None), on one real
scenario (``tests.contract_scenarios``: the per-detector tests' data through the real service):

- the baseline rule fires (asserted first, so no case below can pass vacuously);
- every selector field the detector declares: a value matching the firing subject keeps it
  firing, a value matching nothing silences it;
- every parameter of its parameters dataclass: a value that changes how many findings fire (or,
  where no value in range can in the scenario, the effect the parameter has on the evidence);
- every selector field it does not declare is refused when the rule file loads.

The four bugs the one-contract change fixed have named cases (ids ``bug-a-…`` to ``bug-d-…``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from gpuwarden.collector.detect.catalog import DETECTORS, load_rules
from gpuwarden.collector.detect.engine import CycleResult, DetectionEngine, selected
from gpuwarden.collector.detect.findings import Finding, Verdict
from gpuwarden.collector.rules.model import (
    SELECTOR_FIELDS,
    ParamValue,
    Rule,
    RuleError,
    RuleSet,
    Selector,
)
from tests.contract_scenarios import BUILDERS, Scenario

COMPUTED = sorted(name for name, d in DETECTORS.items() if d.run is not None)
NOWHERE = "no-such-thing"


# --- the tables --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Fires:
    """With ``value`` (on top of ``given``), ``firing`` findings fire; with ``given`` alone,
    ``given_firing`` do (``None``: the scenario's baseline, ``given`` empty)."""

    value: ParamValue
    firing: int
    given: Mapping[str, ParamValue] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    given_firing: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Records:
    """No value in range changes the verdicts in the scenario; the parameter shows in the
    evidence of every finding as ``evidence[key] == want`` (``why`` says why no verdict moves)."""

    value: ParamValue
    key: str
    want: Any
    why: str


@dataclasses.dataclass(frozen=True, slots=True)
class Bounds:
    """The parameter bounds how many findings there are (``findings``) without changing any
    verdict of the scenario."""

    value: ParamValue
    findings: int
    why: str


@dataclasses.dataclass(frozen=True, slots=True)
class Unobserved:
    """No effect on the scenario's findings could be shown (reported, not hidden): the value is
    accepted and the rule still runs and fires as at baseline."""

    value: ParamValue
    why: str


Case = Fires | Records | Bounds | Unobserved

#: baseline firing findings of each scenario
BASELINE = {
    "idle_gpu": 1,
    "orphaned_memory": 2,
    "forgotten_gpu": 1,
    "input_bound": 2,
    "overprovisioned_inference": 1,
    "straggler": 1,
    "model_drift": 1,
    "deploy_regression": 1,
    "distribution_drift": 1,
    "slo_burn": 1,
    "budget_burn": 1,
    "demand_forecast": 1,
    "hardware_fault": 4,
    "preemption": 3,
    "node_silent": 1,
    "metric_anomaly": 1,
    "level_shift": 2,
    "team_starved": 1,
    "team_hogging": 1,
}

LATENCY = "gpuwarden.model.request.latency"
TTFT = "gpuwarden.model.time_to_first_token"

#: per detector, per declared selector field: (a value matching the firing subject, firing with
#: it; a value matching nothing)
SELECTORS: dict[str, dict[str, tuple[Any, int, Any]]] = {
    "idle_gpu": {
        "teams": (("ml",), 1, (NOWHERE,)),
        "jobs": (("slurm:c:1",), 1, ("slurm:c:9*",)),
        "models": (("llama",), 1, ("mistral",)),
        "nodes": (("a",), 1, ("b",)),
    },
    "orphaned_memory": {
        "teams": (("ml",), 1, (NOWHERE,)),
        "jobs": (("slurm:c:1",), 1, ("slurm:c:2",)),
        "nodes": (("a",), 2, (NOWHERE,)),
    },
    "forgotten_gpu": {
        "teams": (("m*",), 1, (NOWHERE,)),
        "jobs": (("slurm:c:1",), 1, ("slurm:c:2",)),
        "models": (("llama",), 1, ("mistral",)),
        "nodes": (("a",), 1, (NOWHERE,)),
    },
    "input_bound": {
        "teams": (("ml",), 2, (NOWHERE,)),
        "jobs": (("slurm:c:1",), 1, ("slurm:c:2",)),
        "models": (("llama",), 2, ("mistral",)),
        "nodes": (("a",), 1, ("b",)),
    },
    "overprovisioned_inference": {
        "teams": (("ml",), 1, (NOWHERE,)),
        "models": (("sd",), 1, ("llm",)),
        "nodes": (("a",), 1, (NOWHERE,)),
    },
    "straggler": {
        "teams": (("ml",), 1, (NOWHERE,)),
        "jobs": (("slurm:c:1",), 1, ("slurm:c:2",)),
        "models": (("llama",), 1, ("mistral",)),
        "nodes": (("a",), 1, (NOWHERE,)),
    },
    "model_drift": {
        "metrics": ((LATENCY,), 1, ("some.other.metric",)),
        "models": (("llama",), 1, ("mistral",)),
        "labels": ({"host.name": "serve-1"}, 1, {"host.name": NOWHERE}),
    },
    "deploy_regression": {
        "metrics": ((LATENCY,), 1, ("some.other.metric",)),
        "models": (("slower",), 1, ("same",)),
        "labels": ({"host.name": "gpu-1"}, 1, {"host.name": NOWHERE}),
    },
    "distribution_drift": {
        "metrics": ((TTFT,), 1, (LATENCY,)),
        "teams": (("ml",), 1, (NOWHERE,)),
        "models": (("llama",), 1, ("mistral",)),
        "labels": ({"host.name": "srv"}, 1, {"host.name": NOWHERE}),
    },
    "budget_burn": {
        "teams": (("nlp",), 1, (NOWHERE,)),
    },
    "slo_burn": {
        "teams": (("ml",), 1, (NOWHERE,)),
        "models": (("llama",), 1, ("mistral",)),
        "labels": ({"host.name": "srv"}, 1, {"host.name": NOWHERE}),
    },
    "demand_forecast": {
        "teams": (("ml",), 1, (NOWHERE,)),
        "models": (("llama",), 1, ("mistral",)),
        "labels": ({"host.name": "srv"}, 1, {"host.name": NOWHERE}),
    },
    "hardware_fault": {
        "nodes": (("n1",), 4, ("n2",)),
    },
    "preemption": {
        "teams": (("ml",), 3, (NOWHERE,)),
        "jobs": (("slurm:c:1",), 1, ("slurm:c:4",)),
        "models": (("llama",), 3, ("mistral",)),
        "nodes": (("a",), 1, (NOWHERE,)),
    },
    "node_silent": {
        "nodes": (("b",), 1, ("a",)),
    },
    "metric_anomaly": {
        "metrics": (("hw.gpu.power.usage",), 1, ("hw.gpu.utilization",)),
        "teams": (("ml",), 1, (NOWHERE,)),
        "jobs": (("slurm:c:1",), 1, ("slurm:c:2",)),
        "models": (("llama",), 1, ("mistral",)),
        "nodes": (("gpu-07",), 1, (NOWHERE,)),
        "labels": ({"hw.id": "GPU-7"}, 1, {"hw.id": "GPU-8"}),
    },
    "level_shift": {
        "metrics": (("hw.gpu.utilization",), 2, ("hw.gpu.power.usage",)),
        "teams": (("ml",), 2, (NOWHERE,)),
        "jobs": (("slurm:c:1",), 2, ("slurm:c:2",)),
        "models": (("llama",), 2, ("mistral",)),
        "nodes": (("a",), 1, ("c",)),
        "labels": ({"hw.id": "GPU-a"}, 1, {"hw.id": "GPU-c"}),
    },
    "team_starved": {
        "teams": (("cv",), 1, (NOWHERE,)),
    },
    "team_hogging": {
        "teams": (("m*",), 1, (NOWHERE,)),
    },
}

HOUR = 3600.0
DAY = 86400.0

PARAMS: dict[str, dict[str, Case]] = {
    "idle_gpu": {
        "window_seconds": Fires(HOUR, 0),  # the job's GPUs have 40 min of telemetry
        "utilization_below": Fires(0.0, 0),
        "min_coverage": Records(
            0.5,
            "idle_gpus",
            2,
            "GPU a/1's gap (a third of the window) is tolerated: the job's "
            "one finding then lists both its GPUs",
        ),
        "min_gpus": Fires(3, 0),  # the job holds 2 GPUs
        "busy_fraction_tolerated": Fires(0.0, 0),  # GPU a/0's two heartbeat blips clear it
    },
    "orphaned_memory": {
        "memory_above_bytes": Fires(20 * 2**30, 0),  # each orphan holds 10 GiB
        "grace_seconds": Fires(HOUR, 0),  # the orphans are 20 and 30 min old
    },
    "forgotten_gpu": {
        "window_seconds": Fires(4 * HOUR, 0),  # 3 h of data: coverage 0.75
        "utilization_below": Fires(0.01, 0),  # job 1's mean is ~4 %
        "min_coverage": Fires(0.95, 0),  # the 200 min window is 90 % covered
    },
    "input_bound": {
        "window_seconds": Fires(HOUR, 0),  # 30 min of data: the jobs are not seen held
        # job 1 (20 %) is over 0.1; job 3 (stalled every other sample) fires on its stalls
        "gpu_utilization_below": Fires(0.1, 1),
        "cpu_utilization_above": Fires(0.99, 1),  # job 1's host is at 95 %; job 3 oscillates
        # over 30 min the first CPU-counter slot has no rate: coverage just under 1
        "min_coverage": Fires(1.0, 1, given={"window_seconds": 1800.0}, given_firing=2),
    },
    "overprovisioned_inference": {
        "window_seconds": Fires(3 * HOUR, 0),  # 2 h of data: under the peak coverage
        # llm (2 replicas, median 35 %) can go to one replica only under a floor of 1
        "quantile": Fires(
            0.5,
            2,
            given={"peak_utilization_below": 0.5, "min_replicas": 1, "target_utilization": 0.9},
            given_firing=1,
        ),
        "peak_utilization_below": Fires(0.1, 0),  # sd peaks at 15 %
        "target_utilization": Records(
            0.3, "suggested_replicas", 4, "the verdict is the peak's; the target sizes the fix"
        ),
        "min_replicas": Records(
            6, "suggested_replicas", 6, "the verdict is the peak's; the floor bounds the fix"
        ),
    },
    "straggler": {
        "window_seconds": Fires(HOUR, 0),  # 30 min of data: under the coverage
        "tolerance": Records(
            20.0, "tolerance_mads", 20.0, "GPU 3 at half its peers is > 20 MADs out"
        ),
        "outside_fraction": Fires(0.3, 1, given={"window_seconds": 1800.0}, given_firing=0),
        "min_peers": Fires(8, 0),  # 7 of the 8 GPUs send telemetry
        "min_relative_gap": Fires(0.6, 0),  # GPU 3 runs at half its peers: a gap of 0.5
        "idle_below": Fires(0.5, 0),  # GPU 3 runs at ~45 %: under 0.5 it counts as idle
    },
    "model_drift": {
        "statistic": Fires("rate", 0),  # the step is in latency, not in traffic
        "direction": Fires("decrease", 0),
        "window_seconds": Fires(2 * HOUR, 0),  # the step is 30 min old
        "history_seconds": Fires(HOUR, 0, given={"season_seconds": 0.0, "window_seconds": 600.0}),
        "season_seconds": Records(
            0.0, "season_seconds", 0.0, "the store holds 5.5 h: no season can be removed"
        ),
        "threshold": Fires(50.0, 0),
        "min_relative_change": Fires(2.0, 0),  # the p95 doubles: +100 %
    },
    "deploy_regression": {
        "statistic": Fires("rate", 0),  # the deploy slowed requests, not their rate
        "direction": Fires("decrease", 0),
        "before_seconds": Fires(DAY, 0),  # no data a day before the deploy
        "after_seconds": Fires(HOUR, 0),  # not judged until settle + 1 h after the deploy
        "settle_seconds": Fires(HOUR, 0),
        "test": Records("ks", "test", "ks", "a 30 % slowdown is significant to every test"),
        "p_value_below": Records(
            1e-9, "threshold", 1e-9, "the slowdown's p-value is below even 1e-9"
        ),
        "min_relative_change": Fires(1.0, 0),
    },
    "distribution_drift": {
        "method": Records("ks", "method", "ks", "the shift is found by every method"),
        "threshold": Fires(10.0, 0),
        "window_seconds": Fires(HOUR, 0),  # the shift is 20 min old
        "reference_seconds": Fires(HOUR, 0),
        "same_phase": Fires(True, 0),  # 3 h of reference hold no window of the same hour
        "persistence": Fires(5, 0),  # 4 windows drifted in a row
    },
    "slo_burn": {
        "objective": Fires(0.95, 0),  # 2 % errors burn a 5 % budget at 0.4x
        "period_seconds": Unobserved(
            DAY, "the store holds 7 h; the budget over 1 d and 30 d is the same"
        ),
        "long_windows_seconds": Fires((DAY, DAY), 0),  # 7 h of data: unknown
        "short_windows_seconds": Records(
            (2400.0, 7200.0), "burn_rate_2h", 20.0, "the errors are steady: every window burns"
        ),
        "burn_rates": Fires((100.0, 100.0), 0),  # the burn is 20x
        "error_outcomes": Fires(("timeout",), 0),
    },
    "budget_burn": {
        # 1 h of surge at 20x after days at 0.5x: a 1 d long window burns (23 x 0.5 + 20) / 24
        "long_windows_seconds": Fires((DAY, 6 * 3600.0), 0),
        "short_windows_seconds": Records(
            (600.0, 1200.0), "burn_rate_10m", 20.0, "the last hour is all surge"
        ),
        "burn_rates": Fires((25.0, 25.0), 0),  # the hour's burn is 20x
    },
    "demand_forecast": {
        "horizon_seconds": Records(
            300.0, "horizon_seconds", 300.0, "the upper bound is over 80 % already"
        ),
        "history_seconds": Unobserved(
            2 * DAY, "the store's long ring holds 3 days; the fit on 2 still crosses"
        ),
        "season_seconds": Unobserved(0.0, "the growth alone crosses the capacity"),
        "interval_level": Records(
            0.5, "interval_level", 0.5, "even the 50 % interval's upper bound crosses"
        ),
        "capacity_utilization_above": Fires(1.0, 0),
    },
    "hardware_fault": {
        "xid_codes": Fires((48,), 3),  # GPU-xid79 clears
        "uncorrected_ecc": Fires(False, 3),  # GPU-ecc clears
        "remap_failure": Fires(False, 3),  # GPU-remap clears
        "gpu_lost": Fires(False, 3),  # GPU-lost clears
    },
    "preemption": {
        "window_seconds": Fires(300.0, 0),  # the last preemption is 20 min old
        "min_preemptions": Fires(2, 0),
        "price_tiers": Fires(("reserved",), 0),
    },
    "node_silent": {
        "grace_seconds": Fires(1200.0, 0),  # node b has been silent 1210 s: not past 60 + 1200
        "with_jobs_only": Fires(False, 2),  # node a, silent since its job was preempted, too
    },
    "metric_anomaly": {
        "history_seconds": Unobserved(
            7 * DAY, "10 h of data: 12 h and a week of history hold the same minutes"
        ),
        "recent_seconds": Unobserved(60.0, "the drop is in the newest minute too"),
        "score_above": Fires(0.99, 0),
        "max_series": Bounds(1, 1, "the firing series is scored first"),
        "min_fold_change": Fires(20.0, 0),  # the drop is 300 W to 30 W: tenfold, under 20
    },
    "level_shift": {
        "window_seconds": Fires(3 * HOUR, 0),  # 2 h of data: baseline unknown
        "baseline_seconds": Fires(3 * HOUR, 0),
        # the drops are 40 min old: the new level has not held for 50 min yet
        "hold_seconds": Fires(50 * 60.0, 0),
        "z_above": Unobserved(50.0, "a 0.3 drop on 0.03 noise is over 50 robust sigmas"),
        "direction": Fires("increase", 0),
        "min_change": Fires(0.35, 1),  # a drops 0.4, b 0.3
        "ignore_below": Fires(0.5, 0),  # both land at 0.4-0.5
        "noise_floor": Fires(1.0, 0),
        "season_seconds": Unobserved(1200.0, "no season in the data; the drops stay"),
        "max_fits": Fires(1, 1),  # the weaker drop waits for the next cycle (UNKNOWN)
    },
    "team_starved": {
        "window_seconds": Fires(21600.0, 0),  # over 6 h cv used more than its share
        "wait_ratio": Fires(5.0, 0),  # cv waits 2 h, 4x ml's 30 min
        "min_wait_seconds": Fires(10800.0, 0),  # cv's p95 is 2 h
    },
    "team_hogging": {
        "window_seconds": Fires(21600.0, 0),  # over 6 h ml used less than half
        "over_share_margin": Fires(0.6, 0),  # ml holds 100 %, entitled to 50 %
        "min_wait_seconds": Fires(10800.0, 0),  # cv's p95 is 2 h
    },
}


# --- running rules through the engine ----------------------------------------------------------

_ids = itertools.count()


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Scenario]]:
    """Each detector's scenario, built on first use and shared by its cases."""
    built: dict[str, Scenario] = {}

    class Lazy(dict[str, Scenario]):
        def __missing__(self, name: str) -> Scenario:
            built[name] = self[name] = BUILDERS[name](tmp_path_factory.mktemp(name))
            return built[name]

    yield Lazy()
    for scenario in built.values():
        scenario.service.storage.close()


def variant(
    scenario: Scenario,
    parameters: Mapping[str, ParamValue] | None = None,
    selector: Selector | None = None,
) -> Rule:
    """The scenario's rule with some parameters and its selector replaced. A fresh id each time:
    fit caches and trackers are per rule, so no case reuses another's state."""
    rule = scenario.rule
    values = {**rule.parameters, **(parameters or {})}
    spec = DETECTORS[rule.detector].spec
    for name, value in values.items():  # only values a rule file could hold
        table = spec.parameters[name]
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, int | float) and not isinstance(item, bool):
                assert table.minimum is None or item >= table.minimum, (name, item)
                assert table.maximum is None or item <= table.maximum, (name, item)
    assert spec.check is None or spec.check(values) is None, values
    return dataclasses.replace(
        rule,
        id=f"{rule.detector}-{next(_ids)}",
        parameters=values,
        selector=selector or rule.selector,
    )


def cycle(scenario: Scenario, rule: Rule) -> CycleResult:
    engine = DetectionEngine(
        scenario.service.detection_view,
        RuleSet((rule,)),
        storage=scenario.service.storage,
        clock=lambda: scenario.now,
    )
    result = engine.run_cycle(scenario.now)
    assert result.failed_rules == ()
    return result


def firing(scenario: Scenario, rule: Rule) -> int:
    return cycle(scenario, rule).firing


_baselines: dict[int, int] = {}


def fires_at_baseline(scenario: Scenario) -> int:
    """The baseline rule's firing count, run once per scenario (the data never changes; the
    cases assert it before their own, so none can pass vacuously)."""
    key = id(scenario)
    if key not in _baselines:
        _baselines[key] = firing(scenario, variant(scenario))
    return _baselines[key]


def findings(scenario: Scenario, rule: Rule) -> list[Finding]:
    """What the engine keeps of the rule's findings (the same selection, without incidents)."""
    detector = DETECTORS[rule.detector]
    found = detector.detect(scenario.service.detection_view, rule, scenario.now)
    return [f for f in found if selected(rule, detector, f)]


def same(got: object, want: object) -> bool:
    """Evidence equality: numbers within 5 % (burn rates are measured), the rest exactly."""
    if isinstance(want, str) or isinstance(got, str) or got is None:
        return got == want
    return bool(got == pytest.approx(want, rel=0.05))


# --- the contract ------------------------------------------------------------------------------


def test_every_computed_detector_has_a_scenario_and_complete_tables():
    assert set(BUILDERS) == set(COMPUTED) == set(BASELINE) == set(SELECTORS) == set(PARAMS)
    for name in COMPUTED:
        detector = DETECTORS[name]
        assert set(SELECTORS[name]) == set(detector.spec.selector), name
        fields = {f.name for f in dataclasses.fields(detector.params)}
        assert set(PARAMS[name]) == fields, name


@pytest.mark.parametrize("name", COMPUTED)
def test_the_baseline_rule_fires(scenarios, name):
    scenario = scenarios[name]
    assert fires_at_baseline(scenario) == BASELINE[name] > 0


SELECTOR_CASES = [
    pytest.param(name, field, id=f"{name}-selector.{field}")
    for name in COMPUTED
    for field in sorted(SELECTORS[name])
]


def with_field(selector: Selector, field: str, value: Any) -> Selector:
    if field == "labels":
        value = MappingProxyType(dict(value))
    return dataclasses.replace(selector, **{field: value})


@pytest.mark.parametrize(("name", "field"), SELECTOR_CASES)
def test_a_declared_selector_field_selects(scenarios, name, field):
    scenario = scenarios[name]
    assert fires_at_baseline(scenario) == BASELINE[name] > 0
    match, firing_with_match, nothing = SELECTORS[name][field]
    base = scenario.rule.selector
    assert firing(scenario, variant(scenario, selector=with_field(base, field, match))) == (
        firing_with_match
    )
    assert firing_with_match > 0
    assert firing(scenario, variant(scenario, selector=with_field(base, field, nothing))) == 0


PARAM_CASES = [
    pytest.param(name, param, id=f"{name}-{param}") for name in COMPUTED for param in PARAMS[name]
]


@pytest.mark.parametrize(("name", "param"), PARAM_CASES)
def test_a_parameter_changes_the_findings(scenarios, name, param):
    scenario = scenarios[name]
    assert fires_at_baseline(scenario) == BASELINE[name] > 0
    case = PARAMS[name][param]
    match case:
        case Fires(value, want, given, given_firing):
            before = firing(scenario, variant(scenario, given))
            assert before == (BASELINE[name] if given_firing is None else given_firing)
            assert want != before
            assert firing(scenario, variant(scenario, {**given, param: value})) == want
        case Records(value, key, want, _):
            rule = variant(scenario, {param: value})
            assert firing(scenario, rule) == BASELINE[name]
            found = [f for f in findings(scenario, rule) if f.verdict is Verdict.FIRING]
            assert found
            assert all(same(f.evidence.get(key), want) for f in found), key
            default = findings(scenario, variant(scenario))
            assert not any(same(f.evidence.get(key), want) for f in default), key
        case Bounds(value, want, _):
            assert cycle(scenario, variant(scenario)).findings > want
            result = cycle(scenario, variant(scenario, {param: value}))
            assert (result.findings, result.firing) == (want, BASELINE[name])
        case Unobserved(value, _):
            assert firing(scenario, variant(scenario, {param: value})) == BASELINE[name]


# --- fields a detector does not honour are refused at load --------------------------------------

YAML_VALUES = {
    "metrics": "[hw.gpu.utilization]",
    "teams": "[ml]",
    "jobs": '["slurm:c:1"]',
    "models": "[llama]",
    "nodes": "[a]",
    "labels": "{cluster: nowhere}",
}

UNHONOURED = [
    pytest.param(name, field, id=f"{name}-selector.{field}")
    for name in sorted(DETECTORS)
    for field in SELECTOR_FIELDS
    if field not in DETECTORS[name].spec.selector
]


def rule_file(tmp_path: Path, detector: str, selector: Mapping[str, str]) -> Path:
    lines = ["version: 1", "rules:", "  - id: contract", f"    detector: {detector}"]
    if selector:
        lines.append("    selector:")
        lines += [f"      {key}: {value}" for key, value in selector.items()]
    lines += ["    severity: warning", "    owner: test", "    runbook: test.md"]
    path = tmp_path / "rules.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("name", "field"), UNHONOURED)
def test_an_unhonoured_selector_field_is_refused_at_load(tmp_path, name, field):
    selector = {f: YAML_VALUES[f] for f in DETECTORS[name].spec.requires}
    selector[field] = YAML_VALUES[field]
    with pytest.raises(RuleError) as raised:
        load_rules([rule_file(tmp_path, name, selector)], runbooks_dir=None)
    message = str(raised.value)
    assert f"selector.{field}" in message
    assert "does not honour" in message
    assert "rules.yaml" in message
    assert "contract" in message


# --- the four bugs the one contract fixed (each fails on 25695f1) -------------------------------

NO_SERIES = sorted(n for n, d in DETECTORS.items() if "labels" not in d.spec.selector)


@pytest.mark.parametrize("name", NO_SERIES, ids=[f"bug-a-labels-refused-{n}" for n in NO_SERIES])
def test_bug_a_labels_on_a_detector_that_reads_no_series_are_refused(tmp_path, name):
    selector = {f: YAML_VALUES[f] for f in DETECTORS[name].spec.requires}
    selector["labels"] = YAML_VALUES["labels"]
    with pytest.raises(RuleError, match=r"selector\.labels.*does not honour"):
        load_rules([rule_file(tmp_path, name, selector)], runbooks_dir=None)


@pytest.mark.parametrize("case", ["bug-b-idle_gpu-min_gpus"])
def test_bug_b_idle_gpu_min_gpus_above_the_jobs_width_finds_nothing(scenarios, case):
    scenario = scenarios["idle_gpu"]
    assert firing(scenario, variant(scenario, {"min_gpus": 2})) == 1  # the job holds 2
    assert firing(scenario, variant(scenario, {"min_gpus": 3})) == 0
    assert all(
        f.facts.job != "slurm:c:1" for f in findings(scenario, variant(scenario, {"min_gpus": 3}))
    )


@pytest.mark.parametrize(
    "name", ["slo_burn", "demand_forecast"], ids=["bug-c-slo_burn", "bug-c-demand_forecast"]
)
def test_bug_c_loads_and_fires_without_selector_metrics(scenarios, tmp_path, name):
    loaded = load_rules([rule_file(tmp_path, name, {})], runbooks_dir=None)
    (rule,) = loaded.rules
    assert rule.selector.metrics == ()
    scenario = scenarios[name]
    assert scenario.rule.selector.metrics == ()
    assert firing(scenario, variant(scenario)) > 0


JOB_MODELS = ["idle_gpu", "forgotten_gpu", "input_bound", "straggler", "preemption"]
MODEL_CASES = [
    pytest.param(n, id=f"bug-d-models-{n}") for n in [*JOB_MODELS, "overprovisioned_inference"]
]


@pytest.mark.parametrize("name", MODEL_CASES)
def test_bug_d_selector_models_selects_by_the_jobs_or_deployments_model(scenarios, name):
    scenario = scenarios[name]
    match, want, other = SELECTORS[name]["models"]
    base = scenario.rule.selector
    assert firing(scenario, variant(scenario, selector=with_field(base, "models", match))) == want
    assert want > 0
    assert firing(scenario, variant(scenario, selector=with_field(base, "models", other))) == 0
