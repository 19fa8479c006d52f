"""Fairness on the real Slurm with accounting (slurmctld + slurmd + slurmdbd + MariaDB).

Team ``hogs`` fills both fake GPUs; team ``waiters`` submits two jobs that wait, and one on the
``urgent`` partition that preempts (requeues) a ``hogs`` job. Then:

- ``report fairness --sacct`` shows, per team, the GPU-hours, share, queue wait p50/p95, pending
  jobs and preemptions that the scheduler's own ``sacct`` rows give (read here independently,
  from ``sacct --parsable2`` with Unix times, not the JSON the report reads), field by field;
- the collector, polling ``squeue`` like in production, opens a ``team-starved`` incident for
  ``waiters`` naming ``hogs`` as the team over its share.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuwarden.collector.accounting.report import add_report_parser, run_report
from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.detect.catalog import load_rules
from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.fairness.settings import FairnessSettings
from gpuwarden.collector.jobs.runs import run_from_job
from gpuwarden.collector.jobs.slurm import SlurmJobSource
from gpuwarden.collector.jobs.slurm_sacct import sacct_time
from gpuwarden.collector.rules.loader import default_rules_dir, default_runbooks_dir
from tests.slurm.cluster import SlurmCluster

pytestmark = pytest.mark.slurm
TIMEOUT_SECONDS = 60.0
LONG = "#!/bin/sh\nsleep 600\n"
SHORT = "#!/bin/sh\nsleep 2\n"
TARGETS = {"hogs": 0.5, "waiters": 0.5}
MIN_WAIT_SECONDS = 5.0
FIELDS = ("JobID", "Account", "State", "Eligible", "Start", "End", "AllocTRES", "ReqTRES")


def sacct_rows(cluster: SlurmCluster, since: float, until: float) -> list[dict[str, str]]:
    """``sacct``'s own rows for the window: every attempt, times as Unix seconds."""
    env = {**cluster.env(), "SLURM_TIME_FORMAT": "%s"}
    args = [
        "sacct",
        "--allusers",
        "--duplicates",
        "--allocations",
        "--parsable2",
        "--noheader",
        f"--starttime={sacct_time(since)}",
        f"--endtime={sacct_time(until)}",
        f"--format={','.join(FIELDS)}",
    ]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout
    return [dict(zip(FIELDS, line.split("|"), strict=True)) for line in out.splitlines()]


def unix(text: str) -> float | None:
    return float(text) if text.isdigit() and int(text) > 0 else None


def gpus(row: dict[str, str]) -> int:
    for tres in (row["AllocTRES"], row["ReqTRES"]):
        for item in tres.split(","):
            if item.startswith("gres/gpu="):
                return int(item.partition("=")[2])
    return 0


def expected(rows: list[dict[str, str]], since: float, until: float) -> dict[str, Any]:
    """Per account, the figures as the scheduler's rows give them (the definitions of
    docs/fairness.md, computed here without the collector's code)."""
    teams: dict[str, Any] = {}
    for row in rows:
        team = teams.setdefault(
            row["Account"],
            {"gpu_seconds": 0.0, "waits": [], "preempted": 0, "lost": 0.0, "pending": 0},
        )
        eligible, start, end = unix(row["Eligible"]), unix(row["Start"]), unix(row["End"])
        if start is not None and start < until:
            stop = min(end if end is not None else until, until)
            team["gpu_seconds"] += gpus(row) * max(0.0, stop - max(start, since))
            if start >= since and eligible is not None:
                team["waits"].append(start - eligible)
        elif row["State"] == "PENDING" and eligible is not None and eligible < until:
            team["waits"].append(until - eligible)
            team["pending"] += 1
        if row["State"] == "PREEMPTED" and end is not None and since <= end < until:
            assert start is not None
            team["preempted"] += 1
            team["lost"] += gpus(row) * (end - start)
    return teams


def report_json(cluster: SlurmCluster, config: Path, since: float, until: float) -> Any:
    parser = argparse.ArgumentParser()
    add_report_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        [
            "report",
            "fairness",
            "--sacct",
            "--slurm-conf",
            str(cluster.conf_path),
            "--config",
            str(config),
            "--since",
            f"{until - since:.0f}s",
            "--until",
            f"{until:.0f}",
            "--format",
            "json",
        ]
    )
    out = io.StringIO()
    assert run_report(args, out=out) == 0
    return json.loads(out.getvalue())


def wait_until(moment: float) -> None:
    """Let the wall clock pass ``moment`` (queue waits are wall-clock time)."""
    while time.time() < moment:
        time.sleep(0.2)


