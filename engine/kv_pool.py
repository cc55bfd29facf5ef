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
    KVCommitResponse,
    KVLookupResponse,
    KVPoolDescription,
    KVReserveResponse,
    KVValidity,
    kv_block_checksum,
    kv_block_hash,
)
from engine.metrics import EngineMetrics
from engine.model import KVCache
from engine.prefix_cache import KVBlock, usable_positions

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
        self.validity = pool.validity
        self.root_hash = pool.root_hash
        self.metrics = metrics
        mapped = np.memmap(pool.region.path, dtype=np.uint8, mode="r+", shape=(pool.region.size,))  # MAP_SHARED
        self.pool_blocks = torch.from_numpy(mapped.view(self.layout.dtype).reshape(pool.num_blocks, *self.layout.shape))
        self.enabled = True
        self._free: list[int] = []
        self._client = httpx.Client(timeout=TIMEOUT)  # the decode thread's
        self._publisher_client = httpx.Client(timeout=TIMEOUT)
        self._other_client = httpx.Client(timeout=TIMEOUT)  # export, import, checkpoints: not the decode thread
        self._other_lock = threading.Lock()
        self._commits: queue.Queue[KVCommitRequest | None] = queue.Queue()
        self._publisher = threading.Thread(target=self._publish_loop, name="kv-publisher", daemon=True)
        self._publisher.start()

    @property
    def block_tokens(self) -> int:
        return self.layout.block_tokens

    @staticmethod
    def fits(pool: KVPoolDescription, engine: KVValidity) -> str | None:
        """Why this pool's blocks are not valid for this engine (its tuple at the pool's block size), or None."""
        differ = engine.mismatches(pool.validity)
        return f"pool's validity tuple differs in {', '.join(differ)}" if differ else None

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
        usable = usable_positions(len(prompt_ids), size)
        if not self.enabled or usable == 0:
            return []
        try:
            found = self._lookup(self._client, prompt_ids[:usable])
        except httpx.HTTPError as exc:
            self._off("lookup", exc)
            return []
        if found.discarded:
            self.metrics.kv_discarded_blocks.inc(len(found.discarded))
        chain = []
        for index, ref in enumerate(found.blocks):
            copy = self.pool_blocks[ref.block].clone()
            if kv_block_checksum(memoryview(copy.numpy()).cast("B")) != ref.checksum:
                self.metrics.kv_discarded_blocks.inc()
                log.warning("kv block changed between lookup and copy; prefilling from here", block=ref.block)
                break
            span = slice(index * size, (index + 1) * size)
            cache.keys[:, :, span] = copy[0]
            cache.values[:, :, span] = copy[1]
            chain.append(ref.hash)
        cache.length = len(chain) * size
        return chain

    def _lookup(self, client: httpx.Client, token_ids: list[int]) -> KVLookupResponse:
        response = client.post(f"{self.url}/v1/kv/lookup", json={"token_ids": token_ids})
        response.raise_for_status()
        return KVLookupResponse.model_validate_json(response.content)

    # -- export, import (any thread but the decode thread's client) -------------------------
    def cached_blocks(self, token_ids: list[int]) -> int:
        if not self.enabled:
            return 0
        try:
            with self._other_lock:
                return len(self._lookup(self._other_client, token_ids).blocks)
        except httpx.HTTPError as exc:
            self._off("lookup", exc)
            return 0

    def blocks(self, token_ids: list[int]) -> list[KVBlock]:
        """Copies of the vouched chain's blocks, each checked against its checksum after the copy."""
        if not self.enabled:
            return []
        size = self.layout.block_tokens
        try:
            with self._other_lock:
                found = self._lookup(self._other_client, token_ids)
        except httpx.HTTPError as exc:
            self._off("lookup", exc)
            return []
        chain, parent = [], self.root_hash
        for index, ref in enumerate(found.blocks):
            copy = self.pool_blocks[ref.block].clone()
            if kv_block_checksum(memoryview(copy.numpy()).cast("B")) != ref.checksum:
                self.metrics.kv_discarded_blocks.inc()
                break
            chain.append(KVBlock(ref.hash, parent, tuple(token_ids[index * size:(index + 1) * size]), copy))
            parent = ref.hash
        return chain

    def install(self, token_ids: list[int], blocks: list[KVBlock]) -> int:
        """Write verified blocks into reserved pool blocks and commit them in chain order, synchronously:
        a lookup right after this returns them. The holder refuses a block whose parent it lacks, so
        an install that starts after a gap installs nothing."""
        if not self.enabled or not blocks:
            return 0
        first = len(token_ids) // self.layout.block_tokens - len(blocks)  # chain index of blocks[0]
        held = 0
        try:
            with self._other_lock:
                known = len(self._lookup(self._other_client, token_ids).blocks)
                todo = blocks[max(0, known - first):]
                held = len(blocks) - len(todo)
                if not todo:
                    return held
                response = self._other_client.post(f"{self.url}/v1/tenants/{self.tenant_id}/kv/reserve",
                                                   json={"generation": self.generation, "count": len(todo)})
                response.raise_for_status()
                reserved = KVReserveResponse.model_validate_json(response.content).blocks
                for block, slot in zip(todo, reserved):  # a short reservation installs a shorter chain
                    self.pool_blocks[slot].copy_(block.kv)
                    commit = KVCommitRequest(generation=self.generation, block=slot, parent_hash=block.parent_hash,
                                             token_ids=list(block.token_ids))
                    answer = self._other_client.post(f"{self.url}/v1/tenants/{self.tenant_id}/kv/commit",
                                                     content=commit.model_dump_json(),
                                                     headers={"content-type": "application/json"})
                    if answer.status_code != 200:
                        log.info("kv install stopped: commit refused", status=answer.status_code, body=answer.text[:200])
                        break
                    KVCommitResponse.model_validate_json(answer.content)
                    self.metrics.kv_published_blocks.inc()
                    held += 1
        except httpx.HTTPError as exc:
            self._off("install", exc)
        return held

    def summary(self) -> dict:
        return {"kind": "holder", "enabled": self.enabled, "blocks": self.pool.num_blocks, "holder": self.url}

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
            self.pool_blocks[block][0] = cache.keys[:, :, span]
            self.pool_blocks[block][1] = cache.values[:, :, span]
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
