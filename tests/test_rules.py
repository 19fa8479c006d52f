"""Detection rules: loading, validation messages (file + key), the default rule set, the CLI."""

from __future__ import annotations

import argparse
import dataclasses
import io
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwarden.collector.cli.rules import add_rules_parser, run_rules
from gpuwarden.collector.detect.catalog import SPECS as DETECTORS
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.rules.durations import parse_duration
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import (
    MAX_FILE_BYTES,
    ActionMode,
    ParamType,
    RuleError,
    Selector,
    Severity,
)
from gpuwarden.collector.rules.vocabulary import ACTIONS


def _base(**changes: Any) -> dict[str, Any]:
    """A valid idle_gpu rule with ``changes`` applied (a value of ``None`` removes the key)."""
    rule: dict[str, Any] = {
        "id": "r1",
        "detector": "idle_gpu",
        "severity": "warning",
        "owner": "ml-platform",
        "runbook": "r1.md",
        "parameters": {"window_seconds": "30m"},
        "actions": [{"kind": "requeue", "mode": "approve"}],
        "routes": ["slack:#gpu-waste"],
    }
    for key, value in changes.items():
        if value is None:
            rule.pop(key, None)
        else:
            rule[key] = value
    return rule


def _slo(**parameters: Any) -> dict[str, Any]:
    return _base(detector="slo_burn", selector={}, parameters=parameters, actions=[])


@pytest.fixture
def runbooks(tmp_path: Path) -> Path:
    folder = tmp_path / "runbooks"
    folder.mkdir()
    (folder / "r1.md").write_text("# r1\n", encoding="utf-8")
    (folder / "r2.md").write_text("# r2\n", encoding="utf-8")
    return folder


def _write(folder: Path, name: str, rules: list[Any]) -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump({"version": 1, "rules": rules}), encoding="utf-8")
    return path


