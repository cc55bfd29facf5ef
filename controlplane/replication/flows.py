"""Replication's work on the stores: what is pending, one verified copy, retention. No database here.

A checkpoint is pending when the source holds its manifest, the destination
does not, it is no older than the policy's retention (it would be deleted on
arrival) and it was not dead-lettered. A copy is `contract.kv_checkpoint.
copy_checkpoint` (blocks, then the manifest, each block verified on both
sides) followed by a read-back of the whole checkpoint at the destination:
if any block is missing or differs there (retention raced the copy and
removed a shared block), the manifest is deleted again and the copy fails,
to be retried — the destination never keeps a manifest naming a missing
block.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def pending_checkpoints(source: KVCheckpointStore, target: KVCheckpointStore, *, skip: set[str],
                        not_before: float) -> list[PendingCheckpoint]:
    """Checkpoints to copy, oldest first (undated last)."""
    held = set(target.manifests())
    pending = []
    for key in source.manifests():
        if key in held or key in skip:
            continue
        try:
            manifest = source.manifest_at(key)
        except KVCheckpointInvalid:  # unreadable: still pending, so the copy refuses it and it is dead-lettered
            manifest = None
        created_at = manifest.created_at if manifest is not None else None
        if created_at is not None and created_at < not_before:
            continue
        pending.append(PendingCheckpoint(key, created_at))
    return sorted(pending, key=lambda p: (p.created_at is None, p.created_at or 0.0, p.key))


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
