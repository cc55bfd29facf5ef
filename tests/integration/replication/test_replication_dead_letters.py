"""Dead letters retried and cleared over the API and the CLI, on SQLite and PostgreSQL and real stores:
a retried one is planned and copied again (or dead again), a cleared one is no longer reported."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from contract.kv_checkpoint import KVCheckpointInvalid, KVCheckpointStore, open_kv_store
from controlplane.auth.models import AuditRecord
from controlplane.db import session_scope
from controlplane.event.models import Event
from controlplane.replication import service, tasks
from controlplane.replication.cli import replication_app
from tests.integration.replication.conftest import ROOT, write_checkpoint
from tests.integration.replication.test_replication_flows import make_policy


def corrupt_block(store: KVCheckpointStore, key: str, index: int = 1) -> bytes:
    """Flip a byte of one block at the source; the block's original bytes."""
    block = store.manifest_at(key).blocks[index].hash
    original = store.read_block(ROOT, block)
    data = bytearray(original)
    data[-2] ^= 0x10
    store.write_block(ROOT, block, bytes(data))
    return original


def dead_letter(session_factory: Any, clock: Any, policy_id: int, key: str, attempts: int = 3) -> None:
    """Fail a copy `attempts` times as the worker does (the last one dead-letters it)."""
    for attempt in range(1, attempts + 1):
        with pytest.raises(KVCheckpointInvalid):
            tasks.copy(session_factory, policy_id, key, clock=clock, s3_endpoint_url=None)
        tasks.failed(session_factory, policy_id, key, attempt=attempt, error=KVCheckpointInvalid("bad block"),
                     clock=clock)


def events(session_factory: Any, prefix: str = "replication.dead_letter") -> list[tuple[str, str]]:
    with session_scope(session_factory) as session:
        return [(e.kind, e.outcome) for e in session.scalars(select(Event).order_by(Event.id))
                if e.kind.startswith(prefix)]


def reported(client: Any, as_role: Any) -> list[tuple[str, str]]:
    [row] = client.get("/api/v1/replication/status", headers=as_role("viewer")).json()["policies"]
    return [(d["checkpoint_key"], d["state"]) for d in row["dead_letters"]]


@pytest.fixture
def stores(store_urls: Any) -> tuple[str, str, KVCheckpointStore, KVCheckpointStore]:
    source_url, _ = store_urls("filesystem", "primary")
    target_url, _ = store_urls("redis", "standby")
    return (source_url, target_url, KVCheckpointStore(open_kv_store(source_url)),
            KVCheckpointStore(open_kv_store(target_url)))


def test_a_retried_dead_letter_is_copied_again_or_dead_again(session_factory, clock, stores, client, as_role):
    source_url, target_url, source, target = stores
    policy_id = make_policy(session_factory, clock, source_url, target_url)
    key = write_checkpoint(source, list(range(12)), created_at=clock.wall())
    original = corrupt_block(source, key)
    dead_letter(session_factory, clock, policy_id, key)
    assert reported(client, as_role) == [(key, "dead")]
    with session_scope(session_factory) as session:  # the sweep has run since: the policy is not due now
        service.record_sweep(session, policy_id=policy_id, pending=0, oldest_pending_created_at=None, clock=clock)
    body = {"model": "tiny", "session_class": "chat", "checkpoint_keys": [key], "reason": "source disk replaced"}

    retried = client.post("/api/v1/replication/dead-letters/retry", json=body, headers=as_role("operator"))
    assert retried.status_code == 200, retried.text
    assert (retried.json()["changed"], retried.json()["unchanged"], retried.json()["state"]) == ([key], [], "retrying")
    again = client.post("/api/v1/replication/dead-letters/retry", json=body, headers=as_role("operator"))
    assert (again.status_code, again.json()["changed"], again.json()["unchanged"]) == (200, [], [key])
    assert reported(client, as_role) == [(key, "retrying")]
    with session_scope(session_factory) as session:  # due at the next sweep, whatever the cadence
        assert [p.id for p in service.due_policies(session, clock=clock)] == [policy_id]
    assert tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=None) == [key]

    dead_letter(session_factory, clock, policy_id, key)  # still corrupt: its attempts afresh, then dead again
    assert reported(client, as_role) == [(key, "dead")]
    assert tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=None) == []
    assert target.manifests() == []

    source.write_block(ROOT, source.manifest_at(key).blocks[1].hash, original)  # the operator fixed the source
    assert client.post("/api/v1/replication/dead-letters/retry", headers=as_role("operator"),
                       json={**body, "checkpoint_keys": None}).json()["changed"] == [key]  # every dead one
    assert tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=None) == [key]
    assert tasks.copy(session_factory, policy_id, key, clock=clock, s3_endpoint_url=None) == "replicated"
    assert target.manifests() == [key]
    assert reported(client, as_role) == []
    assert client.get("/api/v1/replication/dead-letters", params={"include_cleared": True},
                      headers=as_role("viewer")).json() == []
    assert events(session_factory) == [
        ("replication.dead_letter", "failed"), ("replication.dead_letter.retry", "succeeded"),
        ("replication.dead_letter", "failed"), ("replication.dead_letter.retry", "succeeded"),
        ("replication.dead_letter.replicated", "succeeded")]
    audit = client.get("/api/v1/audit", headers=as_role("admin")).json()
    assert sum(1 for r in audit if r["action"] == "retry_dead_letters" and r["outcome"] == "succeeded") == 3


