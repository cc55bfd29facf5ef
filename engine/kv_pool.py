"""KV blocks in the holder's pool: published as they fill, restored after a restart.

Promise: semantic recovery at a lower cost. A continuation `prompt ‖
committed` prefills only the positions no committed block vouches for; the
tokens are the same as a full prefill's (float64; the unit test and the e2e
test compare them exactly). Anything in doubt is a miss, never a misuse:

- a block is named by a hash chain over the weights digest, KV layout,
  dtype, position encoding (`contract.holder.kv_root_hash`) and every token
  id before it, so it can only match the exact prefix it was computed for;
- the holder checks a block's checksum before it vouches for it (and frees
  it if it fails), and this process checks the checksum again on its own
  copy, so a block rewritten between lookup and copy is not used either.

Called only from the decode thread (`engine.scheduler`); commits go to the
holder from a publisher thread so decoding never waits on the ledger's fsync.
A holder that stops answering turns the pool off for this process (logged):
requests are then prefilled in full, as without a holder.
"""

from __future__ import annotations

import queue
import threading

import httpx
import numpy as np
import torch

from common.logs import get_logger
from contract.holder import (
    KVCommitRequest,
    KVLookupResponse,
    KVPoolDescription,
    KVReserveResponse,
    kv_block_checksum,
    kv_block_hash,
)
from engine.metrics import EngineMetrics
from engine.model import KVCache, LlamaShape

log = get_logger(__name__)

TIMEOUT = httpx.Timeout(connect=0.5, read=5.0, write=2.0, pool=1.0)
RESERVE_BATCH = 32


class HolderKVPool:
    def __init__(self, url: str, tenant_id: str, generation: int, pool: KVPoolDescription, metrics: EngineMetrics) -> None:
        self.url = url
        self.tenant_id = tenant_id
        self.generation = generation
        self.pool = pool
        self.layout = pool.layout
        self.metrics = metrics
        mapped = np.memmap(pool.region.path, dtype=np.uint8, mode="r+", shape=(pool.region.size,))  # MAP_SHARED
        self.blocks = torch.from_numpy(mapped.view(self.layout.dtype).reshape(pool.num_blocks, *self.layout.shape))
        self.enabled = True
        self._free: list[int] = []
        self._client = httpx.Client(timeout=TIMEOUT)  # the decode thread's
        self._publisher_client = httpx.Client(timeout=TIMEOUT)
        self._commits: queue.Queue[KVCommitRequest | None] = queue.Queue()
        self._publisher = threading.Thread(target=self._publish_loop, name="kv-publisher", daemon=True)
        self._publisher.start()

    @staticmethod
    def fits(pool: KVPoolDescription, shape: LlamaShape, dtype: torch.dtype) -> str | None:
        """Why this pool's layout cannot hold this model's KV, or None."""
        layout = pool.layout
        wanted = (shape.num_layers, shape.num_kv_heads, shape.head_dim, str(dtype).removeprefix("torch."),
                  shape.rope_theta)
        held = (layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.dtype, layout.rope_theta)
        return None if wanted == held else f"pool layout {held} does not fit this model {wanted}"

    def _off(self, what: str, exc: BaseException) -> None:
        if self.enabled:
            log.warning("kv pool off for this process; prefilling in full", during=what, error=repr(exc))
        self.enabled = False

    # -- restore (before a prefill) --------------------------------------------------------
    def restore(self, prompt_ids: list[int], cache: KVCache) -> list[str]:
        """Copy the longest vouched chain of blocks for this prompt into an empty cache; their hashes.

        At least the last prompt position is always left to prefill: its logits pick the next token.
        """
        size = self.layout.block_tokens
        usable = (len(prompt_ids) - 1) // size * size
        if not self.enabled or usable == 0:
            return []
        try:
            response = self._client.post(f"{self.url}/v1/kv/lookup", json={"token_ids": prompt_ids[:usable]})
            response.raise_for_status()
            found = KVLookupResponse.model_validate_json(response.content)
        except httpx.HTTPError as exc:
            self._off("lookup", exc)
            return []
        if found.discarded:
            self.metrics.kv_discarded_blocks.inc(len(found.discarded))
        chain = []
        for index, ref in enumerate(found.blocks):
            copy = self.blocks[ref.block].clone()
            if kv_block_checksum(memoryview(copy.numpy()).cast("B")) != ref.checksum:
                self.metrics.kv_discarded_blocks.inc()
                log.warning("kv block changed between lookup and copy; prefilling from here", block=ref.block)
                break
            span = slice(index * size, (index + 1) * size)
            cache.keys[:, :, span] = copy[0]
            cache.values[:, :, span] = copy[1]
            chain.append(ref.hash)
        cache.length = len(chain) * size
        self.metrics.kv_reused_tokens.inc(cache.length)
        return chain

    # -- publish (after a prefill or decode step) ------------------------------------------
    def publish(self, token_ids: list[int], cache: KVCache, chain: list[str]) -> None:
        """Write every block the cache has filled since the last call and queue its commit; extends `chain`."""
        size = self.layout.block_tokens
        while self.enabled and (len(chain) + 1) * size <= cache.length:
            block = self._take_block()
            if block is None:
                return
            index = len(chain)
            span = slice(index * size, (index + 1) * size)
            self.blocks[block][0] = cache.keys[:, :, span]
            self.blocks[block][1] = cache.values[:, :, span]
            parent = chain[-1] if chain else self.pool.root_hash
            tokens = token_ids[span]
            chain.append(kv_block_hash(parent, tokens))
            self._commits.put(KVCommitRequest(generation=self.generation, block=block, parent_hash=parent,
                                              token_ids=tokens))

    def _take_block(self) -> int | None:
        if not self._free:
            try:
                response = self._client.post(f"{self.url}/v1/tenants/{self.tenant_id}/kv/reserve",
                                             json={"generation": self.generation, "count": RESERVE_BATCH})
                response.raise_for_status()
            except httpx.HTTPError as exc:
                self._off("reserve", exc)
                return None
            self._free = KVReserveResponse.model_validate_json(response.content).blocks[::-1]
            if not self._free:
                return None  # the pool is full of frozen or committed blocks: publish nothing more now
        return self._free.pop()

    def _publish_loop(self) -> None:
        while (commit := self._commits.get()) is not None:
            try:
                response = self._publisher_client.post(f"{self.url}/v1/tenants/{self.tenant_id}/kv/commit",
                                             content=commit.model_dump_json(),
                                             headers={"content-type": "application/json"})
            except httpx.HTTPError as exc:
                self._off("commit", exc)
                continue
            if response.status_code == 200:
                self.metrics.kv_published_blocks.inc()
            else:  # e.g. the parent was evicted: this block is simply not shared
                log.info("kv commit refused", block=commit.block, status=response.status_code,
                         body=response.text[:200])

    def close(self) -> None:
        """Send what is queued, then stop the publisher."""
        self._commits.put(None)
        self._publisher.join(timeout=30)