# (rule, key, words in the message): every kind of error names the file, the rule and the key.
RULE_ERRORS: list[tuple[dict[str, Any], str, str]] = [
    (_base(detector="idle_gpuu"), "detector", "did you mean 'idle_gpu'"),
    (_base(detector=["idle_gpu"]), "detector", "expected a string, got ['idle_gpu']"),
    (_base(parameters={"windw_seconds": "30m"}), "parameters.windw_seconds", "did you mean"),
    (_base(parameters={"utilization_below": "low"}), "parameters.utilization_below", "a number"),
    (_base(parameters={"utilization_below": True}), "parameters.utilization_below", "a number"),
    (_base(parameters={"utilization_below": float("nan")}), "parameters.utilization_below",
     "finite"),
    (_base(parameters={"min_gpus": 1.5}), "parameters.min_gpus", "an integer"),
    (_base(parameters={"utilization_below": 1.5}), "parameters.utilization_below",
     "between 0 and 1"),
    (_base(parameters={"window_seconds": 10}), "parameters.window_seconds", "between 1m and 1w"),
    # no coverage at all would make a window without a sample idle: refused, not a crash later
    (_base(parameters={"min_coverage": 0}), "parameters.min_coverage", "between 0.01 and 1"),
    (_base(parameters={"window_seconds": "30 minutes"}), "parameters.window_seconds",
     "expected a duration"),
    (_base(parameters=["window_seconds"]), "parameters", "expected a mapping"),
    (_base(runbook="missing.md"), "runbook", "no such runbook"),
    (_base(runbook="../r1.md"), "runbook", "inside the runbooks folder"),
    (_base(runbook="/etc/r1.md"), "runbook", "inside the runbooks folder"),
    (_base(runbook="r1.txt"), "runbook", ".md"),
    (_base(actions=[{"kind": "reboot"}]), "actions[0].kind", "unknown action kind"),
    (_base(actions=[{"mode": "auto"}]), "actions[0].kind", "required"),
    (_base(actions=[{"kind": "requeue", "mode": "yolo"}]), "actions[0].mode",
     "expected one of auto, approve, notify, got 'yolo'"),
    (_base(actions=[{"kind": "scale_up", "mode": "auto"}]), "actions[0].kind",
     "acts on a deployment"),
    (_base(actions=[{"kind": "requeue", "parameters": {"retries": 3}}]),
     "actions[0].parameters.retries", "unknown parameter of requeue"),
    (_base(actions=[{"kind": "webhook"}]), "actions[0].parameters.name", "required by webhook"),
    (_base(actions=[{"kind": "requeue", "when": "now"}]), "actions[0].when", "unknown key"),
    (_base(actions={"kind": "requeue"}), "actions", "expected a list"),
    (_base(detector="model_drift", actions=[]), "selector.metrics", "needs at least one entry"),
    (_base(detector="level_shift", selector={"teams": ["a"]}, actions=[]), "selector.metrics",
     "needs at least one entry"),
    (_base(detector="slo_burn", selector={"metrics": ["gpuwarden.model.requests"]}, actions=[]),
     "selector.metrics", "detector slo_burn does not honour this field"),
    (_base(selector={"labels": {"cluster": "a"}}), "selector.labels",
     "detector idle_gpu does not honour this field (it honours: teams, jobs, models, nodes)"),
    (_base(detector="hardware_fault", selector={"models": ["llama-*"]}, actions=[]),
     "selector.models", "detector hardware_fault does not honour this field"),
    (_base(selector={"team": ["ml-*"]}), "selector.team", "did you mean 'teams'"),
    (_base(selector={"teams": "ml-*"}), "selector.teams", "expected a list"),
    (_base(selector={"teams": ["ml-*", ""]}), "selector.teams[1]", "non-empty string"),
    (_base(selector={"metrics": ["hw gpu"]}), "selector.metrics[0]", "expected a metric name"),
    (_base(selector={"labels": {"gpus": 8}}), "selector.labels.gpus", "non-empty string"),
    (_base(severity="urgent"), "severity",
     "expected one of info, warning, critical, page, got 'urgent'"),
    (_base(owner=None), "owner", "required"),
    (_base(owner=""), "owner", "non-empty string"),
    (_base(id="Idle GPU"), "id", "expected lowercase letters"),
    (_base(actions=[{"kind": "drain", "mode": "approve"}]), "actions[0].kind",
     "drain acts on a node; idle_gpu finds job problems"),
    (_base(sevrity="page"), "sevrity", "did you mean 'severity'"),
    (_base(enabled="yes"), "enabled", "true or false"),
    (_base(description=["x"]), "description", "a string"),
    (_base(routes=["#gpu-waste"]), "routes[0]", "<scheme>:<target>"),
    (_base(routes=["email:ops@example.com"]), "routes[0]", "unknown route scheme"),
    (_base(routes="slack:#x"), "routes", "expected a list"),
    (_slo(burn_rates=[14.4]), "parameters.burn_rates", "one length"),
    (_slo(long_windows_seconds=["5m", "6h"]), "parameters.short_windows_seconds[0]",
     "shorter than its long window"),
    (_slo(long_windows_seconds=["1h", "40d"], period_seconds="30d"),
     "parameters.long_windows_seconds[1]", "period_seconds"),
    (_slo(objective=0.9), "parameters.burn_rates[0]", "never fire"),
    (_slo(burn_rates=[14.4, "x"]), "parameters.burn_rates[1]", "a number"),
    (_slo(error_outcomes="failure"), "parameters.error_outcomes", "expected a list"),
    (_base(detector="model_drift", selector={"metrics": ["m"]}, actions=[],
           parameters={"history_seconds": "1d", "season_seconds": "1d"}),
     "parameters.history_seconds", "two seasons"),
    (_base(detector="model_drift", selector={"metrics": ["m"]}, actions=[],
           parameters={"statistic": "p90"}), "parameters.statistic", "unknown value 'p90'"),
    (_base(detector="distribution_drift", selector={"metrics": ["m"]}, actions=[],
           parameters={"reference_seconds": "1h", "window_seconds": "1h"}),
     "parameters.reference_seconds", "longer than window_seconds"),
    (_base(detector="hardware_fault", actions=[], parameters={
        "xid_codes": [], "uncorrected_ecc": False, "remap_failure": False, "gpu_lost": False}),
     "parameters.xid_codes", "watches nothing"),
    (_base(detector="hardware_fault", actions=[], parameters={"xid_codes": [79, "x"]}),
     "parameters.xid_codes[1]", "an integer"),
    (_base(detector="preemption", actions=[], parameters={"price_tiers": ["spot", "cheap"]}),
     "parameters.price_tiers[1]", "unknown value"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "key", "words"), RULE_ERRORS)
