"""Replication's steps on real stores and the real database (SQLite and PostgreSQL), on virtual time:
plan a sweep, copy verified, retention, dead letters, and the status the API shows."""

from __future__ import annotations

from typing import Any

import pytest

from contract.kv_checkpoint import KVCheckpointInvalid, KVCheckpointStore, open_kv_store
from controlplane.db import session_scope
from controlplane.replication import flows, service, tasks
from controlplane.replication.schemas import ReplicationPolicySpec
from tests.integration.replication.conftest import ROOT, write_checkpoint


def make_policy(session_factory: Any, clock: Any, source: str, target: str, **extra: Any) -> int:
    spec = ReplicationPolicySpec(model="tiny", session_class="chat", mode="critical", rpo_context_seconds=60,
                                 source_store=source, destination_store=target, retention_seconds=3600,
                                 max_attempts=3, reason="test", **extra)
    with session_scope(session_factory) as session:
        return service.put_policy(session, spec=spec, actor="test", clock=clock).id


def current_status(session_factory: Any, clock: Any) -> dict[str, Any]:
    with session_scope(session_factory) as session:
        [row] = service.status(session, clock=clock).policies
        return row.model_dump(mode="json")


@pytest.mark.parametrize("backends", [("filesystem", "redis"), ("redis", "s3"), ("s3", "filesystem")])
def test_a_sweep_copies_what_the_standby_lacks_and_ages_out_old_checkpoints(
        session_factory, clock, store_urls, backends):
    (source_url, s3), (target_url, s3b) = store_urls(backends[0], "primary"), store_urls(backends[1], "standby")
    endpoint = s3 or s3b
    source = KVCheckpointStore(open_kv_store(source_url, s3_endpoint_url=endpoint))
    target = KVCheckpointStore(open_kv_store(target_url, s3_endpoint_url=endpoint))
    policy_id = make_policy(session_factory, clock, source_url, target_url)
    now = clock.wall()
    stale = write_checkpoint(source, list(range(8)), created_at=now - 7200)  # older than retention: never copied
    first = write_checkpoint(source, list(range(16)), created_at=now - 20)
    second = write_checkpoint(source, list(range(24)), created_at=now - 10)

    keys = tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=endpoint)
    assert keys == [first, second]
    assert current_status(session_factory, clock)["pending"] == 2
    assert current_status(session_factory, clock)["lag_seconds"] == pytest.approx(20)

    clock.advance(5)
    assert tasks.copy(session_factory, policy_id, first, clock=clock, s3_endpoint_url=endpoint) == "replicated"
    assert tasks.copy(session_factory, policy_id, second, clock=clock, s3_endpoint_url=endpoint) == "replicated"
    assert tasks.copy(session_factory, policy_id, second, clock=clock, s3_endpoint_url=endpoint) == "already_present"
    status = current_status(session_factory, clock)
    assert (status["replicated_total"], status["blocks_copied_total"], status["pending"]) == (2, 6, 0)
    assert status["last_lag_seconds"] == pytest.approx(15) and status["within_rpo"] is True
    assert sorted(target.manifests()) == sorted([first, second])
    assert stale not in target.manifests()

    assert tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=endpoint) == []
    clock.advance(3600 - 20 - 5 + 5)  # `first` (created 20 s before the start) is past retention; `second` not
    assert tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=endpoint) == []
    assert target.manifests() == [second]
    manifest = target.manifest_at(second)
    for entry in manifest.blocks:  # the blocks `second` shares with `first` stayed
        assert target.read_block(ROOT, entry.hash) is not None
    assert current_status(session_factory, clock)["deleted_total"] == 1


