"""The allocation ledger: a write-ahead log the holder fsyncs before it acts.

Every reservation, seal, free and tenant attach/confirm/release is appended
and fsynced *before* the file is created, filled, unlinked or the tenant
answered; after a holder restart `read_records` returns the consistent prefix
and `holder.regions.rebuild` replays it into the mapping in allocation order.

Framing, one record after another:

    [u32 little-endian payload length][u32 crc32 of payload][payload: UTF-8 JSON object]

A holder killed while writing leaves a torn last record: a short header, a
short payload, or a checksum that does not match. Reading stops at the first
such record and `Ledger.open` truncates the file there, so the next append
continues a consistent prefix rather than burying garbage mid-log. A record
is written with a single `os.write` to an `O_APPEND` descriptor; what a crash
can tear is only the tail.

Rejected: SQLite for the ledger (a second fsync'd journal under our own, and
the engine side would need it too only to read); one JSON file rewritten per
change (O(ledger) per allocation, and a rename is not atomic on every
filesystem the state dir may live on). Compaction is not done yet: the log
grows by a few hundred bytes per allocation and tenant restart.
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common.logs import get_logger

log = get_logger(__name__)

HEADER = struct.Struct("<II")
MAX_RECORD = 16 << 20  # a length beyond this is a torn header, not a real record


def encode_record(record: dict[str, Any]) -> bytes:
    payload = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def iter_records(data: bytes) -> Iterator[tuple[dict[str, Any], int]]:
    """Each intact record and the offset just past it; stops at the first torn or corrupt one."""
    offset = 0
    while offset + HEADER.size <= len(data):
        length, crc = HEADER.unpack_from(data, offset)
        start = offset + HEADER.size
        end = start + length
        if length > MAX_RECORD or end > len(data):
            return
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            return
        try:
            record = json.loads(payload)
        except ValueError:
            return
        if not isinstance(record, dict) or "op" not in record:
            return
        yield record, end
        offset = end


def read_records(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The consistent prefix of a ledger's bytes: its records and its length in bytes."""
    records, consistent = [], 0
    for record, end in iter_records(data):
        records.append(record)
        consistent = end
    return records, consistent


class LedgerLocked(Exception):
    pass


class Ledger:
    """An open ledger file: `append` returns only once the record is on disk."""

    def __init__(self, path: Path, fd: int, records: list[dict[str, Any]], torn_bytes: int) -> None:
        self.path = path
        self._fd = fd
        self.records = records  # what replay found at open; appends are not added here
        self.torn_bytes = torn_bytes
        self.appended = 0

    @classmethod
    def open(cls, path: Path) -> Ledger:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # One writer per ledger: a second holder on the same state dir would interleave records.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LedgerLocked(f"another holder has the ledger {path} open") from None
        data = path.read_bytes()
        records, consistent = read_records(data)
        torn = len(data) - consistent
        if torn:
            # The tail a crash tore (or corruption after the last good record): drop it so
            # new records follow the consistent prefix. Logged: it is evidence of a crash.
            log.warning("ledger tail discarded", path=str(path), torn_bytes=torn, records=len(records))
            os.ftruncate(fd, consistent)
            os.fsync(fd)
        _fsync_dir(path.parent)
        return cls(path, fd, records, torn)

    def append(self, record: dict[str, Any]) -> None:
        frame = encode_record(record)
        written = os.write(self._fd, frame)
        if written != len(frame):  # a full disk: never leave a torn record we then build on
            raise OSError(f"short write to the ledger ({written} of {len(frame)} bytes)")
        os.fsync(self._fd)
        self.appended += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
