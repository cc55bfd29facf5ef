"""Token issue, listing and revocation over the API and the CLI."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from typer.testing import CliRunner

from controlplane.auth import service as auth_service
from controlplane.auth.errors import LastAdminToken
from controlplane.auth.models import ApiToken, AuditRecord
from controlplane.auth.roles import Role
from common.clock import ManualClock
from controlplane.db import session_scope
from lifeline.cli import app


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _token_id(client: TestClient, admin: dict[str, str], name: str) -> int:
    listed = client.get("/api/v1/tokens", headers=admin).json()
    return next(t["id"] for t in listed if t["name"] == name)


def _stored(session_factory: Any) -> list[tuple[int, str | None]]:
    with session_scope(session_factory) as session:
        rows = session.scalars(select(ApiToken).order_by(ApiToken.id)).all()
        return [(t.id, t.revoked_by) for t in rows]


def test_created_token_secret_is_shown_once_and_never_listed(client: TestClient, as_role: Any,
                                                             tokens: dict[str, str]) -> None:
    admin = as_role("admin")
    created = client.post("/api/v1/tokens", json={"name": "ci", "role": "operator"}, headers=admin)
    assert created.status_code == 201
    secret = created.json()["token"]
    assert secret.startswith("llt_")

    listed = client.get("/api/v1/tokens", headers=admin)
    assert listed.status_code == 200
    body = listed.json()
    assert [(t["name"], t["role"], t["active"]) for t in body] == [
        ("test-viewer", "viewer", True), ("test-operator", "operator", True), ("test-admin", "admin", True),
        ("ci", "operator", True),
    ]
    text = listed.text
    assert secret not in text and all(s not in text for s in tokens.values())
    assert all("token" not in t and "token_sha256" not in t for t in body)


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_only_admins_list_and_revoke_tokens(client: TestClient, as_role: Any, session_factory: Any, role: str) -> None:
    assert client.get("/api/v1/tokens", headers=as_role(role)).status_code == 403
    before = _stored(session_factory)
    denied = client.post(f"/api/v1/tokens/{before[0][0]}/revoke", headers=as_role(role))
    assert (denied.status_code, denied.json()["error"]["type"]) == (403, "forbidden")
    assert _stored(session_factory) == before


def test_revoked_token_is_refused_on_the_very_next_request(client: TestClient, as_role: Any,
                                                           session_factory: Any) -> None:
    admin = as_role("admin")
    secret = client.post("/api/v1/tokens", json={"name": "leaked", "role": "operator"}, headers=admin).json()["token"]
    assert client.get("/api/v1/whoami", headers=_bearer(secret)).status_code == 200
    token_id = _token_id(client, admin, "leaked")

    revoked = client.post(f"/api/v1/tokens/{token_id}/revoke", headers=admin)
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["active"] is False
    assert revoked.json()["revoked_by"].startswith("token:test-admin#")

    refused = client.get("/api/v1/whoami", headers=_bearer(secret))
    assert refused.status_code == 401
    assert refused.json() == {"error": {"type": "unauthenticated", "message": "the token is unknown or revoked", "param": None, "code": 401}}
    mutation = client.post("/api/v1/regions", json={"name": "eu"}, headers=_bearer(secret))
    assert mutation.status_code == 401
    assert client.get("/api/v1/regions", headers=admin).json() == []

    active = client.get("/api/v1/tokens", params={"include_revoked": "false"}, headers=admin).json()
    assert "leaked" not in {t["name"] for t in active}
    with session_scope(session_factory) as session:
        audit = session.scalars(select(AuditRecord).where(AuditRecord.action == "revoke_token")).all()
        assert [(a.target, a.outcome, a.status_code) for a in audit] == [
            (f"/api/v1/tokens/{token_id}/revoke", "succeeded", 200)
        ]


def test_revoking_unknown_revoked_or_malformed_ids_is_typed_and_changes_nothing(
    client: TestClient, as_role: Any, session_factory: Any
) -> None:
    admin = as_role("admin")
    operator_id = _token_id(client, admin, "test-operator")
    assert client.post(f"/api/v1/tokens/{operator_id}/revoke", headers=admin).status_code == 200
    before = _stored(session_factory)

    cases = [
        (f"/api/v1/tokens/{operator_id}/revoke", 409, "token_already_revoked"),
        ("/api/v1/tokens/999999/revoke", 404, "token_not_found"),
        ("/api/v1/tokens/0/revoke", 422, "invalid_request"),
        ("/api/v1/tokens/abc/revoke", 422, "invalid_request"),
        (f"/api/v1/tokens/{2**31}/revoke", 422, "invalid_request"),
    ]
    for path, status, type_ in cases:
        response = client.post(path, headers=admin)
        assert (response.status_code, response.json()["error"]["type"]) == (status, type_), path
    assert _stored(session_factory) == before
    with session_scope(session_factory) as session:
        failed = session.scalars(
            select(AuditRecord).where(AuditRecord.action == "revoke_token", AuditRecord.outcome == "failed")
        ).all()
        # Every refused call is audited, bad input included.
        assert sorted(r.status_code for r in failed) == [404, 409, 422, 422, 422]


def test_the_last_active_admin_token_cannot_be_revoked(client: TestClient, as_role: Any,
                                                       session_factory: Any) -> None:
    admin = as_role("admin")
    first_id = _token_id(client, admin, "test-admin")
    refused = client.post(f"/api/v1/tokens/{first_id}/revoke", headers=admin)
    assert (refused.status_code, refused.json()["error"]["type"]) == (409, "last_admin_token")
    assert client.get("/api/v1/whoami", headers=admin).status_code == 200

    second = client.post("/api/v1/tokens", json={"name": "admin-2", "role": "admin"}, headers=admin).json()
    # With a second admin, an admin may revoke even its own token...
    assert client.post(f"/api/v1/tokens/{first_id}/revoke", headers=admin).status_code == 200
    assert client.get("/api/v1/whoami", headers=admin).status_code == 401
    # ...but the one left is the last again.
    again = client.post(f"/api/v1/tokens/{second['id']}/revoke", headers=_bearer(second["token"]))
    assert (again.status_code, again.json()["error"]["type"]) == (409, "last_admin_token")
    assert [t["name"] for t in client.get("/api/v1/tokens", params={"include_revoked": "false"},
                                          headers=_bearer(second["token"])).json() if t["role"] == "admin"] == [
        "admin-2"
    ]


def test_two_admins_revoking_each_other_at_once_leave_one_admin(session_factory: Any, clock: ManualClock) -> None:
    with session_scope(session_factory) as session:
        first, _ = auth_service.create_token(session, name="a", role=Role.ADMIN, created_by="t", clock=clock)
        second, _ = auth_service.create_token(session, name="b", role=Role.ADMIN, created_by="t", clock=clock)
        first_id, second_id = first.id, second.id
    outcome: dict[str, BaseException | None] = {}

    def revoke_second() -> None:
        try:
            with session_scope(session_factory) as session:
                auth_service.revoke_token(session, token_id=second_id, actor="b", clock=clock)
            outcome["second"] = None
        except BaseException as exc:  # noqa: BLE001 - the assertion below inspects it
            outcome["second"] = exc

    holder = session_factory()
    try:
        auth_service.revoke_token(holder, token_id=first_id, actor="a", clock=clock)  # not yet committed
        racer = threading.Thread(target=revoke_second)
        racer.start()
        time.sleep(0.5)  # let the racer reach the lock (PostgreSQL) or the write lock (SQLite)
        holder.commit()
    finally:
        holder.close()
    racer.join(timeout=60)
    assert not racer.is_alive()
    # PostgreSQL: the racer waited on FOR UPDATE; SQLite: on the write lock.
    # Either way it counted after the first revocation committed, and refused.
    assert isinstance(outcome["second"], LastAdminToken), outcome
    with session_scope(session_factory) as session:
        assert session.get(ApiToken, second_id).revoked_at is None  # type: ignore[union-attr]


def test_cli_lists_and_revokes_tokens_and_audits_it(
    database_url: str, session_factory: Any, tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    runner = CliRunner()
    listed = runner.invoke(app, ["controlplane", "token", "list", "--json"], catch_exceptions=False)
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [r["name"] for r in rows] == ["test-viewer", "test-operator", "test-admin"]
    assert all(s not in listed.output for s in tokens.values())
    table = runner.invoke(app, ["controlplane", "token", "list"], catch_exceptions=False)
    assert "test-operator" in table.stdout and "active" in table.stdout

    by_name = {r["name"]: r["id"] for r in rows}
    revoked = runner.invoke(app, ["controlplane", "token", "revoke", str(by_name["test-operator"])],
                            catch_exceptions=False)
    assert revoked.exit_code == 0, revoked.output
    last = runner.invoke(app, ["controlplane", "token", "revoke", str(by_name["test-admin"])])
    assert last.exit_code == 1 and "last_admin_token" in last.output
    missing = runner.invoke(app, ["controlplane", "token", "revoke", "424242"])
    assert missing.exit_code == 1 and "token_not_found" in missing.output
    assert runner.invoke(app, ["controlplane", "token", "revoke", "0"]).exit_code == 2

    with session_scope(session_factory) as session:
        audit = session.scalars(select(AuditRecord).order_by(AuditRecord.id)).all()
        assert [(a.action, a.outcome, a.actor.startswith("cli:")) for a in audit] == [
            ("token.revoke", "succeeded", True), ("token.revoke", "failed", True), ("token.revoke", "failed", True),
        ]
        states = {t.name: t.revoked_at is not None for t in session.scalars(select(ApiToken))}
    assert states == {"test-viewer": False, "test-operator": True, "test-admin": False}
