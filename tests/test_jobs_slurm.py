"""The Slurm adapter: pure parsers on recorded ``squeue --json`` output, then a real cluster."""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from gpuwarden.collector.jobs import JobSourceError
from gpuwarden.collector.jobs.model import GpuAllocation, Job, JobState
from gpuwarden.collector.jobs.slurm import (
    SQUEUE_ARGS,
    NodeGpus,
    SlurmJobSource,
    expand_hostlist,
    gpus_in_tres,
    parse_gres_detail,
    parse_squeue_json,
    slurm_number,
    slurm_state,
    slurm_time,
)
from gpuwarden.collector.jobs.slurm_cli import RunStatus, SlurmCli, SlurmResult
from tests.slurm.cluster import SlurmCluster

DATA = Path(__file__).parent / "data" / "slurm"
# Recorded on Debian's slurm-wlm 22.05.8 (openapi/v0.0.38) with tests/slurm/cluster.py:
# gw-done (COMPLETED, no GRES), gw-fail (exit 3 with --gres=gpu:1), gw-train-a (RUNNING, IDX:0),
# gw-train-b (cancelled while running), gw-pending (--gres=gpu:2, waiting for Resources).
SAMPLE = DATA / "squeue-22.05.json"
# The same cluster with gw-train-a and gw-train-b both running (IDX:0 and IDX:1), gw-pending.
SAMPLE_RUNNING = DATA / "squeue-22.05-running.json"
TIMEOUT_SECONDS = 30.0
NOW = 1_795_321_400.0


# --- hostlists -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("vm", ["vm"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
        ("gpu[098-100]", ["gpu098", "gpu099", "gpu100"]),
        ("a[1-2],b,c[5]", ["a1", "a2", "b", "c5"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("node[1-2]-ib", ["node1-ib", "node2-ib"]),
        ("", []),
        ("(null)", []),
        ("None assigned", []),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    "hostlist",
    ["node[01-", "node]1[", "node[3-1]", "node[a-b]", "a,,b", "node[1-2", "n[1-99999999]"],
)
def test_expand_hostlist_rejects_malformed(hostlist: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        expand_hostlist(hostlist)


# --- gres_detail and TRES ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("detail", "expected"),
    [
        ("gpu:1(IDX:0)", NodeGpus(1, (0,))),
        ("gpu:a100:2(IDX:0-1)", NodeGpus(2, (0, 1))),
        ("gpu:4(IDX:0,2-3)", NodeGpus(4, (0, 2, 3))),
        ("gpu:a100:1(IDX:0),gpu:v100:1(IDX:3)", NodeGpus(2, (0, 3))),
        ("gpu:1(IDX:1),nic:1(IDX:0)", NodeGpus(1, (1,))),
        ("gpu:h100(CNT:2)", NodeGpus(2)),
        ("gpu:0(IDX:N/A)", NodeGpus(0)),
        ("shard:2(IDX:0)", NodeGpus(0)),
        ("nic:1(IDX:0)", NodeGpus(0)),
    ],
)
def test_parse_gres_detail(detail: str, expected: NodeGpus) -> None:
    assert parse_gres_detail(detail) == expected


@pytest.mark.parametrize("detail", ["gpu(IDX:0)", "gpu:x(IDX:0)", "gpu:1(IDX:a)", "gpu:1(IDX:0"])
def test_parse_gres_detail_rejects_malformed(detail: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_gres_detail(detail)


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [
        ("gres:gpu:1", 1),  # 22.05
        ("gres:gpu:a100:2", 2),
        ("gres/gpu:4", 4),  # later releases
        ("gres/gpu=3", 3),
        ("gres/gpu", 1),
        ("gres:gpu:2,gres:nic:1", 2),
        ("cpu=1,mem=1000M", 0),
        ("", 0),
    ],
)
def test_gpus_in_tres(tres: str, gpus: int) -> None:
    assert gpus_in_tres(tres) == gpus


# --- numbers, times, states ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "number"),
    [
        (4294901759, 4294901759),
        (0, 0),
        ({"set": True, "infinite": False, "number": 7}, 7),
        ({"set": False, "infinite": False, "number": 0}, None),
        ({"set": True, "infinite": True, "number": 0}, None),
        (None, None),
        (True, None),
        ("12", None),
    ],
)
def test_slurm_number_reads_both_shapes(value: object, number: int | None) -> None:
    assert slurm_number(value) == number


