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

Bounded reads. A sweep reads a store's records once for every policy whose
source it is (`read_source`, then `plan_records` per policy), and only those
that changed: the listing's version tokens (`KVStore.versions`) say which did,
and what an earlier scan read of a record (`RecordFacts`, not the record: about
400 bytes a key) is kept in the process's `flows.ReadCache` under its token. At
most `max_reads` changed records are read at the source per scan, and as many
destination copies and re-reads per policy; the rest are `deferred`, oldest
first seen first at the next scan, so a backlog of 10^5 records is read a share
per sweep and a record that changes at every turn still gets its turn. A
deferred record is pending: it counts in the pending figures and its age counts
from when a scan first saw it changed (a lower bound; the probe says truncated).
Its class is the one its last read said, or unknown for one never read: then it
is pending for every policy on the store until read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from contract.kv_checkpoint import KVStore, split_manifest_key
from contract.session import SESSION_KEY_PREFIX, SessionRecord, SessionRecordInvalid, parse_session_record
from controlplane.replication.flows import ReadCache

SESSION_KEY = re.compile(re.escape(SESSION_KEY_PREFIX) + r"[0-9a-f]{64}\.json")  # contract.session.session_key


@dataclass(frozen=True, slots=True)
class RecordFacts:
    """What a scan keeps of a record it read: enough to tell, unread, whether a copy is due."""

    model: str
    session_class: str
    version: tuple[int, float]
    recorded_at: float | None
    checkpoint_key: str | None
    replicated: bool  # replicated_at is set: a copy replication wrote, not the store's own gateways

    @classmethod
    def of(cls, record: SessionRecord) -> RecordFacts:
        return cls(record.model, record.session_class, record.version, record.recorded_at, record.checkpoint_key,
                   record.replicated_at is not None)


@dataclass(frozen=True, slots=True)
class Deferred:
    """A record a scan saw changed (or new) and left unread past its cap: pending until read."""

    first_seen: float  # Unix seconds: its age counts from here at least
    last: RecordFacts | None  # its previous version's, if ever read (its class)


@dataclass(frozen=True)
class Verdict:
    whole: bool  # with its checkpoint claim; False: without it
    new_turn: bool  # the destination lacks this turn (it is pending until written); False: only the claim


@dataclass(frozen=True)
class RecordCopy:
    """One record a sweep writes at the destination."""

    key: str
    record: SessionRecord  # as it goes: whole, or without its checkpoint claim
    whole: bool
    new_turn: bool


@dataclass(frozen=True)
class InvalidRecord:
    key: str
    reason: str  # oversized | malformed | misplaced
    side: str  # source | destination


@dataclass(frozen=True)
class StoreRecords:
    """One store's records as one scan saw them: known (read now or unchanged since), invalid, deferred."""

    facts: dict[str, RecordFacts] = field(default_factory=dict)
    fresh: dict[str, SessionRecord] = field(default_factory=dict)  # read by this scan: at hand to copy
    invalid: list[InvalidRecord] = field(default_factory=list)
    deferred: dict[str, Deferred] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordScan:
    """One policy's share of a store's records: what to write, what was skipped, what waits for a later scan."""

    copies: list[RecordCopy] = field(default_factory=list)
    invalid: list[InvalidRecord] = field(default_factory=list)
    deferred: dict[str, float] = field(default_factory=dict)  # key → Unix seconds its age counts from

    @property
    def pending(self) -> list[RecordCopy]:
        """The copies whose turn the destination lacks (pending until written)."""
        return [c for c in self.copies if c.new_turn]

    @property
    def unread(self) -> int:
        return len(self.deferred)

    @property
    def oldest_recorded_at(self) -> float | None:
        """Of the pending copies and the deferred records (written copies are pending no more)."""
        times = [c.record.recorded_at for c in self.pending if c.record.recorded_at is not None]
        return min([*times, *self.deferred.values()], default=None)


def decide(source: RecordFacts, held: RecordFacts | None, *, checkpoint_present: bool) -> Verdict | None:
    """Pure: what to write at the destination for one source record (`held`: the destination's copy), or
    None; `checkpoint_present`: whether the destination holds the manifest the record claims."""
    if held is not None and not held.replicated:
        return None  # the destination's gateways wrote it: the session went on there
    whole = source.checkpoint_key is None or checkpoint_present
    if held is None or source.version > held.version:
        return Verdict(whole, new_turn=True)
    if source.version == held.version and held.checkpoint_key is None and source.checkpoint_key is not None \
            and whole:
        return Verdict(whole, new_turn=False)
    return None


def _read(store: KVStore, key: str) -> SessionRecord | str | None:
    """The record under `key`, the reason it is not one, or None if it is gone."""
    data = store.get(key)
    if data is None:
        return None
    try:
        return parse_session_record(data, key=key)
    except SessionRecordInvalid as exc:
        return exc.reason


def _learnt(value: SessionRecord | str) -> RecordFacts | str:
    return RecordFacts.of(value) if isinstance(value, SessionRecord) else value


