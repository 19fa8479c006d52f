"""``python -m tests.slow_detection collector ...``: the real CLI with a slow detection cycle.

Each cycle says ``detection cycle started`` on stdout, then holds until the app starts to stop
(``AppRunner.cleanup``), does half a second more work and reads the store, as a long cycle over a
large fleet would, and says ``detection cycle finished``. So a signal sent after the first line
always lands while a cycle runs, and the cycle touches the store after shutdown began. (The CLI
builds its engine inside; a subprocess has no other seam than replacing the method.)
"""

from __future__ import annotations

import sys
import threading
import time

from aiohttp import web

from gpuwarden.cli import main
from gpuwarden.collector.detect.engine import CycleResult, DetectionEngine

HOLD_SECONDS = 30.0
"""Bound on the hold: a cycle goes on by itself if the app never stops."""
REST_OF_CYCLE_SECONDS = 0.5
"""The work a long cycle still has to do once the stop begins (not a wait for anything)."""

stopping = threading.Event()
run_cycle = DetectionEngine.run_cycle
cleanup = web.AppRunner.cleanup


def slow_cycle(engine: DetectionEngine, now: float | None = None) -> CycleResult:
    print("detection cycle started", flush=True)
    stopping.wait(HOLD_SECONDS)
    time.sleep(REST_OF_CYCLE_SECONDS)
    engine._tracker.storage.incidents()  # what a real cycle reads
    result = run_cycle(engine, now)
    print("detection cycle finished", flush=True)
    return result


async def signalled_cleanup(runner: web.AppRunner) -> None:
    stopping.set()
    await cleanup(runner)


DetectionEngine.run_cycle = slow_cycle  # type: ignore[method-assign,assignment]
web.AppRunner.cleanup = signalled_cleanup  # type: ignore[method-assign,assignment]

if __name__ == "__main__":
    sys.exit(main())