def test_rule_errors_name_file_rule_and_key(tmp_path, runbooks, rule, key, words):
    path = _write(tmp_path, "team.yaml", [rule])
    with pytest.raises(RuleError) as caught:
        load_rules([path], runbooks_dir=runbooks)
    rule_id = rule["id"]
    assert str(caught.value).startswith(f"{path}: rules[0] ({rule_id}).{key}: "), caught.value
    assert words in str(caught.value)
    problem = caught.value.problem
    assert (problem.file, problem.index, problem.rule_id, problem.key) == (
        str(path),
        0,
        rule_id,
        key,
    )


def test_a_rule_that_is_not_a_mapping_is_named_by_position(tmp_path, runbooks):
    path = _write(tmp_path, "a.yaml", [_base(), "idle"])
    with pytest.raises(RuleError, match=re.escape(f"{path}: rules[1] (?): expected a mapping")):
        load_rules([path], runbooks_dir=runbooks)


def test_unknown_key_error_reads_as_one_line(tmp_path, runbooks):
    path = _write(tmp_path, "team.yaml", [_base(id="idle-gpu", selector={"team": ["ml-*"]})])
    with pytest.raises(RuleError) as caught:
        load_rules([path], runbooks_dir=runbooks)
    assert str(caught.value) == (
        f"{path}: rules[0] (idle-gpu).selector.team: unknown key 'team'; did you mean 'teams'?"
    )


def test_null_lists_and_mappings_mean_empty(tmp_path, runbooks):
    rule = _base(selector=None, parameters=None, actions=None, routes=None)
    path = tmp_path / "nulls.yaml"
    text = yaml.safe_dump({"rules": [rule]}).replace(
        "- detector", "- selector:\n  parameters:\n  actions:\n  routes:\n  detector"
    )
    path.write_text(text, encoding="utf-8")
    loaded = load_rules([path], runbooks_dir=runbooks).rules[0]
    assert (loaded.selector, loaded.actions, loaded.routes) == (Selector(), (), ())
    assert loaded.parameters["window_seconds"] == 1800.0


def test_rule_errors_name_missing_required_keys(tmp_path, runbooks):
    for required in ("id", "detector", "severity", "owner", "runbook"):
        path = _write(tmp_path, f"{required}.yaml", [_base(**{required: None})])
        with pytest.raises(RuleError, match=re.escape(f".{required}: required")):
            load_rules([path], runbooks_dir=runbooks)


# A few kB that stand for 64**4 values through aliases (the "billion laughs").
_ALIAS_BOMB = "a: &a [" + ", ".join(["1"] * 64) + "]\n"
for _prev, _name in (("a", "b"), ("b", "c"), ("c", "d")):
    _ALIAS_BOMB += f"{_name}: &{_name} [" + ", ".join([f"*{_prev}"] * 64) + "]\n"
_ALIAS_BOMB += "rules: []\n"

# (file text, key or "", words in the message): problems of the file as a whole.
FILE_ERRORS: list[tuple[str | bytes, str, str]] = [
    ("rules: [\n  - id: r1\n   detector: x\n", "", "not valid YAML at line"),
    ("rules:\n  - id: r1\n    id: r2\n", "", "duplicate key 'id'"),
    ("- id: r1\n", "", "expected a mapping"),
    ("rulez: []\n", "rulez", "did you mean 'rules'"),
    ("version: 2\nrules: []\n", "version", "unsupported version 2"),
    ("version: true\nrules: []\n", "version", "expected an integer, got True"),
    ("version: 1\n", "rules", "required"),
    ("rules: {id: r1}\n", "rules", "expected a list"),
    ("", "", "empty file"),
    ("# only a comment\n", "", "empty file"),
    ("groups:\n  - name: gpu\n    rules: []\n", "groups", "Prometheus rules file"),
    ("rules: !!python/object/apply:os.system ['true']\n", "", "not valid YAML"),
    ("---\nrules: []\n---\nrules: []\n", "", "not valid YAML"),
    (b"rules: []\n# \xff\xfe\n", "", "not UTF-8"),
    ("[" * 20_000 + "]" * 20_000, "", "not valid YAML"),
    ("rules:\n  - id: r1\n    1: x\n", "", "line 3, column 5: keys must be strings"),
    (_ALIAS_BOMB, "", "aliases expand it beyond"),
]


@pytest.mark.parametrize(("text", "key", "words"), FILE_ERRORS)
def test_file_errors_name_the_file(tmp_path, runbooks, text, key, words):
    path = tmp_path / "broken.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(RuleError) as caught:
        load_rules([path], runbooks_dir=runbooks)
    prefix = f"{path}: {key}: " if key else f"{path}: "
    assert str(caught.value).startswith(prefix), caught.value
    assert words in str(caught.value)
    assert caught.value.problem.key == key
    assert caught.value.problem.index is None


