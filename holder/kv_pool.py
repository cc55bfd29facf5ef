"""The holder's KV pool: one region of fixed-size blocks that engines reserve, write, commit and look up by prefix.

Moved out of holder/service.py unchanged; the holder owns one `KVPool`, and
every change here is a ledger record through the holder's `record` under the
holder's lock, as every other change is. The holder only reads the pool's
bytes (to checksum a block); engines write them. A frozen tenant's blocks are
never handed to anyone else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from common.logs import get_logger
from contract.holder import (
    KVBlockRef,
    KVLookupResponse,
    KVPoolDescription,
    KVValidity,
    RegionView,
    kv_block_checksum,
    kv_block_hash,
    kv_layout_from_config,
    kv_root_hash,
    tokenizer_digest,
)
from holder import store
from holder.errors import KVConflict, KVPoolAbsent
from holder.regions import KVBlockState, RegionStatus

if TYPE_CHECKING:
    from holder.service import MemoryHolder

log = get_logger(__name__)


class KVPool:
    def __init__(self, holder: MemoryHolder) -> None:
        self.holder = holder
        self.description: KVPoolDescription | None = None
        self.bytes: np.memmap | None = None  # the pool, read-only: the holder only checksums blocks

    def ensure(self) -> KVPoolDescription | None:
        """Adopt the pool region for these weights and layout, or reserve a new (zeroed) one."""
        holder = self.holder
        if holder.settings.kv_blocks == 0:
            return None
        weights = holder.ready_weights()
        model_dir = Path(weights.model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        tokenizer = model_dir / "tokenizer.json"
        validity = KVValidity(
            weights_digest=weights.weights_digest,
            tokenizer_digest=tokenizer_digest(tokenizer.read_bytes() if tokenizer.exists() else None),
            layout=kv_layout_from_config(config, block_tokens=holder.settings.kv_block_tokens, dtype=weights.dtype))
        layout = validity.layout
        meta = {"weights_digest": weights.weights_digest, "validity": validity.model_dump(),
                "num_blocks": holder.settings.kv_blocks}
        with holder.lock:
            region = next((r for r in holder.state.live_regions() if r.purpose == "kv" and r.meta == meta
                           and r.status is RegionStatus.SEALED), None)
            if region is None:
                for stale in list(holder.state.kv_blocks):  # blocks of a pool that is gone or of other weights
                    holder.record({"op": "kv_free", "block": stale, "reason": "pool region replaced"})
                region_id = holder.state.next_region_id
                path = holder.shm_dir / f"region-{region_id:06d}.bin"
                size = layout.block_bytes * holder.settings.kv_blocks
                holder.record({"op": "reserve", "region": region_id, "path": str(path), "size": size, "purpose": "kv",
                               "owner": "holder", "tensors": [], "meta": meta})
                store.create_region_file(path, size)
                holder.record({"op": "seal", "region": region_id, "checksum": store.PER_BLOCK, "epoch": holder.epoch})
                region = holder.state.regions[region_id]
                log.info("kv pool reserved", region=region_id, blocks=holder.settings.kv_blocks, bytes=size)
            else:
                log.info("kv pool adopted", region=region.region_id, committed=len(holder.state.kv_by_hash))
            view = RegionView(region_id=region.region_id, path=region.path, size=region.size, purpose="kv",
                              owner="holder", epoch=region.epoch or holder.epoch, checksum=store.PER_BLOCK, tensors=[])
            self.description = KVPoolDescription(region=view, validity=validity, num_blocks=holder.settings.kv_blocks,
                                                 root_hash=kv_root_hash(validity))
            self.bytes = np.memmap(region.path, dtype=np.uint8, mode="r")
            return self.description

    def _block_checksum(self, block: int) -> str:
        assert self.description is not None and self.bytes is not None
        size = self.description.layout.block_bytes
        return kv_block_checksum(memoryview(self.bytes[block * size:(block + 1) * size]))

    def _ready(self) -> KVPoolDescription:
        if self.description is None:
            raise KVPoolAbsent("this holder keeps no KV pool (--kv-blocks 0)")
        return self.description

    def reserve(self, tenant_id: str, generation: int, count: int) -> list[int]:
        """Blocks for a tenant to write: its own uncommitted ones from a dead generation first (the
        takeover), then free ones in id order, then the oldest committed blocks of tenants that are
        not frozen. A frozen tenant's blocks are never handed to anyone else."""
        holder = self.holder
        kv = self._ready()
        with holder.lock:
            tenant = holder.leases.current(tenant_id)
            holder.leases.check_generation(tenant, generation)
            blocks = holder.state.kv_blocks
            chosen = [b.block for b in blocks.values() if b.owner == tenant_id and b.state is KVBlockState.RESERVED
                      and b.generation < generation][:count]
            chosen += [i for i in range(kv.num_blocks) if i not in blocks][:count - len(chosen)]
            if len(chosen) < count:
                frozen = {t.tenant_id for t in map(holder.leases.view, holder.state.tenants.values()) if t.frozen}
                evictable = sorted((b for b in blocks.values() if b.state is KVBlockState.COMMITTED
                                    and b.owner not in frozen), key=lambda b: b.seq)
                for victim in evictable[:count - len(chosen)]:
                    holder.record({"op": "kv_free", "block": victim.block, "reason": "evicted"})
                    chosen.append(victim.block)
            if chosen:
                holder.record({"op": "kv_reserve", "tenant": tenant_id, "generation": generation, "blocks": chosen})
            return chosen

    def commit(self, tenant_id: str, generation: int, block: int, parent_hash: str,
               token_ids: list[int]) -> KVBlockRef:
        holder = self.holder
        kv = self._ready()
        with holder.lock:
            tenant = holder.leases.current(tenant_id)
            holder.leases.check_generation(tenant, generation)
            record = holder.state.kv_blocks.get(block)
            if record is None or record.owner != tenant_id or record.state is not KVBlockState.RESERVED \
                    or record.generation != generation:
                raise KVConflict(f"block {block} is not reserved by {tenant_id!r} generation {generation}")
            if len(token_ids) != kv.layout.block_tokens:
                raise KVConflict(f"a block holds {kv.layout.block_tokens} tokens, not {len(token_ids)}")
            if parent_hash != kv.root_hash and parent_hash not in holder.state.kv_by_hash:
                raise KVConflict("the parent block is not committed (evicted or discarded): commit the chain in order")
            block_hash = kv_block_hash(parent_hash, token_ids)
            existing = holder.state.kv_by_hash.get(block_hash)
            if existing is not None:
                holder.record({"op": "kv_free", "block": block, "reason": "duplicate of a committed block"})
                held = holder.state.kv_blocks[existing]
                return KVBlockRef(block=existing, hash=block_hash, checksum=held.checksum or "")
            checksum = self._block_checksum(block)
            holder.record({"op": "kv_commit", "tenant": tenant_id, "generation": generation, "block": block,
                           "hash": block_hash, "parent_hash": parent_hash, "tokens": token_ids, "checksum": checksum})
            return KVBlockRef(block=block, hash=block_hash, checksum=checksum)

    def lookup(self, token_ids: list[int]) -> KVLookupResponse:
        """The longest chain of committed blocks for this prefix whose bytes still match their checksum."""
        holder = self.holder
        kv = self._ready()
        size = kv.layout.block_tokens
        found, discarded = [], []
        with holder.lock:
            parent = kv.root_hash
            for start in range(0, len(token_ids) - size + 1, size):
                block_hash = kv_block_hash(parent, token_ids[start:start + size])
                block = holder.state.kv_by_hash.get(block_hash)
                if block is None:
                    break
                record = holder.state.kv_blocks[block]
                if self._block_checksum(block) != record.checksum:
                    holder.record({"op": "kv_free", "block": block, "reason": "checksum mismatch"})
                    discarded.append(block)
                    log.warning("kv block discarded", block=block, reason="checksum mismatch")
                    break
                found.append(KVBlockRef(block=block, hash=block_hash, checksum=record.checksum or ""))
                parent = block_hash
        return KVLookupResponse(blocks=found, discarded=discarded)

    def summary(self) -> dict[str, Any]:
        with self.holder.lock:
            blocks = self.holder.state.kv_blocks.values()
            return {"blocks": self.description.num_blocks if self.description else 0,
                    "reserved": sum(b.state is KVBlockState.RESERVED for b in blocks),
                    "committed": sum(b.state is KVBlockState.COMMITTED for b in blocks),
                    "committed_blocks": [{"block": b.block, "hash": b.hash, "parent_hash": b.parent_hash,
                                          "owner": b.owner, "generation": b.generation}
                                         for b in sorted(blocks, key=lambda b: b.seq)
                                         if b.state is KVBlockState.COMMITTED]}
