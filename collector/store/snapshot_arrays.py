"""The arrays of a window snapshot: ``.npy`` members written and read in row chunks, and the
ring slots a snapshot holds (``store.snapshot`` is the format and the store's part)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from gpuwarden.collector.store.ring import Ring, encode
from gpuwarden.collector.store.rows import SeriesTable


class SnapshotError(Exception):
    """A snapshot that cannot be used: another shape, another format, or a broken file."""


def text(value: object) -> npt.NDArray[np.uint8]:
    return np.frombuffer(json.dumps(value, separators=(",", ":")).encode(), dtype=np.uint8)


def untext(array: npt.NDArray[Any]) -> Any:
    return json.loads(np.asarray(array, dtype=np.uint8).tobytes().decode())


def put(archive: zipfile.ZipFile, name: str, array: npt.NDArray[Any]) -> None:
    with archive.open(name + ".npy", "w", force_zip64=True) as member:
        np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)


def put_rows(
    archive: zipfile.ZipFile, name: str, dtype: type[np.generic], shape: tuple[int, int]
) -> IO[bytes]:
    """An open ``.npy`` member of ``shape`` whose rows the caller writes in order (C order)."""
    member = archive.open(name + ".npy", "w", force_zip64=True)
    header = {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_2_0(member, header)
    return member


def rows_of(archive: zipfile.ZipFile, name: str, chunk_bytes: int) -> Iterator[npt.NDArray[Any]]:
    """Blocks of about ``chunk_bytes`` of rows of a 2-D ``.npy`` member, in order, as needed."""
    with archive.open(name + ".npy") as member:
        version = np.lib.format.read_magic(member)
        if version not in ((1, 0), (2, 0)):
            raise SnapshotError(f"{name}: unsupported .npy version {version}")
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read_header(member)
        if fortran or len(shape) != 2 or dtype.hasobject:
            raise SnapshotError(f"{name}: not a plain 2-D array")
        rows, cols = shape
        chunk = max(1, chunk_bytes // max(1, cols * dtype.itemsize))
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            data = member.read(n * cols * dtype.itemsize)
            if len(data) != n * cols * dtype.itemsize:
                raise SnapshotError(f"{name}: truncated")
            yield np.frombuffer(data, dtype=dtype).reshape(n, cols)


def held(ring: Ring, first_written: int | None) -> tuple[int, int]:
    """The absolute slots worth writing: ``(first, count)`` from the oldest data to the head."""
    if ring.head is None or first_written is None:
        return (0, 0)
    first = max(first_written, ring.head - ring.n_slots + 1)
    return (first, max(0, ring.head - first + 1))


def earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def after(held: tuple[int, int], since: int) -> tuple[int, int]:
    """``held`` (``(first, count)``) from slot ``since`` on."""
    first, count = held
    start = max(first, since)
    return (start, max(0, first + count - start))


def dt_block(
    table: SeriesTable, rows: npt.NDArray[np.int64], first: int, count: int
) -> npt.NDArray[np.uint16]:
    """Counter rows' covered-time codes over ``[first, first + count)``, 0 outside the ring."""
    out = np.zeros((rows.size, count), dtype=np.uint16)
    lo, hi = table.recent.span(first, first + count)
    if lo < hi and rows.size:
        slots = np.arange(lo, hi)
        out[:, lo - first : hi - first] = table.dts[
            table.counter_row[rows][:, None], slots % table.recent.n_slots
        ]
    return out


def runs(ring: Ring, first: int, count: int) -> list[tuple[int, int, int]]:
    """The held part of absolute slots ``[first, first + count)`` as at most two runs of
    adjacent ring columns: ``(column, offset in the block, length)``."""
    lo, hi = ring.span(first, first + count)
    if lo >= hi:
        return []
    col, length = lo % ring.n_slots, hi - lo
    head = min(length, ring.n_slots - col)
    runs = [(col, lo - first, head)]
    if head < length:
        runs.append((0, lo - first + head, length - head))
    return runs


def put_dts(
    table: SeriesTable, rows: npt.NDArray[np.int64], first: int, block: npt.NDArray[np.uint16]
) -> None:
    crows = table.counter_row[rows]
    kept = crows >= 0  # a counter this store keeps the latest rate of only has no covered times
    if not kept.all():
        crows, block = crows[kept], block[kept]
    for col, at, length in runs(table.recent, first, block.shape[1]):
        table.dts[crows, col : col + length] = block[:, at : at + length]


def put_block(
    ring: Ring, rows: npt.NDArray[np.int64], first: int, bits: npt.NDArray[np.uint32]
) -> None:
    """Write stored bits of ``rows`` over absolute slots from ``first``; slots the ring no
    longer holds (older than its window at restart) are dropped."""
    if not rows.size:
        return
    contiguous = rows.size == int(rows[-1]) - int(rows[0]) + 1 and bool(np.all(np.diff(rows) == 1))
    target = slice(int(rows[0]), int(rows[-1]) + 1) if contiguous else rows
    for col, at, length in runs(ring, first, bits.shape[1]):
        ring.bits[target, col : col + length] = bits[:, at : at + length]


def ring_block(
    table: SeriesTable, name: str, rows: npt.NDArray[np.int64], first: int, count: int
) -> npt.NDArray[Any]:
    """The block of member ``name`` (``recent``, ``long``, ``counter_dt``) for table ``rows``
    over ``[first, first + count)``; recent and long rows through ``recent_row`` and
    ``long_row``."""
    if name == "counter_dt":
        return dt_block(table, rows, first, count)
    if name == "long":
        return table.long.read(table.long_row[rows], first, count)
    return table.recent.read(table.recent_row[rows], first, count)


def put_ring_block(
    table: SeriesTable, name: str, rows: npt.NDArray[np.int64], first: int, block: npt.NDArray[Any]
) -> None:
    """Write a block :func:`ring_block` gave back into ``rows`` (recent and long rows: only of
    the series whose metric keeps that ring in this store, the others are dropped)."""
    if name == "counter_dt":
        put_dts(table, rows, first, block)
    elif name == "long":
        at = table.long_row[rows]
        kept = at >= 0
        put_block(table.long, at[kept], first, encode(block[kept]))
    else:
        at = table.recent_row[rows]
        kept = at >= 0
        put_block(table.recent, at[kept], first, encode(block[kept]))
