"""A fixed-step ring over time for many rows at once: one 2-D numpy array, one time axis.

Absolute slot ``k`` covers ``[k*step, (k+1)*step)`` and lives in column ``k % n_slots``. The ring
holds the slots ``(head - n_slots, head]``; moving the head forward NaN-fills the columns that roll
over, so a column never shows data from an earlier lap. Columns beyond ``head`` still hold the
previous lap until the head reaches them, which is why every read masks by the held range.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


class Ring:
    """``rows x n_slots`` floats, NaN where there is no data."""

    def __init__(self, *, n_slots: int, rows: int, dtype: type[np.floating]) -> None:
        self.n_slots = n_slots
        self.values: npt.NDArray[np.floating] = np.full((rows, n_slots), np.nan, dtype=dtype)
        self.head: int | None = None

    @property
    def rows(self) -> int:
        """Allocated rows."""
        return int(self.values.shape[0])

    def grow(self, rows: int) -> None:
        """Reallocate with ``rows`` rows (more than now), keeping the data."""
        old = self.values
        new = np.empty((rows, self.n_slots), dtype=old.dtype)
        new[: old.shape[0]] = old
        new[old.shape[0] :] = np.nan
        self.values = new

    def advance(self, head: int) -> None:
        """Make ``head`` the newest slot held, NaN-filling the columns that roll over."""
        if self.head is None:
            self.head = head
            return
        steps = head - self.head
        if steps <= 0:
            return
        if steps >= self.n_slots:
            self.values[:] = np.nan
        else:
            start = (self.head + 1) % self.n_slots
            end = start + steps
            self.values[:, start : min(end, self.n_slots)] = np.nan
            if end > self.n_slots:
                self.values[:, : end - self.n_slots] = np.nan
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

    def read(self, rows: npt.NDArray[np.int64], first: int, count: int) -> npt.NDArray[np.floating]:
        """A copy of ``rows`` over absolute slots ``[first, first + count)`` in time order.

        Slots outside the ring are NaN. Vectorised: at most two column slices of the ring.
        """
        out = np.full((rows.size, count), np.nan, dtype=self.values.dtype)
        lo, hi = self.span(first, first + count)
        if lo >= hi or rows.size == 0:
            return out
        col = lo % self.n_slots
        length = hi - lo
        dst = lo - first
        first_part = min(length, self.n_slots - col)
        out[:, dst : dst + first_part] = self.values[rows, col : col + first_part]
        if first_part < length:
            rest = length - first_part
            out[:, dst + first_part : dst + length] = self.values[rows, :rest]
        return out

    def clear_rows(self, rows: npt.NDArray[np.int64]) -> None:
        """NaN-fill whole rows (freed series)."""
        self.values[rows] = np.nan
