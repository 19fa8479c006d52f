"""The one place that runs Slurm's command-line tools (``squeue``, ``scontrol``).

Argument lists only, never a shell: callers build the list from constants and from ids and node
names they have already checked (see :mod:`gpuwarden.collector.jobs.slurm` and
:mod:`gpuwarden.collector.remediate.actuators.slurm`). The environment (``SLURM_CONF``, ``PATH``)
and the timeout are given at construction. Every call answers with a :class:`SlurmResult`: the
program exited (with its status and output), timed out (killed, with what it printed so far), or
could not be started (a missing binary, no permission) — outcomes, not exceptions.

The seam is :data:`SlurmRunner`, any callable from an argument list to a :class:`SlurmResult`:
:class:`SlurmCli` is the real one, tests pass a function that answers from a script.
"""

from __future__ import annotations

import enum
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field


class RunStatus(enum.Enum):
    """How a call ended."""

    EXITED = "exited"
    """The program ran and exited; ``returncode`` says how."""
    TIMED_OUT = "timed_out"
    """The program ran longer than the timeout and was killed."""
    NOT_STARTED = "not_started"
    """The program could not be started (not found, not executable)."""


@dataclass(frozen=True, slots=True)
class SlurmResult:
    """What one call of a Slurm program gave.

    ``stdout`` and ``stderr`` are text; after a timeout they hold what was printed before the kill.
    ``error`` is the operating system's message when the program did not start (``os_error`` the
    exception itself, for a caller that must raise it again).
    """

    args: tuple[str, ...]
    status: RunStatus
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    timeout_seconds: float | None = None
    error: str = ""
    os_error: OSError | None = field(default=None, compare=False, repr=False)

    @classmethod
    def exited(
        cls, args: Sequence[str], returncode: int, stdout: str = "", stderr: str = ""
    ) -> SlurmResult:
        """A program that ran and exited with ``returncode`` (what fakes answer)."""
        return cls(tuple(args), RunStatus.EXITED, returncode, stdout, stderr)

    @classmethod
    def timed_out(
        cls, args: Sequence[str], timeout_seconds: float, stdout: str = "", stderr: str = ""
    ) -> SlurmResult:
        """A program killed after ``timeout_seconds``."""
        return cls(
            tuple(args), RunStatus.TIMED_OUT, None, stdout, stderr, timeout_seconds=timeout_seconds
        )

    @classmethod
    def not_started(cls, args: Sequence[str], error: OSError) -> SlurmResult:
        """A program that could not be started."""
        return cls(tuple(args), RunStatus.NOT_STARTED, error=str(error), os_error=error)

    @property
    def ok(self) -> bool:
        """The program ran and exited with status 0."""
        return self.status is RunStatus.EXITED and self.returncode == 0


SlurmRunner = Callable[[Sequence[str]], SlurmResult]
"""Runs one argument list (program first) and says how it went."""


def _text(stream: str | bytes | None) -> str:
    # After a timeout, subprocess hands back raw bytes whatever ``text`` was.
    if isinstance(stream, bytes):
        return stream.decode("utf-8", errors="replace")
    return stream or ""


class SlurmCli:
    """Runs Slurm programs with one environment and one timeout (the real :data:`SlurmRunner`).

    Args:
        env: the programs' environment (``SLURM_CONF``, ``PATH``); ``None`` inherits ours.
        timeout_seconds: how long one call may take before it is killed.

    """

    def __init__(self, *, env: Mapping[str, str] | None, timeout_seconds: float) -> None:
        self._env = dict(env) if env is not None else None
        self.timeout_seconds = timeout_seconds

    def __call__(self, args: Sequence[str]) -> SlurmResult:
        """Run ``args`` (an argument list, program first; never through a shell)."""
        argv = list(args)
        if not argv or not all(isinstance(arg, str) for arg in argv):
            raise ValueError(f"a Slurm call is a non-empty list of strings, got {args!r}")
        try:
            completed = subprocess.run(
                argv,
                env=self._env,
                capture_output=True,
                text=True,
                timeout=self.timeout_seconds,
                check=False,
            )
        except subprocess.TimeoutExpired as expired:
            return SlurmResult.timed_out(
                argv, expired.timeout, _text(expired.stdout), _text(expired.stderr)
            )
        except OSError as error:
            return SlurmResult.not_started(argv, error)
        return SlurmResult.exited(argv, completed.returncode, completed.stdout, completed.stderr)
