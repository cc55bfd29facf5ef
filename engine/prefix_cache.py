"""The engine's prefix cache: full KV blocks named by their hash chain, reused by new requests.

Two implementations of one interface (`PrefixCache`), picked at start-up:

- `engine.kv_pool.HolderKVPool` when a memory holder with a KV pool is
  attached: blocks live in the holder's shared memory and outlive this process;
- `LocalPrefixCache` otherwise: blocks in this process's memory, bounded by a
  block count, least recently used evicted first.

Either way a block is found only by its hash, and the chain is rooted in the
engine's validity tuple (`contract.holder.kv_root_hash`), so a block computed
under other weights, tokenizer, dtype, block size or position encoding is
never found: a miss, never a misuse. Imports (`engine.kv_transfer`) install
blocks here only after verifying every byte; the scheduler restores from here.

`restore` and `publish` run on the decode thread; `blocks`, `cached_blocks` and
`install` may run on any thread (HTTP export and import, the checkpoint
writer), so the local cache takes a lock for every access.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import torch

from contract.holder import KVValidity, kv_block_checksum, kv_block_hash, kv_chain_hashes, kv_root_hash
from engine.model import KVCache


@dataclass(frozen=True)
class KVBlock:
    """One full block: its place in the chain and its keys and values, [2, layers, kv heads, B, head dim].

    `kv` is never written after the block is made, so readers share it without copying.
    """

    hash: str
    parent_hash: str
    token_ids: tuple[int, ...]
    kv: torch.Tensor

    def checksum(self) -> str:
        return kv_block_checksum(memoryview(self.kv.contiguous().numpy()).cast("B"))


def usable_positions(prompt_len: int, block_tokens: int) -> int:
    """Positions a prompt may restore: whole blocks, leaving at least the last position to prefill
    (its logits pick the next token)."""
    return (prompt_len - 1) // block_tokens * block_tokens


def block_of(cache: KVCache, index: int, size: int) -> torch.Tensor:
    """A copy of block `index` of a sequence's cache, shaped like a KVBlock's tensor."""
    span = slice(index * size, (index + 1) * size)
    return torch.stack((cache.keys[:, :, span], cache.values[:, :, span])).clone()


class PrefixCache(Protocol):
    validity: KVValidity
    root_hash: str

    @property
    def block_tokens(self) -> int: ...

    def restore(self, prompt_ids: list[int], cache: KVCache) -> list[str]:
        """Copy the longest cached chain for this prompt into an empty cache; their hashes (decode thread)."""
        ...

    def publish(self, token_ids: list[int], cache: KVCache, chain: list[str]) -> None:
        """Keep every block the cache has filled since the last call; extends `chain` (decode thread)."""
        ...

    def cached_blocks(self, token_ids: list[int]) -> int:
        """How many leading full blocks of this prefix the cache holds now."""
        ...

    def blocks(self, token_ids: list[int]) -> list[KVBlock]:
        """The longest cached chain of blocks for this prefix, from the root."""
        ...

    def install(self, token_ids: list[int], blocks: list[KVBlock]) -> int:
        """Add verified blocks: the last `len(blocks)` of the chain of `token_ids`, in order; how many of
        them it holds afterwards."""
        ...

    def summary(self) -> dict: ...


class LocalPrefixCache:
    """Blocks in process memory: at most `max_blocks`, least recently used evicted first."""

    def __init__(self, validity: KVValidity, max_blocks: int) -> None:
        self.validity = validity
        self.root_hash = kv_root_hash(validity)
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[str, KVBlock] = OrderedDict()
        self._lock = threading.Lock()
        self.evicted = 0

    @property
    def block_tokens(self) -> int:
        return self.validity.layout.block_tokens

    def _chain(self, token_ids: list[int]) -> list[KVBlock]:
        found = []
        for block_hash in kv_chain_hashes(self.root_hash, token_ids, self.block_tokens):
            block = self._blocks.get(block_hash)
            if block is None:
                break
            self._blocks.move_to_end(block_hash)
            found.append(block)
        return found

    def _add(self, block: KVBlock) -> None:
        if block.hash in self._blocks:
            self._blocks.move_to_end(block.hash)
            return
        self._blocks[block.hash] = block
        while len(self._blocks) > self.max_blocks:
            self._blocks.popitem(last=False)
            self.evicted += 1

    def restore(self, prompt_ids: list[int], cache: KVCache) -> list[str]:
        size = self.block_tokens
        with self._lock:
            found = self._chain(prompt_ids[:usable_positions(len(prompt_ids), size)])
        for index, block in enumerate(found):
            span = slice(index * size, (index + 1) * size)
            cache.keys[:, :, span] = block.kv[0]
            cache.values[:, :, span] = block.kv[1]
        cache.length = len(found) * size
        return [block.hash for block in found]

    def publish(self, token_ids: list[int], cache: KVCache, chain: list[str]) -> None:
        size = self.block_tokens
        if self.max_blocks == 0:
            return
        while (len(chain) + 1) * size <= cache.length:
            index = len(chain)
            parent = chain[-1] if chain else self.root_hash
            tokens = tuple(token_ids[index * size:(index + 1) * size])
            block_hash = kv_block_hash(parent, list(tokens))
            with self._lock:
                known = block_hash in self._blocks
                if known:
                    self._blocks.move_to_end(block_hash)
            if not known:
                block = KVBlock(block_hash, parent, tokens, block_of(cache, index, size))
                with self._lock:
                    self._add(block)
            chain.append(block_hash)

    def cached_blocks(self, token_ids: list[int]) -> int:
        with self._lock:
            return len(self._chain(token_ids))

    def blocks(self, token_ids: list[int]) -> list[KVBlock]:
        with self._lock:
            return self._chain(token_ids)

    def install(self, token_ids: list[int], blocks: list[KVBlock]) -> int:
        with self._lock:
            for block in blocks:
                self._add(block)
            return sum(block.hash in self._blocks for block in blocks)

    def summary(self) -> dict:
        with self._lock:
            return {"kind": "local", "blocks": len(self._blocks), "max_blocks": self.max_blocks,
                    "evicted": self.evicted}
