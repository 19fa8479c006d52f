"""The crash-safe spool: order, sequence, cap, corruption, concurrency and a real SIGKILL."""

from __future__ import annotations

import logging
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuwarden.agent.spool import HEADER_BYTES, Spool, decode_record, encode_record, record_name


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def payload(n: int, size: int = 100) -> bytes:
    return f"{n:08d}".encode().ljust(size, b".")


def everything(spool: Spool) -> list[tuple[int, bytes]]:
    """What the spool holds: a look, not a send (released at once, so nothing stays in flight)."""
    records = spool.peek(10**9, 10**12)
    spool.release()
    return records


def test_fifo_order_sizes_and_ack(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", max_bytes=10**6, fsync=False)
    seqs = [spool.append(payload(n)) for n in range(1, 6)]
    assert seqs == [1, 2, 3, 4, 5]
    assert len(spool) == 5
    assert spool.bytes_used == 5 * (HEADER_BYTES + 100)
    assert everything(spool) == [(n, payload(n)) for n in range(1, 6)]
    assert spool.peek(2, 10**6) == [(1, payload(1)), (2, payload(2))]
    assert [seq for seq, _ in spool.peek(10, 250)] == [1, 2]  # 300 bytes would not fit
    assert spool.peek(10, 1) == [(1, payload(1))]  # always at least one
    spool.ack(2)
    assert [seq for seq, _ in everything(spool)] == [3, 4, 5]
    spool.drop(4)
    spool.drop(99)  # unknown: no-op
    assert [seq for seq, _ in everything(spool)] == [3, 5]
    assert spool.bytes_used == 2 * (HEADER_BYTES + 100)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [record_name(3), record_name(5)]
    with pytest.raises(ValueError, match="max_records"):
        spool.peek(0, 100)


def test_on_disk_format_and_permissions(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "spool"
    spool = Spool(directory, max_bytes=10**6, fsync=True)
    spool.append(b"hello")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    path = directory / "00000000000000000001.otlp"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = path.read_bytes()
    assert raw == b"GWS1" + (5).to_bytes(4, "big") + (0x3610A686).to_bytes(4, "big") + b"hello"
    assert decode_record(raw) == b"hello"
    assert encode_record(b"hello") == raw


def test_sequence_survives_reopen_even_when_empty(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**6, fsync=False)
    for n in range(3):
        spool.append(payload(n))
    reopened = Spool(tmp_path, max_bytes=10**6, fsync=False)
    assert [seq for seq, _ in everything(reopened)] == [1, 2, 3]
    assert reopened.append(b"x") == 4
    reopened.ack(4)
    assert len(reopened) == 0
    again = Spool(tmp_path, max_bytes=10**6, fsync=False)
    assert len(again) == 0
    assert again.append(b"y") == 5
    again.drop(5)  # dropping the newest also keeps its number
    assert Spool(tmp_path, max_bytes=10**6, fsync=False).append(b"z") == 6


def test_cap_evicts_oldest_counts_and_warns_once_per_burst(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    size = HEADER_BYTES + 100
    spool = Spool(tmp_path, max_bytes=3 * size, fsync=False, clock=clock)
    caplog.set_level(logging.WARNING, logger="gpuwarden.agent.spool")
    for n in range(1, 4):
        spool.append(payload(n))
    assert spool.evicted_records == 0
    assert caplog.records == []
    for n in range(4, 8):  # four evictions in one burst: one line
        spool.append(payload(n))
    assert [seq for seq, _ in everything(spool)] == [5, 6, 7]
    assert (spool.evicted_records, spool.evicted_bytes) == (4, 4 * size)
    assert spool.bytes_used == 3 * size
    assert [r.getMessage() for r in caplog.records] == [
        f"spool full (max_bytes={3 * size}): evicted 1 oldest record(s); 1 evicted since start"
    ]
    clock.now += 61  # the burst goes on: one summary per interval
    spool.append(payload(8))
    assert caplog.records[-1].getMessage() == (
        f"spool full (max_bytes={3 * size}): evicted 4 oldest record(s); 5 evicted since start"
    )
    spool.append(payload(9))
    spool.ack(9)  # room again: the next append ends the burst with its unlogged count
    spool.append(payload(10))
    assert (
        caplog.records[-1].getMessage() == "spool: eviction burst ended; 1 more record(s) evicted"
    )
    assert len(caplog.records) == 3
    assert spool.evicted_records == 6


def test_record_larger_than_spool_is_refused(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=HEADER_BYTES + 10, fsync=False)
    spool.append(b"0123456789")
    with pytest.raises(ValueError, match="cannot fit"):
        spool.append(b"01234567890")
    assert everything(spool) == [(1, b"0123456789")]
    assert spool.evicted_records == 0


def test_corrupt_files_are_skipped_and_counted_after_reopen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path, max_bytes=10**6, fsync=False)
    for n in range(1, 7):
        spool.append(payload(n))
    (tmp_path / record_name(2)).write_bytes(b"")  # zero length after a power loss
    torn = (tmp_path / record_name(3)).read_bytes()
    (tmp_path / record_name(3)).write_bytes(torn[:60])  # torn write
    flipped = bytearray((tmp_path / record_name(4)).read_bytes())
    flipped[HEADER_BYTES + 5] ^= 0x01  # same length, CRC mismatch
    (tmp_path / record_name(4)).write_bytes(bytes(flipped))
    (tmp_path / record_name(6)).write_bytes(b"XXXX" + torn[4:])  # bad magic, the newest
    caplog.set_level(logging.WARNING, logger="gpuwarden.agent.spool")
    reopened = Spool(tmp_path, max_bytes=10**6, fsync=False)
    assert reopened.corrupt_records == 4
    assert everything(reopened) == [(1, payload(1)), (5, payload(5))]
    assert reopened.bytes_used == 2 * (HEADER_BYTES + 100)
    assert "skipped 4 corrupt record file(s)" in caplog.text
    assert not (tmp_path / record_name(2)).exists()
    assert reopened.append(b"next") == 7  # the corrupt newest file's number is not reused
    assert Spool(tmp_path, max_bytes=10**6, fsync=False).corrupt_records == 0


def test_record_corrupted_after_load_is_skipped_by_peek(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**6, fsync=False)
    for n in range(1, 4):
        spool.append(payload(n))
    (tmp_path / record_name(1)).write_bytes(b"rot")
    assert everything(spool) == [(2, payload(2)), (3, payload(3))]
    assert spool.corrupt_records == 1
    assert len(spool) == 2


def test_leftover_temp_files_are_removed(tmp_path: Path) -> None:
    Spool(tmp_path, max_bytes=10**6, fsync=False).append(payload(1))
    leftover = tmp_path / (record_name(2) + ".tmp")
    leftover.write_bytes(encode_record(payload(2)))
    (tmp_path / "last-sequence.tmp").write_bytes(b"")
    reopened = Spool(tmp_path, max_bytes=10**6, fsync=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [record_name(1)]
    assert everything(reopened) == [(1, payload(1))]
    assert reopened.corrupt_records == 0


def test_lowered_cap_evicts_on_load(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**6, fsync=False)
    for n in range(1, 6):
        spool.append(payload(n))
    smaller = Spool(tmp_path, max_bytes=2 * (HEADER_BYTES + 100), fsync=False)
    assert [seq for seq, _ in everything(smaller)] == [4, 5]
    assert smaller.evicted_records == 3


def test_writer_and_reader_threads_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=10**8, fsync=False)
    total = 800
    received: list[bytes] = []
    written = threading.Event()

    def write() -> None:  # an exception here fails the test via pytest's thread hook
        try:
            for n in range(total):
                spool.append(payload(n, size=20 + n % 50))
        finally:
            written.set()

    def read() -> None:
        while not (written.is_set() and len(spool) == 0):
            batch = spool.peek(37, 4000)
            if batch:
                received.extend(data for _, data in batch)
                spool.ack(batch[-1][0])

    threads = [threading.Thread(target=fn, daemon=True) for fn in (write, read)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert received == [payload(n, size=20 + n % 50) for n in range(total)]
    assert len(spool) == 0
    assert spool.bytes_used == 0


CHILD = """
import sys
from pathlib import Path
from gpuwarden.agent.spool import Spool

spool = Spool(Path(sys.argv[1]), max_bytes=1 << 30, fsync=True)
n = 0
while True:
    n += 1
    seq = spool.append(f"{n:08d}".encode() * (20 + n % 300))
    print(seq, flush=True)
"""


def test_sigkill_mid_append_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory)], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        printed: list[int] = []
        for line in proc.stdout:
            printed.append(int(line))
            if len(printed) == 150:
                break
        proc.kill()
        # read on through the text buffer: the loop above may have read lines past the 150th
        # into it (communicate with a timeout reads the pipe underneath and would miss them)
        rest = proc.stdout.read()
        proc.wait(timeout=30)
    printed += [int(token) for token in rest.split()]
    assert proc.returncode == -signal.SIGKILL
    assert printed == list(range(1, len(printed) + 1))

    spool = Spool(directory, max_bytes=1 << 30, fsync=False)
    stored = dict(everything(spool))
    for seq in printed:
        assert stored[seq] == f"{seq:08d}".encode() * (20 + seq % 300)
    # The append in flight at the kill may or may not have completed; nothing else may exist.
    assert set(stored) - set(printed) <= {len(printed) + 1}
    assert spool.corrupt_records == 0
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]
