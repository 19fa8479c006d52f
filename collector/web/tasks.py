"""Background work of the collector app: job polling, accounting, eviction, detection,
remediation, alerting, remote-write and the store's snapshots.

Each loop runs its blocking step in a worker thread, on a monotonic deadline, and survives its own
failures (one broad except per iteration, logged with the traceback). When the app stops, the loops
are told to stop and a step already running is waited for (up to ``stop_timeout_seconds``): a
worker thread cannot be cancelled, and the storage closes right after (the app's ``on_cleanup``).
A detection cycle that runs in a forked child (``detect.fork``) is not waited for: its child is
killed, so a cycle over a large fleet never holds up the stop.
Remote-write's buffer is flushed to its durable queue once more at the end, so a restart
sends what it held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.notify.dispatcher import AlertDispatcher
from gpuwarden.collector.remediate.remediator import Remediator
from gpuwarden.collector.remote_write.derived import job_samples
from gpuwarden.collector.web.keys import SERVICE

log = logging.getLogger(__name__)


STOP_TIMEOUT_SECONDS = 30.0
"""How long stopping waits for a step already running (a detection cycle) before giving up on it."""


async def _every(
    name: str,
    interval_seconds: float,
    step: Callable[[], object],
    stop: asyncio.Event,
    *,
    first_after_seconds: float = 0.0,
) -> None:
    deadline = time.monotonic() + first_after_seconds
    if first_after_seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), first_after_seconds)
    while not stop.is_set():
        try:
            await asyncio.to_thread(step)
        except Exception:  # one broad except per iteration: the loop must go on
            log.exception("%s failed; retrying in %.0f s", name, interval_seconds)
        deadline += interval_seconds
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, deadline - time.monotonic()))


async def _stop(loops: dict[asyncio.Task[None], str], timeout_seconds: float) -> None:
    """Let each loop finish its running step and end; cancel what is still busy at the deadline."""
    _, busy = await asyncio.wait(loops, timeout=timeout_seconds)
    if busy:
        names = ", ".join(sorted(loops[task] for task in busy))
        log.warning("still running after %.0f s, stopping without it: %s", timeout_seconds, names)
    for task in busy:
        task.cancel()
    for task in loops:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def background(
    *,
    job_poll_seconds: float,
    accounting_seconds: float,
    scrape_seconds: float = 15.0,
    evict_seconds: float = 600.0,
    detection: DetectionEngine | None = None,
    detection_seconds: float = 60.0,
    remediator: Remediator | None = None,
    remediation_seconds: float = 30.0,
    dispatcher: AlertDispatcher | None = None,
    alerting_seconds: float = 15.0,
    snapshot_seconds: float = 0.0,
    stop_timeout_seconds: float = STOP_TIMEOUT_SECONDS,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` entry that runs the service's loops while the app serves.

    With ``snapshot_seconds`` (and a service with a ``snapshot_path``) the store is written to
    its snapshot every so often, first one interval after the start, and once more when the
    app stops, after the other loops have ended.
    """

    async def context(app: web.Application) -> AsyncIterator[None]:
        service = app[SERVICE]
        steps: list[tuple[str, float, Callable[[], object]]] = [
            ("job polling", job_poll_seconds, service.poll_jobs),
            ("accounting", accounting_seconds, service.run_accounting),
            ("eviction", evict_seconds, service.store.evict_stale),
        ]
        if detection is not None:
            steps.append(("detection", detection_seconds, detection.run_cycle))
        if remediator is not None:
            steps.append(("remediation", remediation_seconds, remediator.tick))
        if dispatcher is not None:
            steps.append(("alerting", alerting_seconds, dispatcher.tick))
        if service.scraper is not None:
            steps.append(("model scraping", scrape_seconds, service.scrape_models))
        history = service.history
        if history is not None:
            steps.append(("remote-write", history.flush_seconds, history.tick))
            steps.append(
                (
                    "remote-write job totals",
                    accounting_seconds,
                    lambda: history.add(job_samples(service.storage, service.clock())),
                )
            )
        stop = asyncio.Event()
        loops = {
            asyncio.create_task(_every(name, seconds, step, stop)): name
            for name, seconds, step in steps
        }
        snapshots = snapshot_seconds > 0 and service.snapshot_path is not None
        if snapshots:
            snapshot = _every(
                "snapshot",
                snapshot_seconds,
                service.save_snapshot,
                stop,
                first_after_seconds=snapshot_seconds,
            )
            loops[asyncio.create_task(snapshot)] = "snapshot"
        yield
        stop.set()
        if detection is not None:  # a cycle in its forked child is killed, not waited for
            detection.stop()
        await _stop(loops, stop_timeout_seconds)
        if history is not None:  # first: quick, and what it holds is not on disk elsewhere
            await asyncio.to_thread(history.flush)
        if snapshots:
            try:
                await asyncio.to_thread(service.save_snapshot)
            except Exception:  # the shutdown goes on: the last periodic snapshot stays
                log.exception("the snapshot at shutdown failed")

    return context
