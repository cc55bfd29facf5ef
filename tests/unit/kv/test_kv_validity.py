"""The validity tuple roots every KV block chain: blocks of another model version, dtype or block size
are a miss (a refused import that installs nothing), never a misuse; matching blocks give the exact tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from contract.holder import KVValidity, engine_validity, kv_chain_hashes, kv_root_hash
from contract.kv_checkpoint import KVCheckpointInvalid, KVValidityMismatch, verify_manifest
from engine.kv_transfer import decode_bundle, encode_bundle, manifest_for
from engine.model import LlamaModel
from engine.prefix_cache import LocalPrefixCache
from contract.identity import directory_weights_digest
from lifeline.processes import built_model

BLOCK = 16
PROMPT = [(i * 37 + 11) % 4096 for i in range(70)]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return built_model("tiny", 0)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> LlamaModel:
    torch.set_num_threads(1)
    return LlamaModel.load(model_dir, torch.float64)


def validity_of(model_dir: Path, *, block_tokens: int = BLOCK, dtype: str = "float64") -> KVValidity:
    return engine_validity(model_dir, directory_weights_digest(model_dir), block_tokens=block_tokens, dtype=dtype)


def greedy(model: LlamaModel, cache_from: LocalPrefixCache | None, prompt: list[int], steps: int,
           publish_to: LocalPrefixCache | None = None) -> tuple[list[int], int]:
    """Greedy tokens, restoring what `cache_from` holds first; (tokens, positions restored)."""
    cache = model.new_cache(len(prompt) + steps)
    restored = cache_from.restore(prompt, cache) if cache_from is not None else []
    held = cache.length
    logits = model.prefill(prompt[held:], cache)
    tokens = []
    chain = list(restored)
    for _ in range(steps):
        tokens.append(int(logits.argmax()))
        if publish_to is not None:
            publish_to.publish(prompt + tokens, cache, chain)
        logits = model.decode([tokens[-1]], [cache])[0]
    return tokens, held


def filled_cache(model: LlamaModel, validity: KVValidity) -> LocalPrefixCache:
    cache = LocalPrefixCache(validity, max_blocks=64)
    greedy(model, None, PROMPT, 20, publish_to=cache)
    return cache


def test_every_field_of_the_tuple_changes_the_root(model_dir):
    base = validity_of(model_dir)
    other_weights = validity_of(built_model("tiny", 1))
    variants = {"weights_digest": other_weights, "layout.dtype": validity_of(model_dir, dtype="float32"),
                "layout.block_tokens": validity_of(model_dir, block_tokens=8),
                "tokenizer_digest": base.model_copy(update={"tokenizer_digest": "sha256:" + "0" * 64}),
                "layout.rope_theta": base.model_copy(update={"layout": base.layout.model_copy(
                    update={"rope_theta": 500000.0})})}
    assert other_weights.tokenizer_digest == base.tokenizer_digest  # the same tokenizer, other weights
    roots = {kv_root_hash(base)}
    for field, variant in variants.items():
        assert base.mismatches(variant) == [field]
        roots.add(kv_root_hash(variant))
        assert kv_chain_hashes(kv_root_hash(variant), PROMPT, BLOCK)[0] != kv_chain_hashes(kv_root_hash(base), PROMPT, BLOCK)[0]
    assert len(roots) == len(variants) + 1


def test_an_exported_bundle_restores_the_exact_tokens_of_a_full_prefill(model, model_dir):
    source = filled_cache(model, validity_of(model_dir))
    continuation = PROMPT + greedy(model, None, PROMPT, 20)[0][:9]
    blocks = source.blocks(continuation)
    assert len(blocks) == len(continuation) // BLOCK == 4
    bundle = encode_bundle(manifest_for(source.validity, source.root_hash, blocks, [b.checksum() for b in blocks],
                                        instance_id="engine-a", request_id=None, created_at=None), blocks)

    target = LocalPrefixCache(validity_of(model_dir), max_blocks=64)
    imported = decode_bundle(bundle, target.validity)
    assert target.install([t for b in imported for t in b.token_ids], imported) == 4
    tokens, restored = greedy(model, target, continuation, 11)
    expected, _ = greedy(model, None, continuation, 11)
    assert restored == 4 * BLOCK
    assert tokens == expected


@pytest.mark.parametrize("other", ["second model version", "float32", "block size 8"])
def test_a_bundle_made_under_another_tuple_is_refused_and_installs_nothing(model, model_dir, other):
    source = filled_cache(model, validity_of(model_dir))
    blocks = source.blocks(PROMPT)
    bundle = encode_bundle(manifest_for(source.validity, source.root_hash, blocks, [b.checksum() for b in blocks],
                                        instance_id="engine-a", request_id=None, created_at=None), blocks)
    engine = {"second model version": validity_of(built_model("tiny", 1)),
              "float32": validity_of(model_dir, dtype="float32"),
              "block size 8": validity_of(model_dir, block_tokens=8)}[other]
    target = LocalPrefixCache(engine, max_blocks=64)
    with pytest.raises(KVValidityMismatch) as refused:
        decode_bundle(bundle, target.validity)
    assert refused.value.fields == {"second model version": ["weights_digest"], "float32": ["layout.dtype"],
                                    "block size 8": ["layout.block_tokens"]}[other]
    assert target.summary()["blocks"] == 0
    assert target.cached_blocks(PROMPT) == 0  # nor could those blocks be found by hash under this tuple


def _bundle_parts(bundle: bytes) -> tuple[dict, int]:
    header_len = int.from_bytes(bundle[:8], "little")
    return json.loads(bundle[8:8 + header_len]), 8 + header_len


def test_a_flipped_bit_or_a_rewritten_manifest_is_refused(model, model_dir):
    source = filled_cache(model, validity_of(model_dir))
    blocks = source.blocks(PROMPT)
    manifest = manifest_for(source.validity, source.root_hash, blocks, [b.checksum() for b in blocks],
                            instance_id="engine-a", request_id=None, created_at=None)
    bundle = bytearray(encode_bundle(manifest, blocks))
    header, data_start = _bundle_parts(bytes(bundle))
    begin = header["block.00002"]["data_offsets"][0]
    bundle[data_start + begin + 100] ^= 0x10
    with pytest.raises(KVCheckpointInvalid, match="block 2's sha256"):
        decode_bundle(bytes(bundle), source.validity)

    # The same tensors under a manifest whose second block claims other tokens: the chain breaks.
    forged = manifest.model_copy(update={"blocks": [manifest.blocks[0],
                                                    manifest.blocks[1].model_copy(update={"token_ids": [1] * BLOCK}),
                                                    *manifest.blocks[2:]]})
    with pytest.raises(KVCheckpointInvalid, match="block 1's hash"):
        verify_manifest(forged, source.validity)
    with pytest.raises(KVCheckpointInvalid, match="block 1's hash"):
        decode_bundle(encode_bundle(forged, blocks), source.validity)
    with pytest.raises(KVCheckpointInvalid, match="not a safetensors file"):
        decode_bundle(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json", source.validity)


def test_the_local_cache_is_bounded_and_evicts_the_least_recently_used(model, model_dir):
    cache = LocalPrefixCache(validity_of(model_dir), max_blocks=3)
    greedy(model, None, PROMPT, 20, publish_to=cache)  # 90 positions → 5 full blocks published
    assert cache.summary() == {"kind": "local", "blocks": 3, "max_blocks": 3, "evicted": 2}
    assert cache.cached_blocks(PROMPT) == 0  # the chain's first blocks went first
