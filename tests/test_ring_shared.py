"""Shared rings (``store.ring``): what a forked detection child costs the collector and sees.

Real ``os.fork`` children, real page-fault counts (``resource.getrusage``): the collector's
writes to a shared ring while a child lives copy no page, where a private ring copies one page
per row written (the control, so the count can tell them apart); the child sees the parent's
writes, never a later lap's value in its oldest columns; growing keeps the data in place.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
from collections.abc import Callable
from typing import cast

import numpy as np
import pytest

from gpuwarden.collector.store.ring import CHILD_MARGIN_SLOTS, Ring, regrow, shared_rows

ROWS = 2048
SLOTS = 1024  # 4 KiB per row: one page per row and column


def filled(ring: Ring, head: int) -> None:
    """Every row holds ``row * 10_000 + slot`` at every slot up to ``head``."""
    ring.advance(head, ROWS)
    slots = np.arange(head - SLOTS + 1, head + 1)
    values = np.arange(ROWS)[:, None] * 10_000.0 + slots[None, :]
    ring.bits[:, slots % SLOTS] = 0  # NaN, then the values through put
    rows = np.repeat(np.arange(ROWS), SLOTS)
    cols = np.tile(slots % SLOTS, ROWS)
    ring.put(rows, cols, values.reshape(-1))


def in_child(work: Callable[[], object], then: Callable[[], None]) -> object:
    """Fork a child that waits for a byte, then runs ``work`` and sends its result back;
    ``then()`` runs here between the fork and the byte."""
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.read(go_r, 1)
            with os.fdopen(out_w, "wb") as out:
                out.write(pickle.dumps(work()))
            code = 0
        finally:
            os._exit(code)
    os.close(go_r)
    os.close(out_w)
    try:
        then()
        os.write(go_w, b"x")
        with os.fdopen(out_r, "rb") as answer:
            data = answer.read()
    finally:
        os.close(go_w)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return pickle.loads(data)  # noqa: S301 - our own child's answer


def faults_while_child_lives(ring: Ring, head: int) -> int:
    """Minor faults here while a child holds the ring and this process moves its head one slot
    (one column NaN-filled in every row) and writes that column."""
    counted: list[int] = []

    def roll() -> None:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        ring.advance(head + 1, ROWS)
        ring.put_column((head + 1) % SLOTS, np.ones(ROWS))
        counted.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    in_child(lambda: None, roll)
    return counted[0]


@pytest.mark.parametrize("shared", [True, False])
def test_a_shared_ring_costs_the_collector_no_page_copy_while_a_child_lives(shared: bool) -> None:
    ring = Ring(n_slots=SLOTS, rows=ROWS, max_rows=ROWS if shared else None)
    filled(ring, 5000)
    faults = faults_while_child_lives(ring, 5000)
    if shared:
        assert faults < ROWS // 8, faults
    else:  # the control: copy-on-write, one page per row
        assert faults >= ROWS, faults


def test_a_child_sees_later_writes_and_never_a_later_lap_in_its_oldest_slots() -> None:
    ring = Ring(n_slots=SLOTS, rows=ROWS, max_rows=ROWS)
    head = 5000
    filled(ring, head)
    rows = np.arange(0, ROWS, 97, dtype=np.int64)
    rolled = 10  # the parent moves on 10 slots while the child waits

    def parent_moves_on() -> None:
        ring.put(rows, np.full(rows.size, head % SLOTS), np.full(rows.size, -1.0))  # late round
        for step in range(1, rolled + 1):
            ring.advance(head + step, ROWS)
            ring.put_column((head + step) % SLOTS, np.full(ROWS, 7e6))  # a later lap's value

    seen = in_child(
        lambda: (
            ring.head,
            ring.read(rows, head - SLOTS + 1, SLOTS),
            ring.held(np.arange(head - SLOTS + 1, head + 1)),
        ),
        parent_moves_on,
    )
    child_head, values, held = cast("tuple[int, np.ndarray, np.ndarray]", seen)
    assert child_head == head  # the child keeps the fork's head
    assert not (values == 7e6).any()  # no later lap's value anywhere
    oldest = head + rolled - SLOTS + 1 + CHILD_MARGIN_SLOTS  # the parent's head, the margin
    cut = oldest - (head - SLOTS + 1)
    assert np.isnan(values[:, :cut]).all()
    assert not held[:cut].any()
    assert held[cut:].all()
    expected = rows[:, None] * 10_000.0 + np.arange(oldest, head + 1)[None, :]
    expected[:, -1] = -1.0  # the late round written after the fork: seen
    np.testing.assert_array_equal(values[:, cut:], expected.astype(np.float32))
    # the parent reads its own window whole
    own = ring.read(rows, head + rolled - SLOTS + 1, SLOTS)[:, 0]
    np.testing.assert_array_equal(
        own, (rows * 10_000.0 + head + rolled - SLOTS + 1).astype(np.float32)
    )


def test_growing_a_shared_ring_keeps_its_data_in_place() -> None:
    ring = Ring(n_slots=SLOTS, rows=16, max_rows=ROWS)
    ring.advance(100)
    ring.put(np.arange(16), np.full(16, 100 % SLOTS), np.arange(16.0))
    before = ring.bits
    ring.grow(64)
    assert ring.rows == 64
    assert np.shares_memory(before, ring.bits)  # a longer view: nothing copied
    assert ring.get(np.arange(16), np.full(16, 100 % SLOTS)).tolist() == list(range(16))
    assert np.isnan(ring.get(np.arange(16, 64), np.full(48, 100 % SLOTS))).all()


def test_regrow_copies_past_the_reservation_and_keeps_the_data() -> None:
    dts = shared_rows(4, 8, np.uint16, 6)
    dts[:] = 3
    same = regrow(dts, 6)
    assert np.shares_memory(same, dts)
    assert same.shape == (6, 8)
    bigger = regrow(same, 10)
    assert not np.shares_memory(bigger, dts)
    assert bigger.shape == (10, 8)
    assert (bigger[:4] == 3).all()
    assert (bigger[4:] == 0).all()


def test_a_killed_child_leaves_the_shared_ring_to_the_parent() -> None:
    ring = Ring(n_slots=SLOTS, rows=ROWS, max_rows=ROWS)
    filled(ring, 5000)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: waits to be killed
        signal.pause()
        os._exit(0)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    ring.advance(5001, ROWS)
    assert np.isnan(ring.get(np.arange(ROWS), np.full(ROWS, 5001 % SLOTS))).all()
    assert ring.get(np.array([3]), np.array([5000 % SLOTS])).tolist() == [30_000.0 + 5000]
