"""Replication policies over the API on SQLite and PostgreSQL: versioned, evented, audited, typed refusals."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

SECRET_URL = "redis://:hunter2@127.0.0.1:6379/0?key_prefix=standby:"


def body(**overrides: Any) -> dict[str, Any]:
    return {"model": "tiny", "session_class": "chat", "mode": "critical", "rpo_context_seconds": 30,
            "source_store": "file:///var/kv/primary", "destination_store": SECRET_URL,
            "retention_seconds": 3600, "reason": "standby for chat", **overrides}


def policy_events(client: TestClient, as_role: Any) -> list[dict[str, Any]]:
    return client.get("/api/v1/events", params={"kind": "replication.policy"}, headers=as_role("viewer")).json()


def test_a_policy_is_set_versioned_evented_and_never_echoes_a_password(client, as_role):
    created = client.put("/api/v1/replication/policies", json=body(), headers=as_role("operator"))
    assert created.status_code == 200, created.text
    policy = created.json()
    assert (policy["revision"], policy["mode"], policy["updated_by"]) == (1, "critical", "token:test-operator#2")
    assert "hunter2" not in created.text and policy["destination_store"].startswith("redis://:***@127.0.0.1")

    changed = client.put("/api/v1/replication/policies", headers=as_role("operator"),
                         json=body(mode="interactive", every_turns=4, every_seconds=60, expected_revision=1))
    assert changed.status_code == 200 and changed.json()["revision"] == 2
    shown = client.get("/api/v1/replication/policies/tiny/chat", headers=as_role("viewer"))
    assert shown.json()["mode"] == "interactive" and shown.json()["every_turns"] == 4
    assert [p["session_class"] for p in client.get("/api/v1/replication/policies",
                                                   headers=as_role("viewer")).json()] == ["chat"]

    events = policy_events(client, as_role)
    assert len(events) == 2
    assert {e["scope"] for e in events} == {"model:tiny/session_class:chat"}
    assert all("hunter2" not in str(e) for e in events)
    audit = client.get("/api/v1/audit", headers=as_role("admin")).json()
    assert sum(1 for r in audit if r["action"] == "put_policy" and r["outcome"] == "succeeded") == 2


@pytest.mark.parametrize("bad, error_type", [
    ({"expected_revision": 7}, "replication_policy_conflict"),
    ({"destination_store": "ftp://:hunter2@host/x"}, "invalid_request"),
    ({"source_store": "s3://"}, "invalid_request"),
    ({"destination_store": "redis://:hunter2@127.0.0.1:99999/0"}, "invalid_request"),
    ({"destination_store": "redis://:hunter2@127.0.0.1:6379/zero"}, "invalid_request"),
    ({"source_store": "file://"}, "invalid_request"),
    ({"mode": "interactive"}, "invalid_request"),  # neither every_turns nor every_seconds
    ({"mode": "sometimes"}, "invalid_request"),
    ({"destination_store": "file:///var/kv/primary"}, "invalid_request"),  # the same store
    ({"destination_store": None}, "invalid_request"),
    ({"rpo_context_seconds": -1}, "invalid_request"),
    ({"session_class": "a/b"}, "invalid_request"),
])
def test_bad_input_is_refused_with_a_type_and_changes_nothing(client, as_role, bad, error_type):
    assert client.put("/api/v1/replication/policies", json=body(), headers=as_role("operator")).status_code == 200
    before = client.get("/api/v1/replication/policies/tiny/chat", headers=as_role("viewer")).json()
    response = client.put("/api/v1/replication/policies", json=body(**bad), headers=as_role("operator"))
    assert response.status_code in (409, 422)
    assert response.json()["error"]["type"] == error_type
    assert "hunter2" not in response.text
    assert client.get("/api/v1/replication/policies/tiny/chat", headers=as_role("viewer")).json() == before
    assert len(policy_events(client, as_role)) == 1


def test_a_rebuildable_policy_needs_no_stores_and_is_never_swept(client, as_role):
    response = client.put("/api/v1/replication/policies", headers=as_role("operator"),
                          json=body(session_class="system", mode="rebuildable", source_store=None,
                                    destination_store=None))
    assert response.status_code == 200, response.text
    assert response.json()["source_store"] is None
    status = client.get("/api/v1/replication/status", headers=as_role("viewer")).json()
    assert [(p["session_class"], p["pending"], p["within_rpo"]) for p in status["policies"]] == [
        ("system", 0, None)]


def test_roles_viewer_reads_operator_writes(client, as_role):
    assert client.put("/api/v1/replication/policies", json=body(), headers=as_role("viewer")).status_code == 403
    assert client.put("/api/v1/replication/policies", json=body()).status_code == 401
    assert client.get("/api/v1/replication/status").status_code == 401
    assert client.get("/api/v1/replication/policies", headers=as_role("gateway")).status_code == 403
    missing = client.get("/api/v1/replication/policies/tiny/nothing", headers=as_role("viewer"))
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "replication_policy_not_found"
