"""The ``gpuwarden`` command line. Subcommands import what they need lazily.

``gpuwarden agent`` must work on a node where only the agent part is installed, so this module
imports neither the collector nor aiohttp at the top.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuwarden import __version__

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + 13
"""What a shell reports for a command that SIGPIPE ended (``gpuwarden agent --once | head -1``)."""


LIGHT_COMMANDS = ("agent", "catalog")
"""Subcommands whose parser is built alone: building every parser imports each collector
command's module (rules, policies, budgets, silences, snappy for backtest ...), which a node
agent would then carry for its whole life (about 3 MiB of its RSS)."""


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (None: none, e.g. ``gpuwarden --help``)."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def _parser(*, light: bool = False) -> argparse.ArgumentParser:
    """The command line's parser; ``light``: only the :data:`LIGHT_COMMANDS`."""
    parser = argparse.ArgumentParser(
        prog="gpuwarden",
        description="Observability and SLO automation for GPU fleets.",
    )
    parser.add_argument("--version", action="version", version=f"gpuwarden {__version__}")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    agent = sub.add_parser(
        "agent",
        help="run the node agent (or 'agent install' to install it as a systemd service)",
        description="Run the node agent: sample GPUs and the host, attribute processes to jobs, "
        "push OTLP to the collector (spooling to disk while it is away), serve /healthz and "
        "/metrics. 'gpuwarden agent install' writes a systemd unit and a commented config. "
        "Without a GPU: 'gpuwarden agent --source simulated --once' prints one round and "
        "touches neither the collector nor the spool.",
    )
    agent.add_argument("action", nargs="?", default="run", choices=["run", "install"])
    agent.add_argument("--config", type=Path, help="agent config file (YAML)")
    agent.add_argument(
        "--source", choices=["nvml", "simulated", "replay"], help="GPU source (default: nvml)"
    )
    agent.add_argument("--scenario", help="simulated scenario: a preset name or a YAML file")
    agent.add_argument(
        "--replay",
        type=Path,
        help="trace to replay: CSV with time_seconds,gpu_uuid,[name,]<GPU fields> "
        "(no node/job columns), or a GenTD26 duty-cycle file",
    )
    agent.add_argument("--interval", type=float, help="seconds between sample rounds")
    agent.add_argument(
        "--record",
        type=Path,
        metavar="TRACE.csv",
        help="also write every round to a trace (.csv or .csv.gz) that 'gpuwarden backtest "
        "--data' and '--source replay' read",
    )
    agent.add_argument("--collector", help="OTLP/HTTP endpoint, e.g. http://host:4318/v1/metrics")
    agent.add_argument("--nvml-library", type=Path, help="absolute path of libnvidia-ml.so.1")
    agent.add_argument("--spool-dir", type=Path, help="directory of the unsent-request spool")
    agent.add_argument(
        "--once",
        action="store_true",
        help="take one round, print it as JSON and exit; nothing is pushed or spooled "
        "unless --push is given too",
    )
    agent.add_argument(
        "--push",
        action="store_true",
        help="with --once: also push the round to the configured collector (spooling it in "
        "spool.directory if the collector is away)",
    )
    install = agent.add_argument_group("install options")
    install.add_argument("--unit-dir", type=Path, default=Path("/etc/systemd/system"))
    install.add_argument("--config-path", type=Path, default=Path("/etc/gpuwarden/agent.yaml"))
    install.add_argument("--executable", help="gpuwarden executable for ExecStart")
    install.add_argument("--force", action="store_true", help="overwrite existing files")
    install.add_argument("--no-verify", action="store_true", help="skip systemd-analyze verify")

    if not light:
        _add_collector_parsers(sub)
    catalog = sub.add_parser("catalog", help="print the telemetry catalog")
    catalog.add_argument("--format", choices=["markdown", "names"], default="markdown")
    return parser


def _add_collector_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Every subcommand of the collector's side (each imports its module for its arguments)."""
    collector = sub.add_parser(
        "collector",
        help="run the central collector (or 'collector token' to make a bearer token)",
        description="Run the central collector. 'gpuwarden collector token --role R --subject S' "
        "prints a new token and the tokens_file line holding its hash.",
    )
    collector.add_argument("action", nargs="?", default="serve", choices=["serve", "token"])
    collector.add_argument("--config", type=Path, help="collector config file (YAML)")
    collector.add_argument("--host", help="listen address (default 127.0.0.1)")
    collector.add_argument("--port", type=int, help="listen port (default 4318)")
    from gpuwarden.collector.cli.tokens import add_token_arguments

    add_token_arguments(collector)

    demo = sub.add_parser(
        "demo",
        help="the whole loop on a simulated 4 x 8-GPU fleet: detection, remediation, report",
    )
    demo.add_argument(
        "--duration", type=float, default=120.0, help="wall seconds to run (default 120)"
    )
    demo.add_argument("--interval", type=float, default=1.0, help="agent sample interval")
    demo.add_argument(
        "--speed",
        type=float,
        default=60.0,
        help="how much faster workloads run; rule windows shrink alike (default 60)",
    )
    demo.add_argument("--db", type=Path, help="collector database (default: in the temp dir)")
    demo.add_argument("--port", type=int, help="collector port (default: a free one)")
    demo.add_argument(
        "--linger",
        type=float,
        default=0.0,
        help="keep serving the status page this many seconds after the report",
    )

    from gpuwarden.collector.accounting.report import add_report_parser

    add_report_parser(sub)
    _add_rules_and_policies_parsers(sub)
    from gpuwarden.collector.cli.actions import add_actions_parser, add_incidents_parser

    add_incidents_parser(sub)
    add_actions_parser(sub)
    from gpuwarden.collector.cli.silences import add_silence_parser

    add_silence_parser(sub)
    from gpuwarden.collector.backtest.cli import add_backtest_parser

    add_backtest_parser(sub)


