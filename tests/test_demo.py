"""The demo command runs the whole pipeline and reports what the collector received."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_end_to_end(tmp_path):
    db = tmp_path / "demo.db"
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
    out = proc.stdout
    assert "gpu-node-a      8" in out
    assert "gpu-node-b      8" in out
    for job in ("slurm:demo:1001", "slurm:demo:2001", "slurm:demo:2004"):
        assert job in out
    assert " 0 rejected" in out
    assert "{200:" in out
    assert db.exists()
