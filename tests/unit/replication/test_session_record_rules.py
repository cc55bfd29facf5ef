"""The pure rules of session-record replication: what goes to the destination, whole or without its
checkpoint claim, never over a newer copy or one the destination's gateways wrote; a stored record that is
not one is refused with its reason; a replica makes the standby's next turn count `elsewhere`."""

from __future__ import annotations

import pytest

from contract.kv_checkpoint import MemoryKVStore
from contract.session import (
    MAX_SESSION_RECORD_BYTES,
    SessionRecord,
    SessionRecordInvalid,
    parse_session_record,
    session_key,
)
from controlplane.replication.flows import ReadCache
from controlplane.replication.session_records import RecordFacts, decide, plan_records, read_source
from gateway.sessions import SessionTurn

KEY = session_key("tiny", "s1")
CHECKPOINT = "kv/" + "r" * 64 + "/manifests/" + "h" * 64 + ".json"


def record(**fields) -> SessionRecord:
    return SessionRecord(**{"session_id": "s1", "model": "tiny", "session_class": "chat", "started_at": 100.0,
                            "turns": 3, "context_tokens": 90, "context_digest": "d", "checkpointed_turn": 3,
                            "checkpointed_tokens": 80, "checkpointed_at": 130.0, "checkpoint_key": CHECKPOINT,
                            "recorded_at": 130.0, **fields})


def replica(**fields) -> SessionRecord:
    return record(replicated_at=131.0, **fields)


STRIPPED = {"checkpointed_turn": 0, "checkpointed_tokens": 0, "checkpointed_at": None, "checkpoint_key": None}


@pytest.mark.parametrize("held, present, outcome", [
    (None, True, ("whole", True)),
    (None, False, ("without_checkpoint", True)),  # the turn goes now; the claim waits for its manifest
    (replica(turns=2, recorded_at=120.0), True, ("whole", True)),
    (replica(turns=3, **STRIPPED), True, ("whole", False)),  # the claim completed: not a new turn
    (replica(turns=3, **STRIPPED), False, None),  # still no manifest there: nothing new to say
    (replica(), True, None),  # already there
    (replica(turns=4, recorded_at=140.0), True, None),  # never over a newer copy
    (record(turns=1, recorded_at=150.0), True, None),  # the destination's own gateways wrote it: never replaced
])
def test_a_record_goes_whole_only_where_its_checkpoint_is_and_never_over_a_newer_one(held, present, outcome):
    verdict = decide(RecordFacts.of(record()), held and RecordFacts.of(held), checkpoint_present=present)
    if outcome is None:
        assert verdict is None
        return
    kind, new_turn = outcome
    assert verdict is not None and (verdict.whole, verdict.new_turn) == (kind == "whole", new_turn)


def test_a_record_that_never_had_a_checkpoint_goes_whole():
    verdict = decide(RecordFacts.of(record(**STRIPPED)), None, checkpoint_present=False)
    assert verdict is not None and verdict.whole


@pytest.mark.parametrize("data, reason", [
    (b"{" + b" " * MAX_SESSION_RECORD_BYTES + b"}", "oversized"),
    (b"not json", "malformed"),
    (b'{"session_id": "s1"}', "malformed"),
    (record(session_id="s2").model_dump_json().encode(), "misplaced"),
])
def test_a_stored_record_that_is_not_one_is_refused_with_its_reason(data, reason):
    with pytest.raises(SessionRecordInvalid) as refused:
        parse_session_record(data, key=KEY)
    assert (refused.value.reason, refused.value.key) == (reason, KEY)


def test_a_stored_record_reads_back_as_written():
    assert parse_session_record(replica().model_dump_json().encode(), key=KEY) == replica()


@pytest.mark.parametrize("previous, continuity", [
    (record(), "here"),  # a gateway of this region recorded the previous turn
    (replica(), "elsewhere"),  # the previous turn was served in another region: a failover
])
def test_a_replicated_record_counts_the_next_turn_elsewhere(previous, continuity):
    turn = SessionTurn("s1", "chat", "tiny", None, previous, 90, lambda ids, _: ids, cached_tokens=80)
    assert (turn.turn, turn.continuity, turn.context_recomputed_tokens) == (4, continuity, 10)


def scan_chat(source: MemoryKVStore, target: MemoryKVStore, cache: ReadCache, *, max_reads: int | None = None,
              now: float = 200.0):
    seen = read_source(source, cache=cache, now=now, max_reads=max_reads)
    return plan_records(seen, source, target, cache=cache, model="tiny", session_class="chat", not_before=100.0,
                        now=now, max_reads=max_reads)


def test_a_scan_copies_only_its_class_within_retention_and_reads_at_most_its_cap():
    source, target = MemoryKVStore(), MemoryKVStore()
    mine = [record(session_id=f"s{i}", checkpoint_key=None, recorded_at=130.0 + i) for i in range(3)]
    old = record(session_id="old", checkpoint_key=None, recorded_at=10.0)  # before retention
    other = record(session_id="other", session_class="batch", checkpoint_key=None)
    for one in [*mine, old, other]:
        source.put(session_key(one.model, one.session_id), one.model_dump_json().encode())

    scan = scan_chat(source, target, ReadCache())
    assert sorted(c.record.session_id for c in scan.copies) == ["s0", "s1", "s2"]
    assert (len(scan.pending), scan.oldest_recorded_at, scan.unread) == (3, 130.0, 0)
    assert all(c.whole and c.record == mine[int(c.record.session_id[1:])] for c in scan.copies)
    capped = scan_chat(source, target, ReadCache(), max_reads=2)
    read = set(source.list("sessions/")[:2])  # the first two in the listing's order (all first seen at once)
    assert capped.unread == 3  # never read: class unknown, so pending for this policy too
    assert {c.key for c in capped.copies} == read & {session_key("tiny", one.session_id) for one in mine}
