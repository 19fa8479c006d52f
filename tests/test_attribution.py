"""Process-to-job attribution on recorded ``/proc`` trees (tests/data/proc)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuwarden.agent.attribution import (
    CGROUP_LIMIT_BYTES,
    ENVIRON_LIMIT_BYTES,
    Attributor,
    environ_job,
    parse_cgroup,
    parse_environ,
    read_start_time,
)
from gpuwarden.agent.daemon import Agent
from gpuwarden.agent.model import GpuSample, JobRef, ProcessSample
from gpuwarden.agent.telemetry import SampleCache, Telemetry

RECORDED_PROC = Path(__file__).parent / "data" / "proc"
CID = "3f9c1e2d8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d"
UID = "7c8f5f2a-3b1e-4c9d-9a6e-2f0e1b4d5c6a"
UID_SYSTEMD = UID.replace("-", "_")


def slurm(job_id: str, source: str = "cgroup") -> JobRef:
    return JobRef(scheduler="slurm", job_id=job_id, source=source)


def pod(container_id: str | None = CID, uid: str = UID) -> JobRef:
    return JobRef(scheduler="kubernetes", pod_uid=uid, container_id=container_id)


def build_proc(root: Path) -> Path:
    """Copy the recorded tree into ``root``, turning each ``environ.txt`` (one entry a line)
    into the NUL-separated ``environ`` the kernel serves."""
    shutil.copytree(RECORDED_PROC, root)
    for text in root.glob("*/environ.txt"):
        entries = text.read_text().splitlines()
        (text.parent / "environ").write_bytes(b"".join(e.encode() + b"\0" for e in entries))
        text.unlink()
    return root


def set_stat_start_time(proc: Path, pid: int, start_time: int) -> None:
    stat = proc / str(pid) / "stat"
    head, _, tail = stat.read_text().rpartition(")")
    fields = tail.split()
    fields[19] = str(start_time)
    stat.write_text(f"{head}) {' '.join(fields)}\n")


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    return build_proc(tmp_path / "proc")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4:memory:/slurm/uid_1000/job_123/step_0/task_0\n", slurm("123")),
        ("7:freezer:/slurm_node7/uid_0/job_77/step_batch\n", slurm("77")),
        ("7:freezer:/slurm_gpu_node_01/uid_0/job_78/step_extern\n", slurm("78")),
        ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", slurm("4242")),
        ("0::/system.slice/slurmstepd.scope/job_4242/step_batch/slurm\n", slurm("4242")),
        ("0::/system.slice/gpu07_slurmstepd.scope/job_9/step_1/user/task_3\n", slurm("9")),
        ("0::/system.slice/gpu_07_slurmstepd.scope/job_10/step_interactive\n", slurm("10")),
        (f"4:memory:/kubepods/burstable/pod{UID}/{CID}\n", pod()),
        (f"4:memory:/kubepods/besteffort/pod{UID}/{CID}\n", pod()),
        (f"0::/kubepods/pod{UID}/{CID}\n", pod()),
        (f"0::/kubepods/burstable/pod{UID}\n", pod(None)),
        (
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope\n",
            pod(),
        ),
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{UID_SYSTEMD}.slice/docker-{CID}.scope\n",
            pod(),
        ),
        (f"0::/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/crio-{CID}.scope\n", pod()),
        (
            f"0::/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/crio-conmon-{CID}.scope\n",
            pod(None),
        ),
        (
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
            f"kubelet-kubepods-burstable-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope\n",
            pod(),
        ),
        (f"0::/docker/{'ab' * 32}/kubepods/burstable/pod{UID}/{CID}\n", pod()),
        # A static pod's UID is the 32-hex hash of its manifest.
        (f"0::/kubepods/burstable/pod{'c0ffee' * 5}ab/{CID}\n", pod(uid=f"{'c0ffee' * 5}ab")),
        # Slurm running inside a pod: the job is the finer answer.
        (
            f"0::/kubepods/pod{UID}/{CID}/system.slice/slurmstepd.scope/job_5/step_0/user/task_0\n",
            slurm("5"),
        ),
        # Upper-case hex is normalised, as the API server prints ids in lower case.
        (f"0::/kubepods/pod{UID.upper()}/{CID.upper()}\n", pod()),
    ],
)
def test_parse_cgroup_finds_the_job(text: str, expected: JobRef) -> None:
    assert parse_cgroup(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0::/\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/slurmstepd.scope/system\n",  # slurmstepd's own sleeper, no job
        "4:memory:/slurm/uid_1000\n",
        "4:memory:/slurm/uid_1000/job_abc/step_0\n",
        "4:memory:/slurm/job_12/step_0\n",  # no uid_ level: not Slurm's v1 layout
        "0::/kubepods/burstable\n",
        "0::/kubepods.slice/kubepods-burstable.slice\n",
        f"0::/machine.slice/pod{UID}/{CID}\n",  # pod-looking, but not under kubepods
        f"/kubepods/pod{UID}/{CID}\n",  # not an id:controllers:path line
    ],
)
def test_parse_cgroup_finds_nothing(text: str) -> None:
    assert parse_cgroup(text) is None


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"SLURM_JOB_ID=5150\0CUDA_VISIBLE_DEVICES=0\0", slurm("5150", "environ")),
        (b"SLURM_JOBID=61\0", slurm("61", "environ")),
        (b"SLURM_JOB_ID=\0SLURM_JOBID=62\0", slurm("62", "environ")),
        (b"SLURM_JOB_ID=12; rm -rf /\0", None),
        (b"SLURM_JOB_IDX=1\0PATH=/bin\0", None),
        (b"", None),
    ],
)
def test_environ_job(data: bytes, expected: JobRef | None) -> None:
    assert environ_job(parse_environ(data)) == expected


def test_parse_environ_keeps_values_with_equals_and_drops_junk() -> None:
    data = b"A=1\0B=x=y\0junk\0=nokey\0C=\xff\0"
    assert parse_environ(data) == {"A": "1", "B": "x=y", "C": "\ufffd"}


@pytest.mark.parametrize(
    ("pid", "expected"),
    [
        (4101, slurm("123")),  # Slurm, cgroup v1
        (4102, slurm("4242")),  # Slurm, cgroup v2
        (4103, pod()),  # Kubernetes, cgroupfs driver, burstable
        (
            4104,
            pod(
                "e4b1c0d2f3a49586b7c8d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4",
                "9b2d4e6f-1a3c-4b5d-8e7f-0a1b2c3d4e5f",
            ),
        ),  # Kubernetes, systemd driver, containerd
        (
            4105,
            pod(
                "5b6c7d8e9fa0b1c2d3e4f5061728394a5b6c7d8e9fa0b1c2d3e4f5061728394a",
                "1d2e3f40-5a6b-4c7d-8e9f-a0b1c2d3e4f5",
            ),
        ),  # Kubernetes, systemd driver, cri-o, guaranteed
        (4106, slurm("5150", "environ")),  # Slurm with proctrack/linuxproc: environ only
        (4107, None),  # a user's process outside any job
        (4108, None),  # environ unreadable
        (4109, slurm("77")),  # multiple-slurmd node name; environ unreadable, cgroup suffices
        (4999, None),  # no such process
        (0, None),
        (-1, None),
    ],
)
def test_job_for_pid_on_recorded_tree(proc: Path, pid: int, expected: JobRef | None) -> None:
    assert Attributor(proc).job_for_pid(pid) == expected


def test_unreadable_files_give_none_without_raising(proc: Path) -> None:
    (proc / "4106" / "environ").unlink()
    (proc / "4106" / "environ").mkdir()  # reading it raises IsADirectoryError
    (proc / "4106" / "cgroup").unlink()
    assert Attributor(proc).job_for_pid(4106) is None


def test_start_time_survives_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    fields = " ".join(["S", *["0"] * 18, "424242", *["0"] * 30])
    (tmp_path / "7" / "stat").write_text(f"7 (a) b (c) {fields}\n")
    assert read_start_time(tmp_path, 7) == 424242
    (tmp_path / "7" / "stat").write_text("7 (truncated) S 1 2\n")
    assert read_start_time(tmp_path, 7) is None


def test_answers_are_cached_per_process_start_time(proc: Path) -> None:
    attributor = Attributor(proc)
    assert attributor.job_for_pid(4101) == slurm("123")
    cgroup = proc / "4101" / "cgroup"
    cgroup.write_text("0::/system.slice/slurmstepd.scope/job_999/step_0/user/task_0\n")
    assert attributor.job_for_pid(4101) == slurm("123")  # same process: not re-read
    set_stat_start_time(proc, 4101, 8812346)  # the pid now belongs to a new process
    assert attributor.job_for_pid(4101) == slurm("999")


def test_ended_process_gives_none(proc: Path) -> None:
    attributor = Attributor(proc)
    assert attributor.job_for_pid(4102) == slurm("4242")
    shutil.rmtree(proc / "4102")
    assert attributor.job_for_pid(4102) is None


def test_attribute_fills_jobs_in_order_and_keeps_known_ones(proc: Path) -> None:
    known = slurm("1", "environ")
    samples = [
        ProcessSample(pid=4102, gpu_memory_bytes=1024),
        ProcessSample(pid=4107, job=known),
        ProcessSample(pid=4106),
        ProcessSample(pid=4999),
    ]
    assert Attributor(proc).attribute(samples) == (
        ProcessSample(pid=4102, gpu_memory_bytes=1024, job=slurm("4242")),
        ProcessSample(pid=4107, job=known),
        ProcessSample(pid=4106, job=slurm("5150", "environ")),
        ProcessSample(pid=4999),
    )
    assert samples[0].job is None


def test_attribute_forgets_pids_it_no_longer_sees(proc: Path) -> None:
    attributor = Attributor(proc)
    attributor.attribute([ProcessSample(pid=4101), ProcessSample(pid=4102)])
    attributor.attribute([ProcessSample(pid=4102)])
    for pid in (4101, 4102):
        (proc / str(pid) / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_8/x\n")
    assert attributor.job_for_pid(4101) == slurm("8")  # evicted, so read afresh
    assert attributor.job_for_pid(4102) == slurm("4242")  # still cached


def test_cache_is_bounded_without_attribute(proc: Path) -> None:
    attributor = Attributor(proc, max_cache_entries=2)
    for pid in (4101, 4102, 4109):
        attributor.job_for_pid(pid)
    for pid in (4101, 4109):
        (proc / str(pid) / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_8/x\n")
    assert attributor.job_for_pid(4109) == slurm("77")  # newest: cached
    assert attributor.job_for_pid(4101) == slurm("8")  # oldest: evicted


def test_max_cache_entries_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_cache_entries must be at least 1, got 0"):
        Attributor(max_cache_entries=0)


def test_environ_is_read_only_up_to_its_limit(proc: Path) -> None:
    filler = b"X=" + b"y" * ENVIRON_LIMIT_BYTES + b"\0"
    environ = proc / "4107" / "environ"
    environ.write_bytes(b"SLURM_JOB_ID=31\0" + filler)
    assert Attributor(proc).job_for_pid(4107) == slurm("31", "environ")
    environ.write_bytes(filler + b"SLURM_JOB_ID=32\0")
    assert Attributor(proc).job_for_pid(4107) is None


def test_cgroup_is_read_only_up_to_its_limit(proc: Path) -> None:
    line = "0::/system.slice/slurmstepd.scope/job_33/step_0\n"
    cgroup = proc / "4107" / "cgroup"
    cgroup.write_text(line + "1:x:/" + "y" * CGROUP_LIMIT_BYTES + "\n")
    assert Attributor(proc).job_for_pid(4107) == slurm("33")
    cgroup.write_text("1:x:/" + "y" * CGROUP_LIMIT_BYTES + "\n" + line)
    assert Attributor(proc).job_for_pid(4107) is None


class _TwoGpus:
    """A GPU source with one recorded process on each of two GPUs and one on both."""

    def sample(self) -> list[GpuSample]:
        return [
            GpuSample(uuid="GPU-0", index=0, name="g", processes=(ProcessSample(4101),)),
            GpuSample(
                uuid="GPU-1",
                index=1,
                name="g",
                processes=(ProcessSample(4102, gpu_memory_bytes=1), ProcessSample(4101)),
            ),
            GpuSample(uuid="GPU-2", index=2, name="g"),
        ]

    def close(self) -> None:
        pass


def test_a_round_keeps_every_gpus_processes_cached(proc: Path) -> None:
    """The agent attributes the whole round at once, so no GPU's pids evict another's."""
    cache = SampleCache()
    agent = Agent(
        source=_TwoGpus(),
        telemetry=Telemetry(cache, {"host.name": "n"}, version="0"),
        cache=cache,
        interval_seconds=10,
        attribution=Attributor(proc).attribute,
    )
    first = agent.sample_once().snapshot.gpus
    for pid in (4101, 4102):  # a re-read would now find job 8
        (proc / str(pid) / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_8/x\n")
    second = agent.sample_once().snapshot.gpus
    assert second == first
    assert [[p.job for p in gpu.processes] for gpu in second] == [
        [slurm("123")],
        [slurm("4242"), slurm("123")],
        [],
    ]
    assert second[1].processes[0].gpu_memory_bytes == 1