def test_oversized_file_is_refused_before_parsing(tmp_path, runbooks):
    path = tmp_path / "big.yaml"
    path.write_text("rules: []\n" + "#" * MAX_FILE_BYTES, encoding="utf-8")
    with pytest.raises(RuleError, match="larger than"):
        load_rules([path], runbooks_dir=runbooks)


def test_anchors_and_merge_keys_work_inside_the_rules_list(tmp_path, runbooks):
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "rules:\n"
        "  - &first {id: r1, detector: idle_gpu, severity: warning, owner: a, runbook: r1.md}\n"
        "  - {<<: *first, id: r2, runbook: r2.md, severity: info}\n",
        encoding="utf-8",
    )
    loaded = load_rules([path], runbooks_dir=runbooks)
    assert [(r.id, r.severity) for r in loaded.rules] == [
        ("r1", Severity.WARNING),
        ("r2", Severity.INFO),
    ]


def test_duplicate_ids_across_files(tmp_path, runbooks):
    first = _write(tmp_path, "a.yaml", [_base()])
    second = _write(tmp_path, "b.yaml", [_base(id="r2", runbook="r2.md"), _base()])
    with pytest.raises(RuleError) as caught:
        load_rules([first, second], runbooks_dir=runbooks)
    assert str(caught.value) == (
        f"{second}: rules[1] (r1).id: duplicate rule id, first defined in {first} rules[0]"
    )


def test_skip_bad_loads_the_rest_and_reports_every_problem(tmp_path, runbooks):
    good = _write(
        tmp_path,
        "a.yaml",
        [_base(), _base(id="bad", severity="urgent"), _base(id="r2", runbook="r2.md")],
    )
    duplicate = _write(tmp_path, "b.yaml", [_base()])
    broken = tmp_path / "c.yaml"
    broken.write_text("rules: [", encoding="utf-8")
    missing = tmp_path / "nope.yaml"
    result = load_rules([good, duplicate, broken, missing], runbooks_dir=runbooks, skip_bad=True)
    assert [rule.id for rule in result.rules] == ["r1", "r2"]
    assert [(p.file, p.key) for p in result.problems] == [
        (str(missing), ""),
        (str(good), "severity"),
        (str(duplicate), "id"),
        (str(broken), ""),
    ]
    # Without skip_bad the first problem stops the load.
    with pytest.raises(RuleError, match="no such file or folder"):
        load_rules([good, missing], runbooks_dir=runbooks)
    with pytest.raises(RuleError, match=re.escape("rules[1] (bad).severity")):
        load_rules([good], runbooks_dir=runbooks)


def test_folders_expand_to_their_rule_files(tmp_path, runbooks):
    folder = tmp_path / "rules"
    folder.mkdir()
    _write(folder, "b.yml", [_base(id="r2", runbook="r2.md")])
    _write(folder, "a.yaml", [_base()])
    (folder / "README.md").write_text("not a rule file", encoding="utf-8")
    (folder / "__init__.py").write_text("", encoding="utf-8")
    loaded = load_rules([folder], runbooks_dir=runbooks)
    assert [(r.id, Path(r.source.file).name, r.source.index) for r in loaded.rules] == [
        ("r1", "a.yaml", 0),
        ("r2", "b.yml", 0),
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RuleError, match=re.escape("no *.yaml or *.yml rule files")):
        load_rules([empty], runbooks_dir=runbooks)


