"""Replace a small file so a reader (or the next start-up) sees the old bytes or the new, never half.

Write a temporary file beside the target, fsync it, `os.replace` it over the
target and fsync the directory, so the rename itself survives a power cut.
Used for the gateway's lease generation counters and downloaded artifacts, and
for the last good routing snapshot (`contract/snapshot_client.py`, gateway and
agent alike): each is read back by the next process after a crash.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
