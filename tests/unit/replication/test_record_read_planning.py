"""How a sweep reads session records: once per store for every policy on it, only those that changed since
the cache learnt them, at most its cap, a backlog a share at a time in the order first seen; what the cap
defers is pending, with its age."""

from __future__ import annotations

from contract.kv_checkpoint import MemoryKVStore
from contract.session import SessionRecord, session_key
from controlplane.replication.flows import ReadCache
from controlplane.replication.session_records import RecordScan, plan_records, read_source, write_records

NOT_BEFORE = 100.0


class CountedStore(MemoryKVStore):
    """A memory store that counts the reads of each key (what the cap bounds)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def get(self, key: str) -> bytes | None:
        self.reads.append(key)
        return super().get(key)


def record(session_id: str, *, session_class: str = "chat", turns: int = 1, recorded_at: float = 150.0,
           checkpoint_key: str | None = None) -> SessionRecord:
    return SessionRecord(session_id=session_id, model="tiny", session_class=session_class, turns=turns,
                         started_at=120.0, recorded_at=recorded_at, checkpoint_key=checkpoint_key,
                         checkpointed_turn=turns if checkpoint_key else 0)


def put(store: MemoryKVStore, one: SessionRecord) -> str:
    key = session_key(one.model, one.session_id)
    store.put(key, one.model_dump_json().encode())
    return key


def sweep(source: CountedStore, targets: dict[str, MemoryKVStore], cache: ReadCache, *, now: float,
          max_reads: int | None = None) -> dict[str, RecordScan]:
    """One sweep of the store for the policy of each class in `targets`: one read of the source, then
    each policy's copies written to its destination."""
    seen = read_source(source, cache=cache, now=now, max_reads=max_reads)
    scans = {}
    for session_class, target in targets.items():
        scan = plan_records(seen, source, target, cache=cache, model="tiny", session_class=session_class,
                            not_before=NOT_BEFORE, now=now, max_reads=max_reads)
        write_records(target, scan, now=now)
        scans[session_class] = scan
    return scans


def test_policies_sharing_a_store_read_each_record_once_and_unchanged_ones_never_again():
    source, chat, batch, cache = CountedStore(), MemoryKVStore(), MemoryKVStore(), ReadCache()
    chats = [put(source, record(f"c{i}")) for i in range(4)]
    batches = [put(source, record(f"b{i}", session_class="batch")) for i in range(3)]

    first = sweep(source, {"chat": chat, "batch": batch}, cache, now=160.0)
    assert sorted(source.reads) == sorted(chats + batches)  # once each, for both policies
    assert chat.list("sessions/") == sorted(chats) and batch.list("sessions/") == sorted(batches)
    assert [len(first[c].copies) for c in ("chat", "batch")] == [4, 3]

    source.reads.clear()
    second = sweep(source, {"chat": chat, "batch": batch}, cache, now=165.0)
    assert source.reads == [] and all(not s.copies and not s.deferred for s in second.values())

    changed = put(source, record("c1", turns=2, recorded_at=164.0))
    third = sweep(source, {"chat": chat, "batch": batch}, cache, now=170.0)
    assert source.reads == [changed]  # only the record whose version changed
    assert [(c.key, c.record.turns) for c in third["chat"].copies] == [(changed, 2)]
    assert third["batch"].copies == []


def test_a_backlog_past_the_cap_arrives_a_share_per_sweep_and_what_waits_is_pending_with_its_age():
    source, target, cache = CountedStore(), MemoryKVStore(), ReadCache()
    keys = [put(source, record(f"s{i}", recorded_at=140.0 + i)) for i in range(7)]

    shares, deferred = [], []
    for now in (200.0, 205.0, 210.0, 215.0):
        scan = sweep(source, {"chat": target}, cache, now=now, max_reads=3)["chat"]
        shares.append(len(scan.copies))
        deferred.append(scan.deferred)
        assert set(target.list("sessions/")) | set(scan.deferred) == set(keys)  # what is not there is pending
    assert shares == [3, 3, 1, 0]
    assert target.list("sessions/") == sorted(keys)
    assert sorted(source.reads) == sorted(keys)  # each read once over the sweeps
    # Deferred records are pending; their age counts from when the first sweep saw them (a lower bound).
    assert [len(d) for d in deferred] == [4, 1, 0, 0]
    assert set(deferred[0].values()) == set(deferred[1].values()) == {200.0}
    assert scan_oldest(deferred[1]) == 200.0


def test_a_deferred_record_keeps_its_place_when_it_changes_and_newcomers_wait_behind_it():
    source, target, cache = CountedStore(), MemoryKVStore(), ReadCache()
    early = [put(source, record(f"e{i}")) for i in range(4)]
    sweep(source, {"chat": target}, cache, now=200.0, max_reads=2)
    waiting = sorted(set(early) - set(target.list("sessions/")))
    assert len(waiting) == 2
    put(source, record(source_id(waiting[0], early), turns=2, recorded_at=201.0))  # it changes while it waits
    # Newcomers whose keys sort first, so that an order by key would read them first.
    names = [f"l{i}" for i in range(200) if session_key("tiny", f"l{i}") < min(waiting)][:3]
    late = [put(source, record(name, recorded_at=202.0)) for name in names]
    assert len(late) == 3

    source.reads.clear()
    scan = sweep(source, {"chat": target}, cache, now=205.0, max_reads=2)["chat"]
    assert sorted(source.reads) == waiting  # first seen first: before the newcomers
    assert sorted(c.key for c in scan.copies) == waiting
    assert set(scan.deferred) == set(late) and set(scan.deferred.values()) == {205.0}


def scan_oldest(deferred: dict[str, float]) -> float | None:
    return RecordScan(deferred=deferred).oldest_recorded_at


def source_id(key: str, keys: list[str]) -> str:
    return f"e{keys.index(key)}"


def test_an_unchanged_record_waiting_for_its_checkpoint_is_read_again_only_once_the_checkpoint_is_there():
    source, target, cache = CountedStore(), MemoryKVStore(), ReadCache()
    claim = "kv/" + "r" * 64 + "/manifests/" + "h" * 64 + ".json"
    key = put(source, record("s1", checkpoint_key=claim))
    first = sweep(source, {"chat": target}, cache, now=160.0)["chat"]
    assert [(c.whole, c.new_turn) for c in first.copies] == [(False, True)]  # the turn now, the claim later

    source.reads.clear()
    assert sweep(source, {"chat": target}, cache, now=165.0)["chat"].copies == []
    assert source.reads == []  # unchanged, its checkpoint still absent: nothing read
    target.put(claim, b"{}")  # the manifest's copy arrived
    third = sweep(source, {"chat": target}, cache, now=170.0)["chat"]
    assert [(c.key, c.whole, c.new_turn) for c in third.copies] == [(key, True, False)]
    assert source.reads == [key]  # read again to copy it whole
