"""Replication's work on the stores: what is pending, one verified copy, retention. No database here.

A checkpoint is pending when the source holds its manifest, the destination
does not, it is of the policy's session class (or of none: an unclassed
manifest, see `KVCheckpointManifest.session_class`, is in every policy's
scope), it is no older than the policy's retention (it would be deleted on
arrival) and it was not dead-lettered. Finding its age and class costs one
manifest read, so `scan_pending` reads at most `max_reads` manifests it has
not read before (what it learnt kept in a `ReadCache`): a backlog of thousands
after a destination outage is read a few hundred at a time over several
sweeps, not all at every sweep; the ones not read yet are counted (`unread`),
their age and class unknown. Session records (session_records.py) keep what
their scans read in the same cache. A copy is `contract.kv_checkpoint.
copy_checkpoint` (blocks, then the manifest, each block verified on both
sides) followed by a read-back of the whole checkpoint at the destination:
if any block is missing or differs there (retention raced the copy and
removed a shared block), the manifest is deleted again and the copy fails,
to be retried — the destination never keeps a manifest naming a missing
block.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from contract.kv_checkpoint import (
    KVCheckpointInvalid,
    KVCheckpointStore,
    block_object_checksum,
    copy_checkpoint,
    open_kv_store,
    verify_manifest,
)


@dataclass(frozen=True)
class PendingCheckpoint:
    key: str
    created_at: float | None  # Unix seconds at the source; None: undated (or unreadable: the copy will say)


@dataclass(frozen=True)
class CopyOutcome:
    blocks: int  # blocks written to the destination
    created_at: float | None
    already_present: bool  # the destination held the manifest before this copy: nothing to count


def open_checkpoints(url: str, *, s3_endpoint_url: str | None) -> KVCheckpointStore:
    return KVCheckpointStore(open_kv_store(url, s3_endpoint_url=s3_endpoint_url))


class ReadCache:
    """LRU of what scans learnt by reading store objects: (store location, key) → (version, what was learnt).

    A manifest is immutable once written, so its entry has no version (None). A session record is
    replaced after every turn, so its entry holds the store's version token (`KVStore.versions`) and
    holds only while the listing shows the same token. One cache per process, shared by its scans.
    """

    def __init__(self, size: int = 100_000) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], tuple[str | None, Any]] = OrderedDict()

    def get(self, key: tuple[str, str]) -> tuple[str | None, Any] | None:
        """(version, value) as last put, or None if unknown (never read, or evicted)."""
        entry = self._items.get(key)
        if entry is not None:
            self._items.move_to_end(key)
        return entry

    def put(self, key: tuple[str, str], value: Any, *, version: str | None = None) -> None:
        self._items[key] = (version, value)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


@dataclass(frozen=True)
class PendingScan:
    pending: list[PendingCheckpoint] = field(default_factory=list)  # age known, oldest first (undated last)
    unread: int = 0  # pending too, past the read cap: age unknown until a later scan reads them

    @property
    def count(self) -> int:
        return len(self.pending) + self.unread

    @property
    def oldest_created_at(self) -> float | None:
        return min((p.created_at for p in self.pending if p.created_at is not None), default=None)


def scan_pending(source: KVCheckpointStore, target: KVCheckpointStore, *, skip: set[str] | frozenset[str],
                 not_before: float, ages: ReadCache | None = None, max_reads: int | None = None,
                 source_id: str | None = None, session_class: str | None = None) -> PendingScan:
    """What the source holds that the destination lacks, of `session_class` or unclassed (None: any class),
    within retention and not skipped.

    Lists both stores once; reads at most `max_reads` manifests that `ages` does not already know.
    An unreadable manifest stays pending (undated, unclassed), so its copy refuses it and it is
    dead-lettered. `source_id` names the source in `ages` (the policy's store URL; default: its location).
    """
    ages = ages if ages is not None else ReadCache()
    held = set(target.manifests())
    location = source_id or source.store.location
    pending, unread, reads = [], 0, 0
    for key in source.manifests():
        if key in held or key in skip:
            continue
        known = ages.get((location, key))
        if known is None:
            if max_reads is not None and reads >= max_reads:
                unread += 1
                continue
            reads += 1
            try:
                manifest = source.manifest_at(key)
            except KVCheckpointInvalid:
                manifest = None
            created_at, of_class = (manifest.created_at, manifest.session_class) if manifest else (None, None)
            if manifest is not None:  # a manifest deleted meanwhile is not cached as undated
                ages.put((location, key), (created_at, of_class))
        else:
            created_at, of_class = known[1]
        if session_class is not None and of_class is not None and of_class != session_class:
            continue  # another class's checkpoint: its own policy copies it
        if created_at is not None and created_at < not_before:
            continue  # past retention: it would be deleted on arrival
        pending.append(PendingCheckpoint(key, created_at))
    pending.sort(key=lambda p: (p.created_at is None, p.created_at or 0.0, p.key))
    return PendingScan(pending=pending, unread=unread)


def copy_verified(source: KVCheckpointStore, target: KVCheckpointStore, key: str) -> CopyOutcome:
    """Copy one checkpoint and read all of it back at the destination; KVCheckpointInvalid if it is not whole."""
    already = target.store.exists([key])[0]
    blocks = copy_checkpoint(source, target, key)
    manifest = target.manifest_at(key)
    try:
        if manifest is None:
            raise KVCheckpointInvalid(f"{key} is not in {target.store.location} after the copy")
        verify_manifest(manifest)
        for entry in manifest.blocks:
            data = target.read_block(manifest.root_hash, entry.hash)
            if data is None or block_object_checksum(data, manifest.validity) != entry.checksum:
                raise KVCheckpointInvalid(f"block {entry.hash[:12]}… is missing or differs in "
                                          f"{target.store.location} after the copy")
    except KVCheckpointInvalid:
        target.store.delete(key)  # never leave a manifest that names a block the destination lacks
        raise
    return CopyOutcome(blocks=blocks, created_at=manifest.created_at, already_present=already and blocks == 0)


def apply_retention(target: KVCheckpointStore, *, not_before: float) -> int:
    """Delete the destination's checkpoints created before `not_before`; checkpoints deleted."""
    old = target.manifests_older_than(not_before)
    if not old:
        return 0
    doomed = set(old)
    keep = target.block_hashes([k for k in target.manifests() if k not in doomed])
    for key in old:
        target.delete_checkpoint(key, keep_blocks=keep)
    return len(old)
