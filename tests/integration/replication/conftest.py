"""Two regions' KV stores for the replication tests: a directory, Redis and S3 (moto's server, an emulator),
and synthetic checkpoints written through `contract.kv_checkpoint` (numpy + safetensors, no torch)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from safetensors.numpy import save

from contract.holder import KVLayout, KVValidity, kv_block_checksum, kv_block_hash, kv_root_hash
from contract.kv_checkpoint import (
    BLOCK_TENSOR,
    KVBlockEntry,
    KVCheckpointManifest,
    KVCheckpointStore,
    manifest_key,
)

REDIS = "redis://127.0.0.1:6379/0"
VALIDITY = KVValidity(weights_digest="a" * 64, tokenizer_digest="b" * 64,
                      layout=KVLayout(block_tokens=4, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=2,
                                      dtype="float32", rope_theta=10000.0))
ROOT = kv_root_hash(VALIDITY)


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[Any]:
    """moto's S3 server: AWS emulated over real HTTP (the only emulated part of these tests)."""
    from lifeline.daemons import MotoServer

    server = MotoServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_prefixes() -> Iterator[Callable[[], str]]:
    made: list[str] = []

    def make() -> str:
        made.append(f"test:replication:{uuid.uuid4().hex}:")
        return made[-1]

    yield make
    client = redis.Redis.from_url(REDIS)
    for prefix in made:
        for key in client.scan_iter(match=prefix + "*"):
            client.delete(key)


@pytest.fixture
def s3_env(moto_s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    return moto_s3


@pytest.fixture
def store_urls(tmp_path: Path, redis_prefixes: Callable[[], str],
               request: pytest.FixtureRequest) -> Callable[[str, str], tuple[str, str | None]]:
    """`make(backend, region)` → (store URL, S3 endpoint or None) for one region's store."""

    def make(backend: str, region: str) -> tuple[str, str | None]:
        if backend == "filesystem":
            return f"file://{tmp_path / region}", None
        if backend == "redis":
            return f"{REDIS}?key_prefix={redis_prefixes()}{region}:&socket_timeout=5", None
        moto = request.getfixturevalue("s3_env")
        bucket = f"kv-{uuid.uuid4().hex[:12]}"
        moto.client().create_bucket(Bucket=bucket)
        return f"s3://{bucket}/{region}", moto.endpoint_url

    return make


def block_bytes(seed: int) -> bytes:
    layout = VALIDITY.layout
    rng = np.random.default_rng(seed)
    return save({BLOCK_TENSOR: rng.standard_normal(layout.shape).astype(layout.dtype)})


def write_checkpoint(store: KVCheckpointStore, token_ids: list[int], *, created_at: float | None,
                     seed: int = 0, session_class: str | None = None) -> str:
    """Blocks, then the manifest, as an engine writes them (a session's key point names its class); the
    manifest key."""
    size = VALIDITY.layout.block_tokens
    parent, entries = ROOT, []
    for index in range(len(token_ids) // size):
        ids = token_ids[index * size:(index + 1) * size]
        parent = kv_block_hash(parent, ids)
        data = block_bytes(seed * 100_003 + index)
        from safetensors.numpy import load

        tensor = load(data)[BLOCK_TENSOR]
        entries.append(KVBlockEntry(hash=parent, token_ids=ids, checksum=kv_block_checksum(memoryview(tensor).cast("B"))))
        if not store.store.exists([f"kv/{ROOT}/blocks/{parent}.safetensors"])[0]:
            store.write_block(ROOT, parent, data)
    manifest = KVCheckpointManifest(validity=VALIDITY, root_hash=ROOT, blocks=entries, instance_id="synthetic",
                                    generation=1, created_at=created_at, session_class=session_class)
    store.write_manifest(manifest)
    return manifest_key(ROOT, manifest.last_hash)
