"""``gpuwarden backtest`` and ``gpuwarden rules test``: replay recorded telemetry through the rules.

Light on purpose: the CLI imports this module to build its parser (also on agent-only installs),
so the replay machinery is imported only when a command runs. Exit 0 on success, 2 on bad input
(data, labels or rules) with a message naming the file and line or key.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from gpuwarden.collector.backtest.data import Dataset, Label
    from gpuwarden.collector.backtest.replay import Backtest, RuleScore
    from gpuwarden.collector.rules.model import RuleSet

EXIT_OK, EXIT_BAD_INPUT = 0, 2


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _add_replay_options(parser: argparse.ArgumentParser, *, rules_help: str) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--data",
        type=Path,
        help="our trace CSV (optionally .gz) or a GenTD26 folder (docs/backtest.md)",
    )
    source.add_argument(
        "--prometheus",
        metavar="URL",
        help="a Prometheus-compatible HTTP API holding dcgm-exporter series (with --start, --end)",
    )
    parser.add_argument("--start", help="--prometheus: window start (Unix s, RFC 3339, or now-7d)")
    parser.add_argument("--end", help="--prometheus: window end (default: now)")
    parser.add_argument(
        "--bearer-token-file", type=Path, help="--prometheus: file holding a bearer token"
    )
    parser.add_argument(
        "--timeout",
        type=_positive,
        default=60.0,
        metavar="SECONDS",
        help="--prometheus: per-request timeout (default: 60)",
    )
    parser.add_argument(
        "--points-per-query",
        type=int,
        default=10_000,
        metavar="N",
        help="--prometheus: points per series per query_range page (max 11000; default 10000)",
    )
    parser.add_argument("--rules", type=Path, action="append", metavar="PATH", help=rules_help)
    parser.add_argument(
        "--runbooks-dir", type=Path, help="folder of the rules' runbooks (default: packaged)"
    )
    parser.add_argument("--pods", type=int, help="GenTD26: replay the N pods with most samples")
    parser.add_argument(
        "--cycle",
        type=_positive,
        default=60.0,
        metavar="SECONDS",
        help="simulated seconds between detection cycles (default: 60, the rules' natural cycle)",
    )
    parser.add_argument(
        "--step", type=int, metavar="SECONDS", help="store step (default: from the data's cadence)"
    )
    parser.add_argument(
        "--labels", type=Path, help="CSV 'subject,start,end[,rule]' of truth windows: adds P/R"
    )
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def add_backtest_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``backtest`` to the CLI's subcommands."""
    parser = subparsers.add_parser(
        "backtest",
        help="replay recorded telemetry through the rules on a simulated clock",
        description="Replay recorded GPU telemetry through the collector and the detection engine "
        "on a simulated clock; print the incidents, the waste they found, and with --labels "
        "precision, recall and detection delay per rule.",
    )
    _add_replay_options(
        parser, rules_help="rule file or folder, repeatable (default: the packaged rules)"
    )


