"""``gpuwarden backtest`` and ``gpuwarden rules test`` on recorded traces."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from gpuwarden.collector.backtest import Label, read_labels, run_backtest, score
from gpuwarden.collector.backtest_cli import add_backtest_parser, run_backtest_command
from gpuwarden.collector.rules import default_rules_dir, default_runbooks_dir, load_rules
from gpuwarden.collector.rules_cli import add_rules_parser, run_rules

GENTD26 = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba_gentd26"
BUSY, IDLE = "GPU-00000000-0000-0000-0000-00000000000b", "GPU-00000000-0000-0000-0000-00000000000a"


def trace(path: Path, hours: float = 4.0) -> Path:
    """Two GPUs every 60 s: one busy throughout, one idle from 1 h to 2.5 h."""
    rows = ["time_seconds,gpu_uuid,name,utilization_ratio,power_watts"]
    for t in range(0, int(hours * 3600), 60):
        idle = 3600 <= t < 9000
        rows.append(f"{t},{BUSY},NVIDIA H100 80GB HBM3,0.9,600")
        rows.append(
            f"{t},{IDLE},NVIDIA H100 80GB HBM3,{0.0 if idle else 0.8},{80 if idle else 550}"
        )
    path.write_text("\n".join(rows) + "\n")
    return path


def cli(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="gpuwarden")
    sub = parser.add_subparsers(dest="command", required=True)
    add_backtest_parser(sub)
    add_rules_parser(sub)
    args = parser.parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    if args.command == "backtest":
        code = run_backtest_command(args, out=out, err=err)
    else:
        code = run_rules(args, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_the_known_idle_span_gives_exactly_that_incident(tmp_path):
    data = trace(tmp_path / "t.csv")
    (tmp_path / "labels.csv").write_text(f"subject,start,end\n{IDLE},3600,9000\n")
    code, out, err = cli("backtest", "--data", str(data), "--labels", str(tmp_path / "labels.csv"),
                         "--format", "json", "--quiet")  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    idle = [i for i in result["incidents"] if i["rule"] == "idle-gpu"]
    assert [i["subject"] for i in idle] == [f"{'replay'}/{IDLE}"]
    (incident,) = idle
    # 30-minute window: the span starts at 1 h, so the incident opens at 1.5 h (next cycle)
    assert 5400 <= incident["opened_seconds"] <= 5400 + 60
    assert incident["resolved_seconds"] is not None
    assert 9000 <= incident["resolved_seconds"] <= 9000 + 4 * 60  # hysteresis: 3 clear cycles
    # idle GPU-h: the window before opening plus the time open, priced on demand ($4/GPU-h)
    assert incident["idle_gpu_hours"] == pytest.approx(1.5, abs=0.1)
    assert incident["wasted_usd"] == pytest.approx(incident["idle_gpu_hours"] * 4.0)
    quality = result["quality"]
    assert quality["recall"] == 1.0
    assert quality["precision"] == pytest.approx(1 / len(result["incidents"]))
    assert quality["delays_seconds"][0] == pytest.approx(incident["opened_seconds"] - 3600)


def test_rules_test_runs_one_rule_and_prints_what_it_found(tmp_path):
    data = trace(tmp_path / "t.csv")
    code, out, err = cli("rules", "test", "idle-gpu", "--data", str(data), "--quiet")
    assert code == 0, err
    assert "rules: idle-gpu" in out
    assert "idle-gpu" in out
    assert f"replay/{IDLE}" in out
    # 1 h 30 min idle + 3 min of hysteresis, at the H100's $4.00 per GPU-h
    assert "1 incidents; waste found: 1.6 idle GPU-h, $6.20 at on-demand prices" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["backtest", "--data", "/nonexistent.csv"], "no such file"),
        (["rules", "test", "no-such-rule", "--data", "X"], "no rule 'no-such-rule'"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(tmp_path, argv, message):
    argv = [str(trace(tmp_path / "t.csv")) if a == "X" else a for a in argv]
    code, _, err = cli(*argv)
    assert code == 2
    assert message in err


def test_bad_labels_and_traces_name_the_file_and_line(tmp_path):
    labels = tmp_path / "labels.csv"
    labels.write_text("subject,start,end\nGPU-1,10,5\n")
    with pytest.raises(ValueError, match=r"labels\.csv:2"):
        read_labels(labels)
    bad = tmp_path / "bad.csv"
    bad.write_text("time_seconds,gpu_uuid,utilization_ratio\n0,GPU-1,0.5\nx,GPU-1,0.5\n")
    code, _, err = cli("backtest", "--data", str(bad), "--quiet")
    assert code == 2
    assert "bad.csv:3" in err


def test_scoring_by_hand():
    from gpuwarden.collector.backtest import FoundIncident

    found = [
        FoundIncident("idle-gpu", "n/GPU-a", 1800.0, None, 1.0, 4.0),
        FoundIncident("idle-gpu", "n/GPU-b", 100.0, None, 1.0, 4.0),
    ]
    labels = [Label("GPU-a", 0.0, 3600.0), Label("GPU-c", 0.0, 3600.0)]
    quality = score(found, labels, match_slack=0.0)
    assert (quality.precision, quality.recall) == (0.5, 0.5)
    assert quality.delays_seconds == (1800.0,)


@pytest.mark.skipif(not GENTD26.exists(), reason=f"GenTD26 data not found at {GENTD26}")
def test_gentd26_pods_find_idle_incidents():
    rules = load_rules([default_rules_dir()], runbooks_dir=default_runbooks_dir())
    from gpuwarden.collector.backtest import only_rule

    result = run_backtest(
        only_rule(rules, "idle-gpu"),
        GENTD26 / "pod_gpu_duty_cycle_anon.csv.gz",
        max_gpus=10,
    )
    assert result.gpus == 10
    assert result.trace_seconds > 20 * 3600
    assert any(i.rule == "idle-gpu" for i in result.incidents)
    assert result.idle_gpu_hours > 0
