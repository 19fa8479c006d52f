"""Background work of the collector app: job polling, accounting, eviction, detection,
remediation, alerting.

Each loop runs its blocking step in a worker thread, on a monotonic deadline, and survives its own
failures (one broad except per iteration, logged with the traceback).
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
from gpuwarden.collector.web.keys import SERVICE

log = logging.getLogger(__name__)


async def _every(name: str, interval_seconds: float, step: Callable[[], object]) -> None:
    deadline = time.monotonic()
    while True:
        try:
            await asyncio.to_thread(step)
        except Exception:  # one broad except per iteration: the loop must go on
            log.exception("%s failed; retrying in %.0f s", name, interval_seconds)
        deadline += interval_seconds
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))


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
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` entry that runs the service's loops while the app serves."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        service = app[SERVICE]
        tasks = [
            asyncio.create_task(_every("job polling", job_poll_seconds, service.poll_jobs)),
            asyncio.create_task(_every("accounting", accounting_seconds, service.run_accounting)),
            asyncio.create_task(_every("eviction", evict_seconds, service.store.evict_stale)),
        ]
        if detection is not None:
            tasks.append(
                asyncio.create_task(_every("detection", detection_seconds, detection.run_cycle))
            )
        if remediator is not None:
            tasks.append(
                asyncio.create_task(_every("remediation", remediation_seconds, remediator.tick))
            )
        if dispatcher is not None:
            tasks.append(asyncio.create_task(_every("alerting", alerting_seconds, dispatcher.tick)))
        if service.scraper is not None:
            tasks.append(
                asyncio.create_task(_every("model scraping", scrape_seconds, service.scrape_models))
            )
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return context