def test_loaded_rule_is_typed_frozen_and_has_defaults(tmp_path, runbooks):
    path = _write(
        tmp_path,
        "a.yaml",
        [
            _base(
                selector={"teams": ["ml-*"], "nodes": ["gpu-a-*"]},
                actions=[{"kind": "requeue", "mode": "approve"}, {"kind": "notify"}],
                description="  Idle.  ",
            ),
            _base(id="r2", runbook="r2.md", enabled=False),
        ],
    )
    loaded = load_rules([path], runbooks_dir=runbooks)
    rule = loaded.get("r1")
    assert rule is not None
    assert loaded.get("nope") is None
    assert rule.detector == "idle_gpu"
    assert rule.severity is Severity.WARNING
    assert rule.parameters == {
        "window_seconds": 1800.0,
        "utilization_below": 0.05,
        "min_coverage": 0.8,
        "min_gpus": 1,
        "busy_fraction_tolerated": 0.02,
    }
    assert [(a.kind, a.mode) for a in rule.actions] == [
        ("requeue", ActionMode.APPROVE),
        ("notify", ActionMode.NOTIFY),  # mode defaults to the least powerful one
    ]
    assert rule.actions[0].parameters == {"max_attempts": 1, "price_tier": "same"}
    assert rule.selector.teams == ("ml-*",)
    assert rule.description == "Idle."
    assert rule.routes == ("slack:#gpu-waste",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.owner = "someone"  # type: ignore[misc]
    with pytest.raises(TypeError):
        rule.parameters["min_gpus"] = 2  # type: ignore[index]
    assert [r.id for r in loaded.enabled()] == ["r1"]


def test_runbooks_dir_none_checks_only_the_form(tmp_path):
    path = _write(tmp_path, "a.yaml", [_base(runbook="anything.md")])
    assert load_rules([path], runbooks_dir=None).rules[0].runbook == "anything.md"
    path = _write(tmp_path, "b.yaml", [_base(runbook="../anything.md")])
    with pytest.raises(RuleError, match="runbook"):
        load_rules([path], runbooks_dir=None)


def _minimal(detector: str) -> dict[str, Any]:
    examples: dict[str, Any] = {"metrics": ["m"], "labels": {"alertname": "A"}}
    selector = {name: examples[name] for name in DETECTORS[detector].requires}
    return _base(id=detector.replace("_", "-"), detector=detector, selector=selector,
                 parameters={}, actions=[], runbook="r1.md")  # fmt: skip


@pytest.mark.parametrize("detector", sorted(DETECTORS))
def test_every_detector_loads_with_defaults_and_with_them_spelled_out(tmp_path, detector):
    spec = DETECTORS[detector]
    defaults = _write(tmp_path, "defaults.yaml", [_minimal(detector)])
    rule = load_rules([defaults], runbooks_dir=None).rules[0]
    assert dict(rule.parameters) == {name: p.default for name, p in spec.parameters.items()}
    # Every default is inside its own range (what a user copying it into a file would get).
    explicit = {
        name: list(value) if isinstance(value, tuple) else value
        for name, value in rule.parameters.items()
    }
    spelled = _write(tmp_path, "spelled.yaml", [{**_minimal(detector), "parameters": explicit}])
    assert load_rules([spelled], runbooks_dir=None).rules[0].parameters == rule.parameters


def test_vocabulary_tables_are_consistent():
    tables = [spec.parameters for spec in DETECTORS.values()]
    tables += [spec.parameters for spec in ACTIONS.values()]
    for table in tables:
        for name, spec in table.items():
            is_duration = spec.type in (ParamType.DURATION, ParamType.DURATION_LIST)
            assert name.endswith("_seconds") == is_duration, name  # units in names
            assert spec.description
    for detector in DETECTORS.values():
        assert set(detector.requires) <= {"metrics", "teams", "jobs", "models", "nodes", "labels"}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(90, 90.0), (1.5, 1.5), ("90s", 90.0), ("30m", 1800.0), ("1h30m", 5400.0), ("24h", 86400.0),
     ("7d", 604800.0), ("2w", 1209600.0), ("0.5h", 1800.0), (" 5M ", 300.0)],
)  # fmt: skip
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "m", "5 m", "-5m", "5y", True, None, [5]])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("selector", "facts", "expected"),
    [
        (Selector(), {}, True),
        (Selector(teams=("ml-*",)), {"team": "ml-vision"}, True),
        (Selector(teams=("ml-*",)), {"team": "ML-vision"}, False),  # case-sensitive
        (Selector(teams=("ml-*",)), {}, False),  # a missing fact fails a pattern
        (Selector(teams=("ml-*", "research")), {"team": "research"}, True),
        (Selector(nodes=("gpu[0-9]",), models=("llama*",)), {"node": "gpu3", "model": "llama-3"},
         True),
        (Selector(nodes=("gpu[0-9]",), models=("llama*",)), {"node": "gpu3", "model": "mistral"},
         False),
        (Selector(labels={"cluster": "a100"}), {"labels": {"cluster": "a100", "x": "y"}}, True),
        (Selector(labels={"cluster": "a100"}), {"labels": {"cluster": "h100"}}, False),
        (Selector(labels={"cluster": "a100"}), {}, False),
    ],
)  # fmt: skip
def test_selector_matches(selector, facts, expected):
    assert selector.matches(**facts) is expected


