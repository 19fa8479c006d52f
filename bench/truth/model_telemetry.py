"""What a model server and its GPUs send, drawn from a request rate, an error ratio and a latency.

A :class:`ModelTraffic` holds, on the fleet's cadence grid, the demand (requests/s), the share
of requests that fail and the median request latency (seconds; latencies are log-normal around
it). Every count is drawn once, from the fleet's seed: requests per interval are Poisson, failures
binomial, latency bucket counts multinomial over the log-normal's bucket probabilities. Points
are cumulative, as the OTel SDK and Prometheus servers export them:

- ``gpuwarden.model.requests`` (sum, monotonic) by ``outcome`` (``success``, ``failure``);
- ``gpuwarden.model.request.latency`` (histogram, seconds);
- the serving GPUs' info and utilisation (busy in proportion to demand over capacity).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr

from bench.truth.model import Gpu
from bench.truth.telemetry import gpu_points
from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint
from gpuwarden.collector.store.types import AttrValue

Floats = npt.NDArray[np.float64]
REQUESTS = "gpuwarden.model.requests"
LATENCY = "gpuwarden.model.request.latency"
BOUNDS = tuple(float(b) for b in np.geomspace(0.01, 60.0, 61))
LATENCY_SIGMA = 0.4
"""Spread of log-latency: p95 is about 1.9x the median."""


@dataclass
class ModelTraffic:
    """One model's traffic on ``[start, start + cadence * (len(rps) - 1)]``.

    ``capacity_rps`` only sets how busy the serving GPUs look (utilisation 0.1 + 0.85 x load).
    """

    model: str
    node: str
    gpus: tuple[Gpu, ...]
    start: float
    cadence: float
    rps: Floats
    error_ratio: Floats
    median_seconds: Floats
    capacity_rps: float
    seed: int
    _ok: npt.NDArray[np.int64] = field(init=False, repr=False)
    _failed: npt.NDArray[np.int64] = field(init=False, repr=False)
    _buckets: npt.NDArray[np.int64] = field(init=False, repr=False)
    _sums: Floats = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        n = rng.poisson(np.maximum(self.rps, 0.0) * self.cadence)
        failed = rng.binomial(n, np.clip(self.error_ratio, 0.0, 1.0))
        self._ok = np.cumsum(n - failed)
        self._failed = np.cumsum(failed)
        z = (np.log(BOUNDS)[None, :] - np.log(self.median_seconds)[:, None]) / LATENCY_SIGMA
        cdf = np.concatenate((np.zeros((len(n), 1)), ndtr(z), np.ones((len(n), 1))), axis=1)
        probs = np.diff(cdf, axis=1)
        probs /= probs.sum(axis=1, keepdims=True)
        self._buckets = np.cumsum(rng.multinomial(n, probs), axis=0)
        mean = self.median_seconds * np.exp(LATENCY_SIGMA**2 / 2)
        self._sums = np.cumsum(n * mean)

    def index(self, t: float) -> int:
        """The grid index of ``t``."""
        return round((t - self.start) / self.cadence)

    def points(self, t: float) -> list[NumberPoint]:
        """The request counters and the serving GPUs' utilisation at ``t``."""
        k = self.index(t)
        resource: dict[str, AttrValue] = {"host.name": self.node}
        out = [
            NumberPoint(resource, REQUESTS, "{request}", "sum", True,
                        {"model": self.model, "outcome": outcome}, int(t * 1e9), float(value))
            for outcome, value in (("success", self._ok[k]), ("failure", self._failed[k]))
        ]  # fmt: skip
        load = float(self.rps[k]) / self.capacity_rps
        util = min(1.0, 0.1 + 0.85 * load)
        for gpu in self.gpus:
            out += gpu_points(gpu, t, util, 60.0 * 2**30)
        return out

    def histograms(self, t: float) -> list[HistogramPoint]:
        """The cumulative latency histogram at ``t``."""
        k = self.index(t)
        return [
            HistogramPoint(
                resource={"host.name": self.node},
                metric=LATENCY,
                unit="s",
                attributes={"model": self.model},
                time_unix_nano=int(t * 1e9),
                bounds=BOUNDS,
                bucket_counts=tuple(int(c) for c in self._buckets[k]),
                sum_value=float(self._sums[k]),
            )
        ]


def diurnal(times: Floats, low: float, high: float, peak_hour: float = 15.0) -> Floats:
    """A daily curve from ``low`` (at night) to ``high`` (at ``peak_hour`` UTC)."""
    phase = 2 * np.pi * ((times % 86400.0) / 3600.0 - peak_hour) / 24.0
    out: Floats = low + (high - low) * 0.5 * (1.0 + np.cos(phase))
    return out