def add_rules_test_parser(
    rules_subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Add ``rules test RULE --data FILE`` to the ``rules`` subcommands."""
    parser = rules_subparsers.add_parser(
        "test",
        help="run one rule on recorded data and print what it would have found",
        description="Replay recorded telemetry through one rule of the rule set (the same "
        "machinery as 'gpuwarden backtest').",
    )
    parser.add_argument("rule", metavar="RULE", help="the rule's id")
    _add_replay_options(
        parser, rules_help="rule file or folder holding RULE (default: the packaged rules)"
    )


def run_backtest(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``gpuwarden backtest`` from parsed arguments; return the exit code."""
    return _run(args, None, out or sys.stdout, err or sys.stderr)


def run_rules_test(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``gpuwarden rules test RULE`` from parsed arguments; return the exit code."""
    return _run(args, str(args.rule), out or sys.stdout, err or sys.stderr)


def run_backtest_command(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Either command, told apart by ``args.rule`` (the name the CLI hooks call today)."""
    if getattr(args, "rule", None) is not None:
        return run_rules_test(args, out=out, err=err)
    return run_backtest(args, out=out, err=err)


def _load_rules(args: argparse.Namespace, rule: str | None) -> RuleSet:
    from gpuwarden.collector.backtest.data import DataError
    from gpuwarden.collector.backtest.replay import with_rules
    from gpuwarden.collector.detect.catalog import DETECTORS, load_rules
    from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir

    paths = list(args.rules or [default_rules_dir()])
    for path in paths:
        if not path.exists():
            raise DataError(f"{path}: no such rules file or folder")
    rules = load_rules(paths, runbooks_dir=args.runbooks_dir or default_runbooks_dir())
    if rule is None:
        return rules
    found = rules.get(rule)
    if found is None:
        known = ", ".join(r.id for r in rules.rules)
        raise DataError(f"rule {rule!r} is not in {', '.join(map(str, paths))}; known: {known}")
    if DETECTORS[found.detector].run is None:
        raise DataError(f"rule {rule!r}: detector {found.detector!r} takes pushed alerts, not data")
    if not found.enabled:
        raise DataError(f"rule {rule!r} is disabled in its rules file")
    return with_rules(rules, [rule])


def _dataset(args: argparse.Namespace) -> Dataset:
    from gpuwarden.collector.backtest.data import DataError, load_dataset
    from gpuwarden.collector.backtest.prometheus import PromQuery, load_prometheus, parse_time

    if args.prometheus is None:
        for option in ("start", "end", "bearer_token_file"):
            if getattr(args, option) is not None:
                raise DataError(f"--{option.replace('_', '-')}: only with --prometheus")
        return load_dataset(args.data, pods=args.pods)
    if args.pods is not None:
        raise DataError("--pods: only for a GenTD26 folder")
    if args.start is None:
        raise DataError("--prometheus needs --start")
    now = time.time()
    query = PromQuery(
        url=args.prometheus,
        start_seconds=parse_time(args.start, now=now, option="--start"),
        end_seconds=parse_time(args.end or "now", now=now, option="--end"),
        step_seconds=args.step or 60,
        bearer_token_file=args.bearer_token_file,
        timeout_seconds=args.timeout,
        points_per_query=args.points_per_query,
    )
    return load_prometheus(query)


def _run(args: argparse.Namespace, rule: str | None, out: TextIO, err: TextIO) -> int:
    from gpuwarden.collector.backtest.data import DataError, load_labels
    from gpuwarden.collector.backtest.replay import run_backtest as replay
    from gpuwarden.collector.backtest.replay import score

    command = "gpuwarden rules test" if rule else "gpuwarden backtest"
    began = time.perf_counter()
    try:
        if args.step is not None and (args.step <= 0 or 60 % args.step):
            raise DataError(f"--step: must divide 60, got {args.step}")
        rules = _load_rules(args, rule)
        dataset = _dataset(args)
        labels = load_labels(args.labels) if args.labels else None
        result = replay(
            dataset,
            rules,
            cycle_seconds=args.cycle,
            step_seconds=args.step,
            progress=not args.quiet and err.isatty(),
            progress_file=err,
        )
    except ValueError as exc:  # DataError, RuleError, or a value the store refused
        print(f"{command}: {exc}", file=err)
        return EXIT_BAD_INPUT
    # a truth window counts as found up to one cycle and one step after its end
    grace = args.cycle + result.step_seconds
    scores = score(result, labels, grace_seconds=grace) if labels is not None else None
    runtime = time.perf_counter() - began
    if args.format == "json":
        json.dump(_as_json(result, scores, runtime), out, indent=2)
        out.write("\n")
    else:
        out.write(_table(result, scores, labels, runtime))
    return EXIT_OK


def _waste_by_rule(result: Backtest) -> dict[str, tuple[float, float]]:
    waste: dict[str, tuple[float, float]] = {}
    for i in result.incidents:
        if i.waste_gpu_hours is not None:
            hours, usd = waste.get(i.rule_id, (0.0, 0.0))
            waste[i.rule_id] = (hours + i.waste_gpu_hours, usd + (i.waste_usd or 0.0))
    return waste


def _as_json(
    result: Backtest, scores: list[RuleScore] | None, runtime_seconds: float
) -> dict[str, object]:
    return {
        "data": result.data,
        "gpus": result.gpus,
        "jobs": result.jobs,
        "start_seconds": result.start_seconds,
        "end_seconds": result.end_seconds,
        "cycles": result.cycles,
        "cycle_seconds": result.cycle_seconds,
        "step_seconds": result.step_seconds,
        "rules": list(result.rules),
        "not_implemented": list(result.not_implemented),
        "failed_rules": list(result.failed_rules),
        "incidents": [
            {
                "rule": i.rule_id,
                "subject": i.subject,
                "opened_seconds": i.opened_seconds,
                "last_seen_seconds": i.last_seen_seconds,
                "resolved_seconds": i.resolved_seconds,
                "summary": i.summary,
                "waste_gpu_hours": i.waste_gpu_hours,
                "waste_usd": i.waste_usd,
            }
            for i in result.incidents
        ],
        "waste": {
            rule: {"gpu_hours": hours, "usd": usd}
            for rule, (hours, usd) in _waste_by_rule(result).items()
        },
        "scores": None
        if scores is None
        else [
            {
                "rule": s.rule_id,
                "incidents": s.incidents,
                "true_incidents": s.true_incidents,
                "labels": s.labels,
                "labels_found": s.labels_found,
                "precision": s.precision,
                "recall": s.recall,
                "delays_seconds": list(s.delays_seconds),
            }
            for s in scores
        ],
        "runtime_seconds": round(runtime_seconds, 3),
    }


def _hours(seconds: float) -> str:
    sign = "-" if seconds < 0 else ""
    minutes = round(abs(seconds) / 60)
    return f"{sign}{minutes // 60}h{minutes % 60:02d}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _table(
    result: Backtest,
    scores: list[RuleScore] | None,
    labels: tuple[Label, ...] | None,
    runtime_seconds: float,
) -> str:
    start = result.start_seconds
    span = result.end_seconds - start
    lines = [
        f"data: {result.data} — {result.gpus} GPUs, {result.jobs} jobs, "
        f"{start:.0f} .. {result.end_seconds:.0f} s ({_hours(span)} simulated)",
        f"replay: {result.cycles} cycles every {result.cycle_seconds:g} s, "
        f"store step {result.step_seconds} s, {runtime_seconds:.1f} s wall time",
        f"rules run: {', '.join(result.rules) or 'none'}",
    ]
    if result.not_implemented:
        lines.append(
            f"rules skipped (detector not implemented): {', '.join(result.not_implemented)}"
        )
    if result.failed_rules:
        lines.append(
            f"rules that failed in some cycle (see the log): {', '.join(result.failed_rules)}"
        )
    lines.append("")
    lines.append(f"incidents: {len(result.incidents)} (times: data seconds, +h:mm from its start)")
    if result.incidents:
        lines.append(
            f"  {'rule':22} {'subject':36} {'opened':>18} {'resolved':>18} {'GPU-h':>7} {'$':>8}"
        )
    for i in result.incidents:
        opened = f"{i.opened_seconds:.0f} +{_hours(i.opened_seconds - start)}"
        resolved = (
            "open at end"
            if i.resolved_seconds is None
            else f"{i.resolved_seconds:.0f} +{_hours(i.resolved_seconds - start)}"
        )
        hours = "-" if i.waste_gpu_hours is None else f"{i.waste_gpu_hours:.2f}"
        usd = "-" if i.waste_usd is None else f"{i.waste_usd:.2f}"
        lines.append(
            f"  {i.rule_id:22} {i.subject:36} {opened:>18} {resolved:>18} {hours:>7} {usd:>8}"
        )
    waste = _waste_by_rule(result)
    lines.append("")
    lines.append("waste found (from the incidents' evidence; rules may overlap):")
    if not waste:
        lines.append("  none")
    for rule, (gpu_hours, dollars) in sorted(waste.items()):
        lines.append(f"  {rule:22} {gpu_hours:10.2f} GPU-h  ${dollars:,.2f}")
    if scores is not None and labels is not None:
        lines.append("")
        lines.append(f"against {len(labels)} truth windows:")
        lines.append(
            f"  {'rule':22} {'incidents':>9} {'true':>5} {'labels':>6} {'found':>5} "
            f"{'precision':>9} {'recall':>6}  delay (min / median / max)"
        )
        for s in scores:
            delays = sorted(s.delays_seconds)
            delay = (
                f"{_hours(delays[0])} / {_hours(delays[len(delays) // 2])} / {_hours(delays[-1])}"
                if delays
                else "-"
            )
            lines.append(
                f"  {s.rule_id:22} {s.incidents:9d} {s.true_incidents:5d} {s.labels:6d} "
                f"{s.labels_found:5d} {_ratio(s.precision):>9} {_ratio(s.recall):>6}  {delay}"
            )
    return "\n".join(lines) + "\n"
