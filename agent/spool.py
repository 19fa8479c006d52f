"""A bounded, crash-safe on-disk FIFO of opaque records (one OTLP request each).

The sampler thread appends; the sender thread peeks, then acks or drops. One lock guards all.

On-disk format (the directory is created with mode 0o700, files with 0o600):

* ``<seq>.otlp`` — one record; ``<seq>`` is the sequence number as 20 zero-padded decimal
  digits, so a name sort is a sequence sort. Contents: a 12-byte header, then the payload::

      offset 0  4 bytes  magic b"GWS1"
      offset 4  4 bytes  payload length, unsigned big-endian
      offset 8  4 bytes  CRC-32 (zlib.crc32) of the payload, unsigned big-endian
      offset 12 ...      payload (the record's bytes, unchanged)

* ``last-sequence`` — the highest sequence number ever assigned, in the same framing with an
  8-byte big-endian payload. It is rewritten only when the newest record is removed, so that
  the sequence keeps rising across restarts even when the spool was empty.
* ``instance-id`` — this spool's identity (16 random bytes, same framing), sent with every request
  so the collector can recognise a record it already stored (``Gpuwarden-Agent-Instance``). It is
  kept as long as the sequence provably continues: when ``last-sequence`` could not be saved, or
  is gone with no record left, numbers may restart lower, so the identity is replaced (a new
  instance starts its own numbering and nothing new is mistaken for a duplicate).
* ``*.tmp`` — a write in progress. A record is written to ``<seq>.otlp.tmp``, flushed,
  fsync'd, renamed to its final name (atomic), and the directory is fsync'd. Leftover temp
  files are deleted on start.

On start, final files are loaded in sequence order; a short, torn or corrupt file (bad magic,
wrong length, CRC mismatch, e.g. zero length after a power loss) is deleted, counted in
``corrupt_records`` and logged, never raised. Sizes (``bytes_used``, ``max_bytes``,
``evicted_bytes``) count whole files, header included; ``peek``'s ``max_bytes`` counts payloads.

A record larger than the whole spool (header included) is refused with ``ValueError``: storing
it would evict everything else, and silently dropping it would hide a mis-sized spool.

Eviction counts what is lost, exactly: a record evicted while the sender has it in flight (peeked,
not yet acked) is counted only if that send fails; when the collector accepts the batch it was
delivered, not lost. ``evicted_points`` adds the data points of the lost records when the spool
was given a ``count_points`` function (the records are opaque to the spool itself).
"""

from __future__ import annotations

import logging
import os
import secrets
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

MAGIC = b"GWS1"
HEADER = struct.Struct(">4sII")
HEADER_BYTES = HEADER.size
SUFFIX = ".otlp"
TMP_SUFFIX = ".tmp"
MARKER_NAME = "last-sequence"
INSTANCE_NAME = "instance-id"
INSTANCE_BYTES = 16
EVICTION_LOG_INTERVAL_SECONDS = 60.0


def encode_record(payload: bytes) -> bytes:
    """Frame ``payload`` with the spool header (magic, length, CRC-32)."""
    return HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def decode_record(data: bytes) -> bytes:
    """Return the payload of a framed record; raise ``ValueError`` saying what is wrong."""
    if len(data) < HEADER_BYTES:
        raise ValueError(f"short file ({len(data)} bytes)")
    magic, length, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("bad magic")
    payload = data[HEADER_BYTES:]
    if len(payload) != length:
        raise ValueError(f"length {len(payload)} != header length {length}")
    if zlib.crc32(payload) != crc:
        raise ValueError("CRC mismatch")
    return payload


def record_name(seq: int) -> str:
    """The final file name of record ``seq``."""
    return f"{seq:020d}{SUFFIX}"


