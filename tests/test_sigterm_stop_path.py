"""The stop path's parts, on their own: a step runs in a daemon thread whose result or error
reaches its waiter, and which the process does not wait for once abandoned; the final saves
run in order, a failing one does not stop the next, and one still running at the deadline is
abandoned with a warning. (``tests/test_sigterm_load.py`` runs the whole stop under load.)"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from gpuwarden.collector.web import tasks


async def test_a_step_in_its_daemon_thread_returns_or_raises_to_its_waiter():
    threads: list[threading.Thread] = []

    def step() -> str:
        threads.append(threading.current_thread())
        return "done"

    def failing() -> None:
        raise ValueError("boom")

    assert await tasks.in_daemon_thread("step", step) == "done"
    assert threads[0] is not threading.main_thread()
    assert threads[0].daemon
    assert threads[0].name == "gpuwarden step"
    with pytest.raises(ValueError, match="boom"):
        await tasks.in_daemon_thread("failing", failing)


async def test_an_abandoned_step_drops_its_result_without_an_error_on_the_loop():
    release = threading.Event()
    ran_in: list[threading.Thread] = []
    errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context))

    def held() -> str:
        ran_in.append(threading.current_thread())
        release.wait(60)
        return "too late"

    waiter = asyncio.create_task(tasks.in_daemon_thread("held", held))
    while not ran_in:
        await asyncio.sleep(0.01)
    waiter.cancel()  # the stop's deadline
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    await asyncio.to_thread(ran_in[0].join, 60)  # it ended and handed its result to the loop
    await asyncio.sleep(0)  # the loop runs that hand-over: nobody waits, nothing raised
    assert not ran_in[0].is_alive()
    assert errors == []


async def test_final_saves_run_in_order_past_a_failure_and_are_abandoned_at_the_deadline(caplog):
    order: list[str] = []
    never = threading.Event()

    def flush() -> None:
        order.append("flush")
        raise OSError("disk full")

    def snapshot() -> None:
        order.append("snapshot")
        never.wait(60)  # a snapshot slower than the budget

    caplog.set_level(logging.INFO, logger=tasks.__name__)
    await tasks._final_saves([flush, snapshot], timeout_seconds=0.3)
    never.set()
    assert order == ["flush", "snapshot"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("flush at shutdown failed" in m for m in messages), messages
    assert any("did not finish within 0.3 s, abandoned at shutdown" in m for m in messages)
