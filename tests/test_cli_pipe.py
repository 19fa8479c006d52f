"""``gpuwarden ... | head``: a reader that closes the pipe ends the command quietly."""

from __future__ import annotations

import os
import subprocess
import sys

from gpuwarden.cli import EXIT_BROKEN_PIPE


def test_agent_once_into_a_closed_pipe_exits_quietly(tmp_path):
    """The reader is gone before the first write, as with ``| head -1`` on a slow start."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will read: the agent's first write meets EPIPE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuwarden", "--log-level", "WARNING", "agent",
             "--source", "simulated", "--once", "--spool-dir", str(tmp_path / "spool")],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
            cwd=tmp_path,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == EXIT_BROKEN_PIPE


def test_agent_once_read_to_the_end_still_exits_zero(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gpuwarden", "--log-level", "WARNING", "agent",
         "--source", "simulated", "--once", "--spool-dir", str(tmp_path / "spool")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("{")