def read_source(store: KVStore, *, cache: ReadCache, now: float, max_reads: int | None = None) -> StoreRecords:
    """A store's records, reading only those whose version changed since the cache learnt them, at most
    `max_reads`, oldest first seen first; the rest deferred. Raises KVStoreUnavailable."""
    seen = StoreRecords()
    queue: list[tuple[float, str, str, RecordFacts | None]] = []
    for key, version in store.versions(SESSION_KEY_PREFIX).items():
        if not SESSION_KEY.fullmatch(key):  # not a name a gateway writes: never read, never copied
            seen.invalid.append(InvalidRecord(key, "misplaced", "source"))
            continue
        entry = cache.get((store.location, key))
        value = entry[1] if entry is not None else None
        if entry is not None and entry[0] == version and not isinstance(value, Deferred):
            if isinstance(value, str):
                seen.invalid.append(InvalidRecord(key, value, "source"))
            else:
                seen.facts[key] = value
            continue
        if isinstance(value, Deferred):  # still waiting: it keeps its place, whatever it changed to
            queue.append((value.first_seen, key, version, value.last))
        else:
            queue.append((now, key, version, value if isinstance(value, RecordFacts) else None))
    queue.sort(key=lambda q: (q[0], q[1]))
    for reads, (first_seen, key, version, last) in enumerate(queue):
        if max_reads is not None and reads >= max_reads:
            seen.deferred[key] = Deferred(first_seen, last)
            cache.put((store.location, key), seen.deferred[key], version=version)
            continue
        read = _read(store, key)
        if read is None:
            continue  # deleted since the listing
        cache.put((store.location, key), _learnt(read), version=version)
        if isinstance(read, str):
            seen.invalid.append(InvalidRecord(key, read, "source"))
        else:
            seen.facts[key], seen.fresh[key] = RecordFacts.of(read), read
    return seen


def _is_claim(key: str | None) -> bool:
    """A claim that names no manifest is never one the destination holds (and is never sent to a store)."""
    if key is None:
        return False
    try:
        split_manifest_key(key)
    except ValueError:
        return False
    return all(part not in ("", ".", "..") for part in key.split("/"))


def plan_records(records: StoreRecords, source: KVStore, target: KVStore, *, cache: ReadCache, model: str,
                 session_class: str, not_before: float, now: float, max_reads: int | None = None) -> RecordScan:
    """What to write at `target` for the policy of (model, session class), from `read_source`'s view.

    Reads a destination copy only when its version changed since the cache learnt it, and a source record
    again only to copy one this scan did not read; at most `max_reads` of these. Raises KVStoreUnavailable.
    """
    held_versions = target.versions(SESSION_KEY_PREFIX)
    scan = RecordScan(invalid=list(records.invalid), deferred={
        key: d.first_seen for key, d in records.deferred.items()
        if d.last is None or (d.last.model, d.last.session_class) == (model, session_class)})
    budget: float = max_reads if max_reads is not None else math.inf
    candidates: list[tuple[str, RecordFacts, RecordFacts | None]] = []
    for key, facts in records.facts.items():
        if (facts.model, facts.session_class) != (model, session_class):
            continue
        if facts.recorded_at is not None and facts.recorded_at < not_before:
            continue
        held = None
        if key in held_versions:
            entry = cache.get((target.location, key))
            if entry is not None and entry[0] == held_versions[key]:
                value = entry[1]
            elif budget <= 0:
                scan.deferred[key] = facts.recorded_at if facts.recorded_at is not None else now
                continue
            else:
                budget -= 1
                read = _read(target, key)
                value = _learnt(read) if read is not None else None
                if value is not None:
                    cache.put((target.location, key), value, version=held_versions[key])
            if isinstance(value, str):  # replaced: no gateway can read it anyway
                scan.invalid.append(InvalidRecord(key, value, "destination"))
            else:
                held = value
        if decide(facts, held, checkpoint_present=True) is not None:  # None here is None with it absent too
            candidates.append((key, facts, held))
    claims = sorted({f.checkpoint_key for _, f, _ in candidates if _is_claim(f.checkpoint_key)})
    present = {k for k, there in zip(claims, target.exists(claims), strict=True) if there} if claims else set()
    for key, facts, held in candidates:
        verdict = decide(facts, held, checkpoint_present=facts.checkpoint_key in present)
        if verdict is None:
            continue
        record = records.fresh.get(key)
        if record is None:
            if budget <= 0:
                if verdict.new_turn:
                    scan.deferred[key] = facts.recorded_at if facts.recorded_at is not None else now
                continue
            budget -= 1
            read = _read(source, key)
            if not isinstance(read, SessionRecord) or RecordFacts.of(read) != facts:
                continue  # changed since the listing: the next scan sees its new version
            record = read
        scan.copies.append(RecordCopy(key, record if verdict.whole else record.without_checkpoint(), verdict.whole,
                                      verdict.new_turn))
    return scan


def write_records(target: KVStore, scan: RecordScan, *, now: float) -> list[float]:
    """Write the scan's copies, each marked `replicated_at = now`; the lags of the turns that reached the
    destination (now − recorded_at, dated records only)."""
    lags = []
    for copy in scan.copies:
        replica = copy.record.model_copy(update={"replicated_at": now})
        target.put(copy.key, replica.model_dump_json().encode())
        if copy.new_turn and copy.record.recorded_at is not None:
            lags.append(max(0.0, now - copy.record.recorded_at))
    return lags
