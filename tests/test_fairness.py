"""Fairness: the figures (shares, waits, preemptions) from scheduling attempts, the ``fairness:``
config section, ``sacct --json`` parsing, the team-starved / team-hogging detectors on a real
service, and ``report fairness`` from the stored jobs.

The real-Slurm comparison with ``sacct`` is ``test_fairness_slurm.py``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from gpuwarden.agent.schema import ConfigError
from gpuwarden.collector.accounting.report import add_report_parser, run_report
from gpuwarden.collector.config import load_collector_config
from gpuwarden.collector.detect.findings import Verdict
from gpuwarden.collector.fairness.figures import (
    NONE_GROUP,
    fairness_figures,
    used_seconds,
    wait_seconds,
)
from gpuwarden.collector.jobs import JobSourceError
from gpuwarden.collector.jobs.model import Job, JobState
from gpuwarden.collector.jobs.runs import QueueRun, job_queue, run_from_job
from gpuwarden.collector.jobs.slurm_cli import SlurmResult
from gpuwarden.collector.jobs.slurm_sacct import SlurmAccounting, parse_sacct_json
from gpuwarden.collector.service import CollectorService
from tests.detectors import make_rule, run_rule
from tests.test_detect_waste import T0, make_service

H = 3600.0
NOW = T0 + 10 * H


def run(team: str, queued: float, start: float | None = None, end: float | None = None,
        *, gpus: int = 1, eligible: float | None = None, preempted: bool = False,
        queue: str = "batch") -> QueueRun:  # fmt: skip
    return QueueRun(
        key=f"slurm:c:{team}{queued}",
        team=team,
        queue=queue,
        gpus=gpus,
        submit_time=queued,
        eligible_time=eligible,
        start_time=start,
        end_time=end,
        preempted=preempted,
    )


# --- the figures, table-driven ------------------------------------------------------------------

USED_CASES = [  # run, window, GPU-seconds inside it
    (run("a", 0, 10, 20, gpus=2), (0, 100), 20.0),
    (run("a", 0, 10, None, gpus=2), (0, 100), 180.0),  # running: up to the window's end
    (run("a", 0, 10, 200, gpus=1), (50, 100), 50.0),  # clipped on both sides
    (run("a", 0, None, None), (0, 100), 0.0),  # pending
    (run("a", 0, 150, 200), (0, 100), 0.0),  # after the window
]


@pytest.mark.parametrize(("queue_run", "window", "want"), USED_CASES)
def test_used_seconds_is_the_allocation_inside_the_window(queue_run, window, want):
    assert used_seconds(queue_run, *window) == want


WAIT_CASES = [  # run, window, wait
    (run("a", 10, 40, 90), (0, 100), 30.0),
    (run("a", 10, 40, 90, eligible=25), (0, 100), 15.0),  # from eligible, not submit
    (run("a", 10), (0, 100), 90.0),  # pending: its wait so far
    (run("a", -500), (0, 100), 600.0),  # pending since before the window: still waiting in it
    (run("a", -50, -10, 20), (0, 100), None),  # started before the window
    (run("a", 10, None, 30), (0, 100), None),  # cancelled while pending
    (run("a", 150), (0, 100), None),  # queued after the window
]


@pytest.mark.parametrize(("queue_run", "window", "want"), WAIT_CASES)
def test_the_wait_counts_from_eligible_to_start_or_to_the_window_end(queue_run, window, want):
    assert wait_seconds(queue_run, *window) == want


def test_figures_per_team_and_queue():
    runs = [
        run("a", 0, 0, 100, gpus=2),  # 200 GPU-s, wait 0
        run("a", 0, 10, 60, gpus=2, preempted=True),  # 100 GPU-s, wait 10, preempted
        run("b", 0, 40, 100, queue="urgent"),  # 60 GPU-s, wait 40
        run("b", 20),  # pending: wait 80 so far
        run(None, 0, 0, 40),  # type: ignore[arg-type]  # no team: 40 GPU-s
    ]
    figures = fairness_figures(runs, since=0, until=100, targets={"a": 0.5, "b": 0.3, "c": 0.2})
    total = 200 + 100 + 60 + 40
    assert figures.gpu_seconds == total
    a, b, c, none = (figures.team(name) for name in ("a", "b", "c", NONE_GROUP))
    assert a is not None
    assert b is not None
    assert c is not None
    assert none is not None
    assert (a.gpu_seconds, a.share_used_ratio, a.share_target_ratio) == (300, 300 / total, 0.5)
    assert (a.runs, a.pending, a.waits, a.preemptions) == (2, 0, 2, 1)
    assert a.wait_p50_seconds == 5.0  # halfway between 0 and 10
    assert a.wait_p95_seconds == pytest.approx(9.5)
    assert a.preemption_ratio == 0.5
    assert a.preempted_gpu_hours == pytest.approx(2 * 50 / H)
    assert (b.gpu_seconds, b.pending, b.waits, b.preemptions) == (60, 1, 2, 0)
    assert b.wait_p95_seconds == pytest.approx(40 + 0.95 * 40)
    assert b.preemption_ratio == 0.0
    # a target with nothing in the window is listed, at zero use; no waits are None, not 0
    assert (c.gpu_seconds, c.share_used_ratio, c.wait_p95_seconds) == (0, 0.0, None)
    assert none.share_target_ratio is None
    assert [q.group for q in figures.queues] == ["batch", "urgent"]
    assert sum(q.gpu_seconds for q in figures.queues) == total


def test_an_empty_window_is_refused_and_no_use_gives_no_share():
    with pytest.raises(ValueError, match="empty"):
        fairness_figures([], since=10, until=10, targets={})
    figures = fairness_figures([run("a", 0)], since=0, until=100, targets={})
    (a,) = figures.teams
    assert a.share_used_ratio is None  # nobody used anything: no share, not 0 %
    assert a.pending == 1
    assert a.share_target_ratio == 1.0  # no targets set: the teams seen share equally
    assert dict(figures.targets) == {"a": 1.0}


# --- the fairness: section ----------------------------------------------------------------------

CONFIG_ERRORS = [
    ("fairness: {targets: {a: 1.5}}", "fairness: targets.a: share 1.5 is not in (0, 1]"),
    ("fairness: {targets: {a: 0}}", "targets.a: share 0 is not in (0, 1]"),
    ("fairness: {targets: {a: 0.6, b: 0.5}}", "the shares add up to 1.1"),
    ("fairness: {targets: {a: 0.5}, target: {a: 1}}", "fairness: unknown key 'target'"),
    ("fairness: {targets: {a: lots}}", "fairness.targets.a"),
]


@pytest.mark.parametrize(("text", "message"), CONFIG_ERRORS)
def test_bad_targets_are_one_line_naming_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "collector.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_collector_config(path)
    assert str(error.value).startswith(f"{path}: ")
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_targets_load_frozen(tmp_path):
    path = tmp_path / "collector.yaml"
    path.write_text("fairness: {targets: {a: 0.7, b: 0.2, c: 0.1}}")
    fairness = load_collector_config(path).fairness
    assert dict(fairness.targets) == {"a": 0.7, "b": 0.2, "c": 0.1}
    assert fairness.target("a") == 0.7
    assert fairness.target("z") is None
    with pytest.raises(TypeError):
        fairness.targets["a"] = 1.0  # type: ignore[index]


# --- sacct --json -------------------------------------------------------------------------------


def sacct_entry(job_id: int, account: str, state: object, times: dict[str, object],
                gpus: object = 1, partition: str = "batch") -> dict[str, object]:  # fmt: skip
    return {
        "job_id": job_id,
        "account": account,
        "partition": partition,
        "qos": "normal",
        "state": {"current": state, "reason": "None"},
        "time": times,
        "tres": {
            "allocated": [
                {"type": "cpu", "name": None, "id": 1, "count": 1},
                {"type": "gres", "name": "gpu", "id": 1001, "count": gpus},
            ],
            "requested": [{"type": "gres", "name": "gpu", "id": 1001, "count": 2}],
        },
    }


def test_sacct_json_in_both_dialects():
    old = sacct_entry(
        7, "nlp", "PREEMPTED", {"submission": 100, "eligible": 110, "start": 120, "end": 180}
    )
    new = sacct_entry(
        8,
        "cv",
        ["PENDING"],
        {
            "submission": {"set": True, "infinite": False, "number": 150},
            "eligible": {"set": True, "infinite": False, "number": 160},
            "start": {"set": True, "infinite": False, "number": 0},
            "end": {"set": False, "infinite": False, "number": 0},
        },
        gpus={"set": True, "infinite": False, "number": 3},
        partition="urgent",
    )
    pending_no_alloc = sacct_entry(9, "cv", "PENDING", {"submission": 170})
    pending_no_alloc["tres"] = {"allocated": [], "requested": [{"type": "gres", "name": "gpu",
                                                                "count": 2}]}  # fmt: skip
    text = json.dumps({"meta": {}, "errors": [], "jobs": [old, new, pending_no_alloc, {}]})
    first, second, third = parse_sacct_json(text, cluster="gw")
    assert first == QueueRun("slurm:gw:7", "nlp", "batch", 1, 100.0, 110.0, 120.0, 180.0,
                             preempted=True, qos="normal", state="PREEMPTED")  # fmt: skip
    assert (second.key, second.team, second.queue, second.gpus) == ("slurm:gw:8", "cv", "urgent", 3)
    assert (second.submit_time, second.eligible_time, second.start_time) == (150.0, 160.0, None)
    assert second.end_time is None
    assert not second.preempted
    assert third.gpus == 2  # the request, before an allocation


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (SlurmResult.exited(["sacct"], 1, "", "sacct: error: Problem talking to the database"),
         "status 1: sacct: error: Problem talking to the database"),
        (SlurmResult.exited(["sacct"], 0, "not json"), "no valid JSON"),
        (SlurmResult.exited(["sacct"], 0, json.dumps({"errors": ["x"], "jobs": []})),
         "sacct reported errors"),
        (SlurmResult.timed_out(["sacct"], 30), "timed out after 30 s"),
    ],
)  # fmt: skip
def test_sacct_failures_are_job_source_errors(result, message):
    calls: list[list[str]] = []

    def runner(args):
        calls.append(list(args))
        return result

    with pytest.raises(JobSourceError, match=message):
        SlurmAccounting(cluster="gw", runner=runner).runs(0, 100)
    (args,) = calls
    assert args[:5] == ["sacct", "--json", "--allusers", "--duplicates", "--allocations"]
    assert args[5].startswith("--starttime=")
    assert args[6].startswith("--endtime=")


# --- registry jobs as attempts ------------------------------------------------------------------


def registry_job(key: str, team: str, queued: float, start: float | None = None,
                 end: float | None = None, *, gpus: int = 1,
                 state: JobState = JobState.RUNNING, partition: str = "batch") -> Job:  # fmt: skip
    return Job(
        key=key,
        scheduler="slurm",
        job_id=key.rsplit(":", 1)[1],
        state=state,
        team=team,
        gpus=gpus,
        submit_time=queued,
        start_time=start,
        end_time=end,
        labels=MappingProxyType({"partition": partition, "qos": "normal"}),
    )


def test_queues_of_slurm_jobs_pods_and_kueue_workloads():
    slurm = registry_job("slurm:c:1", "a", 0)
    pod = Job("k8s:u1", "kubernetes", "research/train-0", JobState.PENDING, team="research")
    kueue = Job("k8s:u2", "kubernetes", "research/train-1", JobState.PENDING,
                labels=MappingProxyType({"kueue.x-k8s.io/queue-name": "gpu-large"}))  # fmt: skip
    assert [job_queue(j) for j in (slurm, pod, kueue)] == ["batch", "research", "gpu-large"]
    preempted = run_from_job(registry_job("slurm:c:2", "a", 0, 5, 9, state=JobState.PREEMPTED))
    assert preempted.preempted
    assert (preempted.queued_time, preempted.qos) == (0, "normal")


# --- the detectors on a real service ------------------------------------------------------------


def fairness_fleet(tmp_path: Path) -> CollectorService:
    """Two teams, no targets set (so each is entitled to half). Over the last 2 h team ``ml``
    held every GPU-hour used: two 1-GPU jobs since 3 h ago, one more started 1 h ago after a
    30 min wait; team ``cv`` has two jobs pending for 2 h. Earlier (5.5 h to 3.5 h ago) a 4-GPU
    ``cv`` job ran: over 6 h, ``cv`` used more than ``ml``."""
    svc = make_service(tmp_path, NOW)
    svc.registry.put(
        [
            registry_job("slurm:c:1", "ml", NOW - 3 * H - 60, NOW - 3 * H),
            registry_job("slurm:c:2", "ml", NOW - 3 * H - 60, NOW - 3 * H),
            registry_job("slurm:c:3", "ml", NOW - 1.5 * H, NOW - 1 * H),
            registry_job("slurm:c:4", "cv", NOW - 2 * H, state=JobState.PENDING),
            registry_job("slurm:c:5", "cv", NOW - 2 * H, state=JobState.PENDING),
            registry_job(
                "slurm:c:6",
                "cv",
                NOW - 6 * H,
                NOW - 5.5 * H,
                NOW - 3.5 * H,
                gpus=4,
                state=JobState.COMPLETED,
            ),
        ]
    )
    return svc


def test_the_starved_team_is_found_naming_the_team_over_its_share(tmp_path):
    svc = fairness_fleet(tmp_path)
    found = run_rule(svc, make_rule("team_starved", window_seconds=2 * H), NOW)
    by_team = {f.facts.team: f for f in found}
    assert by_team["ml"].verdict is Verdict.CLEAR  # it waited 30 min, but cv waits 4x longer
    starved = by_team["cv"]
    assert starved.verdict is Verdict.FIRING
    assert starved.subject == "team:cv"
    ev = starved.evidence
    assert (ev["wait_p95_seconds"], ev["peers_wait_p95_seconds"]) == (2 * H, 0.5 * H)
    assert (ev["share_used_ratio"], ev["share_target_ratio"], ev["pending"]) == (0.0, 0.5, 2)
    assert (ev["over_share_team"], ev["over_share_used_ratio"]) == ("ml", 1.0)
    assert "team cv is starved" in starved.summary
    assert "team ml holds 100%" in starved.summary
    # over 6 h cv used its share (the 4-GPU job): waiting long is not starvation then
    wide = run_rule(svc, make_rule("team_starved", window_seconds=6 * H), NOW)
    assert all(f.verdict is Verdict.CLEAR for f in wide)


def test_the_hogging_team_is_found_naming_the_team_that_waits(tmp_path):
    svc = fairness_fleet(tmp_path)
    rule = make_rule("team_hogging", window_seconds=2 * H)
    found = {f.facts.team: f for f in run_rule(svc, rule, NOW)}
    assert found["cv"].verdict is Verdict.CLEAR
    hog = found["ml"]
    assert hog.verdict is Verdict.FIRING
    assert (hog.evidence["waiting_team"], hog.evidence["waiting_team_pending"]) == ("cv", 2)
    assert "team ml holds 100%" in hog.summary
    assert "team cv waits" in hog.summary


def test_configured_targets_decide_who_is_under_its_share(tmp_path):
    """With ml entitled to 0.95, its 100 % is inside the 0.1 margin: no hogging; cv (0.05)
    still uses less than its share and waits: starved."""
    path = tmp_path / "collector.yaml"
    path.write_text(f"database: {tmp_path / 'c.db'}\nfairness: {{targets: {{ml: 0.95, cv: 0.05}}}}")
    from gpuwarden.collector.build import build_service

    svc = build_service(load_collector_config(path), clock=lambda: NOW)
    svc.registry.put(fairness_fleet(tmp_path / "other").registry.jobs())
    hog = run_rule(svc, make_rule("team_hogging", window_seconds=2 * H), NOW)
    assert all(f.verdict is Verdict.CLEAR for f in hog)
    starved = run_rule(svc, make_rule("team_starved", window_seconds=2 * H), NOW)
    (firing,) = [f for f in starved if f.verdict is Verdict.FIRING]
    assert (firing.facts.team, firing.evidence["share_target_ratio"]) == ("cv", 0.05)


# --- report fairness --db -----------------------------------------------------------------------


def report(*args: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_report_parser(parser.add_subparsers(dest="command", required=True))
    out = io.StringIO()
    return run_report(parser.parse_args(["report", "fairness", *args]), out=out), out.getvalue()


def test_report_from_the_stored_jobs_in_every_format(tmp_path):
    svc = fairness_fleet(tmp_path)
    svc.storage.close()
    config = tmp_path / "collector.yaml"
    config.write_text("fairness: {targets: {ml: 0.6, cv: 0.4}}")
    common = ["--db", str(tmp_path / "c.db"), "--since", "2h", "--until", str(NOW),
              "--config", str(config)]  # fmt: skip
    code, text = report(*common, "--format", "json")
    assert code == 0
    doc = json.loads(text)
    teams = {t["group"]: t for t in doc["teams"]}
    # ml: 2 GPUs x 2 h + 1 GPU x 1 h inside the window; cv: nothing, 2 pending for 2 h
    assert teams["ml"]["gpu_hours"] == 5.0
    assert (teams["ml"]["share_used_ratio"], teams["ml"]["share_target_ratio"]) == (1.0, 0.6)
    assert (teams["cv"]["pending"], teams["cv"]["wait_p95_seconds"]) == (2, 2 * H)
    assert [q["group"] for q in doc["queues"]] == ["batch"]
    code, table = report(*common)
    assert code == 0
    assert table.splitlines()[2].split()[:4] == ["team", "GPU-h", "share", "target"]
    assert "pending jobs count with their wait so far" in table
    code, text = report(*common, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["kind"], r["group"]) for r in rows] == [("team", "cv"), ("team", "ml"),
                                                      ("queue", "batch")]  # fmt: skip
    assert float(rows[1]["gpu_hours"]) == 5.0


def test_report_errors_are_one_line(tmp_path, capsys):
    code, _ = report("--db", str(tmp_path / "missing.db"))
    assert code == 1
    assert "missing.db: no such database" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("fairness: {targets: {a: 2}}")
    code, _ = report("--db", str(tmp_path / "missing.db"), "--config", str(bad))
    assert code == 1
    assert "share 2 is not in (0, 1]" in capsys.readouterr().err


# --- /metrics -----------------------------------------------------------------------------------


async def test_metrics_families_over_the_accounting_window(aiohttp_client, tmp_path):
    """Over 24 h: ml used 2 x 3 h + 1 h = 7 GPU-h, cv 4 x 2 h = 8; no targets set, so each team
    is entitled to half; cv's waits are 2 h (twice, pending) and 30 min, ml's 1 min (twice)
    and 30 min."""
    from tests.test_exposition import samples, scrape

    svc = fairness_fleet(tmp_path)
    got = samples(await scrape(aiohttp_client, svc), "gpuwarden_fairness_")
    svc.storage.close()

    def value(name: str, **labels: str) -> float | None:
        return got.get((f"gpuwarden_fairness_{name}", frozenset(labels.items())))

    assert value("gpu_hours", team="ml") == pytest.approx(7.0)
    assert value("share_used_ratio", team="cv") == pytest.approx(8 / 15)
    assert value("share_target_ratio", team="cv") == 0.5  # no targets set: equal shares
    assert value("pending_jobs", team="cv") == 2
    assert value("wait_seconds", team="cv", quantile="0.5") == 2 * H
    assert value("wait_seconds", team="ml", quantile="0.5") == 60
    assert value("preemptions", team="ml") == 0
    assert value("queue_gpu_hours", queue="batch") == pytest.approx(15.0)
    assert value("queue_wait_seconds", queue="batch", quantile="0.95") == 2 * H


# --- Kubernetes pods, through the real client against the API stub -----------------------------


def test_pods_give_waits_per_namespace_and_kueue_queue():
    """The fixture's ``research/notebook-alice`` is pending since 11:30 (no team label: the
    namespace is its team); a copy admitted through Kueue queue ``gpu-large`` waited from 11:00
    to its start at 11:20; ``inference/llm-serving`` was created at 10:00 and started 10:00:01."""
    from tests.k8s_stub import KubeApiStub
    from tests.test_jobs_kubernetes import fixture_pod, fixture_pods, list_jobs, ts

    kueue = fixture_pod("notebook-alice")
    kueue["metadata"] |= {"name": "notebook-bob", "uid": "kueue-1",
                          "creationTimestamp": "2025-03-01T11:00:00Z",
                          "labels": {"kueue.x-k8s.io/queue-name": "gpu-large"}}  # fmt: skip
    kueue["status"] = {"phase": "Running", "startTime": "2025-03-01T11:20:00Z"}
    kueue["spec"]["nodeName"] = "gpu-node-03"
    with KubeApiStub([*fixture_pods(), kueue], token="gw-collector-token-7f3a9c") as stub:
        jobs = list_jobs(stub.url)
    until = ts("2025-03-01T12:00:00+00:00")
    figures = fairness_figures(
        [run_from_job(job) for job in jobs.values()], since=until - 4 * H, until=until, targets={}
    )
    queues = {q.group: q for q in figures.queues}
    assert queues["gpu-large"].wait_p50_seconds == 20 * 60  # creation to start
    research = figures.team("research")
    assert research is not None
    assert research.pending == 1
    assert research.wait_p95_seconds == pytest.approx(
        float(np.quantile([20 * 60, 30 * 60], 0.95))  # bob's 20 min, alice's 30 so far
    )
    assert queues["inference"].wait_p50_seconds == 1.0


async def test_api_jobs_carry_their_eligible_time(aiohttp_client, tmp_path):
    """A job announced over the API with an eligible time waits from it, not from submission."""
    from tests.test_collector_api import AUTH, collector_app

    svc = make_service(tmp_path, NOW)
    client = await aiohttp_client(collector_app(svc))
    body = [{"job_id": "b1", "state": "pending", "team": "cv", "submit_time": NOW - 600,
             "eligible_time": NOW - 60, "labels": {"queue": "short"}}]  # fmt: skip
    resp = await client.post("/v1/jobs", json=body, headers=AUTH)
    assert resp.status == 200
    resp = await client.get("/v1/jobs", headers=AUTH)
    (listed,) = (await resp.json())["jobs"]
    assert listed["eligible_time"] == NOW - 60
    (run_b1,) = [run_from_job(job) for job in svc.registry.jobs()]
    assert (run_b1.queue, wait_seconds(run_b1, NOW - H, NOW)) == ("short", 60.0)
    svc.storage.close()