class Spool:
    """Bounded crash-safe FIFO; see the module docstring for the format and the guarantees.

    Args:
        directory: where records live; created (mode 0o700) if missing.
        max_bytes: cap on the files' total size; the oldest records are evicted to stay under.
        fsync: fsync files and the directory (turn off only for tests and benchmarks).
        clock: monotonic clock used to rate-limit the eviction warning.
        count_points: the number of data points in a record, for ``evicted_points`` (read only
            when a record is evicted).

    """

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int,
        fsync: bool = True,
        clock: Callable[[], float] = time.monotonic,
        count_points: Callable[[bytes], int] | None = None,
    ) -> None:
        if max_bytes <= HEADER_BYTES:
            raise ValueError(f"max_bytes must be more than {HEADER_BYTES}, got {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._fsync = fsync
        self._clock = clock
        self._count_points = count_points
        self._lock = threading.Lock()
        self._index: deque[tuple[int, int]] = deque()  # (seq, file bytes), oldest first
        self._bytes = 0
        self._last_seq = 0
        self.evicted_records = 0
        self.evicted_bytes = 0
        self.evicted_points = 0
        self.corrupt_records = 0
        self._inflight_last = 0  # newest seq handed out by peek and not yet settled
        self._evicted_inflight: list[tuple[int, int, int]] = []  # (seq, bytes, points)
        self._instance: str | None = None
        self._burst_pending = 0
        self._burst_logged_at: float | None = None
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._load()

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    @property
    def bytes_used(self) -> int:
        """Total size of the record files, headers included."""
        with self._lock:
            return self._bytes

    @property
    def instance_id(self) -> str:
        """The spool's identity (32 hex digits), created on first use; see the module docstring."""
        with self._lock:
            if self._instance is None:
                value = secrets.token_bytes(INSTANCE_BYTES)
                try:
                    self._write_atomic(INSTANCE_NAME, encode_record(value))
                except OSError as exc:  # still unique for this process: only a restart forgets
                    log.warning("spool: could not save %s: %s", INSTANCE_NAME, exc)
                self._instance = value.hex()
            return self._instance

    def append(self, record: bytes) -> int:
        """Store ``record`` durably and return its sequence number (rising across restarts)."""
        size = HEADER_BYTES + len(record)
        if size > self.max_bytes:
            raise ValueError(
                f"record of {len(record)} bytes cannot fit a spool of max_bytes={self.max_bytes}"
            )
        data = encode_record(record)
        with self._lock:
            self._evict_until(self.max_bytes - size, sync=False)  # the write below syncs
            seq = self._last_seq + 1
            self._write_atomic(record_name(seq), data)
            self._last_seq = seq
            self._index.append((seq, size))
            self._bytes += size
            return seq

    def peek(self, max_records: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """The oldest records as ``(seq, payload)``, within both limits but at least one."""
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        out: list[tuple[int, bytes]] = []
        total = 0
        with self._lock:
            self._settle_lost()  # the previous batch was neither acked nor dropped: it failed
            for seq, _ in list(self._index):
                if len(out) >= max_records:
                    break
                payload = self._read(seq)
                if payload is None:
                    continue
                if out and total + len(payload) > max_bytes:
                    break
                out.append((seq, payload))
                total += len(payload)
            self._inflight_last = out[-1][0] if out else 0
        return out

    def release(self) -> None:
        """The batch last peeked was not delivered: count its records evicted meanwhile as lost."""
        with self._lock:
            self._settle_lost()

    def ack(self, up_to_seq: int) -> None:
        """Remove every record with a sequence number up to and including ``up_to_seq``."""
        with self._lock:
            removed: list[tuple[int, int]] = []
            while self._index and self._index[0][0] <= up_to_seq:
                removed.append(self._index.popleft())
            self._remove(removed)
            # Evicted while in flight, then accepted by the collector: delivered, not lost.
            # (The rest stay in flight: an isolating sender still holds and sends them.)
            self._evicted_inflight = [e for e in self._evicted_inflight if e[0] > up_to_seq]

    def drop(self, seq: int) -> None:
        """Remove record ``seq`` alone (the collector rejected it for good); no-op if gone."""
        with self._lock:
            # Rejected, not lost: if it was evicted meanwhile, the sender counts it, not eviction.
            self._evicted_inflight = [e for e in self._evicted_inflight if e[0] != seq]
            for item in self._index:
                if item[0] == seq:
                    self._index.remove(item)
                    self._remove([item])
                    return

    def _evict_until(self, limit_bytes: int, *, sync: bool) -> None:
        """Evict the oldest records until at most ``limit_bytes`` are used; count and warn."""
        evicted: list[tuple[int, int]] = []
        used = self._bytes
        while self._index and used > limit_bytes:
            evicted.append(self._index.popleft())
            used -= evicted[-1][1]
        lost: list[tuple[int, int, int]] = []
        for seq, nbytes in evicted:
            points = self._points_of(seq) if self._count_points is not None else 0
            if seq <= self._inflight_last:  # the sender may still deliver it: decide on settle
                self._evicted_inflight.append((seq, nbytes, points))
            else:
                lost.append((seq, nbytes, points))
        self._remove(evicted, sync=sync)
        if lost or not evicted:  # evicting in-flight records alone neither counts nor ends a burst
            self._note_eviction(lost)

    def _points_of(self, seq: int) -> int:
        """The data points of record ``seq`` (0 when unreadable or uncountable)."""
        if self._count_points is None:
            return 0
        try:
            payload = decode_record((self.directory / record_name(seq)).read_bytes())
            return self._count_points(payload)
        except (OSError, ValueError) as exc:
            log.debug("spool: cannot count the points of evicted record %d: %s", seq, exc)
            return 0

    def _settle_lost(self) -> None:
        """Count the records evicted while in flight as lost (their send did not succeed)."""
        self._inflight_last = 0
        if self._evicted_inflight:
            lost, self._evicted_inflight = self._evicted_inflight, []
            self._note_eviction(lost)

    def _remove(self, items: list[tuple[int, int]], *, sync: bool = True) -> None:
        """Delete the files of records already taken out of the index."""
        if not items:
            return
        if any(seq == self._last_seq for seq, _ in items):
            # The newest file is going; persist its number first so a restart continues above it.
            self._write_marker()
        for seq, nbytes in items:
            self._unlink(seq, nbytes)
        if sync:
            # Without this a power loss could resurrect acked files, and they would be sent twice.
            self._sync_dir()

    def _write_marker(self) -> None:
        marker = encode_record(self._last_seq.to_bytes(8, "big"))
        try:
            # Synced before any unlink, so the number is durable before the files disappear.
            self._write_atomic(MARKER_NAME, marker)
        except OSError as exc:
            # A full disk must not block acks (that would resend forever); at worst numbers
            # restart lower after a restart, when no older record is left to be confused with.
            # Then the identity must change too, or the collector would take the new, lower
            # numbers for rounds it already stored: remove both, so a restart begins afresh.
            log.warning("spool: could not save %s: %s", MARKER_NAME, exc)
            for name in (MARKER_NAME, INSTANCE_NAME):
                try:
                    (self.directory / name).unlink(missing_ok=True)
                except OSError as unlink_exc:
                    log.warning("spool: could not remove %s: %s", name, unlink_exc)

    def _unlink(self, seq: int, nbytes: int) -> None:
        self._bytes -= nbytes
        (self.directory / record_name(seq)).unlink(missing_ok=True)

    def _read(self, seq: int) -> bytes | None:
        path = self.directory / record_name(seq)
        try:
            return decode_record(path.read_bytes())
        except (OSError, ValueError) as exc:
            # Bit rot or a file removed behind our back: skip it rather than wedge the sender.
            log.warning("spool: discarding unreadable record %s: %s", path.name, exc)
            for item in self._index:
                if item[0] == seq:
                    self._index.remove(item)
                    self._remove([item])
                    break
            self.corrupt_records += 1
            return None

    def _write_atomic(self, name: str, data: bytes) -> None:
        final = self.directory / name
        tmp = final.with_name(name + TMP_SUFFIX)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                if self._fsync:
                    os.fsync(handle.fileno())
            tmp.replace(final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._sync_dir()

    def _sync_dir(self) -> None:
        if not self._fsync:
            return
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _note_eviction(self, lost: list[tuple[int, int, int]]) -> None:
        """Count lost records ``(seq, bytes, points)``; warn once when a burst starts, then at
        most once per interval."""
        records = len(lost)
        if records == 0:
            if self._burst_logged_at is not None and self._burst_pending:
                log.warning(
                    "spool: eviction burst ended; %d more record(s) evicted", self._burst_pending
                )
            self._burst_logged_at = None
            self._burst_pending = 0
            return
        self.evicted_records += records
        self.evicted_bytes += sum(nbytes for _, nbytes, _ in lost)
        self.evicted_points += sum(points for _, _, points in lost)
        self._burst_pending += records
        now = self._clock()
        if (
            self._burst_logged_at is None
            or now - self._burst_logged_at >= EVICTION_LOG_INTERVAL_SECONDS
        ):
            log.warning(
                "spool full (max_bytes=%d): evicted %d oldest record(s); %d evicted since start",
                self.max_bytes,
                self._burst_pending,
                self.evicted_records,
            )
            self._burst_logged_at = now
            self._burst_pending = 0

    def _load_instance(self, *, continued: bool) -> None:
        """Keep the saved identity only while the numbering continues (see the docstring)."""
        path = self.directory / INSTANCE_NAME
        if not path.exists():
            return
        if continued:
            try:
                value = decode_record(path.read_bytes())
                if len(value) == INSTANCE_BYTES:
                    self._instance = value.hex()
                    return
            except (OSError, ValueError) as exc:
                log.warning("spool: ignoring unreadable %s: %s", INSTANCE_NAME, exc)
        else:
            log.info("spool: sequence numbers restart, so this agent takes a new instance id")
        path.unlink(missing_ok=True)

    def _load(self) -> None:
        corrupt: list[str] = []
        found: list[tuple[int, Path]] = []
        for path in self.directory.iterdir():
            name = path.name
            if name.endswith(TMP_SUFFIX):
                path.unlink(missing_ok=True)
            elif name.endswith(SUFFIX) and name[: -len(SUFFIX)].isdigit():
                found.append((int(name[: -len(SUFFIX)]), path))
        marker = self.directory / MARKER_NAME
        continued = False  # whether the numbering provably continues (marker or records)
        if marker.exists():
            try:
                self._last_seq = int.from_bytes(decode_record(marker.read_bytes()), "big")
                continued = True
            except (OSError, ValueError) as exc:
                log.warning("spool: ignoring unreadable %s: %s", MARKER_NAME, exc)
        self._load_instance(continued=continued or bool(found))
        for seq, path in sorted(found):
            self._last_seq = max(self._last_seq, seq)
            try:
                payload = decode_record(path.read_bytes())
            except (OSError, ValueError) as exc:
                corrupt.append(f"{path.name} ({exc})")
                path.unlink(missing_ok=True)
                continue
            self._index.append((seq, HEADER_BYTES + len(payload)))
            self._bytes += HEADER_BYTES + len(payload)
        if corrupt:
            self.corrupt_records += len(corrupt)
            log.warning(
                "spool: skipped %d corrupt record file(s): %s", len(corrupt), ", ".join(corrupt[:5])
            )
            if not self._index or self._index[-1][0] < self._last_seq:
                self._write_marker()  # the newest file was corrupt; keep its number
        self._evict_until(self.max_bytes, sync=True)  # the cap may have been lowered
        if found:
            log.info("spool: loaded %d record(s), %d bytes", len(self._index), self._bytes)