def test_slurm_time_zero_is_unknown() -> None:
    assert slurm_time(0) is None
    assert slurm_time({"set": True, "infinite": False, "number": 0}) is None
    assert slurm_time({"set": True, "infinite": False, "number": 1795321382}) == 1795321382.0


@pytest.mark.parametrize(
    ("value", "state"),
    [
        ("PENDING", JobState.PENDING),
        ("RUNNING", JobState.RUNNING),
        ("SUSPENDED", JobState.SUSPENDED),
        ("COMPLETED", JobState.COMPLETED),
        ("FAILED", JobState.FAILED),
        ("CANCELLED", JobState.CANCELLED),
        ("PREEMPTED", JobState.PREEMPTED),
        ("TIMEOUT", JobState.FAILED),
        ("NODE_FAIL", JobState.FAILED),
        ("OUT_OF_MEMORY", JobState.FAILED),
        ("BOOT_FAIL", JobState.FAILED),
        ("DEADLINE", JobState.FAILED),
        ("REQUEUED", JobState.REQUEUED),
        ("REQUEUE_HOLD", JobState.REQUEUED),
        ("COMPLETING", JobState.RUNNING),  # 22.05 prints the flag instead of the base state
        ("STOPPED", JobState.SUSPENDED),
        (["RUNNING"], JobState.RUNNING),  # later releases: base state, then flags
        (["CANCELLED", "COMPLETING"], JobState.CANCELLED),
        (["PENDING", "REQUEUED"], JobState.REQUEUED),
        (["COMPLETED"], JobState.COMPLETED),
        ("running", JobState.RUNNING),
        ("SOMETHING_NEW", JobState.UNKNOWN),
        ([], JobState.UNKNOWN),
        (None, JobState.UNKNOWN),
    ],
)
def test_slurm_state(value: object, state: JobState) -> None:
    assert slurm_state(value) is state


# --- the recorded 22.05 output -------------------------------------------------------------


def _by_name(jobs: list[Job]) -> dict[str | None, Job]:
    return {job.name: job for job in jobs}


def test_recorded_sample_maps_every_job() -> None:
    jobs = _by_name(parse_squeue_json(SAMPLE.read_text(), cluster="gwtest"))

    assert jobs["gw-train-a"] == Job(
        key="slurm:gwtest:3",
        scheduler="slurm",
        job_id="3",
        state=JobState.RUNNING,
        name="gw-train-a",
        owner="root",
        team="ml-research",
        gpus=1,
        allocations=(GpuAllocation(node="vm", indices=(0,)),),
        submit_time=1795321382.0,
        eligible_time=1795321382.0,
        start_time=1795321385.0,
        end_time=None,  # squeue says start + time limit: not an end that happened
        priority=4294901757,
        restarts=0,
        labels=MappingProxyType({"partition": "debug", "slurm_state": "RUNNING"}),
    )
    summary = {
        name: (job.state, job.gpus, job.allocations, job.team, job.end_time is not None)
        for name, job in jobs.items()
    }
    assert summary == {
        "gw-done": (JobState.COMPLETED, 0, (), "ml-infra", True),
        "gw-fail": (JobState.FAILED, 1, (), "debug", True),  # GPUs from the request
        "gw-train-a": (JobState.RUNNING, 1, (GpuAllocation("vm", (0,)),), "ml-research", False),
        "gw-train-b": (JobState.CANCELLED, 1, (), "debug", True),
        "gw-pending": (JobState.PENDING, 2, (), "debug", False),
    }
    assert jobs["gw-pending"].start_time is None
    assert jobs["gw-pending"].labels["reason"] == "Resources"
    assert jobs["gw-fail"].labels["reason"] == "NonZeroExitCode"