def test_a_corrupt_source_block_is_refused_then_dead_lettered_after_max_attempts(
        session_factory, clock, store_urls, client, as_role):
    source_url, _ = store_urls("filesystem", "primary")
    target_url, _ = store_urls("redis", "standby")
    source = KVCheckpointStore(open_kv_store(source_url))
    target = KVCheckpointStore(open_kv_store(target_url))
    policy_id = make_policy(session_factory, clock, source_url, target_url)
    key = write_checkpoint(source, list(range(12)), created_at=clock.wall())
    manifest = source.manifest_at(key)
    data = bytearray(source.read_block(ROOT, manifest.blocks[1].hash))
    data[-2] ^= 0x10
    source.write_block(ROOT, manifest.blocks[1].hash, bytes(data))

    for attempt in (1, 2, 3):
        with pytest.raises(KVCheckpointInvalid, match="does not match the manifest"):
            tasks.copy(session_factory, policy_id, key, clock=clock, s3_endpoint_url=None)
        assert tasks.failed(session_factory, policy_id, key, attempt=attempt, error=KVCheckpointInvalid("bad block"),
                            clock=clock) is (attempt == 3)
        assert target.manifests() == []  # never a manifest naming a block that was not copied
    assert target.store.exists([f"kv/{ROOT}/blocks/{manifest.blocks[1].hash}.safetensors"]) == [False]
    assert tasks.copy(session_factory, policy_id, key, clock=clock, s3_endpoint_url=None) == "dead_lettered"
    assert tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=None) == []  # skipped from now on

    status = client.get("/api/v1/replication/status", headers=as_role("viewer")).json()
    [row] = status["policies"]
    assert [(d["checkpoint_key"], d["attempts"]) for d in row["dead_letters"]] == [(key, 3)]
    assert "hunter" not in str(status)
    events = client.get("/api/v1/events", params={"kind": "replication.dead_letter"},
                        headers=as_role("viewer")).json()
    assert [(e["outcome"], e["after"]["checkpoint"]) for e in events] == [("failed", key)]


def test_a_backlog_past_the_read_cap_is_planned_a_share_per_sweep_and_each_manifest_read_once(
        session_factory, clock, store_urls):
    (source_url, _), (target_url, _) = store_urls("filesystem", "primary"), store_urls("filesystem", "standby")
    source = KVCheckpointStore(open_kv_store(source_url))
    policy_id = make_policy(session_factory, clock, source_url, target_url)
    now = clock.wall()
    backlog = [write_checkpoint(source, list(range(4 * (i + 1))), created_at=now - 100 + i) for i in range(7)]
    reads: list[str] = []
    read = KVCheckpointStore.manifest_at

    def counted(self: KVCheckpointStore, key: str) -> Any:
        if self.store.location == source.store.location:  # not the destination's, which retention reads
            reads.append(key)
        return read(self, key)

    ages = flows.ReadCache()
    planned: list[list[str]] = []
    for _ in range(3):
        with pytest.MonkeyPatch.context() as patch:  # count the sweep's reads, not the copies'
            patch.setattr(KVCheckpointStore, "manifest_at", counted)
            keys = tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=None, ages=ages, max_reads=3)
        assert current_status(session_factory, clock)["pending"] == len(keys)  # this sweep's share
        for key in keys:
            assert tasks.copy(session_factory, policy_id, key, clock=clock, s3_endpoint_url=None) == "replicated"
        planned.append(keys)
    assert [len(keys) for keys in planned] == [3, 3, 1]
    assert sorted(k for keys in planned for k in keys) == sorted(backlog)
    assert sorted(reads) == sorted(backlog)  # each manifest read once over the three sweeps
    assert current_status(session_factory, clock)["pending"] == 0


def test_a_scan_counts_what_it_did_not_read_and_dates_it_at_a_later_scan(clock, store_urls):
    (source_url, _), (target_url, _) = store_urls("filesystem", "a"), store_urls("filesystem", "b")
    source, target = (KVCheckpointStore(open_kv_store(url)) for url in (source_url, target_url))
    now = clock.wall()
    keys = [write_checkpoint(source, list(range(4 * (i + 1))), created_at=now - 50 + i) for i in range(5)]
    ages = flows.ReadCache()
    first = flows.scan_pending(source, target, skip=set(), not_before=0.0, ages=ages, max_reads=2)
    assert (len(first.pending), first.unread, first.count) == (2, 3, 5)
    second = flows.scan_pending(source, target, skip=set(), not_before=0.0, ages=ages, max_reads=2)
    assert (len(second.pending), second.unread) == (4, 1)
    third = flows.scan_pending(source, target, skip=set(), not_before=0.0, ages=ages, max_reads=2)
    assert [p.key for p in third.pending] == keys  # oldest first, all dated
    assert third.oldest_created_at == pytest.approx(now - 50)
