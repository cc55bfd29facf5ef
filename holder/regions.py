"""Replaying the ledger: records in, the holder's mapping out. Pure; no files touched.

A region moves through

    RESERVED ──seal(checksum, epoch)──► SEALED ──free──► FREED
        └────────────────free──────────────────────────────┘

and only a SEALED region may be handed to a tenant, and only after its file
has been checked against the checksum the seal recorded (`holder.store`).
The seal is written last, after the contents are complete: a region the
holder died while filling has no seal, so replay finds it RESERVED and it is
discarded — a miss (the weights are loaded again), never a misuse.

Region ids are handed out in ledger order and never reused, so the mapping
a replay rebuilds is the one the holder had, in the same allocation order.
Records that do not fit the state (a seal for an unknown region, a second
seal) are counted in `anomalies` and otherwise ignored.

KV blocks (the pool region's fixed-size slots) have their own records:

    free ──kv_reserve(tenant, generation)──► RESERVED ──kv_commit(hash, checksum)──► COMMITTED
      ▲                                         │                                       │
      └─────────────────kv_free(reason)─────────┴───────────────────────────────────────┘

A committed block is immutable and named by its hash chain; its checksum is
checked again on every lookup, and a block that fails is freed — the prefix
is re-prefilled (a miss), never read (a misuse).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from contract.holder import TenantState


class RegionStatus(StrEnum):
    RESERVED = "reserved"
    SEALED = "sealed"
    FREED = "freed"


@dataclass
class RegionRecord:
    region_id: int
    path: str
    size: int
    purpose: str
    owner: str
    tensors: list[dict[str, Any]]
    meta: dict[str, Any]
    status: RegionStatus = RegionStatus.RESERVED
    checksum: str | None = None
    epoch: int | None = None
    freed_reason: str | None = None


class KVBlockState(StrEnum):
    RESERVED = "reserved"
    COMMITTED = "committed"


@dataclass
class KVBlockRecord:
    block: int
    owner: str  # tenant id
    generation: int
    state: KVBlockState = KVBlockState.RESERVED
    hash: str | None = None
    parent_hash: str | None = None
    checksum: str | None = None
    seq: int = 0  # order of commit: the oldest committed block is evicted first


@dataclass
class TenantRecord:
    tenant_id: str
    generation: int
    state: TenantState
    takeovers: int = 0


@dataclass
class LedgerState:
    boots: int = 0
    next_region_id: int = 1
    regions: dict[int, RegionRecord] = field(default_factory=dict)  # allocation order
    tenants: dict[str, TenantRecord] = field(default_factory=dict)
    kv_blocks: dict[int, KVBlockRecord] = field(default_factory=dict)  # absent: free
    kv_by_hash: dict[str, int] = field(default_factory=dict)
    kv_commits: int = 0
    anomalies: list[str] = field(default_factory=list)

    def live_regions(self) -> list[RegionRecord]:
        return [r for r in self.regions.values() if r.status is not RegionStatus.FREED]

    def apply(self, record: dict[str, Any]) -> None:
        op = record["op"]
        handler = _HANDLERS.get(op)
        if handler is None:
            self.anomalies.append(f"unknown op {op!r}")
            return
        handler(self, record)


def _boot(state: LedgerState, record: dict[str, Any]) -> None:
    state.boots = max(state.boots, int(record["epoch"]))


def _reserve(state: LedgerState, record: dict[str, Any]) -> None:
    region_id = int(record["region"])
    if region_id in state.regions or region_id < state.next_region_id:
        state.anomalies.append(f"region {region_id} reserved twice or out of order")
        return
    state.regions[region_id] = RegionRecord(
        region_id=region_id, path=record["path"], size=int(record["size"]), purpose=record["purpose"],
        owner=record["owner"], tensors=list(record.get("tensors", [])), meta=dict(record.get("meta", {})),
    )
    state.next_region_id = region_id + 1


def _seal(state: LedgerState, record: dict[str, Any]) -> None:
    region = state.regions.get(int(record["region"]))
    if region is None or region.status is not RegionStatus.RESERVED:
        state.anomalies.append(f"seal of region {record['region']} that is not reserved")
        return
    region.status = RegionStatus.SEALED
    region.checksum = record["checksum"]
    region.epoch = int(record["epoch"])


def _free(state: LedgerState, record: dict[str, Any]) -> None:
    region = state.regions.get(int(record["region"]))
    if region is None or region.status is RegionStatus.FREED:
        state.anomalies.append(f"free of region {record['region']} that is not live")
        return
    region.status = RegionStatus.FREED
    region.freed_reason = record.get("reason")


def _attach(state: LedgerState, record: dict[str, Any]) -> None:
    tenant_id, generation = record["tenant"], int(record["generation"])
    current = state.tenants.get(tenant_id)
    if current is None or current.state is TenantState.RELEASED:
        takeovers = current.takeovers if current else 0
        state.tenants[tenant_id] = TenantRecord(tenant_id, generation, TenantState.ATTACHED, takeovers)
    elif generation > current.generation:
        current.generation = generation
        current.state = TenantState.TAKING_OVER
        current.takeovers += 1
    elif generation < current.generation:
        state.anomalies.append(f"attach of {tenant_id} at stale generation {generation}")


def _confirm(state: LedgerState, record: dict[str, Any]) -> None:
    current = state.tenants.get(record["tenant"])
    if current is not None and current.generation == int(record["generation"]) \
            and current.state is TenantState.TAKING_OVER:
        current.state = TenantState.ATTACHED


def _release(state: LedgerState, record: dict[str, Any]) -> None:
    current = state.tenants.get(record["tenant"])
    if current is not None and current.generation == int(record["generation"]):
        current.state = TenantState.RELEASED


def _kv_reserve(state: LedgerState, record: dict[str, Any]) -> None:
    tenant, generation = record["tenant"], int(record["generation"])
    for block in record["blocks"]:
        current = state.kv_blocks.get(block)
        if current is not None and not (current.owner == tenant and current.state is KVBlockState.RESERVED):
            state.anomalies.append(f"kv block {block} reserved while {current.state} by {current.owner}")
            continue
        state.kv_blocks[block] = KVBlockRecord(block, tenant, generation)


def _kv_commit(state: LedgerState, record: dict[str, Any]) -> None:
    block = state.kv_blocks.get(int(record["block"]))
    if block is None or block.state is not KVBlockState.RESERVED or block.owner != record["tenant"]:
        state.anomalies.append(f"kv commit of block {record['block']} that {record['tenant']} has not reserved")
        return
    state.kv_commits += 1
    block.state, block.hash, block.parent_hash = KVBlockState.COMMITTED, record["hash"], record["parent_hash"]
    block.checksum, block.seq, block.generation = record["checksum"], state.kv_commits, int(record["generation"])
    state.kv_by_hash[block.hash] = block.block


def _kv_free(state: LedgerState, record: dict[str, Any]) -> None:
    block = state.kv_blocks.pop(int(record["block"]), None)
    if block is None:
        state.anomalies.append(f"kv free of block {record['block']} that is free")
        return
    if block.hash is not None and state.kv_by_hash.get(block.hash) == block.block:
        del state.kv_by_hash[block.hash]


_HANDLERS = {"kv_reserve": _kv_reserve, "kv_commit": _kv_commit, "kv_free": _kv_free, "boot": _boot, "reserve": _reserve, "seal": _seal, "free": _free, "attach": _attach,
             "confirm": _confirm, "release": _release}


def rebuild(records: list[dict[str, Any]]) -> LedgerState:
    """Replay `records` (a consistent prefix, `holder.ledger.read_records`) into the mapping."""
    state = LedgerState()
    for record in records:
        state.apply(record)
    return state
