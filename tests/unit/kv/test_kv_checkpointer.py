"""Checkpoints through a store: written off the decode thread every M tokens, imported before a prefill,
verified block by block; a corrupted or foreign checkpoint is refused and the prompt prefilled instead."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from common.clock import ManualClock
from contract.kv_checkpoint import FilesystemKVStore, KVCheckpointStore, block_key, manifest_key
from contract.holder import engine_validity
from engine.kv_transfer import KVCheckpointer
from engine.metrics import EngineMetrics
from engine.model import LlamaModel
from engine.prefix_cache import LocalPrefixCache
from contract.identity import directory_weights_digest
from lifeline.processes import built_model

BLOCK = 16
EVERY = 8
PROMPT = [(i * 53 + 7) % 4096 for i in range(41)]


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    torch.set_num_threads(1)
    return LlamaModel.load(built_model("tiny", 0), torch.float64)


def checkpointer(model_dir: Path, store_dir: Path, *, block_tokens: int = BLOCK, dtype: str = "float64"):
    validity = engine_validity(model_dir, directory_weights_digest(model_dir), block_tokens=block_tokens, dtype=dtype)
    cache = LocalPrefixCache(validity, max_blocks=256)
    metrics = EngineMetrics()
    return KVCheckpointer(KVCheckpointStore(FilesystemKVStore(store_dir)), validity, cache.root_hash, cache, metrics,
                          ManualClock(), instance_id="engine-a", every_tokens=EVERY), cache, metrics


def metric(metrics: EngineMetrics, name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.registry.get_sample_value(name, labels or {}) or 0.0


def run(model: LlamaModel, prompt: list[int], steps: int, *, writer: KVCheckpointer | None = None,
        restore_from: LocalPrefixCache | None = None) -> tuple[list[int], int]:
    """What the scheduler does for one sequence: restore, prefill the rest, decode, checkpoint every EVERY."""
    cache = model.new_cache(len(prompt) + steps)
    if restore_from is not None:
        restore_from.restore(prompt, cache)
    restored = cache.length
    logits = model.prefill(prompt[restored:], cache)
    tokens: list[int] = []
    done = 0
    for _ in range(steps):
        tokens.append(int(logits.argmax()))
        if writer is not None and writer.due(len(tokens)):
            done = writer.offer("req-1", cache.length, prompt + tokens, cache, done)
        logits = model.decode([tokens[-1]], [cache])[0]
    return tokens, restored


def test_a_survivor_imports_the_newest_checkpoint_and_prefills_only_the_tail(model, tmp_path):
    model_dir = built_model("tiny", 0)
    writer, _, writer_metrics = checkpointer(model_dir, tmp_path / "store")
    expected, _ = run(model, PROMPT, 40)
    committed, _ = run(model, PROMPT, 27, writer=writer)  # due at 8, 16 and 24 generated tokens
    writer.flush()
    assert committed == expected[:27]
    # Positions with KV when due: 48 (3 full blocks), 56 (no new full block: nothing queued), 64 (4 blocks).
    assert metric(writer_metrics, "lifeline_engine_kv_checkpoints_total", {"outcome": "written"}) == 2
    assert metric(writer_metrics, "lifeline_engine_kv_checkpoint_blocks_total") == 4  # each block written once

    survivor, cache, metrics = checkpointer(model_dir, tmp_path / "store")
    continuation = PROMPT + committed  # 68 positions
    found = survivor.prefetch(continuation, "req-1")
    assert (found.cached_blocks, found.upto_blocks, found.refused) == (0, 4, None)
    rest, restored = run(model, continuation, 40 - 27, restore_from=cache)
    assert restored == 4 * BLOCK
    assert committed + rest == expected
    assert metric(metrics, "lifeline_engine_kv_imports_total", {"source": "store", "outcome": "imported"}) == 1


@pytest.mark.parametrize("corruption", ["flipped byte in a block", "block of other weights", "manifest of float32"])
def test_a_corrupted_or_foreign_checkpoint_is_refused_and_recomputed(model, tmp_path, corruption):
    model_dir = built_model("tiny", 0)
    writer, _, _ = checkpointer(model_dir, tmp_path / "store")
    committed, _ = run(model, PROMPT, 25, writer=writer)
    writer.flush()
    store = FilesystemKVStore(tmp_path / "store")
    root = writer.root_hash
    manifest_keys = store.list(f"kv/{root}/manifests/")
    newest = max(manifest_keys, key=lambda k: len(store.get(k)))
    blocks = [k for k in store.list(f"kv/{root}/blocks/")]
    if corruption == "flipped byte in a block":
        data = bytearray(store.get(blocks[1]))
        data[-50] ^= 0x01
        store.put(blocks[1], bytes(data))
    elif corruption == "block of other weights":
        other, _, _ = checkpointer(built_model("tiny", 1), tmp_path / "other")
        run(LlamaModel.load(built_model("tiny", 1), torch.float64), PROMPT, 25, writer=other)
        other.flush()
        other_store = FilesystemKVStore(tmp_path / "other")
        theirs = sorted(other_store.list(f"kv/{other.root_hash}/blocks/"))
        for mine, foreign in zip(sorted(blocks), theirs):  # same shapes, other numbers, under our keys
            store.put(mine, other_store.get(foreign))
    else:
        import json
        body = json.loads(store.get(newest))
        body["validity"]["layout"]["dtype"] = "float32"
        store.put(newest, json.dumps(body).encode())

    survivor, cache, metrics = checkpointer(model_dir, tmp_path / "store")
    continuation = PROMPT + committed
    found = survivor.prefetch(continuation, "req-1")
    assert found.upto_blocks == 0 and found.refused
    assert cache.summary()["blocks"] == 0  # nothing installed
    reason = "refused_validity" if corruption == "manifest of float32" else "refused_invalid"
    assert metric(metrics, "lifeline_engine_kv_imports_total", {"source": "store", "outcome": reason}) == 1
    rest, restored = run(model, continuation, 40 - 25, restore_from=cache)
    assert restored == 0
    assert committed + rest == run(model, PROMPT, 40)[0]


def test_another_block_size_finds_no_checkpoint(model, tmp_path):
    model_dir = built_model("tiny", 0)
    writer, _, _ = checkpointer(model_dir, tmp_path / "store")
    committed, _ = run(model, PROMPT, 25, writer=writer)
    writer.flush()
    survivor, cache, metrics = checkpointer(model_dir, tmp_path / "store", block_tokens=8)
    found = survivor.prefetch(PROMPT + committed, "req-1")
    assert (found.upto_blocks, found.refused) == (0, None)  # another root: nothing to find, a plain miss
    assert metric(metrics, "lifeline_engine_kv_imports_total", {"source": "store", "outcome": "imported"}) == 0
    assert block_key(writer.root_hash, "x").startswith(f"kv/{writer.root_hash}/")
    assert manifest_key(survivor.root_hash, "x") != manifest_key(writer.root_hash, "x")


def test_a_block_another_engine_already_stored_is_named_by_the_stored_bytes(model, tmp_path):
    """Engine A decodes the prompt's continuation; engine B prefills the same positions in one pass (its
    bytes may differ in the last bits) and checkpoints later: B's manifest must still verify on import."""
    model_dir = built_model("tiny", 0)
    writer_a, _, _ = checkpointer(model_dir, tmp_path / "store")
    committed, _ = run(model, PROMPT, 25, writer=writer_a)
    writer_a.flush()

    writer_b, _, metrics_b = checkpointer(model_dir, tmp_path / "store")
    longer = PROMPT + committed  # 66 positions, prefilled at once, then decoded on
    more, _ = run(model, longer, 20, writer=writer_b)  # due at 8 (73 positions: 4 blocks, all A's), 16 (81: 5)
    writer_b.flush()
    assert metric(metrics_b, "lifeline_engine_kv_checkpoint_blocks_total") == 1  # only the block A lacked

    reader, cache, metrics = checkpointer(model_dir, tmp_path / "store")
    found = reader.prefetch(longer + more[:17], "req-2")
    assert (found.upto_blocks, found.refused) == (5, None)


