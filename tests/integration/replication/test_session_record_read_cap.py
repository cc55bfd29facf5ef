"""More session records than a sweep's read cap, on the real stores (a directory and Redis), on virtual time:
every record arrives over successive sweeps, each read once at the source, and what the cap defers is
pending — in the worker's gauge, and on the API's /metrics with its age — until a later sweep reads it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from contract.kv_checkpoint import FilesystemKVStore, KVStore, RedisKVStore, open_kv_store
from contract.session import SessionRecord, SessionStore, session_key
from controlplane.replication import record_sweep
from controlplane.replication.exposition import PREFIX, ReplicationCollector
from controlplane.replication.flows import ReadCache
from tests.integration.replication.test_replication_flows import make_policy

CAP = 3
RECORDS = 7  # more than two sweeps' share


def write_records(store: KVStore, now: float) -> list[str]:
    """Region A's gateways' records, one turn each, recorded 20 s ago; their keys in the listing's order."""
    sessions = SessionStore(store)
    for i in range(RECORDS):
        sessions.put(SessionRecord(session_id=f"s{i}", model="tiny", session_class="chat", turns=1,
                                   started_at=now - 30, recorded_at=now - 20))
    return sorted(session_key("tiny", f"s{i}") for i in range(RECORDS))


def pending_gauge() -> float | None:
    return REGISTRY.get_sample_value("lifeline_replication_pending_session_records",
                                     {"model": "tiny", "session_class": "chat"})


@pytest.mark.parametrize("backends", [("filesystem", "redis"), ("redis", "filesystem")])
def test_records_past_the_cap_all_arrive_over_successive_sweeps_each_read_once(
        session_factory, clock, store_urls, backends, monkeypatch):
    (source_url, _), (target_url, _) = store_urls(backends[0], "region-a"), store_urls(backends[1], "region-b")
    source, target = open_kv_store(source_url), open_kv_store(target_url)
    policy_id = make_policy(session_factory, clock, source_url, target_url)
    keys = write_records(source, clock.wall())
    reads: list[str] = []
    for cls in (FilesystemKVStore, RedisKVStore):
        real = cls.get

        def counted(self: Any, key: str, real: Any = real) -> bytes | None:
            if self.location == source.location:
                reads.append(key)
            return real(self, key)

        monkeypatch.setattr(cls, "get", counted)

    cache, arrived, deferred = ReadCache(), [], []
    for _ in range(4):
        record_sweep.sync_store(session_factory, [policy_id], clock=clock, s3_endpoint_url=None, cache=cache,
                                max_reads=CAP)
        arrived.append(len(target.list("sessions/")))
        deferred.append(pending_gauge())
        clock.advance(5)
    assert arrived == [3, 6, 7, 7]
    assert deferred == [4, 1, 0, 0]  # what the cap deferred is pending until read
    assert sorted(reads) == keys  # each record read once at the source over the sweeps
    for key in keys:
        data = target.get(key)
        assert data is not None and SessionRecord.model_validate_json(data).replicated_at is not None


def test_the_probe_counts_deferred_records_pending_and_ages_them_from_when_first_seen(
        session_factory, clock, store_urls):
    (source_url, _), (target_url, _) = store_urls("redis", "region-a"), store_urls("filesystem", "region-b")
    source, target = open_kv_store(source_url), open_kv_store(target_url)
    make_policy(session_factory, clock, source_url, target_url)  # critical, RPO_context 60 s
    keys = write_records(source, clock.wall())
    # The standby holds all but the last in the listing's order: the probe reads those first, and only the
    # last is pending; until read, what the cap left unread counts pending too.
    for key in keys[:-1]:
        record = SessionRecord.model_validate_json(source.get(key) or b"")
        target.put(key, record.model_copy(update={"replicated_at": clock.wall() - 10}).model_dump_json().encode())
    collector = ReplicationCollector(session_factory, clock=clock, s3_endpoint_url=None,
                                     probe_ttl=timedelta(seconds=30), max_reads=CAP, budget=timedelta(seconds=60))

    def collect() -> dict[str, float]:
        return {s.name.removeprefix(PREFIX): s.value for f in collector.collect() for s in f.samples}

    seen = []
    for _ in range(3):
        seen.append(collect())
        clock.advance(31)  # past the probe's TTL
    assert [s["pending_session_records"] for s in seen] == [4, 1, 1]
    assert [s["probe_truncated"] for s in seen] == [1, 1, 0]
    # First probe: the four unread were first seen now. Second: the last still unread, 31 s since first
    # seen (a lower bound, counted in the lag). Third: read, its own age: recorded 20 s before the first.
    assert [s["oldest_pending_age_seconds"] for s in seen] == pytest.approx([0, 31, 82])
    assert [s["lag_seconds"] for s in seen] == pytest.approx([0, 31, 82])
    assert [s["within_rpo"] for s in seen] == [1, 1, 0]
