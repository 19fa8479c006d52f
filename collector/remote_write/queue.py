"""The durable on-disk queue of encoded remote-write requests.

Segment files (``<sequence>.seg``) of records: a header (payload length, CRC-32 of the
payload, samples in it) and the payload, a ready-to-send request body. ``append`` writes one
record and fsyncs it before returning, so a batch in the queue survives a crash or a restart;
``peek`` reads the oldest record not yet acknowledged and ``ack`` moves the read cursor past it
(kept in ``cursor``, replaced atomically). Fully read segments are deleted. A torn record at
the end (a crash while appending) is cut off when the queue opens.

The queue is bounded by ``max_bytes``: past it the oldest segment is dropped and its unsent
samples are counted in :attr:`DiskQueue.dropped_samples` (the caller logs them).
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

_HEADER = struct.Struct("<III")  # payload bytes, crc32(payload), samples
_SUFFIX = ".seg"
_CURSOR = "cursor"
DEFAULT_SEGMENT_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class Record:
    """One queued request: where it is, its body and the samples it holds."""

    segment: int
    offset: int
    payload: bytes
    samples: int

    @property
    def end(self) -> int:
        """The offset just past this record."""
        return self.offset + _HEADER.size + len(self.payload)


class DiskQueue:
    """A FIFO of request bodies in ``directory``, durable across restarts, at most ``max_bytes``.

    Args:
        directory: the queue's own folder (created if missing).
        max_bytes: bytes of unsent records kept at most (the oldest segment goes beyond).
        segment_bytes: a segment is closed and a new one started past this size (default: 8 MiB
            or a quarter of ``max_bytes``, whichever is smaller, so dropping one frees little).
    """

    def __init__(
        self, directory: Path, *, max_bytes: int, segment_bytes: int | None = None
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or max(4096, min(DEFAULT_SEGMENT_BYTES, max_bytes // 4))
        self.dropped_samples = 0
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        self._segments = sorted(
            int(p.stem) for p in directory.glob(f"*{_SUFFIX}") if p.stem.isdigit()
        )
        self._cursor = self._read_cursor()
        if self._segments:
            self._repair(self._segments[-1])
        else:
            self._segments.append(self._cursor[0])
            self._path(self._cursor[0]).touch()
        if self._cursor[0] < self._segments[0]:  # its segment was read and deleted
            self._cursor = (self._segments[0], 0)

    # --- writing ------------------------------------------------------------------------------

    def append(self, payload: bytes, samples: int) -> int:
        """Queue one request body durably (fsync); return the samples dropped to make room."""
        record = _HEADER.pack(len(payload), zlib.crc32(payload), samples) + payload
        with self._lock:
            tail = self._segments[-1]
            if self._size(tail) >= self.segment_bytes:
                tail += 1
                self._segments.append(tail)
            fd = os.open(self._path(tail), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, record)
                os.fsync(fd)
            finally:
                os.close(fd)
            return self._enforce_bound()

    def _enforce_bound(self) -> int:
        dropped = 0
        while self._pending_bytes() > self.max_bytes and len(self._segments) > 1:
            head = self._segments.pop(0)
            start = self._cursor[1] if self._cursor[0] == head else 0
            dropped += sum(r.samples for r in self._records(head, start))
            self._path(head).unlink(missing_ok=True)
            self._cursor = (self._segments[0], 0)
            self._write_cursor()
        self.dropped_samples += dropped
        return dropped

    # --- reading ------------------------------------------------------------------------------

    def peek(self) -> Record | None:
        """The oldest record not acknowledged yet, or None when the queue is empty."""
        with self._lock:
            while True:
                segment, offset = self._cursor
                record = self._record_at(segment, offset)
                if record is not None:
                    return record
                if segment == self._segments[-1]:
                    return None
                self._segments.remove(segment)  # read to the end: the next one starts
                self._path(segment).unlink(missing_ok=True)
                self._cursor = (self._segments[0], 0)
                self._write_cursor()

    def ack(self, record: Record) -> None:
        """Mark ``record`` (the one ``peek`` gave) sent or given up: the cursor moves past it."""
        with self._lock:
            if (record.segment, record.offset) != self._cursor:
                return  # dropped meanwhile to make room
            self._cursor = (record.segment, record.end)
            self._write_cursor()

    def kept_payloads(self, max_bytes: int = 64 << 20) -> list[bytes]:
        """The intact records of the newest segments still on disk (sent or not, at most about
        ``max_bytes``), oldest first: what the collector queued last before a restart
        (``HistoryWriter`` does not queue it again). The newest are enough: a resend or a
        re-queued flush is recent, and older samples of a series are before its newest."""
        with self._lock:
            chosen: list[int] = []
            size = 0
            for segment in reversed(self._segments):
                if chosen and size + self._size(segment) > max_bytes:
                    break
                chosen.append(segment)
                size += self._size(segment)
            return [r.payload for segment in reversed(chosen) for r in self._records(segment, 0)]

    # --- sizes --------------------------------------------------------------------------------

    def pending_bytes(self) -> int:
        """Bytes of records not acknowledged yet (headers included)."""
        with self._lock:
            return self._pending_bytes()

    def pending_samples(self) -> int:
        """Samples in records not acknowledged yet (reads every header: for tests and tools)."""
        with self._lock:
            total = 0
            for segment in self._segments:
                start = self._cursor[1] if segment == self._cursor[0] else 0
                total += sum(r.samples for r in self._records(segment, start))
            return total

    def _pending_bytes(self) -> int:
        total = sum(self._size(s) for s in self._segments)
        return total - (self._cursor[1] if self._cursor[0] in self._segments else 0)

    # --- files --------------------------------------------------------------------------------

    def _path(self, segment: int) -> Path:
        return self.directory / f"{segment:020d}{_SUFFIX}"

    def _size(self, segment: int) -> int:
        try:
            return self._path(segment).stat().st_size
        except FileNotFoundError:
            return 0

    def _records(self, segment: int, offset: int) -> list[Record]:
        """The whole, intact records of ``segment`` from ``offset`` on."""
        try:
            data = self._path(segment).read_bytes()
        except FileNotFoundError:
            return []
        out: list[Record] = []
        while offset + _HEADER.size <= len(data):
            length, crc, samples = _HEADER.unpack_from(data, offset)
            start = offset + _HEADER.size
            payload = data[start : start + length]
            if len(payload) < length or zlib.crc32(payload) != crc:
                break
            out.append(Record(segment, offset, payload, samples))
            offset = start + length
        return out

    def _record_at(self, segment: int, offset: int) -> Record | None:
        """The intact record at ``offset`` of ``segment`` (None: the segment ends there)."""
        try:
            with self._path(segment).open("rb") as f:
                f.seek(offset)
                header = f.read(_HEADER.size)
                if len(header) < _HEADER.size:
                    return None
                length, crc, samples = _HEADER.unpack(header)
                payload = f.read(length)
        except FileNotFoundError:
            return None
        if len(payload) < length or zlib.crc32(payload) != crc:
            return None
        return Record(segment, offset, payload, samples)

    def _repair(self, segment: int) -> None:
        """Cut a torn record off the end of the last segment (a crash while appending)."""
        records = self._records(segment, 0)
        good = records[-1].end if records else 0
        if self._size(segment) > good:
            os.truncate(self._path(segment), good)

    def _read_cursor(self) -> tuple[int, int]:
        try:
            segment, offset = (self.directory / _CURSOR).read_text().split()
            return int(segment), int(offset)
        except (FileNotFoundError, ValueError):
            return (self._segments[0], 0) if self._segments else (0, 0)

    def _write_cursor(self) -> None:
        path = self.directory / _CURSOR
        tmp = path.with_suffix(".tmp")
        with tmp.open("w") as f:
            f.write(f"{self._cursor[0]} {self._cursor[1]}\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