@pytest.mark.parametrize("url, message", [("ftp://host/x", "a KV store is"), ("s3:///prefix", "name a bucket"),
                                          ("redis+sentinel://h:1/", "Sentinel service")])
def test_a_bad_store_url_stops_start_up_naming_the_key(tmp_path, url, message):
    from pydantic import ValidationError

    from engine.settings import EngineSettings

    with pytest.raises(ValidationError, match=message) as refused:
        EngineSettings(model=tmp_path, kv_checkpoint_store=url)
    assert refused.value.errors()[0]["loc"] == ("kv_checkpoint_store",)
    with pytest.raises(ValidationError, match="needs a prefix cache"):
        EngineSettings(model=tmp_path, kv_checkpoint_store=str(tmp_path), kv_cache_blocks=0)
    assert EngineSettings(model=tmp_path, kv_checkpoint_store="redis://127.0.0.1:6379/0?key_prefix=a:").kv_checkpoint_store


def test_a_manifest_names_the_process_that_wrote_it(model, tmp_path):
    model_dir = built_model("tiny", 0)
    writer, _, _ = checkpointer(model_dir, tmp_path / "store")
    writer.generation_of = lambda: 7
    run(model, PROMPT, 8, writer=writer)
    writer.flush()
    checkpoints = KVCheckpointStore(FilesystemKVStore(tmp_path / "store"))
    [key] = checkpoints.manifests(writer.root_hash)
    manifest = checkpoints.read_manifest(writer.root_hash, key.rsplit("/", 1)[1].removesuffix(".json"))
    assert (manifest.instance_id, manifest.generation, manifest.request_id) == ("engine-a", 7, "req-1")
