"""A fixed-step ring over time for many rows at once: one 2-D numpy array, one time axis.

Absolute slot ``k`` covers ``[k*step, (k+1)*step)`` and lives in column ``k % n_slots``. The ring
holds the slots ``(head - n_slots, head]``; moving the head forward NaN-fills the columns that roll
over, so a column never shows data from an earlier lap. Columns beyond ``head`` still hold the
previous lap until the head reaches them, which is why every read masks by the held range.

Values are float32, stored as their bit pattern XOR the bits of NaN (``uint32``), so that all-zero
memory reads as NaN: large arrays are anonymous private mappings (the kernel hands out zero pages
on first touch), and an empty or pre-sized store neither NaN-fills nor touches gigabytes at
start-up. The mappings opt out of transparent huge pages (numpy's own allocator opts in), else
touching one slot of each 80 KB long-ring row would make the kernel zero every 2 MB around it
(and for the recent ring, huge pages cost more to fault in than they save on reads).
Rows beyond ``used`` (never written) are left untouched when the head moves. Every access goes
through :meth:`read`, :meth:`get` and :meth:`put`, which translate.

Shared rings (``max_rows`` given: the store's recent ring, and its counters' intervals through
:func:`shared_rows`) are one *shared* anonymous mapping reserved for ``max_rows`` rows up front
(``MAP_NORESERVE``: address space only; a page exists once touched) of which the array is a
prefix view, so growing is a longer view (:func:`regrow`): nothing copied, nothing read. Why
shared: detection runs in a child forked from the collector (``detect.fork``), and with a
private mapping every page the collector writes while a child lives is first copied
(copy-on-write). Moving the head NaN-fills one column of every row, one page per row, under
the store's lock: 90,000 page copies at 1,000 GPUs (``bench.detect_cycle --probe-ingest``),
which stalled ingest 0.5-0.8 s once a cycle, and ten times that at 10,000. Shared pages are
never copied. Why reserved: a page of a shared
anonymous mapping is allocated when *read*, too (a private one maps the zero page), so growing
by copying, which reads the old array, would allocate all of it.

What a forked child sees in a shared ring: the parent's writes as they happen, not the ring as
it was at the fork. The child keeps its own ``head`` (the fork's), so slots after it are never
read. Values of slots at or before it may still arrive (an agent's round for the current slot,
a spool's replay); a read may see some of a request's points and not the others, as it would
a moment earlier or later, never half a value (aligned 4-byte stores). The columns the parent
reuses as its head moves on are the oldest ones of the child's window: the parent's head is
kept in a shared cell too, and in a child (another process id than the ring's creator) the
oldest held slot is ``max(head, parent's head) - n_slots + 1 + CHILD_MARGIN_SLOTS``, checked
again after :meth:`read`'s copy, so a child never reads a later lap's value as an old one: it
misses, at most, the oldest minute of its window and what the parent rolled out since the fork.
"""

from __future__ import annotations

import mmap
import os
from typing import cast

import numpy as np
import numpy.typing as npt

NAN_BITS = np.uint32(0x7FC00000)
"""The bits of float32 NaN: stored values are XORed with them, so 0 is NaN."""

Floats = npt.NDArray[np.float32]


LAZY_BYTES = 1 << 22
"""Arrays from this size on are mapped lazily (smaller ones come from numpy, zeroed)."""


MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
"""Reserve address space only (Linux' value; Python's ``mmap`` has it from 3.13)."""

CHILD_MARGIN_SLOTS = 6
"""Oldest slots a forked child leaves out of a shared ring, beyond those the parent rolled out:
what the parent may roll out between a child's look at its head and the end of a read."""


def _no_huge_pages(mapping: mmap.mmap) -> None:
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        mapping.madvise(mmap.MADV_NOHUGEPAGE)


def shared_rows(
    rows: int, cols: int, dtype: type[np.unsignedinteger], max_rows: int
) -> npt.NDArray[np.unsignedinteger]:
    """``rows x cols`` zeros, the prefix of a shared anonymous mapping reserved for
    ``max(rows, max_rows)`` rows (see the module: why shared, why reserved)."""
    reserved = max(rows, max_rows, 1)
    itemsize = np.dtype(dtype).itemsize
    try:
        mapping = mmap.mmap(-1, reserved * cols * itemsize, flags=mmap.MAP_SHARED | MAP_NORESERVE)
    except OSError:  # strict overcommit (vm.overcommit_memory=2) counts it all: no reservation
        reserved = max(rows, 1)
        mapping = mmap.mmap(-1, reserved * cols * itemsize, flags=mmap.MAP_SHARED)
    _no_huge_pages(mapping)
    full = np.frombuffer(mapping, dtype=dtype, count=reserved * cols)
    return full[: rows * cols].reshape(rows, cols)


