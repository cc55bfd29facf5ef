"""Region files: the bytes the holder keeps alive, as memory-mapped files under /dev/shm.

Why files in a tmpfs and not torch shared-memory tensors: a file under
`/dev/shm` has a name that outlives the process that made it. A tenant maps
it by path (no fd passing, no pickling through `multiprocessing`), and when
the holder itself is SIGKILLed the pages stay, so the restarted holder can
replay its ledger, check each file against its sealed checksum and adopt it
instead of reading the weights from disk again. torch's shared tensors are
reference-counted segments that vanish with the last process holding them
(`file_descriptor` strategy) or need torch's own manager process
(`file_system`), and the holder does not need torch at all: it reads the
safetensors shards with numpy and writes them in the tenant's compute dtype,
so a tenant's `tensor.to(dtype)` is a no-op and nothing is copied.

Each tensor starts at a multiple of `contract.holder.TENSOR_ALIGNMENT` bytes;
the layout is computed in the shards' sorted name order, so the same model
and dtype always give the same offsets.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from pathlib import Path

import numpy as np

from contract.holder import TENSOR_ALIGNMENT, TensorSpec

# The seal of a KV pool region: its blocks are checksummed one by one (kv_commit records), not as a whole.
PER_BLOCK = "per-block"


def region_checksum(path: Path) -> str:
    """`sha256:` over the whole region file, hashed through a read-only mapping (no copy)."""
    size = path.stat().st_size
    if size == 0:
        return "sha256:" + hashlib.sha256().hexdigest()
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_READ) as mapped:
        return "sha256:" + hashlib.sha256(mapped).hexdigest()


def plan_layout(tensors: list[tuple[str, str, tuple[int, ...]]]) -> tuple[list[TensorSpec], int]:
    """Aligned offsets for (name, dtype, shape), in the order given; returns the specs and the file size."""
    specs, offset = [], 0
    for name, dtype, shape in tensors:
        nbytes = int(np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)))
        specs.append(TensorSpec(name=name, dtype=dtype, shape=list(shape), offset=offset, nbytes=nbytes))
        offset += -(-nbytes // TENSOR_ALIGNMENT) * TENSOR_ALIGNMENT
    return specs, max(offset, TENSOR_ALIGNMENT)


def model_tensor_shapes(model_dir: Path) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every weight, sorted by name, read from the shard headers only."""
    from safetensors import safe_open

    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    shapes: dict[str, tuple[int, ...]] = {}
    for filename in sorted(set(index["weight_map"].values())):
        with safe_open(str(model_dir / filename), framework="np") as shard:
            for name in shard.keys():  # noqa: SIM118 - safe_open has keys(), no __iter__
                shapes[name] = tuple(shard.get_slice(name).get_shape())
    missing = set(index["weight_map"]) - set(shapes)
    if missing:
        raise ValueError(f"weights missing from shards: {sorted(missing)[:5]}")
    return sorted(shapes.items())


def create_region_file(path: Path, size: int) -> None:
    """A new, zero-filled file of `size` bytes; refuses to overwrite (ids are never reused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def fill_weights(path: Path, model_dir: Path, specs: list[TensorSpec]) -> None:
    """Copy every tensor from the shards into the region, converting to the spec's dtype on the way."""
    from safetensors import safe_open

    by_name = {spec.name: spec for spec in specs}
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    region = np.memmap(path, dtype=np.uint8, mode="r+")
    try:
        for filename in sorted(set(index["weight_map"].values())):
            with safe_open(str(model_dir / filename), framework="np") as shard:
                for name in shard.keys():  # noqa: SIM118 - safe_open has keys(), no __iter__
                    spec = by_name[name]
                    target = region[spec.offset:spec.offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)
                    np.copyto(target, shard.get_tensor(name), casting="same_kind")
        region.flush()
    finally:
        del region


def remove_region_file(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def verify_region_file(path: Path, size: int, checksum: str | None) -> str | None:
    """Why the file cannot be proven to hold the sealed contents, or None when it can."""
    if checksum is None:
        return "unsealed"
    per_block = checksum == PER_BLOCK
    try:
        actual_size = path.stat().st_size
    except FileNotFoundError:
        return "file missing"
    if actual_size != size:
        return f"size {actual_size} != reserved {size}"
    if not per_block and region_checksum(path) != checksum:
        return "checksum mismatch"
    return None
