"""``gpuwarden rules check``, ``gpuwarden rules detectors`` (and ``rules status``, in
:mod:`.rules_status`).

Light on purpose: the CLI imports this module to build its parser, also on agent-only installs,
so it needs only the standard library, PyYAML and ``gpuwarden.collector.rules``. The detector
vocabulary lives with the detectors (``gpuwarden.collector.detect.catalog``), which need the
collector extra: it is imported when a command runs, and its absence is one line. So is the
runbook check (Jinja2).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from gpuwarden.collector.cli.rules_status import add_status_parser, run_status
from gpuwarden.collector.extras import MissingExtraError, needs_extra
from gpuwarden.collector.rules.durations import format_duration, format_number
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from gpuwarden.collector.rules.model import (
    SELECTOR_FIELDS,
    ActionMode,
    DetectorSpec,
    ParamSpec,
    ParamType,
    RuleProblem,
    RuleSet,
    Severity,
)
from gpuwarden.collector.rules.vocabulary import ACTIONS, ROUTE_SCHEMES

EXIT_OK, EXIT_ERROR = 0, 1


def add_rules_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``rules check`` and ``rules detectors`` to the CLI's subcommands."""
    rules = subparsers.add_parser("rules", help="check detection rules, list the vocabulary")
    kinds = rules.add_subparsers(dest="rules_command", required=True, metavar="ACTION")
    check = kinds.add_parser(
        "check",
        help="validate rule files (default: the packaged default rules)",
        description="Load rule files the way the collector does and report every problem with "
        "its file, rule and key, then render each rule's runbook without an incident and with a "
        "sample incident of its detector (an undefined name is a problem). Exit 0 when all rules "
        "are valid, 1 otherwise.",
    )
    check.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="rule files, or folders of *.yaml/*.yml files (default: the packaged rules)",
    )
    check.add_argument(
        "--runbooks-dir",
        type=Path,
        help="folder the rules' runbook paths are relative to (default: the packaged runbooks)",
    )
    kinds.add_parser(
        "detectors",
        help="print the detectors, their parameters, and the action kinds (Markdown)",
    )
    from gpuwarden.collector.backtest.cli import add_rules_test_parser

    add_rules_test_parser(kinds)
    add_status_parser(kinds)


def run_rules(
    args: argparse.Namespace,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Run ``gpuwarden rules ...`` from parsed arguments; return the exit code."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    if args.rules_command == "status":
        return run_status(args, out, err, os.environ if environ is None else environ)
    return _run_offline(args, out, err)


def _run_offline(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The commands that read rule files, not a running collector."""
    try:
        with needs_extra("collector", f"gpuwarden rules {args.rules_command}"):
            from gpuwarden.collector.alerts.runbook_check import runbook_problems
            from gpuwarden.collector.alerts.runbooks import Links, RunbookRenderer
            from gpuwarden.collector.detect import catalog
    except MissingExtraError as exc:
        print(exc, file=err)
        return EXIT_ERROR
    if args.rules_command == "detectors":
        out.write(render_vocabulary(catalog.SPECS))
        return EXIT_OK
    if args.rules_command == "test":
        from gpuwarden.collector.backtest.cli import run_backtest_command

        return run_backtest_command(args, out=out, err=err)
    paths: list[Path] = list(args.paths) or [default_rules_dir()]
    runbooks: Path = args.runbooks_dir or default_runbooks_dir()
    if not runbooks.is_dir():
        print(f"gpuwarden rules check: {runbooks}: no such runbooks folder", file=err)
        return EXIT_ERROR
    # skip_bad collects every problem instead of stopping at the first one.
    result: RuleSet = catalog.load_rules(paths, runbooks_dir=runbooks, skip_bad=True)
    problems = list(result.problems)
    renderer, links = RunbookRenderer(runbooks), Links()
    for rule in result.rules:
        subjects = catalog.SPECS[rule.detector].subjects
        problems += [
            RuleProblem(rule.source.file, "runbook", message, rule.source.index, rule.id)
            for message in runbook_problems(renderer, rule, subjects, links)
        ]
    for problem in problems:
        print(problem, file=err)
    bad = {(p.file, p.index) for p in problems if p.index is not None}
    good = sum((rule.source.file, rule.source.index) not in bad for rule in result.rules)
    if problems:
        count = len(problems)
        print(f"{count} problem{'s' * (count != 1)}; {good} rules OK", file=err)
        return EXIT_ERROR
    print(f"{good} rule{'s' * (good != 1)} OK", file=out)
    return EXIT_OK


def _value(spec: ParamSpec, value: object) -> str:
    if value is None:
        return "required"
    base = spec.type.removeprefix("list[").removesuffix("]")
    items = value if isinstance(value, tuple) else (value,)
    shown = [
        format_duration(float(v)) if base == "duration" and isinstance(v, int | float) else str(v)
        for v in items
    ]
    text = ", ".join(shown)
    return f"[{text}]" if isinstance(value, tuple) else text


def _range(spec: ParamSpec) -> str:
    if spec.choices:
        return " | ".join(spec.choices)
    if spec.minimum is None and spec.maximum is None:
        return ""
    low, high = spec.minimum, spec.maximum
    duration = spec.type in (ParamType.DURATION, ParamType.DURATION_LIST)
    show = format_duration if duration else format_number
    return f"{show(low) if low is not None else ''} … {show(high) if high is not None else ''}"


def _param_rows(table: dict[str, ParamSpec]) -> list[str]:
    if not table:
        return ["(no parameters)", ""]
    rows = ["| parameter | type | default | range | description |", "|---|---|---|---|---|"]
    rows += [
        f"| `{name}` | {spec.type} | {_value(spec, spec.default)} | {_range(spec)} "
        f"| {spec.description} |"
        for name, spec in table.items()
    ]
    return [*rows, ""]


def render_vocabulary(detectors: Mapping[str, DetectorSpec]) -> str:
    """The detector and action vocabularies as Markdown (the rule-writer's reference)."""
    lines = ["# Detection rule vocabulary", ""]
    lines += [
        f"Severities: {', '.join(Severity)}. Action modes: {', '.join(ActionMode)}. "
        f"Route schemes: {', '.join(ROUTE_SCHEMES)}.",
        "",
        "## Detectors",
        "",
    ]
    for spec in detectors.values():
        lines += [f"### `{spec.name}`", "", spec.description, ""]
        lines.append(f"Finds problems of a {' or '.join(spec.subjects)}.")
        if spec.signals:
            lines.append(f"Reads by default: {', '.join(f'`{s}`' for s in spec.signals)}.")
        honoured = [name for name in SELECTOR_FIELDS if name in spec.selector]
        lines.append(f"Selector fields it honours: {', '.join(honoured) or 'none'}.")
        if spec.requires:
            lines.append(f"The selector must set: {', '.join(spec.requires)}.")
        lines += ["", *_param_rows(dict(spec.parameters))]
    lines += ["## Actions", ""]
    for action in ACTIONS.values():
        target = f" Acts on a {action.target}." if action.target else ""
        lines += [f"### `{action.kind}`", "", action.description + target, ""]
        lines += _param_rows(dict(action.parameters))
    return "\n".join(lines)