def regrow(array: npt.NDArray[np.unsignedinteger], rows: int) -> npt.NDArray[np.unsignedinteger]:
    """``array`` (from :func:`shared_rows`) with ``rows`` rows (at least as many as now), its
    data kept: a longer view of its reservation when it has room, else a copy into a new
    shared array of exactly ``rows`` rows (reading the old one, which allocates its holes
    until it is freed)."""
    cols = array.shape[1]
    root = array.base
    exporter: object = getattr(root, "base", None)  # the mapping's buffer, for a reservation
    if (
        isinstance(root, np.ndarray)
        and root.ndim == 1
        and isinstance(exporter, memoryview)
        and root.size >= rows * cols
        and root.ctypes.data == array.ctypes.data
    ):
        return root[: rows * cols].reshape(rows, cols)
    new = shared_rows(rows, cols, array.dtype.type, rows)
    new[: array.shape[0]] = array
    return new


def zeros(
    shape: tuple[int, int], dtype: type[np.unsignedinteger]
) -> npt.NDArray[np.unsignedinteger]:
    """A zero-filled array whose pages are only materialised when written (4 KB at a time)."""
    size = shape[0] * shape[1] * np.dtype(dtype).itemsize
    if size < LAZY_BYTES:
        return np.zeros(shape, dtype=dtype)
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    _no_huge_pages(mapping)
    return np.frombuffer(mapping, dtype=dtype).reshape(shape)


def encode(values: npt.ArrayLike) -> npt.NDArray[np.uint32]:
    """float32 bits XOR NaN bits (NaN → 0); beyond float32's range a value is stored as ±inf."""
    with np.errstate(over="ignore"):
        bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    return np.bitwise_xor(bits, NAN_BITS)


def decode(bits: npt.NDArray[np.uint32]) -> Floats:
    """The float32 values of stored bits (a new array)."""
    return np.bitwise_xor(bits, NAN_BITS).view(np.float32)


