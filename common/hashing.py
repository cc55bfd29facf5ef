"""Streamed sha256 of artifact shards, shards hashed in parallel.

Each shard is read in large blocks (8 MiB by default) into one reused
buffer; `hashlib.sha256.update` releases the GIL for inputs over 2 KiB, so
a thread pool hashes several shards on several cores at once. Threads, not
processes: the data never crosses a process boundary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

DEFAULT_BLOCK_BYTES = 8 * 1024 * 1024

Progress = Callable[[int], None]


@dataclass(frozen=True)
class ShardDigest:
    path: str
    size: int
    sha256: str


class ShardSource(Protocol):
    def open(self, path: str) -> BinaryIO: ...


class DirectorySource:
    """A `ShardSource` over a local directory: shard paths are relative to `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self, path: str) -> BinaryIO:
        return (self.root / path).open("rb")


def _blocks(stream: BinaryIO, block_bytes: int) -> Iterator[bytes | memoryview]:
    """Blocks of the stream; one reused buffer when the stream supports readinto."""
    readinto = getattr(stream, "readinto", None)
    if readinto is not None:
        view = memoryview(bytearray(block_bytes))
        try:
            n = readinto(view)
        except NotImplementedError:  # io.RawIOBase's placeholder
            pass
        else:
            while n:
                yield view[:n]
                n = readinto(view)
            return
    while block := stream.read(block_bytes):
        yield block


def sha256_stream(
    stream: BinaryIO, *, block_bytes: int = DEFAULT_BLOCK_BYTES, progress: Progress | None = None
) -> tuple[str, int]:
    """Hash a binary stream block by block; returns (hex digest, bytes read)."""
    digest = hashlib.sha256()
    size = 0
    for block in _blocks(stream, block_bytes):
        digest.update(block)
        size += len(block)
        if progress is not None:
            progress(len(block))
    return digest.hexdigest(), size


def hash_shards(
    source: ShardSource,
    paths: Sequence[str],
    *,
    workers: int = 4,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: Progress | None = None,
) -> list[ShardDigest]:
    """Hash every shard; results in the order of `paths`."""

    def one(path: str) -> ShardDigest:
        with source.open(path) as stream:
            sha, size = sha256_stream(stream, block_bytes=block_bytes, progress=progress)
        return ShardDigest(path=path, size=size, sha256=sha)

    if workers <= 1 or len(paths) <= 1:
        return [one(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(workers, len(paths)), thread_name_prefix="shard-hash") as pool:
        return list(pool.map(one, paths))
