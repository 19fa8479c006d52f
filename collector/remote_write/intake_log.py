"""The bodies taken since the last flush, on disk: what a ``kill -9`` must not lose.

The history writer decodes OTLP bodies in its flush, up to ``flush_seconds`` after the agent was
answered. Each body is also written here (``intake-<n>.wal``, one ``write`` call, no fsync: a
killed process's writes are in the kernel already; a machine crash can lose the last second).
A flush starts a new file, queues what it took, then deletes the older files. At start,
:meth:`IntakeLog.recover` gives back the bodies of files a stopped collector left, oldest
first. A crash between the queue's fsync and the deletion queues those bodies twice (at most
one flush's worth).
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

_HEADER = struct.Struct("<IIH")  # body bytes, crc32(kind + body), kind bytes
_PREFIX, _SUFFIX = "intake-", ".wal"


class IntakeLog:
    """Append-only files of ``(body, kind)`` in ``directory``, rotated by each flush."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._left = self._files()
        self._number = max((n for n, _ in self._left), default=0) + 1
        self._fd = self._open(self._number)

    def _files(self) -> list[tuple[int, Path]]:
        found = []
        for path in self.directory.glob(f"{_PREFIX}*{_SUFFIX}"):
            digits = path.name[len(_PREFIX) : -len(_SUFFIX)]
            if digits.isdigit():
                found.append((int(digits), path))
        return sorted(found)

    def _open(self, number: int) -> int:
        path = self.directory / f"{_PREFIX}{number:012d}{_SUFFIX}"
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def append(self, body: bytes, kind: str) -> None:
        """Write one body (the caller holds its lock: records keep the intake's order)."""
        tag = kind.encode()
        os.write(self._fd, _HEADER.pack(len(body), zlib.crc32(tag + body), len(tag)) + tag + body)

    def rotate(self) -> int:
        """Start a new file; return its number (files before it are the flush's to delete)."""
        os.close(self._fd)
        self._number += 1
        self._fd = self._open(self._number)
        return self._number

    def release(self, before: int) -> None:
        """Delete the files numbered below ``before`` (their bodies are in the queue)."""
        for number, path in self._files():
            if number < before:
                path.unlink(missing_ok=True)

    def recover(self) -> list[tuple[bytes, str]]:
        """The bodies of files found at start, oldest first (a torn last record is skipped)."""
        out: list[tuple[bytes, str]] = []
        for _, path in self._left:
            data = path.read_bytes()
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, crc, tag_length = _HEADER.unpack_from(data, offset)
                start = offset + _HEADER.size
                tag = data[start : start + tag_length]
                body = data[start + tag_length : start + tag_length + length]
                if len(body) < length or zlib.crc32(tag + body) != crc:
                    break
                out.append((body, tag.decode()))
                offset = start + tag_length + length
        return out

    def close(self) -> None:
        """Close the current file."""
        os.close(self._fd)