def test_recorded_sample_with_both_gpus_busy() -> None:
    jobs = _by_name(parse_squeue_json(SAMPLE_RUNNING.read_text(), cluster="gwtest"))

    assert jobs["gw-train-a"].allocations == (GpuAllocation(node="vm", indices=(0,)),)
    assert jobs["gw-train-b"].allocations == (GpuAllocation(node="vm", indices=(1,)),)
    assert (jobs["gw-pending"].state, jobs["gw-pending"].gpus) == (JobState.PENDING, 2)


_NUMBER_FIELDS = (
    "job_id", "submit_time", "eligible_time", "start_time", "end_time", "priority", "restart_cnt"
)  # fmt: skip


def _as_newer_slurm(document: dict[str, Any]) -> dict[str, Any]:
    """Rewrite 22.05 output in the later shapes: number objects and job_state lists."""
    newer = copy.deepcopy(document)
    for job in newer["jobs"]:
        for name in _NUMBER_FIELDS[1:]:
            job[name] = {"set": True, "infinite": False, "number": job[name]}
        job["job_state"] = [job["job_state"]]
        job["tres_per_node"] = job["tres_per_node"].replace("gres:", "gres/")
        job["node_count"] = {"set": True, "infinite": False, "number": job["node_count"]}
    return newer


@pytest.mark.parametrize("sample", [SAMPLE, SAMPLE_RUNNING])
def test_newer_json_shapes_give_the_same_jobs(sample: Path) -> None:
    document = json.loads(sample.read_text())
    newer = json.dumps(_as_newer_slurm(document))

    old_jobs = parse_squeue_json(json.dumps(document), cluster="gwtest")
    new_jobs = parse_squeue_json(newer, cluster="gwtest")

    # Only the label echoing Slurm's state text differs ("RUNNING" is now a one-element list).
    assert [job.state for job in new_jobs] == [job.state for job in old_jobs]
    no_labels: MappingProxyType[str, str] = MappingProxyType({})
    assert [replace(job, labels=no_labels) for job in new_jobs] == [
        replace(job, labels=no_labels) for job in old_jobs
    ]


def test_bad_entries_are_skipped_or_degraded(caplog: pytest.LogCaptureFixture) -> None:
    document = json.loads(SAMPLE_RUNNING.read_text())
    document["jobs"][0]["gres_detail"] = ["gpu:one(IDX:0)"]
    del document["jobs"][1]["job_id"]
    document["jobs"].append("not a job")

    jobs = parse_squeue_json(json.dumps(document), cluster="gwtest")

    assert [job.name for job in jobs] == ["gw-train-a", "gw-pending"]
    # The allocation could not be read: no indices claimed, the request still counts.
    assert (jobs[0].allocations, jobs[0].gpus) == ((), 1)
    assert "cannot read its GPU allocation" in caplog.text


@pytest.mark.parametrize(
    ("stdout", "match"),
    [
        ("squeue: error: ...", "no valid JSON"),
        ('{"meta": {}}', "no 'jobs' list"),
        (
            '{"jobs": [], "errors": [{"description": "Unable to contact slurm controller"}]}',
            "Unable",
        ),
    ],
)
def test_unreadable_output_is_a_job_source_error(stdout: str, match: str) -> None:
    with pytest.raises(JobSourceError, match=match):
        parse_squeue_json(stdout, cluster="gwtest")


# --- the source, with an injected runner and with fake squeue programs ----------------------


def test_runner_gets_the_argument_list() -> None:
    calls: list[list[str]] = []

    def runner(args: Sequence[str]) -> SlurmResult:
        calls.append(list(args))
        return SlurmResult.exited(args, 0, SAMPLE.read_text(), "")

    jobs = SlurmJobSource(cluster="gwtest", runner=runner).jobs(NOW)

    assert calls == [["squeue", "--json", "--all"]]
    assert len(jobs) == 5


