from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest

from weight_catalog.hashing import hash_shards, sha256_stream
from weight_catalog.store import FilesystemStore


class ReadOnlyStream(io.RawIOBase):
    """A stream without readinto, like a botocore body."""

    def __init__(self, data: bytes) -> None:
        self._inner = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._inner.read(size)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 100_003])
def test_streamed_digest_equals_hashlib_for_any_block_boundary(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    expected = hashlib.sha256(data).hexdigest()
    assert sha256_stream(io.BytesIO(data), block_bytes=4096) == (expected, size)
    assert sha256_stream(ReadOnlyStream(data), block_bytes=4096)[0] == expected


def test_parallel_and_serial_hashing_agree_and_report_progress(tmp_path: Path) -> None:
    for index in range(5):
        (tmp_path / f"shard-{index}.bin").write_bytes(bytes([index]) * (70_000 + index))
    store = FilesystemStore(tmp_path)
    paths = sorted(store.list_files())
    seen: list[int] = []
    serial = hash_shards(store, paths, workers=1, block_bytes=65536)
    parallel = hash_shards(store, paths, workers=4, block_bytes=65536, progress=seen.append)
    assert serial == parallel
    assert [d.path for d in parallel] == paths
    assert sum(seen) == sum(d.size for d in parallel)
    for digest in parallel:
        assert digest.sha256 == hashlib.sha256((tmp_path / digest.path).read_bytes()).hexdigest()


def test_store_refuses_paths_that_escape_the_root(tmp_path: Path) -> None:
    from weight_catalog.errors import InvalidLocation

    (tmp_path / "root").mkdir()
    (tmp_path / "secret").write_text("x")
    with pytest.raises(InvalidLocation):
        FilesystemStore(tmp_path / "root").open("../secret")
