"""``gpuwarden policies check`` and ``policies test`` (a dry evaluation against a backtest).

Light on purpose, like ``rules``: the CLI imports this module to build its parser, also on
agent-only installs, so it needs only the standard library, PyYAML, msgspec and the policy
model; the backtest machinery (the collector extra) is imported when ``test`` runs. Exit codes
as ``rules check|test``: 0 when every policy is valid (and the replay ran), 1 when a policy
file has mistakes (one line each on stderr), 2 when the data or the rules are bad.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gpuwarden.collector.cli.admit import add_admit_parser, run_admit
from gpuwarden.collector.extras import MissingExtraError, needs_extra
from gpuwarden.collector.policy.loader import load_policies
from gpuwarden.collector.policy.model import PolicyKind, PolicySet

if TYPE_CHECKING:
    from gpuwarden.collector.policy.dry_run import DryVerdict

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT = 0, 1, 2


def add_policies_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``policies check`` to the CLI's subcommands."""
    policies = subparsers.add_parser(
        "policies", help="check policy files (limits, approvals, cost caps, idle, quiet hours)"
    )
    actions = policies.add_subparsers(dest="policies_command", required=True, metavar="ACTION")
    check = actions.add_parser(
        "check",
        help="validate policy files",
        description="Load policy files the way the collector does and report every problem with "
        "its file, policy and key. Exit 0 when all policies are valid, 1 otherwise.",
    )
    check.add_argument(
        "paths",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="policy files, or folders of *.yaml/*.yml files",
    )
    test = actions.add_parser(
        "test",
        help="ask the policies about a backtest's actions (nothing acts)",
        description="Replay a recorded trace through the rules (as 'gpuwarden backtest'), then "
        "put every acting action of every incident to the policies as the remediator would "
        "when the incident opened, and print what they would refuse, defer or hold for "
        "approval. Exit 0 when it ran, 1 for policy-file mistakes, 2 for bad data or rules.",
    )
    test.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="policy files or folders")
    test.add_argument(
        "--backtest",
        type=Path,
        required=True,
        metavar="TRACE",
        help="our trace CSV (optionally .gz) or a GenTD26 folder (docs/backtest.md)",
    )
    test.add_argument(
        "--rules", type=Path, action="append", metavar="PATH", help="rule file or folder"
    )
    test.add_argument(
        "--runbooks-dir", type=Path, help="folder of the rules' runbooks (default: packaged)"
    )
    test.add_argument(
        "--spend",
        action="append",
        default=[],
        metavar="TEAM=DOLLARS",
        help="spend so far of a team for the cost caps, repeatable (default: unknown)",
    )
    test.add_argument("--format", choices=("table", "json"), default="table")
    add_admit_parser(actions)


def run_policies(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``gpuwarden policies ...`` from parsed arguments; return the exit code."""
    if args.policies_command == "admit":
        return run_admit(args, out=out)
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    result = load_policies(list(args.paths), skip_bad=True)
    if args.policies_command == "check":
        return report_check(result, out, err)
    if result.problems:
        return report_check(result, out, err)
    return _run_test(args, result, out, err)


def _spend(pairs: list[str]) -> dict[str, float]:
    spend = {}
    for pair in pairs:
        team, sep, dollars = pair.partition("=")
        try:
            spend[team] = float(dollars)
        except ValueError:
            sep = ""
        if not sep or not team:
            raise ValueError(f"--spend: expected TEAM=DOLLARS, got {pair!r}")
    return spend


def _run_test(args: argparse.Namespace, policies: PolicySet, out: TextIO, err: TextIO) -> int:
    command = "gpuwarden policies test"
    try:
        with needs_extra("collector", command):
            from gpuwarden.collector.backtest.data import load_dataset
            from gpuwarden.collector.backtest.replay import run_backtest
            from gpuwarden.collector.detect.catalog import load_rules
            from gpuwarden.collector.policy.dry_run import dry_evaluate
            from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
    except MissingExtraError as exc:
        print(exc, file=err)
        return EXIT_ERROR
    try:
        spend = _spend(args.spend)
        paths = list(args.rules or [default_rules_dir()])
        rules = load_rules(paths, runbooks_dir=args.runbooks_dir or default_runbooks_dir())
        dataset = load_dataset(args.backtest)
        replay = run_backtest(dataset, rules)
    except ValueError as exc:  # DataError, RuleError, a bad --spend
        print(f"{command}: {exc}", file=err)
        return EXIT_BAD_INPUT
    verdicts = dry_evaluate(policies.policies, rules, replay.incidents, dataset.jobs, spend)
    if args.format == "json":
        json.dump([_record(v) for v in verdicts], out, indent=2)
        out.write("\n")
        return EXIT_OK
    for v in verdicts:
        said = f"{v.outcome}" + (f" by {v.policy}: {v.reason}" if v.policy else "")
        out.write(f"{v.at_seconds:>10.0f}s  {v.rule_id}  {v.action} {v.subject}: {said}\n")
    counts = {o: sum(v.outcome == o for v in verdicts) for o in {v.outcome for v in verdicts}}
    summary = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
    out.write(
        f"{len(replay.incidents)} incidents, {len(verdicts)} actions asked"
        + (f": {summary}" if summary else "")
        + "\n"
    )
    return EXIT_OK


def _record(verdict: DryVerdict) -> dict[str, object]:
    return {
        "at_seconds": verdict.at_seconds,
        "rule": verdict.rule_id,
        "subject": verdict.subject,
        "action": verdict.action,
        "outcome": str(verdict.outcome),
        "policy": verdict.policy,
        "reason": verdict.reason,
    }


def report_check(result: PolicySet, out: TextIO, err: TextIO) -> int:
    """Print each problem (stderr) or a summary by kind (stdout); the exit code."""
    for problem in result.problems:
        print(problem, file=err)
    good = len(result.policies)
    if result.problems:
        count = len(result.problems)
        print(f"{count} problem{'s' * (count != 1)}; {_policies(good)} OK", file=err)
        return EXIT_ERROR
    kinds = ", ".join(
        f"{len(found)} {kind}" for kind in PolicyKind if (found := result.of_kind(kind))
    )
    print(
        f"{good} polic{'ies' if good != 1 else 'y'} OK" + (f" ({kinds})" if kinds else ""), file=out
    )
    return EXIT_OK


def _policies(count: int) -> str:
    return f"{count} polic{'y' if count == 1 else 'ies'}"
