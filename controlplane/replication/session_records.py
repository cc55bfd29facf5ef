"""Session records replicated with their KV: what a sweep writes at the destination, and why. No database.

A gateway stores a session's record (`contract.session.SessionRecord`) in its
region's store after each turn; when that store is the policy's source store
(the gateways' `sessions.store` is the engines' `--kv-checkpoint-store`), the
sweep of the session class's policy copies the records of its model and class
to the destination, so the standby's gateway knows the session's turns and,
for a completion, its context. Without the record a completion's next turn at
the standby has no context to measure and its checkpoint cadence restarts.

The rule, per record (`decide`, pure):

- **The KV claim waits for the KV; the turn does not.** A record names its
  newest checkpoint (`checkpoint_key`). If the destination holds that
  manifest (a copy writes it last, after every block is verified there), the
  record goes whole. If not (its copy is still queued, or dead-lettered), the
  record goes *without its checkpoint claim* (`without_checkpoint`: turns and
  context kept), and goes whole at a later sweep once the manifest is there.
  A replica never claims a checkpoint the destination lacks: the standby's
  cadence checkpoints at its next key point, and what it re-prefills is
  measured against what its engine actually restores (miss, never misuse).
  Holding the whole record back instead would leave the standby an older
  record whose shorter context undercounts what the next turn re-prefills.
- **Newer only.** A record replaces the destination's copy only if it is newer
  (`SessionRecord.version`: turns, then recorded_at), or the same turn with
  the claim the copy lacked. A record the destination's own gateways wrote
  (no `replicated_at`: the session went on there after a failover) is never
  replaced.
- **Within retention.** A record recorded before the policy's retention is not
  copied (its checkpoint would be deleted on arrival). Replication never
  deletes a destination record: the gateways own them.
- **Bad input is skipped.** An oversized, malformed or misplaced record (at the
  source or the destination; a key that is no `session_key` is misplaced and
  never read) is `SessionRecordInvalid`: listed in the outcome with its
  reason, logged and counted by the caller; the sweep goes on.

A record's lag is `replicated_at − recorded_at` when its turn first reaches the
destination; pending records (the destination lacks their turn) count in the
API's pending and lag figures (exposition.py) beside the checkpoints.

Cost: a scan lists `sessions/` at both stores and reads each source record of
the store (one GET; a record is mutable, so nothing is cached) and, for those
of the policy's class, the destination's copy (one GET) — linear in the
sessions the store holds, per policy sharing it. `max_reads` bounds the source
reads of a scan (the metrics probe's cap); the rest are `unread`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from contract.kv_checkpoint import KVStore, split_manifest_key
from contract.session import SESSION_KEY_PREFIX, SessionRecord, SessionRecordInvalid, parse_session_record

SESSION_KEY = re.compile(re.escape(SESSION_KEY_PREFIX) + r"[0-9a-f]{64}\.json")  # contract.session.session_key


@dataclass(frozen=True)
class RecordCopy:
    """One record a sweep writes at the destination."""

    key: str
    record: SessionRecord  # as it goes: whole, or without its checkpoint claim
    whole: bool
    new_turn: bool  # the destination lacked this turn (it is pending until written); False: only the claim


@dataclass(frozen=True)
class InvalidRecord:
    key: str
    reason: str  # oversized | malformed | misplaced
    side: str  # source | destination


@dataclass(frozen=True)
class RecordScan:
    copies: list[RecordCopy] = field(default_factory=list)
    invalid: list[InvalidRecord] = field(default_factory=list)
    unread: int = 0  # past `max_reads`: not looked at by this scan

    @property
    def pending(self) -> list[RecordCopy]:
        """The copies whose turn the destination lacks: what the lag figures count."""
        return [c for c in self.copies if c.new_turn]

    @property
    def oldest_recorded_at(self) -> float | None:
        return min((c.record.recorded_at for c in self.pending if c.record.recorded_at is not None), default=None)


def decide(key: str, source: SessionRecord, held: SessionRecord | None, *,
           checkpoint_present: bool) -> RecordCopy | None:
    """Pure: what to write under `key` at the destination for one source record (`held`: the destination's
    copy), or None; `checkpoint_present`: whether the destination holds the manifest the record claims."""
    if held is not None and held.replicated_at is None:
        return None  # the destination's gateways wrote it: the session went on there
    whole = source.checkpoint_key is None or checkpoint_present
    record = source if whole else source.without_checkpoint()
    if held is None or record.version > held.version:
        return RecordCopy(key, record, whole, new_turn=True)
    if record.version == held.version and held.checkpoint_key is None and record.checkpoint_key is not None:
        return RecordCopy(key, record, whole, new_turn=False)
    return None


def _checkpoint_present(target: KVStore, checkpoint_key: str | None) -> bool:
    if checkpoint_key is None:
        return False
    try:
        split_manifest_key(checkpoint_key)
    except ValueError:
        return False  # a claim that names no manifest is never one the destination holds
    return target.exists([checkpoint_key])[0]


def scan_records(source: KVStore, target: KVStore, *, model: str, session_class: str, not_before: float,
                 max_reads: int | None = None) -> RecordScan:
    """What `sync_records` would write for the policy of (model, session class). Raises KVStoreUnavailable."""
    held_keys = set(target.list(SESSION_KEY_PREFIX))
    copies: list[RecordCopy] = []
    invalid: list[InvalidRecord] = []
    reads = unread = 0
    for key in source.list(SESSION_KEY_PREFIX):
        if max_reads is not None and reads >= max_reads:
            unread += 1
            continue
        if not SESSION_KEY.fullmatch(key):  # not a name a gateway writes: never read, never copied
            invalid.append(InvalidRecord(key, "misplaced", "source"))
            continue
        reads += 1
        data = source.get(key)
        if data is None:
            continue  # deleted since the listing
        try:
            record = parse_session_record(data, key=key)
        except SessionRecordInvalid as exc:
            invalid.append(InvalidRecord(key, exc.reason, "source"))
            continue
        if (record.model, record.session_class) != (model, session_class):
            continue
        if record.recorded_at is not None and record.recorded_at < not_before:
            continue
        held = None
        if key in held_keys and (held_data := target.get(key)) is not None:
            try:
                held = parse_session_record(held_data, key=key)
            except SessionRecordInvalid as exc:  # replaced: no gateway can read it anyway
                invalid.append(InvalidRecord(key, exc.reason, "destination"))
        copy = decide(key, record, held, checkpoint_present=_checkpoint_present(target, record.checkpoint_key))
        if copy is not None:
            copies.append(copy)
    return RecordScan(copies=copies, invalid=invalid, unread=unread)


def sync_records(source: KVStore, target: KVStore, *, model: str, session_class: str, not_before: float,
                 now: float) -> tuple[RecordScan, list[float]]:
    """Write what `scan_records` found, each copy marked `replicated_at = now`; the scan and the lags of the
    turns that reached the destination (now − recorded_at, dated records only)."""
    scan = scan_records(source, target, model=model, session_class=session_class, not_before=not_before)
    lags = []
    for copy in scan.copies:
        replica = copy.record.model_copy(update={"replicated_at": now})
        target.put(copy.key, replica.model_dump_json().encode())
        if copy.new_turn and copy.record.recorded_at is not None:
            lags.append(max(0.0, now - copy.record.recorded_at))
    return scan, lags