def test_a_failing_squeue_is_a_job_source_error_with_its_stderr() -> None:
    stderr = "squeue: error: Unable to contact slurm controller (connect failure)\n"

    def runner(args: Sequence[str]) -> SlurmResult:
        return SlurmResult.exited(args, 1, "", "noise\n" * 500 + stderr)

    with pytest.raises(JobSourceError, match=r"status 1: noise\n") as caught:
        SlurmJobSource(cluster="gwtest", runner=runner).jobs(NOW)
    # The tail: whole lines, the last one included, bounded.
    assert str(caught.value).endswith(stderr.strip())
    assert len(str(caught.value)) < 1100


@pytest.mark.parametrize("cluster", ["", "a b", "x;rm -rf /", "-c", "a" * 200])
def test_cluster_names_are_validated(cluster: str) -> None:
    with pytest.raises(ValueError, match="cluster name"):
        SlurmJobSource(cluster=cluster)


def _fake_squeue(directory: Path, script: str) -> dict[str, str]:
    program = directory / "squeue"
    program.write_text(f"#!/bin/sh\n{script}\n")
    program.chmod(0o755)
    return {"PATH": f"{directory}:/usr/bin:/bin"}


def test_default_runner_uses_env(tmp_path: Path) -> None:
    env = _fake_squeue(tmp_path, f'[ "$*" = "{" ".join(SQUEUE_ARGS[1:])}" ] && cat "{SAMPLE}"')

    assert len(SlurmJobSource(cluster="gwtest", env=env).jobs(NOW)) == 5


def test_default_runner_times_out(tmp_path: Path) -> None:
    env = _fake_squeue(tmp_path, "echo 'squeue: slow' >&2; exec sleep 30")

    started = time.monotonic()
    with pytest.raises(JobSourceError, match=r"timed out after 0.2 s"):
        SlurmJobSource(cluster="gwtest", env=env, timeout_seconds=0.2).jobs(NOW)
    assert time.monotonic() - started < 5


def test_a_missing_squeue_is_a_job_source_error(tmp_path: Path) -> None:
    with pytest.raises(JobSourceError, match="cannot run squeue"):
        SlurmJobSource(cluster="gwtest", env={"PATH": str(tmp_path)}).jobs(NOW)


def test_the_cli_answers_outcomes_not_exceptions(tmp_path: Path) -> None:
    env = _fake_squeue(tmp_path, 'echo "$SLURM_CONF"; echo "$*" >&2; exit 3')
    cli = SlurmCli(env={**env, "SLURM_CONF": "/etc/gw.conf"}, timeout_seconds=10)

    ran = cli(["squeue", "--json"])
    assert ran == SlurmResult.exited(("squeue", "--json"), 3, "/etc/gw.conf\n", "--json\n")
    assert not ran.ok

    missing = SlurmCli(env={"PATH": str(tmp_path)}, timeout_seconds=10)(["sacct", "--json"])
    assert missing.status is RunStatus.NOT_STARTED
    assert "sacct" in missing.error
    assert isinstance(missing.os_error, FileNotFoundError)


def test_the_cli_reports_a_timeout_with_what_was_printed(tmp_path: Path) -> None:
    env = _fake_squeue(tmp_path, "echo 'squeue: slow' >&2; exec sleep 30")

    result = SlurmCli(env=env, timeout_seconds=0.5)(["squeue"])

    assert result.status is RunStatus.TIMED_OUT
    assert result.timeout_seconds == 0.5
    assert result.returncode is None


@pytest.mark.parametrize("args", [[], ["squeue", 3]])
def test_the_cli_takes_only_lists_of_strings(args: Any) -> None:
    with pytest.raises(ValueError, match="non-empty list of strings"):
        SlurmCli(env=None, timeout_seconds=1)(args)


# --- a real Slurm -------------------------------------------------------------------------


def test_unreachable_controller_output_is_a_job_source_error() -> None:
    # What 22.05 prints, with exit status 0, when slurmctld does not answer.
    text = (DATA / "squeue-22.05-no-controller.json").read_text()

    with pytest.raises(JobSourceError, match="errors: Failed while looking for jobs"):
        parse_squeue_json(text, cluster="gwtest")