#: The ``gpuwarden agent`` flags that override a config key: dotted key → (flag, its dest).
_AGENT_FLAGS: dict[str, tuple[str, str]] = {
    "source": ("--source", "source"),
    "scenario": ("--scenario", "scenario"),
    "replay_path": ("--replay", "replay"),
    "interval_seconds": ("--interval", "interval"),
    "collector.endpoint": ("--collector", "collector"),
    "nvml_library_path": ("--nvml-library", "nvml_library"),
    "spool.directory": ("--spool-dir", "spool_dir"),
}


def _add_rules_and_policies_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    from gpuwarden.collector.cli.policies import add_policies_parser
    from gpuwarden.collector.cli.rules import add_rules_parser

    add_rules_parser(sub)
    add_policies_parser(sub)


def _run_agent(args: argparse.Namespace) -> int:
    from gpuwarden.agent.config import ConfigError, load_agent_config

    if args.push and not args.once:
        print(
            "gpuwarden agent: --push only applies to --once (the agent always pushes); "
            "drop --push or add --once",
            file=sys.stderr,
        )
        return EXIT_USAGE
    overrides = {key: getattr(args, dest) for key, (_, dest) in _AGENT_FLAGS.items()}
    flags = {key: flag for key, (flag, _) in _AGENT_FLAGS.items()}
    try:
        config = load_agent_config(args.config, os.environ, overrides, flags=flags)
    except ConfigError as exc:
        print(f"gpuwarden agent: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.action == "install":
        from gpuwarden.agent.install import install

        return install(args, config_source=args.config)
    from gpuwarden.agent.main import run_agent

    return run_agent(config, once=args.once, push=args.push, record=args.record)


def _run_collector(args: argparse.Namespace) -> int:
    if args.action == "token":
        from gpuwarden.collector.cli.tokens import main

        return main(args)
    from gpuwarden.collector.cli.collector import run_collector

    return run_collector(args.config, host=args.host, port=args.port, environ=os.environ)


def _run_demo(args: argparse.Namespace) -> int:
    from gpuwarden.demo import run_demo

    return run_demo(
        duration_seconds=args.duration,
        interval_seconds=args.interval,
        speed=args.speed,
        db=args.db,
        linger_seconds=args.linger,
        port=args.port,
    )


def _run_rules(args: argparse.Namespace) -> int:
    from gpuwarden.collector.cli.rules import run_rules

    return run_rules(args)


def _run_policies(args: argparse.Namespace) -> int:
    from gpuwarden.collector.cli.policies import run_policies

    return run_policies(args)


def _run_incidents(args: argparse.Namespace) -> int:
    from gpuwarden.collector.cli.actions import run_incidents

    return run_incidents(args, os.environ)


def _run_actions(args: argparse.Namespace) -> int:
    from gpuwarden.collector.cli.actions import run_actions

    return run_actions(args, os.environ)


def _run_silence(args: argparse.Namespace) -> int:
    from gpuwarden.collector.cli.silences import run_silence

    return run_silence(args, os.environ)


def _run_backtest(args: argparse.Namespace) -> int:
    from gpuwarden.collector.backtest.cli import run_backtest_command

    return run_backtest_command(args)


def _run_report(args: argparse.Namespace) -> int:
    from gpuwarden.collector.accounting.report import run_report

    return run_report(args)


def _run_catalog(args: argparse.Namespace) -> int:
    from gpuwarden.agent.catalog import metric_names, render_markdown

    if args.format == "names":
        print("\n".join(sorted(metric_names())))
    else:
        print(render_markdown(), end="")
    return EXIT_OK


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "agent": _run_agent,
    "collector": _run_collector,
    "demo": _run_demo,
    "rules": _run_rules,
    "policies": _run_policies,
    "incidents": _run_incidents,
    "actions": _run_actions,
    "silence": _run_silence,
    "report": _run_report,
    "backtest": _run_backtest,
    "catalog": _run_catalog,
}
"""Each subcommand's runner; each imports what it needs (the agent must stay light)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuwarden`` console script."""
    words = sys.argv[1:] if argv is None else list(argv)
    args = _parser(light=_command_of(words) in LIGHT_COMMANDS).parse_args(words)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code = _COMMANDS[args.command](args)
        sys.stdout.flush()  # a reader that went away shows here, not at interpreter exit
    except BrokenPipeError:
        return _reader_gone()
    return code


def _reader_gone() -> int:
    """The reader of stdout closed the pipe (``| head``): stop quietly, as ``cat`` would.

    Python ignores SIGPIPE, so a write to a closed pipe raises instead of ending the process.
    stdout is pointed at ``/dev/null`` so the interpreter's final flush has nowhere to fail.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
