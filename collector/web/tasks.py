"""Background work of the collector app: job polling, accounting, eviction, detection,
remediation, alerting, remote-write and the store's snapshots.

Each loop runs its blocking step in a thread of its own, on a monotonic deadline, and survives its
own failures (one broad except per iteration, logged with the traceback). When the app stops, the
loops are told to stop and a step already running is waited for, up to ``stop_timeout_seconds``
(4 s). A thread cannot be cancelled: a step still running then (a detection cycle over a large
fleet) is abandoned. Its thread is a daemon thread, so the process does not wait for it at exit
(the default executor's threads are joined at exit: a cycle of 55 s kept SIGTERM waiting 90 s).
It runs on, unwaited, until the process ends: what it commits before the database closes is
whole (each storage write is one transaction), what it has not committed by then is lost. Then
remote-write's buffer is flushed to its durable queue and the store's snapshot written, within
``final_save_seconds`` (4 s) together, so a restart sends what it held and starts warm; a
snapshot still being written then is abandoned too (it is written to a temporary file and
renamed, so the previous snapshot stays whole). The storage closes right after (the app's
``on_cleanup``). So a collector stops within about 10 s of SIGTERM, whatever it was doing:
aiohttp's own shutdown (``run_app``'s ``shutdown_timeout``, answering the requests in progress),
the loops' 4 s, the final saves' 4 s; the CLI then leaves without the interpreter's teardown.
A detection cycle that runs in a forked child (``detect.fork``) is not waited for: its child is
killed, so a cycle over a large fleet never holds up the stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from gpuwarden.collector.detect.engine import DetectionEngine
from gpuwarden.collector.detect.fork import CycleStoppedError
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

GATE_POLL_SECONDS = 1.0
"""How often a leader-only loop of a standby looks whether this replica leads now: a new
leader runs its first step within this time, not one interval later."""

STOP_TIMEOUT_SECONDS = 4.0
"""How long stopping waits for a step already running (a detection cycle) before abandoning it."""

TIMED_STEPS = frozenset({"detection"})
"""Steps whose every duration is logged at INFO (``detection took 12.345 s``: what an operator
and ``bench/capacity.py`` read the cycle time from); the others' at DEBUG."""

FINAL_SAVE_SECONDS = 4.0
"""How long stopping waits for remote-write's last flush and the last snapshot, together."""


async def in_daemon_thread(name: str, step: Callable[[], object]) -> object:
    """Run ``step`` in a daemon thread of its own and wait for its result.

    Unlike ``asyncio.to_thread`` (the default executor, whose threads the interpreter joins at
    exit), a step that is abandoned (its waiter cancelled, or the loop closed) does not hold the
    process: its result is dropped and the thread ends with the process.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[object] = loop.create_future()

    def settle(result: object, error: Exception | None) -> None:
        if done.done():  # abandoned: nobody waits any more
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def run() -> None:
        result: object = None
        error: Exception | None = None
        try:
            result = step()
        except Exception as exc:  # noqa: BLE001 - handed to the waiter, which logs it
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed: the step was abandoned
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=f"gpuwarden {name}", daemon=True).start()
    return await done


async def announce_stop(_app: web.Application) -> None:
    """An ``on_shutdown`` hook: the stop's first moment in the log (listening has ended; aiohttp
    answers the requests in progress, then the loops are stopped)."""
    log.info("stopping: no new connections, answering the requests in progress")


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
        started = time.monotonic()
        try:
            await in_daemon_thread(name, step)
        except FencedError as exc:  # leadership lost mid-step: the standby's turn now
            log.warning("%s stopped: %s", name, exc)
        except CycleStoppedError:  # its forked child was killed: we are stopping
            log.info("%s stopped at shutdown", name)
        except Exception:  # one broad except per iteration: the loop must go on
            log.exception("%s failed; retrying in %.0f s", name, interval_seconds)
        else:
            level = logging.INFO if name in TIMED_STEPS else logging.DEBUG
            log.log(level, "%s took %.3f s", name, time.monotonic() - started)
        deadline += interval_seconds
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, deadline - time.monotonic()))


async def _stop(loops: dict[asyncio.Task[None], str], timeout_seconds: float) -> None:
    """Let each loop finish its running step and end; abandon what is still busy at the deadline
    (its daemon thread runs on unwaited, its uncommitted work is lost with the process)."""
    _, busy = await asyncio.wait(loops, timeout=timeout_seconds)
    if busy:
        names = ", ".join(sorted(loops[task] for task in busy))
        log.warning(
            "still running after %g s, abandoned at shutdown (not waited for; what it has not "
            "committed when the database closes is lost): %s",
            timeout_seconds,
            names,
        )
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
    final_save_seconds: float = FINAL_SAVE_SECONDS,
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
        started = time.monotonic()
        stop.set()
        if detection is not None:  # a cycle in its forked child is killed, not waited for
            detection.stop()
        service.stop_forks()  # so is an accounting run's child
        await _stop(loops, stop_timeout_seconds)
        if election is not None:  # after the loops: none of them acts any more
            await _final_saves([election.release], final_save_seconds)
        final: list[Callable[[], object]] = (
            [history.flush] if history is not None else []
        )  # first: not on disk elsewhere
        if snapshots:
            # only the changes since the last full snapshot: an exit within seconds
            final.append(lambda: service.save_snapshot(changes_only=True))
        await _final_saves(final, final_save_seconds)
        log.info("background work stopped in %.2f s", time.monotonic() - started)

    return context


async def _final_saves(steps: list[Callable[[], object]], timeout_seconds: float) -> None:
    """Run ``steps`` in order, all within ``timeout_seconds``; one that fails is logged and
    the next still runs, and what is still running at the deadline is abandoned."""

    async def in_order() -> None:
        for step in steps:
            try:
                await in_daemon_thread("final save", step)
            except Exception:  # the shutdown goes on: the last periodic save stays
                log.exception("%s at shutdown failed", _step_name(step))

    try:
        await asyncio.wait_for(in_order(), timeout_seconds)
    except TimeoutError:
        log.warning(
            "the final flush and snapshot did not finish within %g s, abandoned at shutdown "
            "(the previous snapshot stays whole)",
            timeout_seconds,
        )


def _step_name(step: Callable[[], object]) -> str:
    return getattr(step, "__qualname__", None) or repr(step)