# --- the default rule set -----------------------------------------------------------------------


def test_default_rules_load_and_cover_every_detector():
    loaded = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    assert loaded.problems == ()
    assert {rule.detector for rule in loaded.rules} == set(DETECTORS)
    for rule in loaded.rules:
        assert rule.enabled
        assert rule.routes, rule.id
        assert rule.actions, rule.id
        assert rule.runbook == f"{rule.id}.md"
        assert (default_runbooks_dir() / rule.runbook).is_file()


def _tuple(value: object) -> tuple[object, ...]:
    assert isinstance(value, tuple)
    return value


def test_default_rules_match_the_issue():
    loaded = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    by_detector = {rule.detector: rule for rule in loaded.rules}

    def actions(detector: str) -> list[tuple[str, str]]:
        return [(a.kind, a.mode.value) for a in by_detector[detector].actions]

    idle = by_detector["idle_gpu"].parameters
    assert (idle["window_seconds"], idle["utilization_below"]) == (1800.0, 0.05)
    assert by_detector["forgotten_gpu"].parameters["window_seconds"] == 86400.0
    assert actions("idle_gpu") == [("requeue", "approve")]
    assert actions("hardware_fault") == [("drain", "approve"), ("notify", "notify")]
    xids = _tuple(by_detector["hardware_fault"].parameters["xid_codes"])
    assert set(xids) == {48, 63, 64, 74, 79, 92, 94, 95}
    burn = [rule for rule in loaded.rules if rule.detector == "slo_burn"]
    windows = {
        (long, short, rate)
        for rule in burn
        for long, short, rate in zip(
            _tuple(rule.parameters["long_windows_seconds"]),
            _tuple(rule.parameters["short_windows_seconds"]),
            _tuple(rule.parameters["burn_rates"]),
            strict=True,
        )
    }
    assert windows == {(3600, 300, 14.4), (21600, 1800, 6), (86400, 7200, 3), (259200, 21600, 1)}
    assert all(rule.parameters["objective"] == 0.999 for rule in burn)
    fast = next(rule for rule in burn if rule.severity is Severity.PAGE)
    assert [(a.kind, a.mode.value) for a in fast.actions] == [
        ("scale_up", "auto"),
        ("degrade", "approve"),
    ]


def test_default_rules_name_only_known_metrics():
    from gpuwarden.agent.catalog import metric_names
    from gpuwarden.collector.ingest.scrape import MODEL_METRICS

    known = set(metric_names()) | {metric.name for metric in MODEL_METRICS}
    loaded = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    named = {m for rule in loaded.rules for m in rule.selector.metrics}
    named |= {m for spec in DETECTORS.values() for m in spec.signals}
    assert named - known == set()


_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)\s*\}\}")


def test_every_runbook_belongs_to_a_rule_and_has_valid_placeholders():
    loaded = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    files = {path.name for path in default_runbooks_dir().glob("*.md")}
    prometheus = (default_rules_dir() / "prometheus" / "gpuwarden.rules.yml").read_text()
    for_alerts = {f"{name}.md" for name in re.findall(r"/runbooks/([a-z0-9-]+)", prometheus)}
    # every runbook serves a rule or a Prometheus alert (rules/prometheus/)
    assert files == {rule.runbook for rule in loaded.rules} | for_alerts
    roots = {"rule", "incident", "job", "node", "gpu", "model", "evidence"}
    for name in sorted(files):
        text = (default_runbooks_dir() / name).read_text(encoding="utf-8")
        assert text.startswith(f"# {name.removesuffix('.md')} — "), name
        for heading in ("## Confirm", "## What automation does", "## Rollback", "## Escalation"):
            assert heading in text, (name, heading)
        # Only simple {{ a.b }} expressions: no statements, and nothing left unbalanced.
        assert "{%" not in text, name
        assert "{#" not in text, name
        stripped = _PLACEHOLDER.sub("", text)
        assert "{{" not in stripped, name
        assert "}}" not in stripped, name
        for match in _PLACEHOLDER.finditer(text):
            assert match.group(1).split(".")[0] in roots, (name, match.group(0))


# --- the CLI --------------------------------------------------------------------------------------


