"""A fleet's telemetry while it is being drawn: per-GPU utilisation on the cadence grid, plus
whatever else agents send (host CPU, GPU processes, faults) as extra point makers.

Generators paint segments onto the canvas; :meth:`Canvas.points` is the fleet's ``points``.
NaN utilisation is a gap (the agent sent nothing for that GPU then).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bench.truth.model import Gpu
from bench.truth.telemetry import GIB, gpu_points
from gpuwarden.collector.ingest.otlp import NumberPoint

Extra = Callable[[float], list[NumberPoint]]


@dataclass
class Canvas:
    """Utilisation of ``gpus`` on ``[start, end]`` every ``cadence`` seconds."""

    gpus: tuple[Gpu, ...]
    start: float
    end: float
    cadence: float
    extras: list[Extra] = field(default_factory=list)
    util: dict[Gpu, npt.NDArray[np.float64]] = field(init=False)
    memory: dict[Gpu, npt.NDArray[np.float64]] = field(init=False)

    def __post_init__(self) -> None:
        n = round((self.end - self.start) / self.cadence) + 1
        self.util = {g: np.zeros(n) for g in self.gpus}
        self.memory = {g: np.full(n, np.nan) for g in self.gpus}

    @property
    def times(self) -> npt.NDArray[np.float64]:
        n = len(next(iter(self.util.values())))
        return np.asarray(self.start + self.cadence * np.arange(n), dtype=np.float64)

    def span(self, start: float, end: float) -> slice:
        """The grid indices of ``[start, end)``."""
        lo = max(0, int(np.ceil((start - self.start) / self.cadence)))
        hi = max(lo, int(np.ceil((end - self.start) / self.cadence)))
        return slice(lo, hi)

    def paint(
        self, gpu: Gpu, start: float, end: float, values: npt.ArrayLike | float,
        *, memory_gib: float | None = None,
    ) -> None:  # fmt: skip
        """Set the GPU's utilisation (and memory) on ``[start, end)``."""
        s = self.span(start, end)
        n = s.stop - s.start
        self.util[gpu][s] = np.broadcast_to(np.asarray(values, dtype=float), (n,))[:n]
        if memory_gib is not None:
            self.memory[gpu][s] = memory_gib * GIB

    def points(self, t: float) -> list[NumberPoint]:
        """Everything agents send at ``t`` (a time on the grid)."""
        k = round((t - self.start) / self.cadence)
        out: list[NumberPoint] = []
        for gpu in self.gpus:
            u, m = self.util[gpu][k], self.memory[gpu][k]
            out += gpu_points(gpu, t, None if np.isnan(u) else float(u),
                              None if np.isnan(m) else float(m))  # fmt: skip
        for extra in self.extras:
            out += extra(t)
        return out


def noisy(
    rng: np.random.Generator, n: int, level: float, sd: float = 0.03
) -> npt.NDArray[np.float64]:
    """``n`` samples around ``level``, clipped to a utilisation ratio."""
    return np.clip(level + sd * rng.standard_normal(n), 0.0, 1.0)
