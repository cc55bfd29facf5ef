"""The holder's work: replay the ledger, keep the weights region, lease it to tenants.

The four phases of the seed, and where each lives:

    reserve   `_reserve_weights`: ledger `reserve` (size, path, purpose, owner,
              layout) fsynced, then the file is created and filled; `seal`
              (checksum, epoch) is written last.
    attach    `attach` (holder/tenants.py): a tenant (an engine, by instance id
              and boot generation) gets the region's description and maps it.
    takeover  a tenant that stops renewing for `lease_ttl` is *frozen*
              (computed at read): nothing of its is reused or overwritten.
              The same tenant id under a higher generation takes over; the
              holder records it TAKING_OVER until the new process `confirm`s
              a consistent view (its self-test passed). A different tenant id
              never takes another's blocks, however long it has been silent.
    release   `release` (holder/tenants.py) on the tenant's clean shutdown;
              regions themselves are unlinked only by the holder's own clean
              shutdown (`close(clean=True)`).

Every change is a ledger record fsynced before the change is made, applied to
the in-memory mapping through the same `LedgerState.apply` replay uses, so a
restart rebuilds exactly what was acknowledged. The KV pool (blocks engines
reserve, commit and look up by prefix) is holder/kv_pool.py.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.clock import Clock
from common.logs import get_logger
from contract.holder import (
    AttachResponse,
    HeartbeatResponse,
    KVBlockRef,
    KVLookupResponse,
    KVPoolDescription,
    RegionView,
    TenantState,
    TenantView,
    TensorSpec,
    WeightsDescription,
    WeightsSnapshot,
)
from contract.identity import directory_weights_digest
from holder import store
from holder.errors import HolderNotReady
from holder.kv_pool import KVPool
from holder.ledger import Ledger
from holder.regions import (
    LedgerState,
    RegionRecord,
    RegionStatus,
    rebuild,
)
from holder.settings import HolderSettings
from holder.tenants import TenantLeases

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
    """The ledger, the weights region and the holder's lifecycle; the KV pool and the tenants are collaborators.

    `kv_pool` (holder/kv_pool.py) and `leases` (holder/tenants.py) share the holder's ledger (`record`) and
    lock; the methods kept here by their old names delegate to them for the endpoints and tests.
    """

    def __init__(self, settings: HolderSettings, clock: Clock) -> None:
        self.settings = settings
        self.clock = clock
        self.shm_dir = settings.resolved_shm_dir()
        self.lock = threading.RLock()
        self._ledger: Ledger | None = None
        self.state = LedgerState()
        self.epoch = 0
        self.weights: WeightsDescription | None = None
        self.replay: ReplayReport | None = None
        self._device_mirror: Any = None  # holder.device.DeviceMirror with a CUDA device: keeps the export alive
        self.kv_pool = KVPool(self)  # the KV blocks engines reserve, commit and look up
        self.leases = TenantLeases(self)  # attach, renew, take over, release

    # -- the ledger ----------------------------------------------------------------
    def record(self, record: dict[str, Any]) -> None:
        """Write ahead, then apply: the mapping never holds what the ledger does not."""
        assert self._ledger is not None, "open() first"  # a programming error, not input
        self._ledger.append(record)
        self.state.apply(record)

    def open(self) -> ReplayReport:
        """Replay the ledger, check every live region against its seal, discard what fails."""
        with self.lock:
            self._ledger = Ledger.open(self.settings.state_dir / LEDGER_FILE)
            self.state = rebuild(self._ledger.records)
            for anomaly in self.state.anomalies:
                log.warning("ledger anomaly", detail=anomaly)
            self.epoch = self.state.boots + 1
            self.record({"op": "boot", "epoch": self.epoch})
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
                    self.leases.last_heartbeat[tenant.tenant_id] = now
            self.replay = ReplayReport(self.epoch, len(self._ledger.records), self._ledger.torn_bytes, adopted,
                                       discarded, orphans)
            log.info("ledger replayed", epoch=self.epoch, records=len(self._ledger.records),
                     torn_bytes=self._ledger.torn_bytes, adopted=adopted, discarded=discarded, orphans_removed=orphans)
            return self.replay

    def _free(self, region: RegionRecord, reason: str) -> None:
        self.record({"op": "free", "region": region.region_id, "reason": reason})
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
        with self.lock:
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

        with self.lock:
            weights = self.ready_weights()
            if self.settings.device == "cpu" or weights.device_copy is not None:
                return weights
            self._device_mirror = DeviceMirror(self.settings.device)
            region = weights.region
            copy = self._device_mirror.upload(Path(region.path), region.size, region.checksum)
            self.weights = weights.model_copy(update={"device_copy": copy})
            return self.weights

    def _reserve_weights(self, model_dir: Path, meta: dict[str, Any]) -> RegionRecord:
        shapes = store.model_tensor_shapes(model_dir)
        specs, size = store.plan_layout([(name, self.settings.dtype, shape) for name, shape in shapes])
        region_id = self.state.next_region_id
        path = self.shm_dir / f"region-{region_id:06d}.bin"
        started = self.clock.now()
        self.record({"op": "reserve", "region": region_id, "path": str(path), "size": size, "purpose": "weights",
                     "owner": "holder", "tensors": [s.model_dump() for s in specs], "meta": meta})
        store.create_region_file(path, size)
        store.fill_weights(path, model_dir, specs)
        checksum = store.region_checksum(path)
        self.record({"op": "seal", "region": region_id, "checksum": checksum, "epoch": self.epoch})
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

    def ready_weights(self) -> WeightsDescription:
        if self.weights is None:
            raise HolderNotReady("the holder is still replaying its ledger or loading weights", retry_after_s=1)
        return self.weights

    def weights_snapshot(self) -> WeightsSnapshot:
        """The description with this boot's epoch, under the lock so both come from the same state."""
        with self.lock:
            return WeightsSnapshot(holder_epoch=self.epoch, weights=self.ready_weights())

    # -- the KV pool (holder/kv_pool.py) ------------------------------------------------
    @property
    def kv(self) -> KVPoolDescription | None:
        return self.kv_pool.description

    def ensure_kv_pool(self) -> KVPoolDescription | None:
        return self.kv_pool.ensure()

    def kv_reserve(self, tenant_id: str, generation: int, count: int) -> list[int]:
        return self.kv_pool.reserve(tenant_id, generation, count)

    def kv_commit(self, tenant_id: str, generation: int, block: int, parent_hash: str,
                  token_ids: list[int]) -> KVBlockRef:
        return self.kv_pool.commit(tenant_id, generation, block, parent_hash, token_ids)

    def kv_lookup(self, token_ids: list[int]) -> KVLookupResponse:
        return self.kv_pool.lookup(token_ids)

    def kv_summary(self) -> dict[str, Any]:
        return self.kv_pool.summary()

    # -- tenants (holder/tenants.py) ---------------------------------------------------
    def attach(self, tenant_id: str, generation: int) -> AttachResponse:
        return self.leases.attach(tenant_id, generation)

    def heartbeat(self, tenant_id: str, generation: int) -> HeartbeatResponse:
        return self.leases.heartbeat(tenant_id, generation)

    def confirm(self, tenant_id: str, generation: int) -> TenantView:
        return self.leases.confirm(tenant_id, generation)

    def release(self, tenant_id: str, generation: int) -> TenantView:
        return self.leases.release(tenant_id, generation)

    def tenants(self) -> list[TenantView]:
        return self.leases.views()

    def announce_frozen(self) -> list[TenantView]:
        return self.leases.announce_frozen()

    def regions(self) -> list[dict[str, Any]]:
        with self.lock:
            return [{"region_id": r.region_id, "path": r.path, "size": r.size, "purpose": r.purpose, "owner": r.owner,
                     "status": r.status, "epoch": r.epoch, "checksum": r.checksum, "freed_reason": r.freed_reason}
                    for r in self.state.regions.values()]

    # -- shutdown ----------------------------------------------------------------------
    def close(self, *, clean: bool) -> None:
        """A clean shutdown releases every region (ledger first); otherwise only the file is closed."""
        with self.lock:
            if self._ledger is None:
                return
            if clean:
                for region in self.state.live_regions():
                    self._free(region, "holder shut down cleanly")
            self._ledger.close()
            self._ledger = None
            self.kv_pool.bytes = None