def test_report_matches_sacct_and_the_starved_team_is_named_with_the_hog(
    slurm_accounting_cluster: SlurmCluster, tmp_path: Path
) -> None:
    cluster = slurm_accounting_cluster
    cluster.add_accounts("hogs", "waiters")
    since = float(int(time.time()) - 1)
    jobs: list[str] = []
    try:
        jobs += [cluster.sbatch(LONG, "--account=hogs", "--gres=gpu:1", "--requeue") for _ in "ab"]
        for job in jobs:
            cluster.wait_for_state(job, {"RUNNING"}, TIMEOUT_SECONDS)
        waiting = [cluster.sbatch(LONG, "--account=waiters", "--gres=gpu:1") for _ in range(2)]
        jobs += waiting
        urgent = cluster.sbatch(SHORT, "--account=waiters", "--gres=gpu:1", "--partition=urgent")
        jobs.append(urgent)
        cluster.wait_for_state(urgent, {"COMPLETED"}, TIMEOUT_SECONDS)
        # The waiters' pending job must have waited well past the rule's ratio x the hogs'
        # waits (the scheduler's latency, longer on a loaded machine) and its minimum.
        source = SlurmJobSource(cluster="gwtest", env=cluster.env())
        runs = {run.key.rsplit(":", 1)[1]: run for run in map(run_from_job, source.jobs(0))}
        hog_waits = [s - (runs[j].queued_time or s) for j in jobs[:2] if (s := runs[j].start_time)]
        pending = [q for j in waiting if runs[j].start_time is None and (q := runs[j].queued_time)]
        assert pending, "a waiters job should still be pending"
        wait_until(max(pending) + max(2 * MIN_WAIT_SECONDS, 4 * max(hog_waits, default=0) + 1))

        # the collector, on squeue as in production
        config = CollectorConfig(
            database=tmp_path / "c.db", fairness=FairnessSettings(targets=TARGETS)
        )
        svc = build_service(config, job_sources=[("slurm", source)])
        assert svc.poll_jobs() == len(jobs)
        shipped = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
        rule = shipped.get("team-starved")
        assert rule is not None
        rule = dataclasses.replace(
            rule,
            parameters={
                **rule.parameters,
                "window_seconds": 600.0,
                "min_wait_seconds": MIN_WAIT_SECONDS,
            },
        )
        engine = DetectionEngine(
            svc.detection_view, dataclasses.replace(shipped, rules=(rule,)), storage=svc.storage
        )
        assert engine.run_cycle().opened == 1
        (incident,) = svc.storage.incidents()
        assert incident.rule_id == "team-starved"
        assert incident.evidence["team"] == "waiters"
        assert incident.evidence["over_share_team"] == "hogs"
        assert "team waiters is starved" in str(incident.evidence["summary"])
        assert "team hogs holds" in str(incident.evidence["summary"])
        svc.storage.close()

        # report fairness against sacct's own rows, over one fixed window
        until = float(int(time.time()))
        path = tmp_path / "collector.yaml"
        path.write_text(f"fairness: {{targets: {json.dumps(TARGETS)}}}\n")
        doc = report_json(cluster, path, since, until)
        want = expected(sacct_rows(cluster, since, until), since, until)
    finally:
        for job in jobs:
            cluster.run(["scancel", job], check=False)
    # the scenario happened: a hogs job preempted, waiters' jobs pending
    assert want["hogs"]["preempted"] == 1
    assert want["waiters"]["pending"] >= 1
    total = sum(team["gpu_seconds"] for team in want.values())
    teams = {team["group"]: team for team in doc["teams"]}
    assert set(teams) == set(want)
    for name, team in want.items():
        got = teams[name]
        assert got["gpu_seconds"] == pytest.approx(team["gpu_seconds"], abs=1e-6), name
        assert got["share_used_ratio"] == pytest.approx(team["gpu_seconds"] / total, abs=1e-6)
        assert got["share_target_ratio"] == TARGETS[name]
        assert got["waits"] == len(team["waits"]), name
        assert got["pending"] == team["pending"], name
        for field, q in (("wait_p50_seconds", 0.5), ("wait_p95_seconds", 0.95)):
            assert got[field] == pytest.approx(float(np.quantile(team["waits"], q)), abs=1e-6)
        assert got["preemptions"] == team["preempted"], name
        assert got["preempted_gpu_hours"] == pytest.approx(team["lost"] / 3600, abs=1e-6), name
    assert (
        teams["waiters"]["share_used_ratio"]
        < TARGETS["waiters"]
        < teams["hogs"]["share_used_ratio"]
    )
    assert os.environ.get("SLURM_CONF") != str(cluster.conf_path)  # the report got it by flag
