"""``gpuwarden policies test DIR --backtest TRACE``: a recorded trace replayed through the rules,
each incident's actions put to the policies, dry; and its exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden.cli import main

CADENCE = 30
IDLE_FROM = 300  # the job's two GPUs idle from here to the end of the hour


def _trace(path: Path) -> Path:
    lines = ["time_seconds,gpu_uuid,node,job,name,utilization_ratio"]
    for t in range(0, 3600, CADENCE):
        for gpu in ("GPU-a", "GPU-b"):
            value = 0.0 if t >= IDLE_FROM else 0.8
            lines.append(f"{t},{gpu},n1,train-1,NVIDIA H100 80GB HBM3,{value}")
    path.write_text("\n".join(lines) + "\n")
    return path


POLICIES = """\
policies:
  - name: backtest-idle
    kind: idle_reclaim
    selector: {teams: [backtest]}
    idle: {idle}
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _trace(tmp_path_factory.mktemp("trace") / "trace.csv")


@pytest.mark.parametrize(("idle", "outcome"), [("2h", "refuse"), ("20m", "allow")])
def test_the_idle_incidents_requeue_is_put_to_the_policy(
    tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str], idle: str, outcome: str
) -> None:
    policies = tmp_path / "p.yaml"
    policies.write_text(POLICIES.replace("{idle}", idle))
    argv = ["policies", "test", str(policies), "--backtest", str(trace), "--format", "json"]
    assert main(argv) == 0
    (verdict,) = json.loads(capsys.readouterr().out)
    assert (verdict["rule"], verdict["action"], verdict["subject"]) == (
        "idle-gpu",
        "requeue",
        "api:train-1",
    )
    assert verdict["outcome"] == outcome
    if outcome == "refuse":
        assert verdict["policy"] == "backtest-idle"
        assert verdict["reason"] == (
            "requeue refused: api:train-1 idle for 30m, policy backtest-idle reclaims after 2h"
        )
    else:
        assert verdict["policy"] is None


def test_exit_codes(tmp_path: Path, trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("policies:\n  - name: x\n    kind: limit\n")
    assert main(["policies", "test", str(bad), "--backtest", str(trace)]) == 1
    assert capsys.readouterr().err.splitlines()[0] == (
        f"{bad}: policies[0] (x): a limit needs max_gpus_per_job, max_gpus_per_team or "
        "max_gpus_per_model"
    )
    good = tmp_path / "good.yaml"
    good.write_text(POLICIES.replace("{idle}", "1h"))
    missing = tmp_path / "none.csv"
    assert main(["policies", "test", str(good), "--backtest", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"gpuwarden policies test: {missing}: no such file or folder\n"
    )
    argv = ["policies", "test", str(good), "--backtest", str(trace), "--spend", "ml"]
    assert main(argv) == 2
    assert "--spend: expected TEAM=DOLLARS, got 'ml'" in capsys.readouterr().err
