"""``gpuwarden report fairness``: share used vs target, queue waits and preemptions per team and
per queue over a window (:mod:`~gpuwarden.collector.fairness.figures`).

The attempts come from one of two places:

- ``--sacct``: Slurm's accounting (``sacct --json --duplicates``, :mod:`~gpuwarden.collector.
  jobs.slurm_sacct`): every attempt, eligible times, preemptions as the scheduler recorded them.
  ``SLURM_CONF`` from the environment, or ``--slurm-conf``.
- ``--db``: the jobs the collector stored from its job sources (``squeue``, Kubernetes pods, the
  API): one record per job, its latest attempt, no eligible time (waits count from submission).
  With ``--kueue``, the Kueue Workloads are read (as they are now) through the Kubernetes client
  of ``--config`` (``kubernetes_kubeconfig`` / ``kubernetes_in_cluster``): a job with a Workload
  waits from its creation to its admission and its pods are not counted again
  (:mod:`~gpuwarden.collector.fairness.kueue`).

Targets are the ``fairness.targets`` of the collector's config (``--config``).

Light on purpose: the CLI imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from gpuwarden.collector.config import CollectorConfig
    from gpuwarden.collector.fairness.figures import FairnessFigures, GroupFigures
    from gpuwarden.collector.jobs.kueue_workloads import KueueWorkload
    from gpuwarden.collector.jobs.runs import QueueRun

EXIT_OK, EXIT_ERROR = 0, 1
FORMATS = ("table", "csv", "json")
_TABLE_COLUMNS = (  # GroupFigures field, heading, format
    ("gpu_hours", "GPU-h", "{:.3f}"),
    ("share_used_ratio", "share", "{:.3f}"),
    ("share_target_ratio", "target", "{:.3f}"),
    ("runs", "runs", "{}"),
    ("pending", "pending", "{}"),
    ("wait_p50_seconds", "wait p50 s", "{:.1f}"),
    ("wait_p95_seconds", "wait p95 s", "{:.1f}"),
    ("preemptions", "preempted", "{}"),
    ("preempted_gpu_hours", "lost GPU-h", "{:.3f}"),
)


def group_record(figures: GroupFigures) -> dict[str, object]:
    """A group's figures as a JSON-ready dict (floats rounded to 6 decimals)."""
    record = {**asdict(figures), "gpu_hours": figures.gpu_hours}
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in record.items()}


def _table(kind: str, groups: tuple[GroupFigures, ...], out: TextIO) -> None:
    rows = [[kind, *(heading for _, heading, _ in _TABLE_COLUMNS)]]
    for group in groups:
        values = [getattr(group, name) for name, _, _ in _TABLE_COLUMNS]
        cells = [
            "-" if v is None else fmt.format(v)
            for v, (_, _, fmt) in zip(values, _TABLE_COLUMNS, strict=True)
        ]
        rows.append([group.group, *cells])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.write("  ".join(cells).rstrip() + "\n")


def write_report(figures: FairnessFigures, fmt: str, out: TextIO, *, source: str) -> None:
    """Print ``figures`` as a table, CSV (one row per team and queue) or JSON."""
    if fmt == "table":
        out.write(f"fairness from {source}, {figures.gpu_seconds / 3600:.3f} GPU-h used\n\n")
        _table("team", figures.teams, out)
        out.write("\n")
        _table("queue", figures.queues, out)
        out.write(
            "\nwaits: start - eligible (or submit); pending jobs count with their wait so far\n"
        )
    elif fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        fields = ["kind", *group_record(figures.teams[0]).keys()] if figures.teams else ["kind"]
        writer.writerow(fields)
        for kind, groups in (("team", figures.teams), ("queue", figures.queues)):
            for group in groups:
                record = group_record(group)
                writer.writerow(
                    [kind, *("" if record[f] is None else record[f] for f in fields[1:])]
                )
    elif fmt == "json":
        doc = {
            "since": figures.since,
            "until": figures.until,
            "source": source,
            "gpu_hours": round(figures.gpu_seconds / 3600, 6),
            "teams": [group_record(g) for g in figures.teams],
            "queues": [group_record(g) for g in figures.queues],
        }
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def add_fairness_parser(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``report fairness`` to ``report``'s subcommands."""
    from gpuwarden.collector.accounting.report import _duration_arg

    fairness = kinds.add_parser(
        "fairness",
        help="GPU share used vs target, queue wait p50/p95 and preemptions per team and queue",
        description="Fairness over a window ending now (or --until), from Slurm accounting "
        "(--sacct) or from the jobs the collector stored (--db).",
    )
    source = fairness.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--sacct", action="store_true", help="ask Slurm's accounting (sacct --json; SLURM_CONF)"
    )
    source.add_argument(
        "--db", help="the collector's database: the SQLite file, or a postgresql:// URL"
    )
    fairness.add_argument("--slurm-conf", type=Path, help="the slurm.conf sacct reads")
    fairness.add_argument(
        "--kueue",
        action="store_true",
        help="with --db: add the Kueue Workloads, read now through the Kubernetes client of "
        "--config (waits from Workload creation to admission)",
    )
    fairness.add_argument(
        "--config", type=Path, help="the collector's config file, whose fairness.targets apply"
    )
    fairness.add_argument(
        "--since", type=_duration_arg, default=86400.0, help="window length, e.g. 24h, 7d"
    )
    fairness.add_argument(
        "--until", default="now", help="window end: now, Unix seconds, or 2h (ago)"
    )
    fairness.add_argument("--format", choices=FORMATS, default="table", dest="fmt")


