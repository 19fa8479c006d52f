"""The demo command runs the whole pipeline; its database feeds ``gpuwarden report costs``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Run the demo once for this module: its output and its database."""
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "--log-level",
            "WARNING",
            "demo",
            "--duration",
            "6",
            "--speed",
            "60",
            "--db",
            str(db),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, db


def test_demo_runs_end_to_end(demo):
    out, db = demo
    assert "gpu-node-a      8" in out
    assert "gpu-node-b      8" in out
    for job in ("slurm:demo:1001", "slurm:demo:2001", "slurm:demo:2004"):
        assert job in out
    assert " 0 rejected" in out
    assert "{200:" in out
    assert db.exists()


def test_report_costs_on_the_demo_fleet_matches_the_scenario(demo):
    """The demo's jobs hold 8 (spot), 2, 2, 2 and 1 GPUs (on-demand) for the same window."""
    _, db = demo
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "report",
            "costs",
            "--db",
            str(db),
            "--since",
            "1h",
            "--by",
            "job",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    groups = {g["group"]: g for g in json.loads(report.stdout)["groups"]}
    gpus = {
        "slurm:demo:1001": 8,
        "slurm:demo:2001": 2,
        "slurm:demo:2002": 2,
        "slurm:demo:2003": 2,
        "slurm:demo:2004": 1,
    }
    per_gpu = {key: groups[key]["gpu_hours_allocated"] / n for key, n in gpus.items()}
    reference = per_gpu["slurm:demo:1001"]
    assert reference > 0
    for key, hours in per_gpu.items():  # every job held its GPUs for the same window
        assert hours == pytest.approx(reference, rel=0.01), key
    # prices: H100 spot 1.60 $/GPU-h (node b, team llm), on-demand 4.00 $/GPU-h (node a)
    assert groups["slurm:demo:1001"]["cost_usd"] == pytest.approx(8 * reference * 1.60, rel=0.01)
    assert groups["slurm:demo:2001"]["cost_usd"] == pytest.approx(2 * reference * 4.00, rel=0.01)
    # training is busy, the idle-allocated job is idle, whenever there was data
    training, idle = groups["slurm:demo:1001"], groups["slurm:demo:2004"]
    assert training["gpu_hours_busy"] > 0
    assert training["gpu_hours_idle"] == 0
    assert idle["gpu_hours_busy"] == 0
    assert idle["gpu_hours_idle"] > 0