def _cli(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="gpuwarden")
    add_rules_parser(parser.add_subparsers(dest="command", required=True))
    out, err = io.StringIO(), io.StringIO()
    code = run_rules(parser.parse_args(["rules", *argv]), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_rules_check_defaults_exit_zero():
    code, out, err = _cli("check")
    assert (code, err) == (0, "")
    count = len(load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir()).rules)
    assert out == f"{count} rules OK\n"


def test_rules_check_broken_file_exits_one_naming_file_and_key(tmp_path, runbooks):
    folder = tmp_path / "rules"
    folder.mkdir()
    good = _write(folder, "a.yaml", [_base()])
    bad = _write(folder, "b.yaml", [_base(id="r2", parameters={"window_seconds": 10})])
    code, out, err = _cli("check", str(folder), "--runbooks-dir", str(runbooks))
    assert (code, out) == (1, "")
    assert f"{bad}: rules[0] (r2).parameters.window_seconds: must be between" in err
    assert err.endswith("1 problem; 1 rules OK\n")
    code, out, _ = _cli("check", str(good), "--runbooks-dir", str(runbooks))
    assert (code, out) == (0, "1 rule OK\n")


def test_rules_check_missing_runbooks_folder(tmp_path):
    code, _, err = _cli("check", "--runbooks-dir", str(tmp_path / "nope"))
    assert code == 1
    assert "no such runbooks folder" in err


def test_rules_detectors_lists_the_vocabulary():
    code, out, _ = _cli("detectors")
    assert code == 0
    for name in [*DETECTORS, *ACTIONS]:
        assert f"### `{name}`" in out
    assert "| `window_seconds` | duration | 30m | 1m … 1w |" in out


def test_a_bad_rule_reports_every_independent_problem(tmp_path, runbooks):
    rule = _base(
        parameters={"window_seconds": 10, "utilisation_below": 0.1},
        selector={"metrics": ["gpu.utilization"]},
        runbook="r9.md",
        actions=[{"kind": "requeue", "parameters": {"nope": 1}}, {"kind": "reboot"}],
        routes=["slack:#ok", "smoke-signal"],
    )
    path = _write(tmp_path, "a.yaml", [rule, _base(id="r2", runbook="r2.md")])
    result = load_rules([path], runbooks_dir=runbooks, skip_bad=True)
    assert [r.id for r in result.rules] == ["r2"]
    assert [(p.index, p.key) for p in result.problems] == [
        (0, "selector.metrics"),
        (0, "parameters.utilisation_below"),  # (the file's keys are written sorted)
        (0, "parameters.window_seconds"),
        (0, "runbook"),
        (0, "actions[0].parameters.nope"),
        (0, "actions[1].kind"),
        (0, "routes[1]"),
    ]
    # Without skip_bad the first one stops the load, as before.
    with pytest.raises(RuleError, match=re.escape("rules[0] (r1).selector.metrics")):
        load_rules([path], runbooks_dir=runbooks)


def test_an_unknown_detector_still_checks_runbook_actions_and_routes(tmp_path, runbooks):
    rule = _base(detector="idle_gpuu", runbook="gone.md", routes=["nope"])
    path = _write(tmp_path, "a.yaml", [rule])
    result = load_rules([path], runbooks_dir=runbooks, skip_bad=True)
    assert [p.key for p in result.problems] == ["detector", "runbook", "routes[0]"]


def test_rules_check_renders_runbooks_and_names_an_undefined_name(tmp_path, runbooks):
    (runbooks / "r1.md").write_text("# r1\n\nOwner {{ rule.owner }}\n{{ job.kee }}\n")
    # only an incident reaches this line: the sample incident does
    (runbooks / "r2.md").write_text("# r2\n{% if has_incident %}{{ incident.sumary }}{% endif %}\n")
    path = _write(tmp_path, "a.yaml", [_base(), _base(id="r2", runbook="r2.md"), _base(id="r3")])
    code, out, err = _cli("check", str(path), "--runbooks-dir", str(runbooks))
    assert (code, out) == (1, "")
    lines = err.splitlines()
    assert lines == [
        f"{path}: rules[0] (r1).runbook: {runbooks / 'r1.md'}:4: error: undefined name job.kee",
        f"{path}: rules[1] (r2).runbook: {runbooks / 'r2.md'}:2: error: "
        "undefined name incident.sumary",
        f"{path}: rules[2] (r3).runbook: {runbooks / 'r1.md'}:4: error: undefined name job.kee",
        "3 problems; 0 rules OK",
    ]
