"""``gpuwarden backtest`` and ``gpuwarden rules test``: argument parsing and printing."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # the CLI's parser is built for agent-only installs too: import when run
    from gpuwarden.collector.backtest import BacktestResult
    from gpuwarden.collector.rules import RuleSet

EXIT_OK, EXIT_BAD_INPUT = 0, 2


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data",
        type=Path,
        required=True,
        help="recorded trace: our CSV (time_seconds,gpu_uuid,...) or GenTD26's duty-cycle file "
        "(a folder means its pod_gpu_duty_cycle_anon.csv.gz)",
    )
    parser.add_argument("--labels", type=Path, help="CSV subject,start,end of truth windows")
    parser.add_argument("--gpus", type=int, help="replay at most this many GPUs")
    parser.add_argument("--step", type=int, default=60, help="sample step, trace seconds (60)")
    parser.add_argument(
        "--cycle", type=float, default=60.0, help="detection cycle, trace seconds (60)"
    )
    parser.add_argument("--runbooks-dir", type=Path, help="runbooks the rules name")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def add_backtest_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``backtest``."""
    parser = subparsers.add_parser(
        "backtest",
        help="replay recorded telemetry through the detection rules",
        description="Replay a recorded GPU trace through the collector's store and detection "
        "engine on a simulated clock; print the incidents, the waste they found, and with "
        "--labels precision, recall and delay.",
    )
    parser.add_argument(
        "--rules", type=Path, action="append", help="rule files or folders (default: packaged)"
    )
    _common(parser)


def add_rules_test_parser(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``rules test`` (to the ``rules`` subcommands)."""
    parser = kinds.add_parser(
        "test", help="run one rule on recorded data and print what it would have found"
    )
    parser.add_argument("rule", help="the rule id")
    parser.add_argument(
        "--rules", type=Path, action="append", help="rule files or folders (default: packaged)"
    )
    _common(parser)


def _data(path: Path) -> Path:
    if path.is_dir():
        return path / "pod_gpu_duty_cycle_anon.csv.gz"
    return path


def _rules(args: argparse.Namespace) -> RuleSet:
    from gpuwarden.collector.rules import default_rules_dir, default_runbooks_dir, load_rules

    paths = list(args.rules or []) or [default_rules_dir()]
    return load_rules(paths, runbooks_dir=args.runbooks_dir or default_runbooks_dir())


def run_backtest_command(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """``gpuwarden backtest`` and ``gpuwarden rules test``; exit 2 on bad input."""
    from gpuwarden.collector.backtest import BacktestError, only_rule, read_labels, run_backtest
    from gpuwarden.collector.rules import RuleError

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    data = _data(args.data)
    try:
        rules = _rules(args)
        if getattr(args, "rule", None):
            rules = only_rule(rules, args.rule)
        if not data.is_file():
            raise BacktestError(f"{data}: no such file")
        labels = read_labels(args.labels) if args.labels else []
        result = run_backtest(
            rules,
            data,
            labels=labels,
            step_seconds=args.step,
            cycle_seconds=args.cycle,
            max_gpus=args.gpus,
            progress=not args.quiet and err.isatty(),
        )
    except (BacktestError, RuleError) as exc:
        print(f"gpuwarden backtest: {exc}", file=err)
        return EXIT_BAD_INPUT
    if args.format == "json":
        json.dump(_json(result), out, indent=2)
        out.write("\n")
    else:
        _table(result, out)
    return EXIT_OK


def _json(result: BacktestResult) -> dict[str, object]:
    quality = result.quality
    return {
        "gpus": result.gpus,
        "trace_seconds": result.trace_seconds,
        "cycles": result.cycles,
        "rules": list(result.rules),
        "not_implemented": list(result.not_implemented),
        "idle_gpu_hours": result.idle_gpu_hours,
        "wasted_usd": result.wasted_usd,
        "incidents": [
            {
                "rule": i.rule,
                "subject": i.subject,
                "opened_seconds": i.opened,
                "resolved_seconds": i.resolved,
                "idle_gpu_hours": i.idle_gpu_hours,
                "wasted_usd": i.wasted_usd,
            }
            for i in result.incidents
        ],
        "quality": None
        if quality is None
        else {
            "labels": quality.labels,
            "incidents": quality.incidents,
            "precision": quality.precision,
            "recall": quality.recall,
            "delays_seconds": list(quality.delays_seconds),
        },
    }


def _table(result: BacktestResult, out: TextIO) -> None:
    hours = result.trace_seconds / 3600
    print(
        f"replayed {result.gpus} GPUs over {hours:.1f} h of trace, {result.cycles} detection "
        f"cycles, rules: {', '.join(result.rules)}",
        file=out,
    )
    if result.not_implemented:
        print(f"not implemented (skipped): {', '.join(result.not_implemented)}", file=out)
    print(f"\n{'rule':<24} {'opened (h)':>10} {'resolved (h)':>12}  subject", file=out)
    for i in sorted(result.incidents, key=lambda i: (i.opened, i.subject)):
        resolved = "open" if i.resolved is None else f"{i.resolved / 3600:.2f}"
        print(f"{i.rule:<24} {i.opened / 3600:>10.2f} {resolved:>12}  {i.subject}", file=out)
    print(
        f"\n{len(result.incidents)} incidents; waste found: {result.idle_gpu_hours:.1f} idle "
        f"GPU-h, ${result.wasted_usd:,.2f} at on-demand prices",
        file=out,
    )
    quality = result.quality
    if quality is not None:
        precision = "-" if quality.precision is None else f"{quality.precision:.3f}"
        recall = "-" if quality.recall is None else f"{quality.recall:.3f}"
        delays = quality.delays_seconds
        median = f"{statistics.median(delays) / 60:.1f} min" if delays else "-"
        print(
            f"labels: {quality.labels}; precision {precision}, recall {recall}, "
            f"median delay {median}",
            file=out,
        )
