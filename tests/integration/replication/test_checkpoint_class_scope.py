"""Policies that share a source store each copy their own class's checkpoints and records, on the real
stores (a directory and Redis) and the real database: a checkpoint whose manifest names another class
is not planned, one that names none (an engine's streaming checkpoint, or a manifest from before the
field) is in every policy's scope, and the store's records are read once for all of them."""

from __future__ import annotations

from typing import Any

import pytest

from contract.kv_checkpoint import FilesystemKVStore, KVCheckpointStore, RedisKVStore, open_kv_store
from contract.session import SessionRecord, SessionStore, session_key
from controlplane.db import session_scope
from controlplane.replication import record_sweep, service, tasks
from controlplane.replication.flows import ReadCache
from controlplane.replication.schemas import ReplicationPolicySpec
from tests.integration.replication.conftest import write_checkpoint


def policy(session_factory: Any, clock: Any, session_class: str, source: str, target: str | None,
           mode: str = "critical") -> int:
    stores = {"source_store": source, "destination_store": target} if target else {}
    spec = ReplicationPolicySpec(model="tiny", session_class=session_class, mode=mode, rpo_context_seconds=60,
                                 retention_seconds=3600, max_attempts=3, reason="test", **stores)
    with session_scope(session_factory) as session:
        return service.put_policy(session, spec=spec, actor="test", clock=clock).id


@pytest.mark.parametrize("backends", [("filesystem", "redis"), ("redis", "filesystem")])
def test_two_policies_on_one_store_copy_only_their_class_and_read_its_records_once(
        session_factory, clock, store_urls, backends, monkeypatch):
    (source_url, _) = store_urls(backends[0], "region-a")
    (chat_url, _), (batch_url, _) = store_urls(backends[1], "chat-standby"), store_urls(backends[1], "batch-standby")
    source = KVCheckpointStore(open_kv_store(source_url))
    chat_target, batch_target = (KVCheckpointStore(open_kv_store(url)) for url in (chat_url, batch_url))
    chat = policy(session_factory, clock, "chat", source_url, chat_url)
    batch = policy(session_factory, clock, "batch", source_url, batch_url)
    policy(session_factory, clock, "system", source_url, None, mode="rebuildable")
    now = clock.wall()
    chat_key = write_checkpoint(source, list(range(8)), created_at=now - 5, session_class="chat")
    batch_key = write_checkpoint(source, list(range(100, 108)), created_at=now - 5, seed=1, session_class="batch")
    system_key = write_checkpoint(source, list(range(200, 208)), created_at=now - 5, seed=2, session_class="system")
    stream_key = write_checkpoint(source, list(range(300, 308)), created_at=now - 5, seed=3)  # unclassed

    planned = {}
    for policy_id in (chat, batch):
        planned[policy_id] = tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=None,
                                        ages=ReadCache())
        for key in planned[policy_id]:
            assert tasks.copy(session_factory, policy_id, key, clock=clock, s3_endpoint_url=None) == "replicated"
    assert sorted(planned[chat]) == sorted([chat_key, stream_key])  # never the rebuildable class's
    assert sorted(planned[batch]) == sorted([batch_key, stream_key])
    assert sorted(chat_target.manifests()) == sorted([chat_key, stream_key])
    assert sorted(batch_target.manifests()) == sorted([batch_key, stream_key])
    assert system_key not in chat_target.manifests() + batch_target.manifests()

    sessions = SessionStore(source.store)
    for session_class, n in (("chat", 3), ("batch", 2), ("system", 2)):
        for i in range(n):
            sessions.put(SessionRecord(session_id=f"{session_class}{i}", model="tiny", session_class=session_class,
                                       turns=1, started_at=now - 9, recorded_at=now - 8))
    reads: list[str] = []
    for cls in (FilesystemKVStore, RedisKVStore):
        real = cls.get

        def counted(self: Any, key: str, real: Any = real) -> bytes | None:
            if self.location == source.store.location and key.startswith("sessions/"):
                reads.append(key)
            return real(self, key)

        monkeypatch.setattr(cls, "get", counted)
    groups = record_sweep.by_source_store(session_factory, [chat, batch], clock=clock)
    assert groups == [[chat, batch]]  # one records task for the store
    assert record_sweep.sync_store(session_factory, groups[0], clock=clock, s3_endpoint_url=None,
                                   cache=ReadCache()) == 5
    assert sorted(reads) == sorted(source.store.list("sessions/"))  # each read once, for both policies
    assert chat_target.store.list("sessions/") == sorted(session_key("tiny", f"chat{i}") for i in range(3))
    assert batch_target.store.list("sessions/") == sorted(session_key("tiny", f"batch{i}") for i in range(2))


def test_a_manifest_from_before_the_class_field_reads_as_unclassed_and_an_unclassed_one_is_written_as_before(
        store_urls):
    (url, _) = store_urls("filesystem", "region-a")
    store = KVCheckpointStore(open_kv_store(url))
    key = write_checkpoint(store, list(range(8)), created_at=1.0)
    data = store.store.get(key) or b""
    assert b"session_class" not in data  # byte for byte what readers before the field accept
    manifest = store.manifest_at(key)
    assert manifest is not None and manifest.session_class is None
    classed = write_checkpoint(store, list(range(8, 16)), created_at=1.0, seed=1, session_class="chat")
    assert (store.manifest_at(classed) or manifest).session_class == "chat"