def test_a_cleared_dead_letter_is_no_longer_reported_and_stays_skipped(session_factory, clock, stores, client,
                                                                      as_role):
    source_url, target_url, source, _ = stores
    policy_id = make_policy(session_factory, clock, source_url, target_url)
    first = write_checkpoint(source, list(range(12)), created_at=clock.wall())
    second = write_checkpoint(source, list(range(100, 112)), created_at=clock.wall(), seed=1)
    for key in (first, second):
        corrupt_block(source, key)
        dead_letter(session_factory, clock, policy_id, key)
    body = {"model": "tiny", "session_class": "chat", "checkpoint_keys": [first], "reason": "accepted: re-prefill"}

    cleared = client.post("/api/v1/replication/dead-letters/clear", json=body, headers=as_role("operator"))
    assert (cleared.status_code, cleared.json()["changed"], cleared.json()["state"]) == (200, [first], "cleared")
    assert client.post("/api/v1/replication/dead-letters/clear", json=body,
                       headers=as_role("operator")).json()["unchanged"] == [first]
    assert reported(client, as_role) == [(second, "dead")]
    listed = client.get("/api/v1/replication/dead-letters", headers=as_role("viewer")).json()
    assert [[d["checkpoint_key"] for d in p["dead_letters"]] for p in listed] == [[second]]
    with_cleared = client.get("/api/v1/replication/dead-letters", params={"include_cleared": True},
                              headers=as_role("viewer")).json()
    [row] = with_cleared
    by_key = {d["checkpoint_key"]: d for d in row["dead_letters"]}
    assert by_key[first]["state"] == "cleared" and by_key[first]["state_changed_by"] == "token:test-operator#2"
    assert tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=None) == []  # both still skipped
    assert tasks.copy(session_factory, policy_id, first, clock=clock, s3_endpoint_url=None) == "dead_lettered"
    assert [k for k, _ in events(session_factory, "replication.dead_letter.clear")] == [
        "replication.dead_letter.clear"]  # the second clear changed nothing: no event

    retried = client.post("/api/v1/replication/dead-letters/retry", json=body, headers=as_role("operator"))
    assert retried.json()["changed"] == [first]  # a cleared one can be retried after all
    assert tasks.plan(session_factory, policy_id, clock=clock, s3_endpoint_url=None) == [first]


@pytest.mark.parametrize("change, status, error_type", [
    ({"checkpoint_keys": ["kv/none/manifests/none.json"]}, 404, "replication_dead_letter_not_found"),
    ({"checkpoint_keys": "KEY+missing"}, 404, "replication_dead_letter_not_found"),  # all or nothing
    ({"session_class": "nothing"}, 404, "replication_policy_not_found"),
    ({"checkpoint_keys": []}, 422, "invalid_request"),
    ({"checkpoint_keys": ["a\x00b"]}, 422, "invalid_request"),
    ({"reason": ""}, 422, "invalid_request"),
    ({"session_class": "a/b"}, 422, "invalid_request"),
    ({"surprise": 1}, 422, "invalid_request"),
])
@pytest.mark.parametrize("action", ["retry", "clear"])
def test_bad_dead_letter_requests_are_refused_with_a_type_and_change_nothing(
        session_factory, clock, stores, client, as_role, change, status, error_type, action):
    source_url, target_url, source, _ = stores
    policy_id = make_policy(session_factory, clock, source_url, target_url)
    key = write_checkpoint(source, list(range(12)), created_at=clock.wall())
    corrupt_block(source, key)
    dead_letter(session_factory, clock, policy_id, key)
    if change.get("checkpoint_keys") == "KEY+missing":
        change = {"checkpoint_keys": [key, "kv/none/manifests/none.json"]}
    body = {"model": "tiny", "session_class": "chat", "checkpoint_keys": [key], "reason": "r", **change}
    before = events(session_factory, "replication")
    response = client.post(f"/api/v1/replication/dead-letters/{action}", json=body, headers=as_role("operator"))
    assert (response.status_code, response.json()["error"]["type"]) == (status, error_type)
    assert reported(client, as_role) == [(key, "dead")]
    assert events(session_factory, "replication") == before
    assert client.post(f"/api/v1/replication/dead-letters/{action}", json=body,
                       headers=as_role("viewer")).status_code == 403


