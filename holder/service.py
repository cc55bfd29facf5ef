"""The holder's work: replay the ledger, keep the weights region, lease it to tenants.

The four phases of the seed, and where each lives:

    reserve   `_reserve_weights`: ledger `reserve` (size, path, purpose, owner,
              layout) fsynced, then the file is created and filled; `seal`
              (checksum, epoch) is written last.
    attach    `attach`: a tenant (an engine, by instance id and boot
              generation) gets the region's description and maps it.
    takeover  a tenant that stops renewing for `lease_ttl` is *frozen*
              (computed at read): nothing of its is reused or overwritten.
              The same tenant id under a higher generation takes over; the
              holder records it TAKING_OVER until the new process `confirm`s
              a consistent view (its self-test passed). A different tenant id
              never takes another's blocks, however long it has been silent.
    release   `release` on the tenant's clean shutdown; regions themselves are
              unlinked only by the holder's own clean shutdown (`close(clean=True)`).

Every change is a ledger record fsynced before the change is made, applied to
the in-memory mapping through the same `LedgerState.apply` replay uses, so a
restart rebuilds exactly what was acknowledged.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.clock import Clock
from common.logs import get_logger
from contract.holder import (
    AttachResponse,
    HeartbeatResponse,
    KVBlockRef,
    KVLookupResponse,
    KVPoolDescription,
    KVValidity,
    RegionView,
    TenantState,
    TenantView,
    TensorSpec,
    WeightsDescription,
    WeightsSnapshot,
    kv_block_checksum,
    kv_block_hash,
    kv_layout_from_config,
    kv_root_hash,
    tokenizer_digest,
)
from contract.identity import directory_weights_digest
from holder import store
from holder.errors import HolderNotReady, KVConflict, KVPoolAbsent, TenantSuperseded, UnknownTenant
from holder.ledger import Ledger
from holder.regions import (
    KVBlockState,
    LedgerState,
    RegionRecord,
    RegionStatus,
    TenantRecord,
    rebuild,
)
from holder.settings import HolderSettings

log = get_logger(__name__)

LEDGER_FILE = "ledger.wal"


@dataclass(frozen=True)
class ReplayReport:
    epoch: int
    records: int
    torn_bytes: int
    adopted: list[int]
    discarded: dict[int, str]  # region id → why it could not be proven consistent
    orphans_removed: int


class MemoryHolder:
    def __init__(self, settings: HolderSettings, clock: Clock) -> None:
        self.settings = settings
        self.clock = clock
        self.shm_dir = settings.resolved_shm_dir()
        self._lock = threading.RLock()
        self._ledger: Ledger | None = None
        self.state = LedgerState()
        self.epoch = 0
        self.weights: WeightsDescription | None = None
        self.kv: KVPoolDescription | None = None
        self._kv_bytes: np.memmap | None = None  # the pool, read-only: the holder only checksums blocks
        self.replay: ReplayReport | None = None
        self._device_mirror: Any = None  # holder.device.DeviceMirror with a CUDA device: keeps the export alive
        self._last_heartbeat: dict[str, float] = {}  # tenant id → clock.now() of its last renewal
        self._announced_frozen: set[tuple[str, int]] = set()  # log dedup only, never consulted for decisions

    # -- the ledger ----------------------------------------------------------------
    def _record(self, record: dict[str, Any]) -> None:
        """Write ahead, then apply: the mapping never holds what the ledger does not."""
        assert self._ledger is not None, "open() first"  # a programming error, not input
        self._ledger.append(record)
        self.state.apply(record)

    def open(self) -> ReplayReport:
        """Replay the ledger, check every live region against its seal, discard what fails."""
        with self._lock:
            self._ledger = Ledger.open(self.settings.state_dir / LEDGER_FILE)
            self.state = rebuild(self._ledger.records)
            for anomaly in self.state.anomalies:
                log.warning("ledger anomaly", detail=anomaly)
            self.epoch = self.state.boots + 1
            self._record({"op": "boot", "epoch": self.epoch})
            adopted, discarded = [], {}
            for region in self.state.live_regions():
                reason = store.verify_region_file(Path(region.path), region.size, region.checksum)
                if reason is None:
                    adopted.append(region.region_id)
                    continue
                discarded[region.region_id] = reason
                self._free(region, f"unverifiable after restart: {reason}")
            orphans = self._remove_orphans()
            now = self.clock.now()
            for tenant in self.state.tenants.values():
                if tenant.state is not TenantState.RELEASED:
                    # A holder restart is no evidence a tenant died: each gets a full lease to renew.
                    self._last_heartbeat[tenant.tenant_id] = now
            self.replay = ReplayReport(self.epoch, len(self._ledger.records), self._ledger.torn_bytes, adopted,
                                       discarded, orphans)
            log.info("ledger replayed", epoch=self.epoch, records=len(self._ledger.records),
                     torn_bytes=self._ledger.torn_bytes, adopted=adopted, discarded=discarded, orphans_removed=orphans)
            return self.replay

    def _free(self, region: RegionRecord, reason: str) -> None:
        self._record({"op": "free", "region": region.region_id, "reason": reason})
        store.remove_region_file(Path(region.path))
        log.warning("region freed", region=region.region_id, reason=reason)

    def _remove_orphans(self) -> int:
        """Region files no live record names (a reservation the ledger never acknowledged)."""
        if not self.shm_dir.exists():
            return 0
        live = {Path(r.path).name for r in self.state.live_regions()}
        removed = 0
        for path in self.shm_dir.glob("region-*.bin"):
            if path.name not in live:
                store.remove_region_file(path)
                removed += 1
        return removed

    # -- weights ---------------------------------------------------------------------
    def ensure_weights(self) -> WeightsDescription:
        """Adopt a sealed region holding these weights in this dtype, or reserve, fill and seal one."""
        model_dir = self.settings.model.resolve()
        digest = directory_weights_digest(model_dir)
        config_sha = hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()
        meta = {"model_dir": str(model_dir), "weights_digest": digest, "config_sha256": config_sha,
                "dtype": self.settings.dtype}
        with self._lock:
            for region in self.state.live_regions():
                if region.purpose == "weights" and region.status is RegionStatus.SEALED and region.meta == meta:
                    log.info("weights region adopted", region=region.region_id, epoch=region.epoch)
                    self.weights = self._describe(region)
                    return self.weights
            region = self._reserve_weights(model_dir, meta)
            self.weights = self._describe(region)
            return self.weights

    def ensure_device_copy(self) -> WeightsDescription:
        """With `device: cuda[:N]`, the sealed weights region uploaded to that device and exported (holder/device.py).

        Raises DeviceUnavailable (naming the setting) when the device is not there: start-up stops.
        """
        from holder.device import DeviceMirror

        with self._lock:
            weights = self.ready_weights()
            if self.settings.device == "cpu" or weights.device_copy is not None:
                return weights
            self._device_mirror = DeviceMirror(self.settings.device)
            region = weights.region
            copy = self._device_mirror.upload(Path(region.path), region.size, region.checksum)
            self.weights = weights.model_copy(update={"device_copy": copy})
            return self.weights

    # -- the KV pool -------------------------------------------------------------------
    def ensure_kv_pool(self) -> KVPoolDescription | None:
        """Adopt the pool region for these weights and layout, or reserve a new (zeroed) one."""
        if self.settings.kv_blocks == 0:
            return None
        weights = self.ready_weights()
        model_dir = Path(weights.model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        tokenizer = model_dir / "tokenizer.json"
        validity = KVValidity(
            weights_digest=weights.weights_digest,
            tokenizer_digest=tokenizer_digest(tokenizer.read_bytes() if tokenizer.exists() else None),
            layout=kv_layout_from_config(config, block_tokens=self.settings.kv_block_tokens, dtype=weights.dtype))
        layout = validity.layout
        meta = {"weights_digest": weights.weights_digest, "validity": validity.model_dump(),
                "num_blocks": self.settings.kv_blocks}
        with self._lock:
            region = next((r for r in self.state.live_regions() if r.purpose == "kv" and r.meta == meta
                           and r.status is RegionStatus.SEALED), None)
            if region is None:
                for stale in list(self.state.kv_blocks):  # blocks of a pool that is gone or of other weights
                    self._record({"op": "kv_free", "block": stale, "reason": "pool region replaced"})
                region_id = self.state.next_region_id
                path = self.shm_dir / f"region-{region_id:06d}.bin"
                size = layout.block_bytes * self.settings.kv_blocks
                self._record({"op": "reserve", "region": region_id, "path": str(path), "size": size, "purpose": "kv",
                              "owner": "holder", "tensors": [], "meta": meta})
                store.create_region_file(path, size)
                self._record({"op": "seal", "region": region_id, "checksum": store.PER_BLOCK, "epoch": self.epoch})
                region = self.state.regions[region_id]
                log.info("kv pool reserved", region=region_id, blocks=self.settings.kv_blocks, bytes=size)
            else:
                log.info("kv pool adopted", region=region.region_id, committed=len(self.state.kv_by_hash))
            view = RegionView(region_id=region.region_id, path=region.path, size=region.size, purpose="kv",
                              owner="holder", epoch=region.epoch or self.epoch, checksum=store.PER_BLOCK, tensors=[])
            self.kv = KVPoolDescription(region=view, validity=validity, num_blocks=self.settings.kv_blocks,
                                        root_hash=kv_root_hash(validity))
            self._kv_bytes = np.memmap(region.path, dtype=np.uint8, mode="r")
            return self.kv

    def _block_checksum(self, block: int) -> str:
        assert self.kv is not None and self._kv_bytes is not None
        size = self.kv.layout.block_bytes
        return kv_block_checksum(memoryview(self._kv_bytes[block * size:(block + 1) * size]))

    def _ready_kv(self) -> KVPoolDescription:
        if self.kv is None:
            raise KVPoolAbsent("this holder keeps no KV pool (--kv-blocks 0)")
        return self.kv

    def kv_reserve(self, tenant_id: str, generation: int, count: int) -> list[int]:
        """Blocks for a tenant to write: its own uncommitted ones from a dead generation first (the
        takeover), then free ones in id order, then the oldest committed blocks of tenants that are
        not frozen. A frozen tenant's blocks are never handed to anyone else."""
        kv = self._ready_kv()
        with self._lock:
            tenant = self._current(tenant_id)
            self._check_generation(tenant, generation)
            blocks = self.state.kv_blocks
            chosen = [b.block for b in blocks.values() if b.owner == tenant_id and b.state is KVBlockState.RESERVED
                      and b.generation < generation][:count]
            chosen += [i for i in range(kv.num_blocks) if i not in blocks][:count - len(chosen)]
            if len(chosen) < count:
                frozen = {t.tenant_id for t in map(self._view, self.state.tenants.values()) if t.frozen}
                evictable = sorted((b for b in blocks.values() if b.state is KVBlockState.COMMITTED
                                    and b.owner not in frozen), key=lambda b: b.seq)
                for victim in evictable[:count - len(chosen)]:
                    self._record({"op": "kv_free", "block": victim.block, "reason": "evicted"})
                    chosen.append(victim.block)
            if chosen:
                self._record({"op": "kv_reserve", "tenant": tenant_id, "generation": generation, "blocks": chosen})
            return chosen

    def kv_commit(self, tenant_id: str, generation: int, block: int, parent_hash: str,
                  token_ids: list[int]) -> KVBlockRef:
        kv = self._ready_kv()
        with self._lock:
            tenant = self._current(tenant_id)
            self._check_generation(tenant, generation)
            record = self.state.kv_blocks.get(block)
            if record is None or record.owner != tenant_id or record.state is not KVBlockState.RESERVED \
                    or record.generation != generation:
                raise KVConflict(f"block {block} is not reserved by {tenant_id!r} generation {generation}")
            if len(token_ids) != kv.layout.block_tokens:
                raise KVConflict(f"a block holds {kv.layout.block_tokens} tokens, not {len(token_ids)}")
            if parent_hash != kv.root_hash and parent_hash not in self.state.kv_by_hash:
                raise KVConflict("the parent block is not committed (evicted or discarded): commit the chain in order")
            block_hash = kv_block_hash(parent_hash, token_ids)
            existing = self.state.kv_by_hash.get(block_hash)
            if existing is not None:
                self._record({"op": "kv_free", "block": block, "reason": "duplicate of a committed block"})
                held = self.state.kv_blocks[existing]
                return KVBlockRef(block=existing, hash=block_hash, checksum=held.checksum or "")
            checksum = self._block_checksum(block)
            self._record({"op": "kv_commit", "tenant": tenant_id, "generation": generation, "block": block,
                          "hash": block_hash, "parent_hash": parent_hash, "tokens": token_ids, "checksum": checksum})
            return KVBlockRef(block=block, hash=block_hash, checksum=checksum)

    def kv_lookup(self, token_ids: list[int]) -> KVLookupResponse:
        """The longest chain of committed blocks for this prefix whose bytes still match their checksum."""
        kv = self._ready_kv()
        size = kv.layout.block_tokens
        found, discarded = [], []
        with self._lock:
            parent = kv.root_hash
            for start in range(0, len(token_ids) - size + 1, size):
                block_hash = kv_block_hash(parent, token_ids[start:start + size])
                block = self.state.kv_by_hash.get(block_hash)
                if block is None:
                    break
                record = self.state.kv_blocks[block]
                if self._block_checksum(block) != record.checksum:
                    self._record({"op": "kv_free", "block": block, "reason": "checksum mismatch"})
                    discarded.append(block)
                    log.warning("kv block discarded", block=block, reason="checksum mismatch")
                    break
                found.append(KVBlockRef(block=block, hash=block_hash, checksum=record.checksum or ""))
                parent = block_hash
        return KVLookupResponse(blocks=found, discarded=discarded)

    def kv_summary(self) -> dict[str, Any]:
        with self._lock:
            blocks = self.state.kv_blocks.values()
            return {"blocks": self.kv.num_blocks if self.kv else 0,
                    "reserved": sum(b.state is KVBlockState.RESERVED for b in blocks),
                    "committed": sum(b.state is KVBlockState.COMMITTED for b in blocks),
                    "committed_blocks": [{"block": b.block, "hash": b.hash, "parent_hash": b.parent_hash,
                                          "owner": b.owner, "generation": b.generation}
                                         for b in sorted(blocks, key=lambda b: b.seq)
                                         if b.state is KVBlockState.COMMITTED]}

    def _reserve_weights(self, model_dir: Path, meta: dict[str, Any]) -> RegionRecord:
        shapes = store.model_tensor_shapes(model_dir)
        specs, size = store.plan_layout([(name, self.settings.dtype, shape) for name, shape in shapes])
        region_id = self.state.next_region_id
        path = self.shm_dir / f"region-{region_id:06d}.bin"
        started = self.clock.now()
        self._record({"op": "reserve", "region": region_id, "path": str(path), "size": size, "purpose": "weights",
                      "owner": "holder", "tensors": [s.model_dump() for s in specs], "meta": meta})
        store.create_region_file(path, size)
        store.fill_weights(path, model_dir, specs)
        checksum = store.region_checksum(path)
        self._record({"op": "seal", "region": region_id, "checksum": checksum, "epoch": self.epoch})
        log.info("weights region sealed", region=region_id, bytes=size, tensors=len(specs),
                 seconds=round(self.clock.now() - started, 3))
        return self.state.regions[region_id]

    @staticmethod
    def _describe(region: RegionRecord) -> WeightsDescription:
        assert region.checksum is not None and region.epoch is not None  # sealed regions only
        view = RegionView(region_id=region.region_id, path=region.path, size=region.size, purpose=region.purpose,
                          owner=region.owner, epoch=region.epoch, checksum=region.checksum,
                          tensors=[TensorSpec(**t) for t in region.tensors])
        return WeightsDescription(model_dir=region.meta["model_dir"], weights_digest=region.meta["weights_digest"],
                                  config_sha256=region.meta["config_sha256"], dtype=region.meta["dtype"], region=view)

    # -- tenants ---------------------------------------------------------------------
    def ready_weights(self) -> WeightsDescription:
        if self.weights is None:
            raise HolderNotReady("the holder is still replaying its ledger or loading weights", retry_after_s=1)
        return self.weights

    def weights_snapshot(self) -> WeightsSnapshot:
        """The description with this boot's epoch, under the lock so both come from the same state."""
        with self._lock:
            return WeightsSnapshot(holder_epoch=self.epoch, weights=self.ready_weights())

    def _view(self, tenant: TenantRecord) -> TenantView:
        ttl = self.settings.lease_ttl.total_seconds()
        expires_in = self._last_heartbeat.get(tenant.tenant_id, float("-inf")) + ttl - self.clock.now()
        frozen = tenant.state is not TenantState.RELEASED and expires_in <= 0
        return TenantView(tenant_id=tenant.tenant_id, generation=tenant.generation, state=tenant.state, frozen=frozen,
                          lease_expires_in_s=max(expires_in, 0.0) if expires_in != float("-inf") else 0.0,
                          takeovers=tenant.takeovers)

    def _current(self, tenant_id: str) -> TenantRecord:
        tenant = self.state.tenants.get(tenant_id)
        if tenant is None or tenant.state is TenantState.RELEASED:
            raise UnknownTenant(f"tenant {tenant_id!r} is not attached; attach first")
        return tenant

    def _check_generation(self, tenant: TenantRecord, generation: int) -> None:
        if generation < tenant.generation:
            raise TenantSuperseded(f"tenant {tenant.tenant_id!r} is held by generation {tenant.generation}; "
                                   f"{generation} is older")
        if generation > tenant.generation:
            raise UnknownTenant(f"generation {generation} of {tenant.tenant_id!r} has not attached; attach first")

    def attach(self, tenant_id: str, generation: int) -> AttachResponse:
        with self._lock:
            weights = self.ready_weights()
            current = self.state.tenants.get(tenant_id)
            live = current is not None and current.state is not TenantState.RELEASED
            if live and generation < current.generation:
                raise TenantSuperseded(f"tenant {tenant_id!r} is held by generation {current.generation}; "
                                       f"{generation} is older")
            takeover = live and generation > current.generation
            if not live or generation != current.generation:
                if takeover:
                    previous = self._view(current)
                    log.warning("tenant takeover", tenant=tenant_id, old_generation=current.generation,
                                new_generation=generation, old_frozen=previous.frozen)
                self._record({"op": "attach", "tenant": tenant_id, "generation": generation})
            self._last_heartbeat[tenant_id] = self.clock.now()
            tenant = self.state.tenants[tenant_id]
            log.info("tenant attached", tenant=tenant_id, generation=generation, takeover=takeover, state=tenant.state)
            return AttachResponse(holder_epoch=self.epoch, tenant=self._view(tenant), takeover=takeover,
                                  heartbeat_interval_s=self.settings.heartbeat_interval.total_seconds(),
                                  lease_ttl_s=self.settings.lease_ttl.total_seconds(), weights=weights, kv=self.kv)

    def heartbeat(self, tenant_id: str, generation: int) -> HeartbeatResponse:
        with self._lock:
            tenant = self._current(tenant_id)
            self._check_generation(tenant, generation)
            view = self._view(tenant)
            if view.frozen:
                # A late renewal from the same generation: nothing was handed to anyone else
                # (frozen blocks are never reused), so the tenant simply resumes.
                log.info("frozen tenant renewed", tenant=tenant_id, generation=generation)
            self._last_heartbeat[tenant_id] = self.clock.now()
            self._announced_frozen.discard((tenant_id, generation))
            return HeartbeatResponse(holder_epoch=self.epoch, tenant=self._view(tenant))

    def confirm(self, tenant_id: str, generation: int) -> TenantView:
        """The tenant has a consistent view (self-test passed): a takeover completes."""
        with self._lock:
            tenant = self._current(tenant_id)
            self._check_generation(tenant, generation)
            if tenant.state is TenantState.TAKING_OVER:
                self._record({"op": "confirm", "tenant": tenant_id, "generation": generation})
                log.info("takeover confirmed", tenant=tenant_id, generation=generation)
            self._last_heartbeat[tenant_id] = self.clock.now()
            return self._view(tenant)

    def release(self, tenant_id: str, generation: int) -> TenantView:
        """The tenant's clean shutdown: its lease ends and nothing is kept for a successor."""
        with self._lock:
            tenant = self._current(tenant_id)
            self._check_generation(tenant, generation)
            for block in [b.block for b in self.state.kv_blocks.values()
                          if b.owner == tenant_id and b.state is KVBlockState.RESERVED]:
                self._record({"op": "kv_free", "block": block, "reason": "tenant released"})
            self._record({"op": "release", "tenant": tenant_id, "generation": generation})
            self._last_heartbeat.pop(tenant_id, None)
            log.info("tenant released", tenant=tenant_id, generation=generation)
            return self._view(tenant)

    def tenants(self) -> list[TenantView]:
        with self._lock:
            return [self._view(t) for t in self.state.tenants.values()]

    def announce_frozen(self) -> list[TenantView]:
        """Log each tenant the moment its lease is seen expired (called every few hundred ms)."""
        newly = []
        with self._lock:
            for tenant in self.state.tenants.values():
                view = self._view(tenant)
                key = (tenant.tenant_id, tenant.generation)
                if view.frozen and key not in self._announced_frozen:
                    self._announced_frozen.add(key)
                    newly.append(view)
                    log.warning("tenant lease expired; blocks frozen for a successor", tenant=tenant.tenant_id,
                                generation=tenant.generation)
        return newly

    def regions(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"region_id": r.region_id, "path": r.path, "size": r.size, "purpose": r.purpose, "owner": r.owner,
                     "status": r.status, "epoch": r.epoch, "checksum": r.checksum, "freed_reason": r.freed_reason}
                    for r in self.state.regions.values()]

    # -- shutdown ----------------------------------------------------------------------
    def close(self, *, clean: bool) -> None:
        """A clean shutdown releases every region (ledger first); otherwise only the file is closed."""
        with self._lock:
            if self._ledger is None:
                return
            if clean:
                for region in self.state.live_regions():
                    self._free(region, "holder shut down cleanly")
            self._ledger.close()
            self._ledger = None
            self._kv_bytes = None
