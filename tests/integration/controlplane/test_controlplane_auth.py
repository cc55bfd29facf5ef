from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select

from controlplane.auth.models import ApiToken, AuditRecord
from controlplane.db import session_scope


def test_request_without_token_is_401_with_typed_error(client: TestClient) -> None:
    response = client.get("/api/v1/regions")
    assert response.status_code == 401
    assert response.json() == {"error": {"type": "unauthenticated", "message": "a bearer token is required", "param": None, "code": 401}}
    assert response.headers["www-authenticate"] == "Bearer"


def test_unknown_token_is_401(client: TestClient, tokens: dict[str, str]) -> None:
    response = client.get("/api/v1/regions", headers={"Authorization": "Bearer llt_not-a-real-token"})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "unauthenticated"


def test_viewer_cannot_mutate_and_nothing_changes(client: TestClient, as_role: Any) -> None:
    response = client.post("/api/v1/regions", json={"name": "eu-west"}, headers=as_role("viewer"))
    assert response.status_code == 403
    assert response.json()["error"]["type"] == "forbidden"
    assert client.get("/api/v1/regions", headers=as_role("viewer")).json() == []


def test_operator_cannot_create_tokens_but_admin_can(client: TestClient, as_role: Any) -> None:
    denied = client.post("/api/v1/tokens", json={"name": "ci", "role": "viewer"}, headers=as_role("operator"))
    assert denied.status_code == 403
    created = client.post("/api/v1/tokens", json={"name": "ci", "role": "viewer"}, headers=as_role("admin"))
    assert created.status_code == 201
    secret = created.json()["token"]
    whoami = client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {secret}"})
    assert whoami.json()["role"] == "viewer"
    assert whoami.json()["actor"].startswith("token:ci#")


def test_tokens_are_stored_only_as_hashes(client: TestClient, tokens: dict[str, str], session_factory: Any) -> None:
    with session_scope(session_factory) as session:
        stored = session.scalars(select(ApiToken)).all()
    assert len(stored) == 3
    secrets = set(tokens.values())
    for token in stored:
        assert token.token_sha256 not in secrets
        assert len(token.token_sha256) == 64
        assert not any(secret in token.token_sha256 for secret in secrets)


def test_every_mutating_call_is_audited_with_outcome(client: TestClient, as_role: Any, session_factory: Any) -> None:
    assert client.post("/api/v1/regions", json={"name": "eu-west"}, headers=as_role("operator")).status_code == 201
    assert client.post("/api/v1/regions", json={"name": "eu-west"}, headers=as_role("operator")).status_code == 409
    assert client.post("/api/v1/regions", json={"name": "x"}, headers=as_role("viewer")).status_code == 403
    assert client.post("/api/v1/regions", json={"name": "y"}).status_code == 401
    client.get("/api/v1/regions", headers=as_role("viewer"))  # reads are not audited
    with session_scope(session_factory) as session:
        records = session.scalars(select(AuditRecord).order_by(AuditRecord.id)).all()
        rows = [(r.actor.split("#")[0], r.action, r.target, r.outcome, r.status_code) for r in records]
        assert all(r.at is not None for r in records)
    assert rows == [
        ("token:test-operator", "create_region", "/api/v1/regions", "succeeded", 201),
        ("token:test-operator", "create_region", "/api/v1/regions", "failed", 409),
        ("token:test-viewer", "create_region", "/api/v1/regions", "failed", 403),
        ("anonymous", "create_region", "/api/v1/regions", "failed", 401),
    ]
    audit = client.get("/api/v1/audit", headers=as_role("admin"))
    assert audit.status_code == 200
    assert len(audit.json()) == 4