@pytest.mark.slurm
@pytest.mark.skipif(shutil.which("squeue") is None, reason="slurm-client is not installed")
def test_real_squeue_without_a_controller_is_a_job_source_error(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    # Nothing listens on port 9; short timeouts make squeue give up at once.
    conf.write_text(
        "ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n"
        "MessageTimeout=1\nTCPTimeout=1\n"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": str(conf)}
    source = SlurmJobSource(cluster="nowhere", env=env, timeout_seconds=20)

    # squeue exits 0 here; only its "errors" list tells the failure from an empty queue.
    with pytest.raises(
        JobSourceError,
        match=r"squeue reported errors: Failed while looking for jobs \(slurm_load_jobs: ",
    ):
        source.jobs(NOW)


def _wait_for_job(
    source: SlurmJobSource, job_id: str, states: set[JobState], timeout_seconds: float
) -> Job:
    """Poll the adapter until it reports ``job_id`` in one of ``states`` (deadline-bounded)."""
    deadline = time.monotonic() + timeout_seconds
    last: Job | None = None
    while time.monotonic() < deadline:
        last = next((job for job in source.jobs(time.time()) if job.job_id == job_id), None)
        if last is not None and last.state in states:
            return last
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not in {states} after {timeout_seconds} s: {last}")


@pytest.mark.slurm
def test_real_cluster_jobs(slurm_cluster: SlurmCluster) -> None:
    source = SlurmJobSource(cluster="gwtest", env=slurm_cluster.env())
    script = "#!/bin/sh\nsleep 300\n"
    common = ("--cpus-per-task=1", "--time=5")
    submitted: list[str] = []
    try:
        submitted.extend(
            slurm_cluster.sbatch(script, *common, "--gres=gpu:1", f"--job-name={name}")
            for name in ("gw-jobs-a", "gw-jobs-b")
        )
        first, second = submitted
        for job_id in submitted:
            slurm_cluster.wait_for_state(job_id, {"RUNNING"}, TIMEOUT_SECONDS)
        # Both GPUs are taken, so a two-GPU job has to wait.
        waiting = slurm_cluster.sbatch(script, *common, "--gres=gpu:2", "--job-name=gw-jobs-p")
        submitted.append(waiting)
        slurm_cluster.wait_for_state(waiting, {"PENDING"}, TIMEOUT_SECONDS)

        jobs = {job.job_id: job for job in source.jobs(time.time())}

        running = [jobs[first], jobs[second]]
        assert [job.state for job in running] == [JobState.RUNNING, JobState.RUNNING]
        assert [(job.owner, job.gpus, job.team) for job in running] == [("root", 1, "debug")] * 2
        assert {job.allocations for job in running} == {
            (GpuAllocation(node=slurm_cluster.hostname, indices=(0,)),),
            (GpuAllocation(node=slurm_cluster.hostname, indices=(1,)),),
        }
        assert all(job.start_time is not None and job.end_time is None for job in running)
        assert jobs[first].key == f"slurm:gwtest:{first}"
        assert jobs[first].name == "gw-jobs-a"
        pending = jobs[waiting]
        assert (pending.state, pending.gpus, pending.allocations) == (JobState.PENDING, 2, ())
        assert pending.start_time is None

        slurm_cluster.run(["scancel", second])
        # Within MinJobAge (300 s by default) squeue --json --all still lists the ended job.
        cancelled = _wait_for_job(source, second, {JobState.CANCELLED}, TIMEOUT_SECONDS)
        assert cancelled.allocations == ()
        assert cancelled.end_time is not None
        assert cancelled.gpus == 1  # from the request, now that nothing is allocated
    finally:
        if submitted:
            slurm_cluster.run(["scancel", *submitted], check=False)
            for job_id in submitted:
                slurm_cluster.wait_for_state(job_id, {"CANCELLED", "COMPLETED"}, TIMEOUT_SECONDS)