class Ring:
    """``rows x n_slots`` float32 values, NaN where there is no data (stored as zeros).

    ``max_rows``: a shared ring reserved for that many rows (see the module); else private.
    """

    def __init__(self, *, n_slots: int, rows: int, max_rows: int | None = None) -> None:
        self.n_slots = n_slots
        self._max_rows = max_rows
        self._head: int | None = None
        self._live: npt.NDArray[np.int64] | None = None
        """The creator's head (shared rings): what a forked child reads to know it."""
        self._creator = os.getpid()
        if max_rows is not None:
            cell = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_SHARED)
            self._live = np.frombuffer(cell, dtype=np.int64, count=1)
            self._live[0] = np.iinfo(np.int64).min
        self.bits = self._zeros(rows)

    @property
    def head(self) -> int | None:
        """The newest slot held (None before the first)."""
        return self._head

    @head.setter
    def head(self, head: int | None) -> None:
        self._head = head
        if self._live is not None and head is not None and os.getpid() == self._creator:
            self._live[0] = head

    @property
    def shared(self) -> bool:
        """Whether this is a shared ring (see the module)."""
        return self._live is not None

    def _oldest(self, head: int) -> int:
        """The oldest slot this process may read (``head``: its own head)."""
        oldest = head - self.n_slots + 1
        if self._live is not None and os.getpid() != self._creator:
            live = max(head, int(self._live[0]))
            oldest = max(oldest, live - self.n_slots + 1 + CHILD_MARGIN_SLOTS)
        return oldest

    @property
    def rows(self) -> int:
        """Allocated rows."""
        return int(self.bits.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes allocated (touched or not)."""
        return int(self.bits.nbytes)

    def grow(self, rows: int) -> None:
        """Reallocate with ``rows`` rows (more than now), keeping the data.

        Only the column runs that hold data are copied: copying the rest (zeros) would touch
        every page of the new array, when most of a young long ring has never been written.
        """
        old = self.bits
        if self.shared:  # a longer view of the reservation (the store never asks past it)
            self.bits = cast("npt.NDArray[np.uint32]", regrow(old, rows))
            return
        new = self._zeros(rows)
        used = np.zeros(self.n_slots + 2, dtype=np.int8)
        used[1:-1] = old.any(axis=0)  # reading untouched pages maps the zero page: no memory
        edges = np.flatnonzero(np.diff(used))
        for start, stop in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
            new[: old.shape[0], start:stop] = old[:, start:stop]
        self.bits = new

    def _zeros(self, rows: int) -> npt.NDArray[np.uint32]:
        if self._max_rows is not None:
            return cast(
                "npt.NDArray[np.uint32]",
                shared_rows(rows, self.n_slots, np.uint32, self._max_rows),
            )
        return cast("npt.NDArray[np.uint32]", zeros((rows, self.n_slots), np.uint32))

    def advance(self, head: int, used: int | None = None) -> None:
        """Make ``head`` the newest slot held, NaN-filling the columns that roll over.

        Only the first ``used`` rows are cleared (default all): rows beyond were never written.
        """
        if self.head is None:
            self.head = head
            return
        steps = head - self.head
        if steps <= 0:
            return
        bits = self.bits[: self.rows if used is None else used]
        if steps >= self.n_slots:
            bits[:] = 0
        else:
            start = (self.head + 1) % self.n_slots
            end = start + steps
            bits[:, start : min(end, self.n_slots)] = 0
            if end > self.n_slots:
                bits[:, : end - self.n_slots] = 0
        self.head = head

    def held(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which absolute slots are inside the ring now."""
        if self.head is None:
            return np.zeros(slots.shape, dtype=bool)
        return (slots >= self._oldest(self.head)) & (slots <= self.head)

    def span(self, first: int, stop: int) -> tuple[int, int]:
        """The held part ``[lo, hi)`` of the absolute slots ``[first, stop)`` (empty: lo >= hi)."""
        if self.head is None:
            return (first, first)
        return (max(first, self._oldest(self.head)), min(stop, self.head + 1))

    def read(self, rows: npt.NDArray[np.int64], first: int, count: int) -> Floats:
        """A copy of ``rows`` over absolute slots ``[first, first + count)`` in time order.

        Slots outside the ring are NaN. Vectorised: at most two column slices of the ring.
        """
        out = np.zeros((rows.size, count), dtype=np.uint32)
        lo, hi = self.span(first, first + count)
        if lo < hi and rows.size:
            col = lo % self.n_slots
            length = hi - lo
            dst = lo - first
            first_part = min(length, self.n_slots - col)
            out[:, dst : dst + first_part] = self.bits[rows, col : col + first_part]
            if first_part < length:
                rest = length - first_part
                out[:, dst + first_part : dst + length] = self.bits[rows, :rest]
            if self._live is not None:  # a child: what the parent rolled out during the copy
                oldest = self._oldest(self._head or 0)
                if oldest > lo:
                    out[:, dst : min(oldest, hi) - first] = 0
        out ^= NAN_BITS
        return out.view(np.float32)

    def get(self, rows: npt.NDArray[np.int64], cols: npt.NDArray[np.int64]) -> Floats:
        """Values at ``(rows, cols)`` (numpy fancy indexing, columns as ring columns)."""
        return decode(self.bits[rows, cols])

    def put(
        self, rows: npt.NDArray[np.int64], cols: npt.NDArray[np.int64], values: npt.ArrayLike
    ) -> None:
        """Set ``(rows, cols)`` to ``values`` (cast to float32)."""
        self.bits[rows, cols] = encode(values)

    def get_column(self, col: int) -> Floats:
        """Every row's value in ring column ``col``."""
        return decode(self.bits[:, col])

    def put_column(self, col: int, values: npt.ArrayLike) -> None:
        """Set every row's value in ring column ``col``."""
        self.bits[:, col] = encode(values)

    def put_flat(self, cells: npt.NDArray[np.int64], values: npt.ArrayLike) -> None:
        """Set flat cells ``row * n_slots + col`` to ``values``."""
        self.bits.reshape(-1)[cells] = encode(values)

    def clear_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """NaN-fill whole rows (freed series)."""
        self.bits[rows] = 0
