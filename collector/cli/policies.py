"""``gpuwarden policies check`` (and ``policies test``, a dry evaluation against a backtest).

Light on purpose, like ``rules``: the CLI imports this module to build its parser, also on
agent-only installs, so it needs only the standard library, PyYAML, msgspec and
``gpuwarden.collector.policy``. Exit codes as ``rules check``: 0 when every policy is valid,
1 otherwise (one line per mistake on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from gpuwarden.collector.cli.admit import add_admit_parser, run_admit
from gpuwarden.collector.policy.loader import load_policies
from gpuwarden.collector.policy.model import PolicyKind, PolicySet

EXIT_OK, EXIT_ERROR = 0, 1


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
    return report_check(result, out, err)


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
