"""Background work of the collector app: job polling, accounting, eviction, detection,
remediation, alerting, remote-write and the store's snapshots.

Each loop runs its blocking step in a worker thread, on a monotonic deadline, and survives its own
failures (one broad except per iteration, logged with the traceback). When the app stops, the loops
are told to stop and a step already running is waited for (up to ``stop_timeout_seconds``): a
worker thread cannot be cancelled, and the storage closes right after (the app's ``on_cleanup``).
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
from gpuwarden.collector.ha.leadership import Leadership, LeaseElection
from gpuwarden.collector.notify.dispatcher import AlertDispatcher
from gpuwarden.collector.remediate.remediator import Remediator
from gpuwarden.collector.remote_write.derived import job_samples
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.storage.sql_base import FencedError
from gpuwarden.collector.web.keys import SERVICE

log = logging.getLogger(__name__)


FOLLOW_SECONDS = 30.0
"""How often a standby reads from the TSDB what the leader wrote (see ``background``)."""

STOP_TIMEOUT_SECONDS = 30.0
"""How long stopping waits for a step already running (a detection cycle) before giving up on it."""
GATE_POLL_SECONDS = 1.0
"""How often a leader-only loop of a standby looks whether this replica leads now: a new
leader runs its first step within this time, not one interval later."""


async def _every(
    name: str,
    interval_seconds: float,
    step: Callable[[], object],
    stop: asyncio.Event,
    *,
    first_after_seconds: float = 0.0,
    gate: Callable[[], bool] | None = None,
) -> None:
    deadline = time.monotonic() + first_after_seconds
    if first_after_seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), first_after_seconds)
    while not stop.is_set():
        if gate is not None and not gate():  # a standby: look again soon, run at once then
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(interval_seconds, GATE_POLL_SECONDS))
            deadline = time.monotonic()
            continue
        try:
            await asyncio.to_thread(step)
        except FencedError as exc:  # leadership lost mid-step: the standby's turn now
            log.warning("%s stopped: %s", name, exc)
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


def _election_loops(
    service: CollectorService,
    election: LeaseElection,
    election_seconds: float,
    follow_seconds: float,
    stop: asyncio.Event,
) -> dict[asyncio.Task[None], str]:
    """The election's loop and, with a TSDB to read back from, the standby's following of it
    (a standby reads what the leader wrote there, so it takes over warm)."""
    loops = {
        asyncio.create_task(
            _every("leader election", election_seconds, election.step, stop)
        ): "leader election"
    }
    if service.tsdb_reader is not None:
        follow = _every(
            "following the TSDB",
            follow_seconds,
            service.follow_tsdb,
            stop,
            first_after_seconds=follow_seconds,
            gate=lambda: not election.leading(),
        )
        loops[asyncio.create_task(follow)] = "following the TSDB"
    return loops


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
    leadership: Leadership | None = None,
    election: LeaseElection | None = None,
    election_seconds: float = 10.0 / 3,
    follow_seconds: float = FOLLOW_SECONDS,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` entry that runs the service's loops while the app serves.

    The leader-only loops (accounting, detection, remediation, alerting, remote-write job
    totals) run a step only while ``leadership`` leads (default: always); the others (job
    polling, eviction, model scraping, remote-write of what this replica ingested, snapshots)
    run on every replica. With an ``election`` (active/standby, ``collector.ha``) it runs every
    ``election_seconds`` (first at once), and at the end, after the loops stopped, it gives
    the lease up so a standby takes over at once; a standby whose service reads back from a
    TSDB (``remote_write.read_url``) reads what the leader wrote there every
    ``follow_seconds`` (``CollectorService.follow_tsdb``), so it takes over warm.

    With ``snapshot_seconds`` (and a service with a ``snapshot_path``) the store is written to
    its snapshot every so often, first one interval after the start, and once more when the
    app stops, after the other loops have ended.
    """

    async def context(app: web.Application) -> AsyncIterator[None]:
        service = app[SERVICE]
        steps: list[tuple[str, float, Callable[[], object]]] = [
            ("job polling", job_poll_seconds, service.poll_jobs),
            ("eviction", evict_seconds, service.store.evict_stale),
        ]
        leader_steps: list[tuple[str, float, Callable[[], object]]] = [
            ("accounting", accounting_seconds, service.run_accounting),
        ]
        if detection is not None:
            leader_steps.append(("detection", detection_seconds, detection.run_cycle))
        if remediator is not None:
            leader_steps.append(("remediation", remediation_seconds, remediator.tick))
        if dispatcher is not None:
            leader_steps.append(("alerting", alerting_seconds, dispatcher.tick))
        if service.scraper is not None:
            steps.append(("model scraping", scrape_seconds, service.scrape_models))
        history = service.history
        if history is not None:
            steps.append(("remote-write", history.flush_seconds, history.tick))
            leader_steps.append(
                (
                    "remote-write job totals",
                    accounting_seconds,
                    lambda: history.add(job_samples(service.storage, service.clock())),
                )
            )
        stop = asyncio.Event()
        gate = leadership.leading if leadership is not None else None
        loops = {
            asyncio.create_task(_every(name, seconds, step, stop)): name
            for name, seconds, step in steps
        }
        for name, seconds, step in leader_steps:
            loops[asyncio.create_task(_every(name, seconds, step, stop, gate=gate))] = name
        if election is not None:
            loops.update(_election_loops(service, election, election_seconds, follow_seconds, stop))
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
        await _stop(loops, stop_timeout_seconds)
        if election is not None:  # after the loops: none of them acts any more
            await asyncio.to_thread(election.release)
        if history is not None:  # first: quick, and what it holds is not on disk elsewhere
            await asyncio.to_thread(history.flush)
        if snapshots:
            try:
                # only the changes since the last full snapshot: an exit within seconds
                await asyncio.to_thread(lambda: service.save_snapshot(changes_only=True))
            except Exception:  # the shutdown goes on: the last periodic snapshot stays
                log.exception("the snapshot at shutdown failed")

    return context
