"""The demo's inference service: a simulated vLLM server that the collector scrapes.

It serves ``/metrics`` in vLLM's exposition format (through ``prometheus_client``): request
outcomes, the end-to-end latency histogram and the queue. Traffic follows a daily curve on the
demo's compressed clock. A deploy of a slower version makes latency and errors climb; sending a
share of the traffic to the smaller fallback model (the reference router's weights, read through
``fallback_share``) relieves the big model, so latency and errors come back down: the loop that
the degrade action closes.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class ServingProfile:
    """How the simulated model behaves.

    Latency is log-normal around ``base_latency_seconds`` × the version's slowdown × a load
    factor; the share of failed requests grows with latency past ``timeout_seconds``.
    """

    model: str = "llama-70b"
    fallback_model: str = "llama-8b"
    peak_requests_per_second: float = 40.0
    trough_requests_per_second: float = 8.0
    peak_hour_utc: float = 14.0
    base_latency_seconds: float = 0.35
    fallback_latency_seconds: float = 0.12
    slow_version_factor: float = 2.3
    timeout_seconds: float = 1.5
    base_error_ratio: float = 0.0005


class SimulatedModelServer:
    """The metrics of one model deployment, advanced one tick at a time.

    Args:
        profile: the behaviour.
        clock: the demo's compressed clock (Unix seconds); the daily curve follows it.
        fallback_share: the share of traffic the router sends to the fallback model (0..1).
        seed: randomness of request latencies.
    """

    def __init__(
        self,
        profile: ServingProfile,
        *,
        clock: Callable[[], float],
        fallback_share: Callable[[], float] = lambda: 0.0,
        seed: int = 7,
    ) -> None:
        self.profile = profile
        self.version = "v1"
        self._clock = clock
        self._fallback_share = fallback_share
        self._random = random.Random(seed)  # noqa: S311 - simulation, not security
        self._lock = threading.Lock()
        self.registry = CollectorRegistry()
        self._requests = Counter(
            "vllm:request_success",
            "Count of finished requests by reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency.",
            ["model_name"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._waiting = Gauge(
            "vllm:num_requests_waiting",
            "Requests waiting to be processed.",
            ["model_name"],
            registry=self.registry,
        )
        self._running = Gauge(
            "vllm:num_requests_running",
            "Requests being processed.",
            ["model_name"],
            registry=self.registry,
        )
        self.served = 0
        self.failed = 0

    def deploy(self, version: str) -> None:
        """Switch the big model to ``version`` (``v2`` is the slow one)."""
        with self._lock:
            self.version = version

    def rate(self, now: float) -> float:
        """Requests per second at ``now`` on the daily curve."""
        p = self.profile
        hour = (now % 86400) / 3600
        phase = math.cos(2 * math.pi * (hour - p.peak_hour_utc) / 24)
        mid = (p.peak_requests_per_second + p.trough_requests_per_second) / 2
        amplitude = (p.peak_requests_per_second - p.trough_requests_per_second) / 2
        return mid + amplitude * phase

    def tick(self, seconds: float) -> None:
        """Serve ``seconds`` of simulated traffic (the wall time since the last tick)."""
        p = self.profile
        with self._lock:
            slow = p.slow_version_factor if self.version == "v2" else 1.0
            share = min(1.0, max(0.0, self._fallback_share()))
            total = self._random.gauss(self.rate(self._clock()), 1.0) * seconds
            count = max(0, round(total))
            big = round(count * (1 - share))
            load = 0.4 + 0.9 * (1 - share)  # the big model is less loaded when traffic moves
            for i in range(count):
                to_big = i < big
                median = (
                    p.base_latency_seconds * slow * load if to_big else p.fallback_latency_seconds
                )
                latency = median * math.exp(self._random.gauss(0.0, 0.35))
                timed_out = latency > p.timeout_seconds and self._random.random() < 0.5
                error = timed_out or self._random.random() < p.base_error_ratio
                model = p.model  # the deployment's metrics: the router's traffic, both backends
                self._latency.labels(model).observe(min(latency, p.timeout_seconds * 2))
                reason = "error" if error else "stop"
                self._requests.labels(model, reason).inc()
                self.served += 1
                self.failed += int(error)
            waiting = max(0.0, (slow * load - 1.0) * 12 + self._random.random() * 2)
            self._waiting.labels(p.model).set(round(waiting))
            self._running.labels(p.model).set(min(64, round(self.rate(self._clock()) * 0.4)))

    async def metrics(self, _request: web.Request) -> web.Response:
        """``GET /metrics``: the text exposition a vLLM server answers."""
        with self._lock:
            body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def app(self) -> web.Application:
        """An aiohttp app serving ``/metrics``."""
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        return app
