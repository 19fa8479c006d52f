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
"""

from __future__ import annotations

import mmap
from typing import cast

import numpy as np
import numpy.typing as npt

NAN_BITS = np.uint32(0x7FC00000)
"""The bits of float32 NaN: stored values are XORed with them, so 0 is NaN."""

Floats = npt.NDArray[np.float32]


LAZY_BYTES = 1 << 22
"""Arrays from this size on are mapped lazily (smaller ones come from numpy, zeroed)."""


def zeros(
    shape: tuple[int, int], dtype: type[np.unsignedinteger]
) -> npt.NDArray[np.unsignedinteger]:
    """A zero-filled array whose pages are only materialised when written (4 KB at a time)."""
    size = shape[0] * shape[1] * np.dtype(dtype).itemsize
    if size < LAZY_BYTES:
        return np.zeros(shape, dtype=dtype)
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        mapping.madvise(mmap.MADV_NOHUGEPAGE)
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
    """``rows x n_slots`` float32 values, NaN where there is no data (stored as zeros)."""

    def __init__(self, *, n_slots: int, rows: int) -> None:
        self.n_slots = n_slots
        self.bits = self._zeros(rows)
        self.head: int | None = None

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
        new = self._zeros(rows)
        used = np.zeros(self.n_slots + 2, dtype=np.int8)
        used[1:-1] = old.any(axis=0)  # reading untouched pages maps the zero page: no memory
        edges = np.flatnonzero(np.diff(used))
        for start, stop in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
            new[: old.shape[0], start:stop] = old[:, start:stop]
        self.bits = new

    def _zeros(self, rows: int) -> npt.NDArray[np.uint32]:
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
        return (slots > self.head - self.n_slots) & (slots <= self.head)

    def span(self, first: int, stop: int) -> tuple[int, int]:
        """The held part ``[lo, hi)`` of the absolute slots ``[first, stop)`` (empty: lo >= hi)."""
        if self.head is None:
            return (first, first)
        return (max(first, self.head - self.n_slots + 1), min(stop, self.head + 1))

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