def test_the_cli_lists_retries_and_clears_dead_letters_audited(database_url, session_factory, clock, stores,
                                                              monkeypatch):
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    source_url, target_url, source, _ = stores
    policy_id = make_policy(session_factory, clock, source_url, target_url)
    key = write_checkpoint(source, list(range(12)), created_at=clock.wall())
    corrupt_block(source, key)
    dead_letter(session_factory, clock, policy_id, key)
    runner = CliRunner()

    def cli(*args: str):
        return runner.invoke(replication_app, ["dead-letters", *args], catch_exceptions=False)

    listed = json.loads(cli("list", "--json").output)
    assert [(d["checkpoint_key"], d["state"]) for d in listed[0]["dead_letters"]] == [(key, "dead")]
    refused = cli("retry", "tiny", "chat", "--reason", "r")  # neither keys nor --all
    assert refused.exit_code == 2 and "--all" in refused.output
    missing = cli("clear", "tiny", "chat", "kv/none/manifests/none.json", "--reason", "r")
    assert missing.exit_code == 1 and "replication_dead_letter_not_found" in missing.output
    retried = cli("retry", "tiny", "chat", "--all", "--reason", "fixed the disk")
    assert retried.exit_code == 0 and "1 now retrying" in retried.output, retried.output
    cleared = cli("clear", "tiny", "chat", key, "--reason", "gave up")
    assert cleared.exit_code == 0 and "1 now cleared" in cleared.output
    assert "cleared" in cli("list", "--include-cleared").output and cli("list").output == ""

    with session_scope(session_factory) as session:
        audits = [(a.action, a.outcome, a.actor[:4]) for a in session.scalars(select(AuditRecord)
                                                                          .order_by(AuditRecord.id))]
    assert audits == [("replication.dead_letters.retry", "failed", "cli:"),
                      ("replication.dead_letters.clear", "failed", "cli:"),
                      ("replication.dead_letters.retry", "succeeded", "cli:"),
                      ("replication.dead_letters.clear", "succeeded", "cli:")]
    assert [k for k, _ in events(session_factory)] == ["replication.dead_letter", "replication.dead_letter.retry",
                                                        "replication.dead_letter.clear"]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_0016_keeps_existing_dead_letters_dead_and_goes_back(backend, tmp_path):
    from sqlalchemy import text

    from controlplane.db import build_engine
    from controlplane.schema import downgrade, upgrade
    from tests.support.controlplane_testing import throwaway_database

    at = {"at": "2026-01-01 00:00:00+00:00"}
    with throwaway_database(backend, tmp_path) as url:
        upgrade(url, "0015")
        engine = build_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(text(
                    "INSERT INTO replication_policies (id, model, session_class, mode, rpo_context_seconds, "
                    "retention_seconds, max_attempts, revision, reason, updated_by, created_at, updated_at) "
                    "VALUES (1, 'tiny', 'chat', 'critical', 30, 3600, 3, 1, 'r', 'a', :at, :at)"), at)
                conn.execute(text("INSERT INTO replication_dead_letters (policy_id, checkpoint_key, attempts, error, "
                                  "created_at) VALUES (1, 'kv/r/manifests/h.json', 3, 'bad', :at)"), at)
            upgrade(url)
            with engine.begin() as conn:
                assert conn.execute(text("SELECT state FROM replication_dead_letters")).scalar() == "dead"
            with pytest.raises(Exception, match="(?i)check"), engine.begin() as conn:
                conn.execute(text("UPDATE replication_dead_letters SET state = 'gone'"))
            downgrade(url, "0015")
            with engine.begin() as conn:
                assert conn.execute(text("SELECT checkpoint_key FROM replication_dead_letters")).scalar() == (
                    "kv/r/manifests/h.json")
        finally:
            engine.dispose()
