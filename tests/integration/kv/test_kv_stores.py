"""One KV store contract, three backends on real servers: a directory, Redis, S3 (moto's emulator).

Each backend is written through `contract.kv_checkpoint` and read back through the same
interface the control plane's replication will use; a checkpoint an engine writes to any of
them is imported by another engine, byte-verified, and gives the exact tokens.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch

from common.clock import ManualClock
from contract.kv_checkpoint import (
    KVCheckpointStore,
    KVStore,
    KVStoreUnavailable,
    block_object_checksum,
    open_kv_store,
)
from contract.holder import engine_validity
from engine.kv_transfer import KVCheckpointer
from engine.metrics import EngineMetrics
from engine.model import LlamaModel
from engine.prefix_cache import LocalPrefixCache
from contract.identity import directory_weights_digest
from lifeline.processes import built_model

REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture(params=["filesystem", "redis", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str | None]]:
    if request.param == "filesystem":
        yield f"file://{tmp_path / 'kv'}", None
    elif request.param == "redis":
        prefix = f"test:kv:{uuid.uuid4().hex}:"
        yield f"{REDIS}?key_prefix={prefix}&socket_timeout=5", None
        client = redis.Redis.from_url(REDIS)
        for key in client.scan_iter(match=prefix + "*"):
            client.delete(key)
    else:
        moto = request.getfixturevalue("moto_s3")
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(name, value)
        bucket = f"kv-{uuid.uuid4().hex[:12]}"
        moto.client().create_bucket(Bucket=bucket)
        yield f"s3://{bucket}/region-a", moto.endpoint_url


def opened(store_url: tuple[str, str | None]) -> KVStore:
    url, endpoint = store_url
    return open_kv_store(url, s3_endpoint_url=endpoint)


def test_put_get_exists_list_delete(store_url):
    store = opened(store_url)
    assert store.get("kv/r/blocks/a.safetensors") is None
    store.put("kv/r/blocks/a.safetensors", b"\x00first")
    store.put("kv/r/blocks/a.safetensors", b"\x00second")  # replaced whole
    store.put("kv/r/manifests/a.json", b"{}")
    store.put("kv/other/blocks/b.safetensors", b"b")
    assert store.get("kv/r/blocks/a.safetensors") == b"\x00second"
    assert store.exists(["kv/r/blocks/a.safetensors", "kv/r/blocks/zz.safetensors", "kv/r/manifests/a.json"]) == [
        True, False, True]
    assert store.list("kv/r/") == ["kv/r/blocks/a.safetensors", "kv/r/manifests/a.json"]
    store.delete("kv/r/blocks/a.safetensors")
    store.delete("kv/r/blocks/a.safetensors")  # absent: no error
    assert store.get("kv/r/blocks/a.safetensors") is None
    assert store.list("kv/") == ["kv/other/blocks/b.safetensors", "kv/r/manifests/a.json"]
    with pytest.raises(ValueError):
        store.put("../escape", b"x")


def test_a_checkpoint_written_to_the_store_is_imported_by_another_engine(store_url):
    torch.set_num_threads(1)
    model_dir = built_model("tiny", 0)
    model = LlamaModel.load(model_dir, torch.float64)
    validity = engine_validity(model_dir, directory_weights_digest(model_dir), block_tokens=16, dtype="float64")

    def engine(instance: str) -> tuple[KVCheckpointer, LocalPrefixCache, EngineMetrics]:
        cache = LocalPrefixCache(validity, max_blocks=64)
        metrics = EngineMetrics()
        return KVCheckpointer(KVCheckpointStore(opened(store_url)), validity, cache.root_hash, cache, metrics,
                              ManualClock(), instance_id=instance, every_tokens=16), cache, metrics

    prompt = [(i * 29 + 3) % 4096 for i in range(40)]
    writer, _, _ = engine("engine-a")
    cache = model.new_cache(80)
    logits = model.prefill(prompt, cache)
    tokens: list[int] = []
    for _ in range(30):
        tokens.append(int(logits.argmax()))
        if writer.due(len(tokens)):
            writer.offer("req", cache.length, prompt + tokens, cache, 0)
        logits = model.decode([tokens[-1]], [cache])[0]
    writer.flush()
    # Checkpoint at 16 tokens: 55 positions with KV → 3 blocks, written by block then manifest.
    checkpoints = KVCheckpointStore(opened(store_url))
    [key] = checkpoints.manifests(writer.root_hash)
    manifest = checkpoints.read_manifest(writer.root_hash, key.rsplit("/", 1)[1].removesuffix(".json"))
    assert manifest is not None and len(manifest.blocks) == 3 and manifest.instance_id == "engine-a"
    for entry in manifest.blocks:  # what a replication worker checks on a copy, without torch
        assert block_object_checksum(checkpoints.read_block(writer.root_hash, entry.hash), validity) == entry.checksum

    survivor, survivor_cache, metrics = engine("engine-b")
    continuation = prompt + tokens[:20]
    found = survivor.prefetch(continuation, "req")
    assert (found.cached_blocks, found.upto_blocks) == (0, 3)
    restored = model.new_cache(80)
    survivor_cache.restore(continuation, restored)
    assert restored.length == 48
    logits = model.prefill(continuation[48:], restored)
    rest = []
    for _ in range(10):
        rest.append(int(logits.argmax()))
        logits = model.decode([rest[-1]], [restored])[0]
    assert tokens[:20] + rest == tokens


def test_a_store_that_does_not_answer_is_unavailable_not_empty(tmp_path):
    with pytest.raises(KVStoreUnavailable):
        open_kv_store("redis://127.0.0.1:1/0?socket_connect_timeout=0.2").get("kv/r/blocks/a.safetensors")
    with pytest.raises(KVStoreUnavailable):
        open_kv_store("s3://bucket/p", s3_endpoint_url="http://127.0.0.1:1").get("kv/r/blocks/a.safetensors")
    with pytest.raises(ValueError, match="a KV store is"):
        open_kv_store("ftp://host/x")


def test_a_checkpoint_copies_between_stores_verified_and_idempotent(store_url, tmp_path):
    """What replication will do: copy a checkpoint from one region's store to another's (here: a
    directory to each backend), verified on both sides, a second copy a no-op, a corrupt source refused."""
    from contract.kv_checkpoint import FilesystemKVStore, KVCheckpointInvalid, copy_checkpoint

    torch.set_num_threads(1)
    model_dir = built_model("tiny", 0)
    model = LlamaModel.load(model_dir, torch.float64)
    validity = engine_validity(model_dir, directory_weights_digest(model_dir), block_tokens=16, dtype="float64")
    primary = KVCheckpointStore(FilesystemKVStore(tmp_path / "primary"))
    cache = LocalPrefixCache(validity, max_blocks=64)
    writer = KVCheckpointer(primary, validity, cache.root_hash, cache, EngineMetrics(), ManualClock(),
                            instance_id="engine-a", every_tokens=16)
    prompt = [(i * 31 + 5) % 4096 for i in range(40)]
    kv = model.new_cache(80)
    logits = model.prefill(prompt, kv)
    tokens: list[int] = []
    for _ in range(17):
        tokens.append(int(logits.argmax()))
        if writer.due(len(tokens)):
            writer.offer("req", kv.length, prompt + tokens, kv, 0)
        logits = model.decode([tokens[-1]], [kv])[0]
    writer.flush()
    [key] = primary.manifests()

    standby = KVCheckpointStore(opened(store_url))
    assert copy_checkpoint(primary, standby, key) == 3
    assert copy_checkpoint(primary, standby, key) == 0  # idempotent
    assert standby.manifests() == [key]

    survivor_cache = LocalPrefixCache(validity, max_blocks=64)
    survivor = KVCheckpointer(standby, validity, survivor_cache.root_hash, survivor_cache, EngineMetrics(),
                              ManualClock(), instance_id="engine-b", every_tokens=16)
    assert survivor.prefetch(prompt + tokens, "req").upto_blocks == 3

    manifest = primary.read_manifest(writer.root_hash, key.rsplit("/", 1)[1].removesuffix(".json"))
    block = manifest.blocks[1].hash
    data = bytearray(primary.read_block(writer.root_hash, block))
    data[-3] ^= 0x01
    primary.write_block(writer.root_hash, block, bytes(data))
    other = KVCheckpointStore(FilesystemKVStore(tmp_path / "third"))
    with pytest.raises(KVCheckpointInvalid, match="does not match the manifest"):
        copy_checkpoint(primary, other, key)
    assert other.manifests() == []  # no manifest naming a block that was never copied
