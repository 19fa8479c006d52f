"""``gpuwarden backtest`` and ``rules test``: recorded telemetry through the real engine."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from gpuwarden.collector.backtest.cli import (
    add_backtest_parser,
    add_rules_test_parser,
    run_backtest,
    run_rules_test,
)
from gpuwarden.collector.backtest.data import RELATIVE_ORIGIN, Label, Reading, load_dataset
from gpuwarden.collector.backtest.replay import Backtest, FoundIncident, points_for, score, waste_of
from gpuwarden.collector.detect.incidents import IncidentTracker

GENTD26 = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba_gentd26"
WINDOW = 1800  # idle-gpu's window in the default rules
CYCLE = 60
RESOLVE_AFTER = IncidentTracker.resolve_after  # clear cycles before an incident resolves
CADENCE = 10
H100_USD_PER_HOUR = 4.00  # the default price table, on-demand


def _write_trace(path: Path, idle: dict[str, tuple[int, int]], *, seconds: int) -> Path:
    """Two GPUs of one job on node n1, busy (80 %) except over their ``idle`` spans."""
    lines = ["time_seconds,gpu_uuid,node,job,name,utilization_ratio"]
    for t in range(0, seconds, CADENCE):
        for gpu in ("GPU-a", "GPU-b"):
            lo, hi = idle.get(gpu, (0, 0))
            value = 0.0 if lo <= t < hi else 0.8
            lines.append(f"{t},{gpu},n1,train-1,NVIDIA H100 80GB HBM3,{value}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(argv: list[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    add_backtest_parser(commands)
    rules = commands.add_parser("rules").add_subparsers(dest="rules_command", required=True)
    add_rules_test_parser(rules)
    args = parser.parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    runner = run_backtest if args.command == "backtest" else run_rules_test
    code = runner(args, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _json(argv: list[str]) -> dict[str, object]:
    code, out, err = _run([*argv, "--format", "json"])
    assert code == 0, err
    result: dict[str, object] = json.loads(out)
    return result


IDLE_A = (3600, 7200)


def test_backtest_finds_exactly_the_idle_span(tmp_path: Path) -> None:
    data = _write_trace(tmp_path / "trace.csv", {"GPU-a": IDLE_A}, seconds=3 * 3600)
    result = _json(["backtest", "--data", str(data)])
    assert result["incidents"] == [
        {
            "rule": "idle-gpu",
            "subject": "api:train-1",  # the job: one incident for its idle GPUs
            # the first cycle whose whole window is idle; the last idle cycle, then 3 clear ones
            "opened_seconds": IDLE_A[0] + WINDOW,
            "last_seen_seconds": IDLE_A[1],
            "resolved_seconds": IDLE_A[1] + RESOLVE_AFTER * CYCLE,
            "summary": "job api:train-1 left 1 of its 2 GPU(s) idle for 30m on n1",
            "waste_gpu_hours": (IDLE_A[1] - IDLE_A[0]) / 3600,
            "waste_usd": (IDLE_A[1] - IDLE_A[0]) / 3600 * H100_USD_PER_HOUR,
        }
    ]
    assert result["waste"] == {"idle-gpu": {"gpu_hours": 1.0, "usd": H100_USD_PER_HOUR}}
    assert result["cycles"] == 3 * 3600 // CYCLE + 1
    assert result["failed_rules"] == []
    assert "idle-gpu" in result["rules"]  # type: ignore[operator]


def test_rules_test_prints_the_same_incident(tmp_path: Path) -> None:
    data = _write_trace(tmp_path / "trace.csv", {"GPU-a": IDLE_A}, seconds=3 * 3600)
    result = _json(["rules", "test", "idle-gpu", "--data", str(data)])
    assert result["rules"] == ["idle-gpu"]
    incidents = result["incidents"]
    assert isinstance(incidents, list)
    assert [(i["rule"], i["subject"], i["opened_seconds"]) for i in incidents] == [
        ("idle-gpu", "api:train-1", IDLE_A[0] + WINDOW)
    ]
    code, table, err = _run(["rules", "test", "idle-gpu", "--data", str(data)])
    assert code == 0
    assert err == ""  # no progress bar when stderr is not a terminal
    row = next(line for line in table.splitlines() if "api:train-1" in line)
    assert f"{IDLE_A[0] + WINDOW} +1h30" in row
    assert f"{IDLE_A[1] + RESOLVE_AFTER * CYCLE} +2h03" in row


def test_labels_give_precision_recall_and_delay(tmp_path: Path) -> None:
    # GPU-a idle 1 h (labelled), GPU-b idle 45 min (not labelled: a false alarm for the score),
    # and a labelled window on GPU-a in which it was busy (missed). Both GPUs are one job's: its
    # incidents are about the job, and a label on a GPU matches the incident that lists it.
    idle = {"GPU-a": IDLE_A, "GPU-b": (1800, 4500)}
    data = _write_trace(tmp_path / "trace.csv", idle, seconds=3 * 3600)
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "subject,start,end,rule\nn1/GPU-a,3600,7200,idle-gpu\nn1/GPU-a,0,1200,idle-gpu\n"
    )
    result = _json(["rules", "test", "idle-gpu", "--data", str(data), "--labels", str(labels)])
    assert result["scores"] == [
        {
            "rule": "idle-gpu",
            "incidents": 2,
            "true_incidents": 1,
            "labels": 2,
            "labels_found": 1,
            "precision": 0.5,
            "recall": 0.5,
            "delays_seconds": [WINDOW],  # opened at 3600 + 1800, the window began at 3600
        }
    ]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("quiet", "shown"), [(False, True), (True, False)])
def test_progress_bar_on_a_terminal_unless_quiet(tmp_path: Path, quiet: bool, shown: bool) -> None:
    data = _write_trace(tmp_path / "trace.csv", {}, seconds=1200)
    parser = argparse.ArgumentParser()
    rules = parser.add_subparsers(dest="rules_command", required=True)
    add_rules_test_parser(rules)
    args = parser.parse_args(
        ["test", "idle-gpu", "--data", str(data), *(["--quiet"] if quiet else [])]
    )
    err = _Terminal()
    assert run_rules_test(args, out=io.StringIO(), err=err) == 0
    assert ("backtest:" in err.getvalue()) is shown


def _incident(subject: str, opened: float, resolved: float | None) -> FoundIncident:
    return FoundIncident("idle-gpu", subject, opened, resolved or opened, resolved, "", None, None)


def test_score_one_incident_spanning_two_windows_and_a_late_one() -> None:
    incidents = (
        _incident("n1/a", 1800, 9000),  # open across a short busy spell between two windows
        _incident("n1/b", 5000, None),  # opens 100 s after its window ended: within the grace
        _incident("n1/c", 100, 200),  # no window: a false alarm
    )
    labels = (
        Label("n1/a", 0, 4000),
        Label("n1/a", 4100, 8000),
        Label("n1/b", 1000, 4900),
        Label("n1/b", 20000, 30000),  # missed
    )
    backtest = Backtest("x", 3, 1, 0, 40000, 10, 60, 10, ("idle-gpu",), (), (), incidents)
    [result] = score(backtest, labels, grace_seconds=120)
    assert (result.incidents, result.true_incidents) == (3, 2)
    assert (result.labels, result.labels_found) == (4, 3)
    assert result.delays_seconds == (1800.0, 0.0, 4000.0)
    assert result.precision == 2 / 3
    assert result.recall == 3 / 4
    [tight] = score(backtest, labels, grace_seconds=60)  # b's incident is now too late
    assert (tight.true_incidents, tight.labels_found) == (1, 2)


def test_relative_times_are_shifted_and_reported_unshifted(tmp_path: Path) -> None:
    data = _write_trace(tmp_path / "trace.csv", {}, seconds=600)
    dataset = load_dataset(data)
    assert dataset.offset_seconds == RELATIVE_ORIGIN
    assert dataset.start_seconds == RELATIVE_ORIGIN
    assert dataset.cadence_seconds == CADENCE
    first = next(iter(dataset.readings()))
    assert first.time_seconds == RELATIVE_ORIGIN
    [job] = dataset.jobs
    assert job.start_time == RELATIVE_ORIGIN
    assert job.end_time == RELATIVE_ORIGIN + 600  # one cadence after the last row


def test_an_agent_trace_without_jobs_holds_each_gpu_by_a_job_of_its_own(tmp_path: Path) -> None:
    data = tmp_path / "agent.csv"
    data.write_text(
        "time_seconds,gpu_uuid,name,utilization_ratio\n"
        "0,GPU-a,H100,0.0\n0,GPU-b,H100,0.5\n10,GPU-a,H100,0.0\n"
    )
    dataset = load_dataset(data)
    spans = {(j.key, j.start_time, j.end_time, j.allocations[0].uuids) for j in dataset.jobs}
    o = RELATIVE_ORIGIN
    assert spans == {
        ("api:replay-GPU-a", o, o + 20, ("GPU-a",)),  # one cadence (10 s) after its last row
        ("api:replay-GPU-b", o, o + 10, ("GPU-b",)),
    }


def test_points_are_the_agents() -> None:
    reading = Reading(100.0, "n1", "GPU-a", "H100", 3, {"utilization_ratio": 0.25})
    info, util = points_for(reading)
    assert (info.metric, info.attributes["hw.id"], info.attributes["gpuwarden.gpu.index"]) == (
        "gpuwarden.gpu.info",
        "GPU-a",
        3,
    )
    assert util.metric == "hw.gpu.utilization"
    assert util.attributes == {"hw.id": "GPU-a", "hw.gpu.task": "general"}
    assert util.resource == {"host.name": "n1"}
    assert (util.time_unix_nano, util.value) == (100_000_000_000, 0.25)


@pytest.mark.parametrize(
    ("evidence", "first", "last", "expected"),
    [
        # one GPU, 30 min window, $2 per window: idle from first − 30 min to last
        ({"idle_gpu_hours": 0.5, "wasted_usd": 2.0, "window_minutes": 30}, 0, 1800, (1.0, 4.0)),
        # two GPUs of a job over a 2 h window, seen once
        ({"wasted_gpu_hours": 4.0, "wasted_usd": 8.0, "window_hours": 2.0}, 0, 0, (4.0, 8.0)),
        # no window in the evidence: one window's worth
        ({"starved_gpu_hours": 1.5, "wasted_usd": 3.0}, 0, 7200, (1.5, 3.0)),
        ({"xid": 79}, 0, 600, (None, None)),  # a rule that does not price waste
        ({"idle_gpu_hours": 0.0, "wasted_usd": 0.0, "window_minutes": 30}, 0, 0, (None, None)),
    ],
)
def test_waste_of_an_incident(
    evidence: dict[str, object],
    first: float,
    last: float,
    expected: tuple[float | None, float | None],
) -> None:
    assert waste_of(evidence, first, last) == expected


def test_gentd26_pods_find_idle_incidents() -> None:
    if not (GENTD26 / "pod_gpu_duty_cycle_anon.csv.gz").is_file():
        pytest.skip(f"GenTD26 data not found in {GENTD26}")
    # one rule, a 5-minute cycle: the same machinery in a few seconds
    argv = ["rules", "test", "idle-gpu", "--data", str(GENTD26), "--pods", "10", "--cycle", "300"]
    result = _json(argv)
    assert result["gpus"] == 10
    incidents = result["incidents"]
    assert isinstance(incidents, list)
    assert incidents
    assert {i["rule"] for i in incidents} == {"idle-gpu"}
    assert len({i["subject"] for i in incidents}) <= 10
    assert all(str(i["subject"]).startswith("api:pod-") for i in incidents)  # one job per pod
    assert all(i["waste_gpu_hours"] >= WINDOW / 3600 for i in incidents)


def _bad(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


BAD_INPUTS = [
    ("missing", None, "no such file or folder"),
    ("header", "time,gpu,utilization_ratio\n", ":1: header must start with"),
    ("column", "time_seconds,gpu_uuid,colour\n0,g,1\n", ":1: unknown column 'colour'"),
    (
        "number",
        "time_seconds,gpu_uuid,utilization_ratio\n0,g,0.5\n10,g,abc\n",
        ":3: utilization_ratio: 'abc' is not a number",
    ),
    (
        "order",
        "time_seconds,gpu_uuid,utilization_ratio\n0,g,0.5\n20,g,0.5\n10,g,0.5\n",
        ":4: time_seconds 10 goes back in time",
    ),
    ("cells", "time_seconds,gpu_uuid,utilization_ratio\n0,g\n", ":2: 2 cells, the header has 3"),
    ("empty", "time_seconds,gpu_uuid,utilization_ratio\n", ":2: no data rows"),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_data_exits_2_naming_file_and_line(
    tmp_path: Path, name: str, text: str | None, message: str
) -> None:
    data = tmp_path / f"{name}.csv" if text is None else _bad(tmp_path, f"{name}.csv", text)
    code, out, err = _run(["backtest", "--data", str(data)])
    assert (code, out) == (2, "")
    assert err.startswith(f"gpuwarden backtest: {data}")
    assert message in err


def test_bad_labels_exit_2(tmp_path: Path) -> None:
    data = _write_trace(tmp_path / "trace.csv", {}, seconds=600)
    labels = _bad(tmp_path, "labels.csv", "subject,start,end\nn1/GPU-a,600,300\n")
    code, _, err = _run(["backtest", "--data", str(data), "--labels", str(labels)])
    assert code == 2
    assert f"{labels}:2: end 300 is before start 600" in err


def test_unknown_rule_exits_2(tmp_path: Path) -> None:
    data = _write_trace(tmp_path / "trace.csv", {}, seconds=600)
    code, _, err = _run(["rules", "test", "no-such-rule", "--data", str(data)])
    assert code == 2
    assert "gpuwarden rules test: rule 'no-such-rule' is not in" in err
    assert "idle-gpu" in err  # the known rules are listed


def test_broken_rules_file_exits_2_naming_file_and_key(tmp_path: Path) -> None:
    data = _write_trace(tmp_path / "trace.csv", {}, seconds=600)
    rules = _bad(tmp_path, "bad.yaml", "rules:\n  - id: x\n    detector: idle_gpu\n    colour: 1\n")
    code, _, err = _run(["backtest", "--data", str(data), "--rules", str(rules)])
    assert code == 2
    assert str(rules) in err
    assert "colour" in err


def test_pods_only_for_gentd26(tmp_path: Path) -> None:
    data = _write_trace(tmp_path / "trace.csv", {}, seconds=600)
    code, _, err = _run(["backtest", "--data", str(data), "--pods", "3"])
    assert code == 2
    assert "--pods: only for a GenTD26 folder" in err


@pytest.mark.parametrize(
    ("value", "key", "scheduler"),
    [
        ("k8s:research/notebook-7", "k8s:research/notebook-7", "kubernetes"),
        ("slurm:gwtest:42", "slurm:gwtest:42", "slurm"),
        ("api:train", "api:train", "api"),
        ("train", "api:train", "api"),
        ("team:x", "api:team:x", "api"),  # not a job source's prefix: a name
    ],
)
def test_a_job_column_keeps_a_job_sources_key(
    tmp_path: Path, value: str, key: str, scheduler: str
) -> None:
    data = tmp_path / "jobs.csv"
    data.write_text(
        "time_seconds,gpu_uuid,node,job,name,utilization_ratio\n"
        f"0,GPU-a,n1,{value},H100,0.0\n10,GPU-a,n1,{value},H100,0.0\n"
    )
    [job] = load_dataset(data).jobs
    assert (job.key, job.scheduler) == (key, scheduler)