def _runs(
    args: argparse.Namespace, since: float, until: float, config: CollectorConfig | None = None
) -> list[QueueRun]:
    if args.sacct:
        from gpuwarden.collector.jobs.slurm_sacct import SlurmAccounting

        env = dict(os.environ)
        if args.slurm_conf is not None:
            env["SLURM_CONF"] = str(args.slurm_conf)
        return SlurmAccounting(cluster="slurm", env=env).runs(since, until)
    from gpuwarden.collector.accounting.report import _open
    from gpuwarden.collector.jobs.runs import run_from_job
    from gpuwarden.collector.storage.urls import is_postgresql_url

    if not is_postgresql_url(args.db) and not Path(args.db).is_file():
        raise FileNotFoundError(f"{args.db}: no such database")
    with _open(args.db) as storage:
        jobs = storage.jobs(since=since)
    if not args.kueue:
        return [run_from_job(job) for job in jobs]
    from gpuwarden.collector.fairness.kueue import runs_with_workloads

    return runs_with_workloads(jobs, _workloads(config), since=since)


def _workloads(config: CollectorConfig | None) -> list[KueueWorkload]:
    """The Kueue Workloads, through the Kubernetes client the collector's config names."""
    from gpuwarden.collector.jobs import JobSourceError
    from gpuwarden.collector.jobs.kube_client import KubeApis, load_client
    from gpuwarden.collector.jobs.kueue_workloads import KueueWorkloadReader

    if config is None or (
        config.kubernetes_kubeconfig is None and not config.kubernetes_in_cluster
    ):
        raise JobSourceError(
            "--kueue needs --config with kubernetes_kubeconfig or kubernetes_in_cluster"
        )
    client = load_client(
        kubeconfig=config.kubernetes_kubeconfig,
        context=config.kubernetes_context,
        in_cluster=config.kubernetes_in_cluster,
    )
    with client:
        api = KubeApis(client).custom_objects()
        return KueueWorkloadReader(api, namespace=config.kubernetes_namespace).workloads()


def run_fairness(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Run ``gpuwarden report fairness`` from parsed arguments; return the exit code."""
    from gpuwarden.collector.accounting.report import parse_time
    from gpuwarden.collector.config import ConfigError, load_collector_config
    from gpuwarden.collector.fairness.figures import fairness_figures
    from gpuwarden.collector.jobs import JobSourceError
    from gpuwarden.collector.storage.base import StorageError

    try:
        until = parse_time(args.until, time.time())
        config = load_collector_config(args.config) if args.config else None
        targets = config.fairness.targets if config is not None else {}
        runs = _runs(args, until - args.since, until, config)
    except (ValueError, ConfigError, JobSourceError, StorageError, OSError) as exc:
        print(f"gpuwarden report fairness: {exc}", file=sys.stderr)
        return EXIT_ERROR
    figures = fairness_figures(runs, since=until - args.since, until=until, targets=targets)
    source = "slurm accounting (sacct)" if args.sacct else f"stored jobs ({args.db})"
    write_report(figures, args.fmt, out if out is not None else sys.stdout, source=source)
    return EXIT_OK
